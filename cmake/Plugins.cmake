# zerod_add_plugin(<kind> <name> SOURCES ... [LIBS ...])
# Builds zd_<kind>_<name>.so into the plugin folder, where libzerod looks for
# it; only zd_plugin_descriptors is exported.
function(zerod_add_plugin kind name)
  cmake_parse_arguments(P "" "" "SOURCES;LIBS" ${ARGN})
  set(target zd_${kind}_${name})
  add_library(${target} MODULE ${P_SOURCES})
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    LIBRARY_OUTPUT_DIRECTORY "${ZEROD_PLUGIN_OUTPUT_DIR}"
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON)
  # include/ and the dependency-free kit only (ARCHITECTURE.md §13).
  target_include_directories(${target} PRIVATE "${PROJECT_SOURCE_DIR}/include")
  target_link_libraries(${target} PRIVATE zerod_kit)
  target_link_libraries(${target} PRIVATE ${P_LIBS})
  # Not in a fuzz build: clang links the sanitizer runtimes and libFuzzer
  # into the executable only, which resolves them when it loads the plugin.
  if(NOT ZEROD_FUZZ)
    target_link_options(${target} PRIVATE "-Wl,--no-undefined")
  endif()
  zerod_warnings(${target})
  install(TARGETS ${target} LIBRARY DESTINATION "${ZEROD_PLUGIN_SUBDIR}")
endfunction()
