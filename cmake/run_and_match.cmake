# Runs a test command and judges it on more than one matching line, which is
# all CTest's PASS_REGULAR_EXPRESSION looks at (it ignores the exit status,
# so a crash, a sanitizer report or a leak after the line would pass):
#
#   cmake [-DZD_EXIT=<n>] [-DZD_PASS=<regex>] [-DZD_FAIL=<regex>] [-DZD_SKIP_EXIT=<n>]
#         -P run_and_match.cmake -- <command> <args>...
#
# The test passes only when the command
#   - ended by exiting (not by a signal), with status ZD_EXIT (default 0; a
#     test of a refusal names the status the refusal must have),
#   - printed nothing a sanitizer prints when it finds something,
#   - printed nothing matching ZD_FAIL, and
#   - printed something matching ZD_PASS (CMake regex, as CTest's; stdout
#     and stderr together).
# Exit status ZD_SKIP_EXIT (when given) prints "run_and_match: SKIPPED", for
# the test's SKIP_REGULAR_EXPRESSION. zerod_add_checked_test
# (cmake/CheckedTest.cmake) writes these command lines.
cmake_minimum_required(VERSION 3.25)

set(sanitizer_reports "ERROR: AddressSanitizer|runtime error:|ThreadSanitizer|LeakSanitizer")

# The command is every argument after "--", one element each. A CMake list
# cannot hold an argument with a ';' in it, so such an argument is refused
# rather than silently split.
set(command)
set(after_dashes FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE ${last})
  set(arg "${CMAKE_ARGV${i}}")
  if(after_dashes)
    if(arg MATCHES ";")
      message(FATAL_ERROR "run_and_match: argument '${arg}' holds a ';', which cmake -P cannot pass on")
    endif()
    list(APPEND command "${arg}")
  elseif(arg STREQUAL "--")
    set(after_dashes TRUE)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "run_and_match: no command after '--'")
endif()
if(NOT DEFINED ZD_EXIT)
  set(ZD_EXIT 0)
endif()

# Echoed as it comes, so a test killed at its timeout still shows its output.
execute_process(COMMAND ${command}
  RESULT_VARIABLE status
  OUTPUT_VARIABLE output ERROR_VARIABLE output
  ECHO_OUTPUT_VARIABLE ECHO_ERROR_VARIABLE)

list(GET command 0 program)
get_filename_component(program "${program}" NAME)
if(NOT status MATCHES "^[0-9]+$")
  # execute_process reports a signal as text ("Segmentation fault", ...).
  message(FATAL_ERROR "run_and_match: ${program} did not exit: ${status}")
endif()
if(DEFINED ZD_SKIP_EXIT AND status EQUAL ZD_SKIP_EXIT)
  message("run_and_match: SKIPPED (${program} exited with status ${status}: it cannot run here; its output says why)")
  return()
endif()
if(NOT status EQUAL ZD_EXIT)
  message(FATAL_ERROR "run_and_match: ${program} exited with status ${status}, expected ${ZD_EXIT}")
endif()
string(REGEX MATCH "${sanitizer_reports}" report "${output}")
if(report)
  message(FATAL_ERROR "run_and_match: a sanitizer reported something ('${report}' in the output)")
endif()
if(DEFINED ZD_FAIL AND NOT ZD_FAIL STREQUAL "")
  string(REGEX MATCH "${ZD_FAIL}" bad "${output}")
  if(bad)
    message(FATAL_ERROR "run_and_match: the output matches the failure pattern: '${bad}'")
  endif()
endif()
if(DEFINED ZD_PASS AND NOT ZD_PASS STREQUAL "")
  if(NOT output MATCHES "${ZD_PASS}")
    message(FATAL_ERROR "run_and_match: nothing in the output matches the pass pattern '${ZD_PASS}'")
  endif()
endif()
message("run_and_match: passed (${program} exited with status ${status}, as expected)")
