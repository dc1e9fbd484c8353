# Tests that are judged honestly, and suites that say why they did not run.

# zerod_add_checked_test(NAME <name> COMMAND <program> <args>...
#                        [EXIT <status>] [PASS <regex>] [FAIL <regex>] [SKIP_EXIT <status>])
# A test that passes only when the command exits (no signal) with EXIT
# (default 0), prints no sanitizer report, nothing matching FAIL and
# something matching PASS: the checks of cmake/run_and_match.cmake. Use it
# instead of PASS_REGULAR_EXPRESSION, with which CTest ignores the exit
# status. <program> may be a target name. Other properties (TIMEOUT,
# ENVIRONMENT, ...) are set on <name> as usual.
function(zerod_add_checked_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME;EXIT;PASS;FAIL;SKIP_EXIT" "COMMAND")
  if(NOT arg_NAME OR NOT arg_COMMAND)
    message(FATAL_ERROR "zerod_add_checked_test needs NAME and COMMAND")
  endif()
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "zerod_add_checked_test(${arg_NAME}): unknown arguments ${arg_UNPARSED_ARGUMENTS}")
  endif()
  list(POP_FRONT arg_COMMAND program)
  if(TARGET ${program})
    set(program "$<TARGET_FILE:${program}>")
  endif()
  set(defines)
  if(DEFINED arg_EXIT)
    list(APPEND defines "-DZD_EXIT=${arg_EXIT}")
  endif()
  if(DEFINED arg_PASS)
    list(APPEND defines "-DZD_PASS=${arg_PASS}")
  endif()
  if(DEFINED arg_FAIL)
    list(APPEND defines "-DZD_FAIL=${arg_FAIL}")
  endif()
  if(DEFINED arg_SKIP_EXIT)
    list(APPEND defines "-DZD_SKIP_EXIT=${arg_SKIP_EXIT}")
  endif()
  add_test(NAME ${arg_NAME}
    COMMAND "${CMAKE_COMMAND}" ${defines} -P "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/run_and_match.cmake" -- "${program}" ${arg_COMMAND})
  if(DEFINED arg_SKIP_EXIT)
    set_tests_properties(${arg_NAME} PROPERTIES SKIP_REGULAR_EXPRESSION "run_and_match: SKIPPED")
  endif()
endfunction()

# zerod_add_skipped_tests(<reason> <name>...)
# Tests that cannot run in this build (a dependency is missing, or the build
# is instrumented): each is registered anyway and reports itself skipped with
# the reason, so a missing suite shows in ctest's summary instead of
# vanishing from it.
function(zerod_add_skipped_tests reason)
  foreach(name ${ARGN})
    add_test(NAME ${name} COMMAND "${CMAKE_COMMAND}" -E echo "SKIPPED: ${reason}")
    set_tests_properties(${name} PROPERTIES SKIP_REGULAR_EXPRESSION "SKIPPED: ")
  endforeach()
endfunction()
