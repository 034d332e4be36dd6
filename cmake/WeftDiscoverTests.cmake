# Run at build time (POST_BUILD) by weft_discover_tests(): lists a doctest executable's cases and
# writes a CTest include file with one test per case. Every case gets the labels in LABELS; a case
# in a doctest test suite named like one of SUITE_LABELS (e.g. TEST_SUITE("slow")) also gets that
# label. (doctest's own doctest_discover_tests flattens label lists and runs the binary once per
# case to find suites; this lists each suite once.)
#
# Inputs: EXE, PREFIX, LABELS, SUITE_LABELS, TIMEOUT, OUT, WORKDIR, SERIAL (all -D; SERIAL: a
# regex, cases whose name matches it get RUN_SERIAL).

cmake_minimum_required(VERSION 3.25)

function(_weft_list_cases out)
  execute_process(COMMAND "${EXE}" --list-test-cases --no-version ${ARGN}
                  OUTPUT_VARIABLE _o RESULT_VARIABLE _r WORKING_DIRECTORY "${WORKDIR}")
  if(NOT _r EQUAL 0)
    message(FATAL_ERROR "weft: listing the test cases of ${EXE} failed (${_r}):\n${_o}")
  endif()
  # CMake lists split on ';' and group on unbalanced '[' ']', so those characters travel as
  # placeholders until the test names are written out.
  string(REPLACE "[" "<weft-lb>" _o "${_o}")
  string(REPLACE "]" "<weft-rb>" _o "${_o}")
  string(REPLACE ";" "<weft-sc>" _o "${_o}")
  string(REPLACE "\n" ";" _lines "${_o}")
  set(_cases)
  foreach(_l IN LISTS _lines)
    if(_l STREQUAL "" OR _l MATCHES "^<weft-lb>doctest<weft-rb>" OR _l MATCHES "^=+$")
      continue()
    endif()
    list(APPEND _cases "${_l}")
  endforeach()
  set(${out} "${_cases}" PARENT_SCOPE)
endfunction()

string(REPLACE "," ";" LABELS "${LABELS}")
string(REPLACE "," ";" SUITE_LABELS "${SUITE_LABELS}")

_weft_list_cases(all_cases)
foreach(s IN LISTS SUITE_LABELS)
  _weft_list_cases(suite_${s} "--test-suite=${s}")
endforeach()

set(script "")
foreach(c IN LISTS all_cases)
  set(labels ${LABELS})
  foreach(s IN LISTS SUITE_LABELS)
    if(c IN_LIST suite_${s})
      list(APPEND labels ${s})
    endif()
  endforeach()
  # doctest filters treat ',' as a separator (escaped with '\\'); '*' and '?' are wildcards that
  # also match themselves, so they may select a few more cases but never none. A filter that
  # selects nothing fails the run (tests/support/main.cpp), so a case cannot pass by not running.
  string(REPLACE "," "\\," filter "${c}")
  list(JOIN labels ";" label_value)
  string(REPLACE "<weft-lb>" "[" c "${c}")
  string(REPLACE "<weft-rb>" "]" c "${c}")
  string(REPLACE "<weft-lb>" "[" filter "${filter}")
  string(REPLACE "<weft-rb>" "]" filter "${filter}")
  string(REPLACE "<weft-sc>" ";" c "${c}")
  string(REPLACE "<weft-sc>" ";" filter "${filter}")
  set(serial "")
  if(DEFINED SERIAL AND NOT "${SERIAL}" STREQUAL "" AND c MATCHES "${SERIAL}")
    set(serial " RUN_SERIAL TRUE")
  endif()
  string(APPEND script
    "add_test([==[${PREFIX}${c}]==] [==[${EXE}]==] [==[--test-case=${filter}]==])\n"
    "set_tests_properties([==[${PREFIX}${c}]==] PROPERTIES LABELS [==[${label_value}]==] "
    "TIMEOUT ${TIMEOUT} WORKING_DIRECTORY [==[${WORKDIR}]==] "
    "ENVIRONMENT OPENBLAS_NUM_THREADS=1${serial})\n")
endforeach()
file(WRITE "${OUT}" "${script}")
