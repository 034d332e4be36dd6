# Configures, builds and runs one consumer project in a fresh directory (cmake -P).
# Inputs: KIND (a folder beside this file: find_package, add_subdirectory...), SOURCE_DIR (weft), BUILD_DIR (weft's
# build tree, for the install), WORK (scratch directory), GENERATOR, CXX_COMPILER.
cmake_minimum_required(VERSION 3.25)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGN}")
  endif()
endfunction()

set(extra)
if(KIND STREQUAL "find_package")
  run("${CMAKE_COMMAND}" --install "${BUILD_DIR}" --prefix "${WORK}/prefix")
  if(NOT EXISTS "${WORK}/prefix/share/cmake/weft/weftConfigVersion.cmake")
    message(FATAL_ERROR "install did not produce share/cmake/weft/weftConfigVersion.cmake")
  endif()
  list(APPEND extra "-DCMAKE_PREFIX_PATH=${WORK}/prefix")
else()
  list(APPEND extra "-DWEFT_SOURCE_DIR=${SOURCE_DIR}")
endif()

run("${CMAKE_COMMAND}" -S "${SOURCE_DIR}/tests/consumers/${KIND}" -B "${WORK}/build" -G "${GENERATOR}"
    "-DCMAKE_CXX_COMPILER=${CXX_COMPILER}" -DCMAKE_BUILD_TYPE=Release ${extra})
run("${CMAKE_COMMAND}" --build "${WORK}/build")
run("${WORK}/build/consumer")
file(REMOVE_RECURSE "${WORK}")
