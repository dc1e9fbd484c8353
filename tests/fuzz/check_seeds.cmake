# fuzz.seed_corpus_is_current: the binary seeds committed under
# tests/fuzz/corpus/ are exactly what zerod_fuzz_make_corpus writes from
# today's protocol (the frames' version, the ABI minor in Hello, every
# message's fields). Seeds of an older protocol still parse, but the fuzzer
# would start from messages no client sends any more.
#   cmake -DMAKE_CORPUS=... -DCOMMITTED=tests/fuzz/corpus -DSCRATCH=dir -P check_seeds.cmake
# SCRATCH is removed first and not made again: the writer makes the folders
# it writes, as it must when run into a fresh one (docs/fuzzing.md).
cmake_minimum_required(VERSION 3.20)
set(targets frame_reader request_handler)
file(REMOVE_RECURSE "${SCRATCH}")
execute_process(COMMAND "${MAKE_CORPUS}" "${SCRATCH}" RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "zerod_fuzz_make_corpus failed (${rc}):\n${out}")
endif()
set(stale "")
foreach(t IN LISTS targets)
  file(GLOB now RELATIVE "${SCRATCH}/${t}" "${SCRATCH}/${t}/*")
  file(GLOB committed RELATIVE "${COMMITTED}/${t}" "${COMMITTED}/${t}/*")
  if(NOT now)
    message(FATAL_ERROR "zerod_fuzz_make_corpus wrote no ${t} seeds into ${SCRATCH}/${t}")
  endif()
  foreach(f IN LISTS now)
    if(NOT EXISTS "${COMMITTED}/${t}/${f}")
      list(APPEND stale "${t}/${f} (not committed)")
      continue()
    endif()
    file(SHA256 "${SCRATCH}/${t}/${f}" a)
    file(SHA256 "${COMMITTED}/${t}/${f}" b)
    if(NOT a STREQUAL b)
      list(APPEND stale "${t}/${f} (differs)")
    endif()
  endforeach()
  foreach(f IN LISTS committed)
    if(NOT f IN_LIST now)
      list(APPEND stale "${t}/${f} (no longer written)")
    endif()
  endforeach()
endforeach()
if(stale)
  list(JOIN stale "\n  " lines)
  message(FATAL_ERROR "the committed fuzz seeds are not what today's protocol writes:\n  ${lines}\n"
                      "write them again: <build>/bin/zerod_fuzz_make_corpus tests/fuzz/corpus "
                      "(and delete the seeds it no longer writes)")
endif()
message(STATUS "the committed frame_reader and request_handler seeds are today's protocol")
