# Turns the ```cpp blocks of a Markdown page into C++ (cmake -P).
# Inputs: DOC (the page), OUT (the generated .cpp), NAME (used in the test names), COMPONENT
# (optional: empty for the page's doctest file, `mpi` or `nccl` for the blocks of that component).
#
# The fence's info string says how a block is compiled: "```cpp" then optional words.
# - "```cpp": the block is the body of a doctest test case of weft.test.docs, run by CTest (label
#   docs); its CHECK lines are assertions. A block that defines `int main(` is a whole program,
#   as a reader would save it to main.cpp: it is compiled at namespace scope (its own namespace
#   per block) and its test checks that main() returns 0. Such a block returns explicitly (a main
#   outside the global namespace has no implicit `return 0`).
# - "```cpp compile-only": compiled, never run. The block is compiled at namespace scope in its
#   own namespace, as a reader would save it to a file: declarations and definitions (functions,
#   or a whole program with its own main()), not loose statements. It may declare functions it
#   does not define (the user's `train`), since nothing is linked against it.
# - "```cpp compile-only mpi" / "```cpp compile-only nccl": as compile-only, but against the
#   component's target (weft::mpi, weft::nccl) in a translation unit of their own (one per page and
#   component, COMPONENT set), an object library built by `all` when the component is found
#   (tests/docs/CMakeLists.txt); without the component the block is not compiled. A component
#   block is always compile-only: running it needs mpiexec or GPUs.
# Any other word after "cpp" is an error, so a typo cannot silently drop a block. ```c++, ```text,
# ```cmake... are never compiled.
# `#include` lines of any block are moved to the top of the generated file (a blank line stays,
# so the compiler's line numbers still point into the page). Component files include only the
# blocks' own headers; the doctest file includes <weft/weft.hpp> and a few standard headers too.
cmake_minimum_required(VERSION 3.25)
set(known_components mpi nccl)
if(DEFINED COMPONENT AND NOT COMPONENT STREQUAL "" AND NOT COMPONENT IN_LIST known_components)
  message(FATAL_ERROR "extract_examples.cmake: unknown COMPONENT '${COMPONENT}' (known: ${known_components})")
endif()
if(NOT DEFINED COMPONENT)
  set(COMPONENT "")
endif()
# Read as one string and protect the characters CMake lists treat specially before splitting.
file(READ "${DOC}" text)
string(REPLACE "[" "<weft-lb>" text "${text}")
string(REPLACE "]" "<weft-rb>" text "${text}")
string(REPLACE ";" "<weft-sc>" text "${text}")
string(REPLACE "\\" "<weft-bs>" text "${text}")
string(REPLACE "\n" ";" lines "${text}")
# Page names may hold characters an identifier cannot ("getting-started.md").
string(MAKE_C_IDENTIFIER "${NAME}" name_id)
set(includes)
set(cases "")
set(in_block FALSE)
set(n 0)         # every ```cpp block of the page, so example numbers do not depend on COMPONENT
set(n_taken 0)   # the blocks this file compiles
set(line_no 0)
foreach(line IN LISTS lines)
  math(EXPR line_no "${line_no} + 1")
  if(NOT in_block AND line MATCHES "^```cpp([ \t].*)?$")
    set(in_block TRUE)
    set(body "")
    set(is_program FALSE)
    math(EXPR n "${n} + 1")
    math(EXPR first "${line_no} + 1")
    # The words after "cpp".
    string(REGEX REPLACE "^```cpp[ \t]*" "" words "${line}")
    string(STRIP "${words}" words)
    string(REGEX REPLACE "[ \t]+" ";" words "${words}")
    set(compile_only FALSE)
    set(component "")
    foreach(w IN LISTS words)
      if(w STREQUAL "compile-only")
        set(compile_only TRUE)
      elseif(w IN_LIST known_components AND component STREQUAL "")
        set(component "${w}")
      else()
        message(FATAL_ERROR "${DOC}:${line_no}: unknown or repeated word '${w}' after ```cpp "
                            "(known: compile-only, and one of ${known_components})")
      endif()
    endforeach()
    if(NOT component STREQUAL "" AND NOT compile_only)
      message(FATAL_ERROR "${DOC}:${line_no}: a ${component} block is compiled only: write "
                          "```cpp compile-only ${component}")
    endif()
    # This file takes the block when its component is the one asked for ("" for the doctest file).
    if(component STREQUAL COMPONENT)
      set(take TRUE)
      math(EXPR n_taken "${n_taken} + 1")
    else()
      set(take FALSE)
    endif()
  elseif(in_block AND line MATCHES "^```[ \t]*$")
    set(in_block FALSE)
    if(take)
      set(title "${NAME} example ${n} (line ${first})")
      set(ns "weft_doc_${name_id}_example_${n}")
      if(compile_only)
        string(APPEND cases "// ${title}: compiled only\nnamespace ${ns} {\n#line ${first} \"${DOC}\"\n${body}}  // namespace ${ns}\n\n")
      elseif(is_program)
        string(APPEND cases "namespace ${ns} {\n#line ${first} \"${DOC}\"\n${body}}  // namespace ${ns}\n\n")
        string(APPEND cases "TEST_CASE(\"${title}\") {\n  CHECK(${ns}::main() == 0);\n}\n\n")
      else()
        string(APPEND cases "TEST_CASE(\"${title}\") {\n#line ${first} \"${DOC}\"\n${body}}\n\n")
      endif()
    endif()
  elseif(in_block)
    if(NOT take)
      # Not this file's block: its includes stay out too.
    elseif(line MATCHES "^[ \t]*#[ \t]*include[ \t]*[<\"]")
      string(STRIP "${line}" line)
      list(APPEND includes "${line}")
      string(APPEND body "\n")
    else()
      if(line MATCHES "^int main[ \t]*\\(")
        set(is_program TRUE)
      endif()
      string(APPEND body "${line}\n")
    endif()
  endif()
endforeach()
if(in_block)
  message(FATAL_ERROR "${DOC}: unterminated ```cpp block")
endif()
if(n_taken EQUAL 0)
  if(COMPONENT STREQUAL "")
    message(FATAL_ERROR "${DOC}: no ```cpp examples found")
  else()
    message(FATAL_ERROR "${DOC}: no ```cpp compile-only ${COMPONENT} examples found")
  endif()
endif()

set(out "// Generated from ${NAME} by tests/docs/extract_examples.cmake: do not edit.\n")
if(COMPONENT STREQUAL "")
  string(APPEND out "#include <weft/weft.hpp>\n\n#include <doctest/doctest.h>\n\n")
  string(APPEND out "#include <array>\n#include <cmath>\n#include <cstdint>\n#include <string>\n")
  string(APPEND out "#include <string_view>\n#include <vector>\n")
else()
  string(APPEND out "// The ```cpp compile-only ${COMPONENT} blocks: compiled against weft::${COMPONENT}, never run.\n")
endif()
if(includes)
  list(REMOVE_DUPLICATES includes)
  string(APPEND out "\n// The examples' own includes.\n")
  foreach(inc IN LISTS includes)
    string(APPEND out "${inc}\n")
  endforeach()
endif()
string(APPEND out "\n${cases}")
string(REPLACE "<weft-lb>" "[" out "${out}")
string(REPLACE "<weft-rb>" "]" out "${out}")
string(REPLACE "<weft-sc>" ";" out "${out}")
string(REPLACE "<weft-bs>" "\\" out "${out}")
file(WRITE "${OUT}.tmp" "${out}")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
