# The test runner's own test: cmake/run_and_match.cmake must fail a command
# that printed its pass line and then crashed, exited with another status,
# or printed a sanitizer report, and pass only the honest case.
#   cmake -DRUNNER=<run_and_match.cmake> -P run_and_match_test.cmake
# Prints one line per case and fails on the first case judged wrongly. The
# cases' output is kept here, not echoed: it holds the very sanitizer lines
# the runner looks for.
cmake_minimum_required(VERSION 3.25)

set(failures 0)
# check(<name> <expect: pass|fail> <message regex> <runner -D options>... -- <command>...)
function(check name expect message)
  execute_process(COMMAND "${CMAKE_COMMAND}" ${ARGN} RESULT_VARIABLE status
    OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(expect STREQUAL "pass")
    set(ok FALSE)
    if(status EQUAL 0 AND out MATCHES "${message}")
      set(ok TRUE)
    endif()
  else()
    set(ok FALSE)
    if(NOT status EQUAL 0 AND out MATCHES "${message}")
      set(ok TRUE)
    endif()
  endif()
  if(ok)
    message("ok: ${name}")
  else()
    message("WRONG: ${name}: the runner exited with ${status}, expected to ${expect} saying '${message}'; it printed:\n${out}")
    math(EXPR f "${failures} + 1")
    set(failures ${f} PARENT_SCOPE)
  endif()
endfunction()

set(r -P "${RUNNER}" --)
check("the honest case passes" pass "run_and_match: passed"
  -DZD_PASS=pass-line ${r} sh -c "echo pass-line")
check("a crash after the pass line fails" fail "did not exit"
  -DZD_PASS=pass-line ${r} sh -c "echo pass-line && kill -SEGV $$")
check("another exit status fails" fail "exited with status 3, expected 0"
  -DZD_PASS=pass-line ${r} sh -c "echo pass-line && exit 3")
check("an expected refusal passes" pass "run_and_match: passed"
  -DZD_EXIT=1 -DZD_PASS=refused ${r} sh -c "echo refused && exit 1")
check("a refusal by crashing fails" fail "did not exit"
  -DZD_EXIT=1 -DZD_PASS=refused ${r} sh -c "echo refused && kill -ABRT $$")
check("success where a refusal was expected fails" fail "exited with status 0, expected 1"
  -DZD_EXIT=1 -DZD_PASS=refused ${r} sh -c "echo refused")
check("an AddressSanitizer report fails" fail "a sanitizer reported"
  -DZD_PASS=pass-line ${r} sh -c "echo pass-line && echo '==7==ERROR: AddressSanitizer: heap-use-after-free' >&2")
check("a LeakSanitizer report fails" fail "a sanitizer reported"
  -DZD_PASS=pass-line ${r} sh -c "echo pass-line && echo '==7==ERROR: LeakSanitizer: detected memory leaks' >&2")
check("a UBSan report fails" fail "a sanitizer reported"
  -DZD_PASS=pass-line ${r} sh -c "echo 'x.cpp:3:5: runtime error: signed integer overflow' && echo pass-line")
check("a ThreadSanitizer report fails" fail "a sanitizer reported"
  -DZD_PASS=pass-line ${r} sh -c "echo 'WARNING: ThreadSanitizer: data race' && echo pass-line")
check("no pass line fails" fail "nothing in the output matches"
  -DZD_PASS=pass-line ${r} sh -c "echo something-else")
check("the failure pattern fails" fail "matches the failure pattern"
  -DZD_PASS=pass-line -DZD_FAIL=ZD_ERR ${r} sh -c "echo pass-line ZD_ERR_IO")
check("the skip status skips" pass "run_and_match: SKIPPED"
  -DZD_SKIP_EXIT=77 ${r} sh -c "echo no namespaces here && exit 77")

if(failures GREATER 0)
  message(FATAL_ERROR "${failures} case(s) judged wrongly")
endif()
message("run_and_match: every case judged as it should be")
