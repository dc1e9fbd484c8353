# zerod_x86_sources(TARGET SOURCES f... FLAGS -m... DEFINE NAME [PUBLIC])
#
# Adds sources built for one x86 ISA level (each with its own -m flags, not
# target_clones, whose ifunc resolvers crash sanitizer builds) and defines
# NAME=1 on x86-64, NAME=0 elsewhere, so the target's run-time dispatch
# knows whether they are there. PUBLIC when users of the target test the
# ISA paths themselves.
function(zerod_x86_sources target)
  cmake_parse_arguments(arg "PUBLIC" "DEFINE" "SOURCES;FLAGS" ${ARGN})
  set(scope PRIVATE)
  if(arg_PUBLIC)
    set(scope PUBLIC)
  endif()
  if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
    target_sources(${target} PRIVATE ${arg_SOURCES})
    set_source_files_properties(${arg_SOURCES} PROPERTIES COMPILE_OPTIONS "${arg_FLAGS}")
    target_compile_definitions(${target} ${scope} ${arg_DEFINE}=1)
  else()
    target_compile_definitions(${target} ${scope} ${arg_DEFINE}=0)
  endif()
endfunction()
