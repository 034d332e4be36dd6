# WeftTesting.cmake — helpers for weft's own tests and nvcc checks (not installed).
#
# weft_target_defaults(<target>)       warnings, sanitizers and the C++ standard for weft's programs
# weft_add_test_area(<name> DIR <dir> [LABELS ...] [LIBS ...] [CUDA_LIBS ...] [NO_CUDA_TWIN]
#                    [CUDA_ARCH_SPECIFIC] [OPTIMIZATION <flag>])
#     <dir>/*.test.cpp      -> executable weft.test.<name> (not recursive: tests/comm/mpi and
#                              tests/comm/nccl have their own CMakeLists), one CTest test per doctest case,
#                              named "<name>/<case>", labelled <name> and LABELS, plus "slow",
#                              "threads" or "mpi" for cases inside TEST_SUITE("slow") etc.
#     with WEFT_ENABLE_CUDA -> the files among them with a CUDA path of their own (they test
#                              __CUDACC__, WEFT_CUDA_COMPILER or WEFT_HAS_CUDA_RUNTIME) compiled by
#                              nvcc into weft.test.<name>.cuda, registered as one test labelled gpu
#                              (run only where a GPU is present). Host-only test files are not
#                              twinned: nvcc would compile the same host code again through g++ and
#                              test nothing new; that every public header compiles under nvcc is
#                              weft_add_nvcc_header_check's job. CUDA_LIBS (e.g. CUDA::cublas)
#                              link only the .cuda twin, never the host executable.
#                              CUDA_ARCH_SPECIFIC: the twin's kernels branch on the architecture
#                              (see WEFT_CUDA_TWINS_FIRST_ARCHITECTURE).
#                              OPTIMIZATION: the host program's level in the optimised build
#                              types, instead of a non-empty WEFT_TEST_OPTIMIZATION (an area
#                              whose tests' runs outweigh their build).
# weft_add_cuh_check()                 compiles every include/weft/**/*.cuh alone in a .cu file
#                              (nvcc's device pass: -ptx)
# weft_add_header_check(<name> LINK <lib> HEADERS <headers>)  every given public header alone in
#                              its own TU from a precompiled standard library (clang++: target
#                              weft_header_check, CI's headers stage)
# weft_add_nvcc_header_check(<headers>) compiles every given public .hpp in one .cu file (alone,
#                              each is checked by g++ and clang++ in the headers stage)
# weft_cuda_twin_architectures(<target> [ARCH_SPECIFIC])  the architectures of an nvcc test program
# Every nvcc-compiled target joins the `weft_nvcc` target, which is what CI's nvcc stage builds.
#
# weft's test programs (everything under tests/) compile at WEFT_TEST_OPTIMIZATION (-O1) in the
# optimised build types: tests/CMakeLists.txt.
#
# The presets build every host program as one unity TU (CMAKE_UNITY_BUILD, batch size 0): the
# test files of an area share most of their template instantiations, and compiling them once
# takes about 2.5 times less CPU. The test files therefore keep their namespace-scope helpers
# apart: shared ones live in tests/support (checks.hpp), file-specific ones get file-specific
# names, so that two files' helpers can neither clash nor silently overload each other (the test
# ci/unity-names, scripts/check_unity_names.py, fails otherwise).

include_guard(GLOBAL)

# A test's run time is dominated by the examples' layout runs (built at the build type's level),
# its build by the test programs' template instantiations, which g++ compiles at -O1 in about half
# of -O2's time (tests/rl: 48 s against 90 s). So the test programs build at this level in the
# optimised build types (Release, RelWithDebInfo, MinSizeRel: the presets' -O2 -g1); the library's
# examples and benchmarks keep the build type's. The asan preset builds at -O1 and its test
# programs at -O0: clang compiles a sanitized test TU 2.6 times faster there (tests/optim: 17 s
# against 46 s), which outweighs their slower runs, except the pipeline and comm areas' (their
# OPTIMIZATION).
# The tsan preset builds everything at -O1: g++ builds a ThreadSanitizer test TU at -O0 only 1.6
# times faster (tests/comm: 43 s against 69 s), and its threads tests run 2.5 times slower (71 s
# -> 176 s). Empty: the build type's level for the tests too.
set(WEFT_TEST_OPTIMIZATION "-O1" CACHE STRING
    "Optimisation flag of weft's test programs in the optimised build types (empty: the build type's)")
# The test programs whose tests run in seconds at any level, but take long to compile (the parallel,
# docs, rl, nn, mesh and optim areas: their OPTIMIZATION), build at this lower level: g++ compiles
# tests/parallel at -O0 in 58 s against 90 s at -O1, tests/docs in 49 s against 80 s, and their
# runs stay within seconds. (The areas with slow or long tests keep WEFT_TEST_OPTIMIZATION: core's
# exhaustive conversions, comm, pipeline and attention.) Empty: WEFT_TEST_OPTIMIZATION for them too.
set(WEFT_BRIEF_TEST_OPTIMIZATION "-O0" CACHE STRING
    "Optimisation flag of the test programs whose tests run briefly, in the optimised build types (empty: WEFT_TEST_OPTIMIZATION)")
# Where those levels apply: C++ in the optimised build types (tests/CMakeLists.txt, and an area's
# own OPTIMIZATION, which weft_add_test_area appends after it).
set(_weft_test_optimized_cxx
    "$<AND:$<COMPILE_LANGUAGE:CXX>,$<CONFIG:Release,RelWithDebInfo,MinSizeRel>>")

function(weft_target_defaults target)
  target_compile_features(${target} PRIVATE cxx_std_20)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion>)
  if(WEFT_WARNINGS_AS_ERRORS)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(WEFT_SANITIZE)
    list(JOIN WEFT_SANITIZE "," _san)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=all>)
    target_link_options(${target} PRIVATE -fsanitize=${_san})
  endif()
endfunction()

function(_weft_test_main_lib out lang)
  set(_lib weft_test_main_${lang})
  if(NOT TARGET ${_lib})
    if(lang STREQUAL "cuda")
      set(_src "${CMAKE_BINARY_DIR}/weft_generated/test_main.cu")
      file(CONFIGURE OUTPUT "${_src}" CONTENT "#include \"${PROJECT_SOURCE_DIR}/tests/support/main.cpp\"\n")
      add_library(${_lib} OBJECT "${_src}")
      _weft_check_architecture(${_lib})  # doctest's main: no device code
      target_link_libraries(${_lib} PUBLIC weft::cuda doctest::doctest)
    else()
      add_library(${_lib} OBJECT "${PROJECT_SOURCE_DIR}/tests/support/main.cpp")
      target_link_libraries(${_lib} PUBLIC weft::weft doctest::doctest)
      weft_target_defaults(${_lib})
    endif()
    target_include_directories(${_lib} PUBLIC "${PROJECT_SOURCE_DIR}/tests")
  endif()
  set(${out} ${_lib} PARENT_SCOPE)
endfunction()

# Registers every doctest case of <target> with CTest at build time (see WeftDiscoverTests.cmake).
function(weft_discover_tests target)
  cmake_parse_arguments(A "" "PREFIX;TIMEOUT" "LABELS;SUITE_LABELS" ${ARGN})
  set(_serial "${WEFT_SERIAL_CASES}")
  if(NOT A_TIMEOUT)
    set(A_TIMEOUT 300)
  endif()
  set(_out "${CMAKE_CURRENT_BINARY_DIR}/${target}_tests.cmake")
  list(JOIN A_LABELS "," _labels)
  list(JOIN A_SUITE_LABELS "," _suites)
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND "${CMAKE_COMMAND}" -D "EXE=$<TARGET_FILE:${target}>" -D "PREFIX=${A_PREFIX}"
            -D "LABELS=${_labels}" -D "SUITE_LABELS=${_suites}" -D "TIMEOUT=${A_TIMEOUT}"
            -D "OUT=${_out}" -D "WORKDIR=${CMAKE_CURRENT_BINARY_DIR}" -D "SERIAL=${_serial}"
            -P "${PROJECT_SOURCE_DIR}/cmake/WeftDiscoverTests.cmake"
    BYPRODUCTS "${_out}"
    VERBATIM)
  file(WRITE "${CMAKE_CURRENT_BINARY_DIR}/${target}_include.cmake"
       "if(EXISTS \"${_out}\")\n  include(\"${_out}\")\nelse()\n  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${CMAKE_CURRENT_BINARY_DIR}/${target}_include.cmake")
endfunction()

# Cases whose name matches this regex run with RUN_SERIAL (no other CTest test beside them): the
# straggler detector's cases assert how soon a slow rank is named among 8 thread ranks on the CI's
# 2 cores, which a concurrent test's load delays (two busy loops beside "8 ranks, one 20 % slower
# ... named within 20" fail it 13 times in 20, with or without the 2026-11-27 changes; it failed
# once in a plain ctest -j2 run).
set(WEFT_SERIAL_CASES "^straggler:[ ]" CACHE INTERNAL "")  # cmake -D trims a trailing space

# Suites whose name becomes a CTest label of their cases: TEST_SUITE("slow") { ... }.
set(WEFT_SUITE_LABELS slow threads mpi CACHE INTERNAL "")

# Where set (a list of suite names), each test area is built from its files that open one of
# these suites only (TEST_SUITE("name") or TEST_SUITE_BEGIN("name")). The tsan preset sets
# `threads`: it runs only those cases (its test preset's filter), and CI's tsan stage checks that it
# ran every threads case the default build lists.
set(WEFT_TEST_SUITES_ONLY "" CACHE STRING
    "Build each test area only from its files with one of these doctest suites (empty: all files)")

# Sets <out> to those of the given files that hold a line matching <regex>.
function(_weft_files_with_line out regex)
  set(_kept)
  foreach(_f IN LISTS ARGN)
    file(STRINGS "${_f}" _lines REGEX "${regex}")
    if(_lines)
      list(APPEND _kept "${_f}")
    endif()
  endforeach()
  set(${out} ${_kept} PARENT_SCOPE)
endfunction()

function(weft_add_test_area name)
  cmake_parse_arguments(A "NO_CUDA_TWIN;CUDA_ARCH_SPECIFIC" "DIR;OPTIMIZATION" "LABELS;LIBS;CUDA_LIBS"
                        ${ARGN})
  if(NOT A_DIR)
    set(A_DIR "${CMAKE_CURRENT_SOURCE_DIR}/${name}")
  endif()
  file(GLOB _tests CONFIGURE_DEPENDS "${A_DIR}/*.test.cpp")
  if(WEFT_TEST_SUITES_ONLY)
    # Only the files that open one of these suites (the tsan preset's `threads`, the only cases it
    # runs): the others' cases could not run there, and building them took most of its build.
    list(JOIN WEFT_TEST_SUITES_ONLY "|" _only)
    _weft_files_with_line(_tests "TEST_SUITE(_BEGIN)?\\(\"(${_only})\"\\)" ${_tests})
  endif()
  if(NOT _tests)
    return()
  endif()
  _weft_test_main_lib(_main cxx)

  set(_exe weft.test.${name})
  add_executable(${_exe} ${_tests})
  target_link_libraries(${_exe} PRIVATE ${_main} weft::weft ${A_LIBS})
  weft_target_defaults(${_exe})
  if(A_OPTIMIZATION AND WEFT_TEST_OPTIMIZATION)
    # After the directory's WEFT_TEST_OPTIMIZATION, so this level wins (an empty one leaves every
    # test program at the build type's level, this area's too).
    target_compile_options(${_exe} PRIVATE "$<${_weft_test_optimized_cxx}:${A_OPTIMIZATION}>")
  endif()
  weft_discover_tests(${_exe} PREFIX "${name}/" LABELS ${name} ${A_LABELS}
                      SUITE_LABELS ${WEFT_SUITE_LABELS} TIMEOUT 1800)

  if(WEFT_ENABLE_CUDA AND NOT A_NO_CUDA_TWIN)
    _weft_files_with_line(_twinned "[^!]defined\\(__CUDACC__\\)|WEFT_CUDA_COMPILER|WEFT_HAS_CUDA_RUNTIME"
                          ${_tests})
    if(NOT _twinned)
      return()
    endif()
    _weft_test_main_lib(_cmain cuda)
    set(_cexe weft.test.${name}.cuda)
    weft_nvcc_unity_source(_cu ${_cexe} ${_twinned})
    add_executable(${_cexe} "${_cu}")
    target_link_libraries(${_cexe} PRIVATE ${_cmain} weft::cuda ${A_LIBS} ${A_CUDA_LIBS})
    target_compile_options(${_cexe} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:--extended-lambda --expt-relaxed-constexpr>)
    # One CTest test for the whole twin; slow cases are left to the host build.
    add_test(NAME ${name}/cuda COMMAND ${_cexe} --test-suite-exclude=slow)
    set_tests_properties(${name}/cuda PROPERTIES LABELS "gpu;${name}" TIMEOUT 900)
    set(_arch_specific)
    if(A_CUDA_ARCH_SPECIFIC)
      set(_arch_specific ARCH_SPECIFIC)
    endif()
    weft_cuda_twin_architectures(${_cexe} ${_arch_specific})
    weft_nvcc_target(${_cexe})
  endif()
endfunction()

# Sets <out> to one generated .cu that #includes the given sources: the unity build of an nvcc
# program, by hand (CMake 3.25 merges only C and C++ sources). nvcc then parses the headers and
# instantiates the templates the files share once: the CUDA twins and the NCCL suites.
function(weft_nvcc_unity_source out name)
  set(_content "// Generated by weft_nvcc_unity_source: the sources of ${name} as one nvcc TU.\n")
  foreach(_s IN LISTS ARGN)
    get_filename_component(_abs "${_s}" ABSOLUTE)
    string(APPEND _content "#include \"${_abs}\"\n")
  endforeach()
  set(_cu "${CMAKE_BINARY_DIR}/weft_generated/unity/${name}.cu")
  file(CONFIGURE OUTPUT "${_cu}" CONTENT "${_content}")
  set(${out} "${_cu}" PARENT_SCOPE)
endfunction()

# Adds <target> to `weft_nvcc`, the aggregate of every nvcc-compiled check.
function(weft_nvcc_target target)
  # No CMake unity build for nvcc targets (3.25 does not merge CUDA sources; a later one might):
  # the .cuh checks must compile alone, and the others merge their sources by hand
  # (weft_nvcc_unity_source).
  set_target_properties(${target} PROPERTIES UNITY_BUILD OFF)
  if(NOT TARGET weft_nvcc)
    add_custom_target(weft_nvcc)
  endif()
  add_dependencies(weft_nvcc ${target})
endfunction()

# The header checks and the nvcc-compiled test main instantiate no kernel: they compile for the
# first architecture of CMAKE_CUDA_ARCHITECTURES only (a second one would parse the same
# declarations again, 40 % of their time). The CUDA twins and rl_trainer_cuda, which instantiate
# the kernels, build them all, but see WEFT_CUDA_TWINS_FIRST_ARCHITECTURE.
function(_weft_check_architecture target)
  list(GET CMAKE_CUDA_ARCHITECTURES 0 _first)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${_first}" ${ARGN})
endfunction()

# Only the flash attention kernels branch on the architecture (wgmma on 90a, mma.sync elsewhere:
# __CUDA_ARCH_FEAT_SM90_ALL). Every other twin's device code is the same text for 90a and 90, and
# nvcc's device front end (cicc) runs once per architecture over the whole TU, host templates
# included: the second pass is a third to a half of such a twin's time and checks nothing the
# first did not. CI's nvcc stage, where the twins are compile checks (no GPU answers there), sets
# this ON; the twins with architecture-specific kernels (weft_cuda_twin_architectures(<target>
# ARCH_SPECIFIC)) still build every architecture. OFF (the default): every twin builds every
# architecture, so that the 90-virtual PTX runs them on GPUs after Hopper.
option(WEFT_CUDA_TWINS_FIRST_ARCHITECTURE
       "Build the CUDA twins whose kernels do not branch on the architecture for the first CUDA architecture only (CI's nvcc stage)"
       OFF)
function(weft_cuda_twin_architectures target)
  cmake_parse_arguments(A "ARCH_SPECIFIC" "" "" ${ARGN})
  if(WEFT_CUDA_TWINS_FIRST_ARCHITECTURE AND NOT A_ARCH_SPECIFIC)
    _weft_check_architecture(${target})
  endif()
endfunction()

# clang++'s check that every public header compiles alone: each header in its own TU, included
# twice (its include guard too), one object file each, as CMake's VERIFY_INTERFACE_HEADER_SETS
# builds them, but every TU starts from one precompiled header holding the third-party headers
# that the public headers include: the C++ standard library, CCCL's cuda/std and range-v3
# (whatever `#include <...>` lines name them, read from the headers at configure time). Parsing
# those took more than half of each clang++ check (30 headers one after another: 78 s -> 35 s;
# all 148 take 69 s on two cores). Every line of weft's own headers is still
# compiled in each TU, so clang++ still shows that each public header is complete for it; that
# none misses a standard #include is shown by g++, whose all_verify_interface_header_sets has no
# precompiled header and sees the same libstdc++. The checks of weft, weft::mpi and weft::nccl
# join `weft_header_check` (CMakeLists.txt defines them under clang++ only).
function(weft_add_header_check name)
  cmake_parse_arguments(A "" "LINK" "HEADERS" ${ARGN})
  if(NOT A_HEADERS)
    return()
  endif()
  set(_sources)
  set(_third_party)
  foreach(_h IN LISTS A_HEADERS)
    string(REGEX REPLACE "^include/" "" _rel "${_h}")
    string(MAKE_C_IDENTIFIER "${_rel}" _id)
    set(_cpp "${CMAKE_BINARY_DIR}/weft_generated/header_check/${_id}.cpp")
    file(CONFIGURE OUTPUT "${_cpp}" CONTENT "#include <${_rel}>\n#include <${_rel}>\n")
    list(APPEND _sources "${_cpp}")
    file(STRINGS "${PROJECT_SOURCE_DIR}/include/${_rel}" _lines REGEX "^[ \t]*#[ \t]*include[ \t]*<")
    foreach(_l IN LISTS _lines)
      string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*<([^>]+)>.*" "\\1" _inc "${_l}")
      if(_inc MATCHES "^[a-z_]+$|^cuda/std/[a-z_]+$|^range/v3/")
        list(APPEND _third_party "<${_inc}>")
      endif()
    endforeach()
  endforeach()
  add_library(${name} OBJECT ${_sources})
  target_link_libraries(${name} PRIVATE ${A_LINK})
  # One TU per header, whatever CMAKE_UNITY_BUILD says; built by name only, never by `all`.
  set_target_properties(${name} PROPERTIES UNITY_BUILD OFF EXCLUDE_FROM_ALL ON)
  if(_third_party)
    list(REMOVE_DUPLICATES _third_party)
    list(SORT _third_party)
    target_precompile_headers(${name} PRIVATE ${_third_party})
  endif()
  if(NOT TARGET weft_header_check)
    add_custom_target(weft_header_check)
  endif()
  add_dependencies(weft_header_check ${name})
endfunction()

function(weft_add_nvcc_header_check)
  set(_content "")
  foreach(_h IN LISTS ARGN)
    string(APPEND _content "#include <${_h}>\n")
  endforeach()
  if(NOT _content)
    return()
  endif()
  set(_cu "${CMAKE_BINARY_DIR}/weft_generated/nvcc_headers.cu")
  file(CONFIGURE OUTPUT "${_cu}" CONTENT "${_content}")
  add_library(weft_nvcc_headers OBJECT "${_cu}")
  _weft_check_architecture(weft_nvcc_headers)
  target_link_libraries(weft_nvcc_headers PRIVATE weft::cuda)
  weft_nvcc_target(weft_nvcc_headers)
endfunction()

function(weft_add_cuh_check)
  set(_sources)
  foreach(_h IN LISTS WEFT_CUH_HEADERS)
    string(MAKE_C_IDENTIFIER "${_h}" _id)
    set(_cu "${CMAKE_BINARY_DIR}/weft_generated/cuh_check/${_id}.cu")
    file(CONFIGURE OUTPUT "${_cu}" CONTENT "#include <${_h}>\n#include <${_h}>\n")
    list(APPEND _sources "${_cu}")
  endforeach()
  if(NOT _sources)
    return()
  endif()
  add_library(weft_cuh_check OBJECT ${_sources})
  # Device pass only (nvcc -ptx: the preprocessor and cicc, the whole TU's front end, host
  # functions included, for the first architecture as PTX), about 5.5 s a header instead of 20 s
  # (cudafe++ 7 s and the host compile 5 s are left out). The host passes of every .cuh run where
  # it is used: in the CUDA twins, the NCCL suites and rl_trainer_cuda.
  # (PTX compilation emits the architecture's PTX whatever its -real/-virtual suffix says.)
  _weft_check_architecture(weft_cuh_check CUDA_PTX_COMPILATION ON)
  target_link_libraries(weft_cuh_check PRIVATE weft::cuda)
  if(TARGET weft::nccl)
    target_link_libraries(weft_cuh_check PRIVATE weft::nccl)
  endif()
  weft_nvcc_target(weft_cuh_check)
endfunction()
