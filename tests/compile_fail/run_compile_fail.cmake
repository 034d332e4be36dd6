# run_compile_fail.cmake — builds one compile-fail snippet target and reports in its exit code.
#
#   cmake -D BUILD_DIR=<build tree> -D TARGET=<target> -D EXPECT=fail|success
#         [-D CONFIG=<config>] [-D REGEX=<regex>] [-D REGEX2=<regex>] -P run_compile_fail.cmake
#
# EXPECT=success (the positive twins, plain tests): exits 0 iff the target builds.
# EXPECT=fail (registered with WILL_FAIL TRUE): exits non-zero ONLY when the build failed AND its
# output matches REGEX (and REGEX2 if given), i.e. weft's own diagnostic was printed; then CTest's
# WILL_FAIL turns that into a pass. Every other outcome — the snippet compiled, it failed for
# another reason, the script was misused — exits 0, which WILL_FAIL reports as a failure. A
# broken script would exit non-zero, but the twins run the same script and would fail then.

set(_usage "usage: cmake -D BUILD_DIR=... -D TARGET=... -D EXPECT=fail|success [-D REGEX=...] -P run_compile_fail.cmake")
if(NOT DEFINED BUILD_DIR OR NOT DEFINED TARGET OR NOT EXPECT MATCHES "^(fail|success)$")
  if(EXPECT STREQUAL "fail")
    message("weft compile-fail: misused (${_usage}); reporting a test failure")
    return()
  endif()
  message(FATAL_ERROR "weft compile-fail: ${_usage}")
endif()
if(EXPECT STREQUAL "fail" AND NOT REGEX)
  message("weft compile-fail: EXPECT=fail needs REGEX (the diagnostic weft promises); reporting a test failure")
  return()
endif()

set(_config)
if(CONFIG)
  set(_config --config "${CONFIG}")
endif()
execute_process(
  COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}" ${_config}
  RESULT_VARIABLE _rc
  OUTPUT_VARIABLE _out
  ERROR_VARIABLE _out)

if(EXPECT STREQUAL "success")
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "weft compile-fail: the positive twin `${TARGET}` must compile but did not:\n${_out}")
  endif()
  message("weft compile-fail: `${TARGET}` compiled, as it must")
  return()
endif()

if(_rc EQUAL 0)
  message("weft compile-fail: `${TARGET}` compiled, but it must not (test FAILS)")
  return()
endif()
foreach(_re IN ITEMS "${REGEX}" "${REGEX2}")
  if(_re AND NOT _out MATCHES "${_re}")
    message("weft compile-fail: `${TARGET}` failed to compile, but its output lacks weft's "
            "diagnostic /${_re}/ (test FAILS). Output:\n${_out}")
    return()
  endif()
endforeach()
message(FATAL_ERROR
  "weft compile-fail: `${TARGET}` failed to compile with weft's diagnostic /${REGEX}/, as it "
  "must. (This non-zero exit is the pass condition of a WILL_FAIL test.)")
