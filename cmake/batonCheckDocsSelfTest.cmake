# Run as: cmake -DCHECK=<path of batonCheckDocs.cmake> -DWORK=<scratch directory> -P batonCheckDocsSelfTest.cmake
# (baton_add_docs_test registers it as docs_check_selftest, label "selftest").
#
# The docs check must be able to fail: it runs on two small source trees written here, one
# whose every block is compiled (it must pass and count them) and one with one instance of
# each problem the check exists for (it must fail and name each).
cmake_minimum_required(VERSION 3.25)

file(REMOVE_RECURSE "${WORK}")

# ---- a tree that passes -------------------------------------------------------------------
set(good "${WORK}/good")
file(WRITE "${good}/README.md" [==[
# project

```sh
cmake --build build
```

```cpp
int answer = 6 * 7;
std::cout << "answer " << answer << "\n";
```

It prints:

```text
answer 42
```
]==])
file(WRITE "${good}/docs/guide.md" [==[
# guide

```c++
#include <thing.hpp>

  // indentation and blank lines do not count
  thing t;

  t.run();
```

Two lines of prose after a block: what follows is not
that block's output.

```
plain text, not C++
```
]==])
file(WRITE "${good}/include/baton/thing.hpp" [==[
// thing.hpp
#pragma once

/// Example:
/// ```
///   thing t;  // a plain fence in a header comment is C++
/// ```
struct thing {};
]==])
file(WRITE "${good}/tests/thing/CMakeLists.txt" [==[
add_executable(test_thing test_thing.cpp)
]==])
file(WRITE "${good}/tests/thing/test_thing.cpp" [==[
// [doc:guide_block]
#include <thing.hpp>
// [/doc:guide_block]
#include "thing_docs.hpp"

void f() {
  // [doc:answer]
  int answer = 6 * 7;
  std::cout << "answer " << answer << "\n";
  // [/doc:answer]
  // [doc-output:answer]
  const std::string expected = doc_output(R"(
answer 42
)");
  // [/doc-output:answer]
  // [doc:guide_block]
  // indentation and blank lines do not count
  thing t;
  t.run();
  // [/doc:guide_block]
}
]==])
file(WRITE "${good}/tests/thing/thing_docs.hpp" [==[
#pragma once
inline void g() {
    // [doc:header_example]
    thing t;  // a plain fence in a header comment is C++
    // [/doc:header_example]
}
]==])

execute_process(COMMAND "${CMAKE_COMMAND}" "-DROOT=${good}" -P "${CHECK}"
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(text "${out}${err}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "the docs check failed on a tree whose every block is compiled:\n${text}")
endif()
foreach(expected IN ITEMS "docs: 3 of 3 code blocks in README, docs and headers are compiled by tests"
                          "docs: 1 program outputs shown in the docs are asserted")
  string(FIND "${text}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the docs check passed the good tree but did not print '${expected}':\n${text}")
  endif()
endforeach()

# ---- a tree with one of each problem ------------------------------------------------------
set(bad "${WORK}/bad")
file(WRITE "${bad}/README.md" [==[
# project

```cpp
int answer = 6 * 7;
std::cout << "answer " << answer + 1 << "\n";
```

```cpp
orphan_call();
```

```
output of orphan_call
```

```cpp
int shown = 1;
std::cout << shown << "\n";
```

It prints:

```text
2
```

```text
baton::thing t;
```
]==])
file(WRITE "${bad}/include/baton/thing.hpp" [==[
#pragma once
/// Example: thing t;
struct thing {};
]==])
file(WRITE "${bad}/tests/thing/CMakeLists.txt" [==[
add_executable(test_thing test_thing.cpp)
]==])
file(WRITE "${bad}/tests/thing/test_thing.cpp" [==[
void f() {
  // [doc:answer]
  int answer = 6 * 7;
  std::cout << "answer " << answer << "\n";
  // [/doc:answer]
  // [doc:shown]
  int shown = 1;
  std::cout << shown << "\n";
  // [/doc:shown]
  // [doc-output:shown]
  const std::string expected = doc_output(R"(
1
)");
  // [/doc-output:shown]
  // [example: old]
  // [end example]
  // [doc:unused]
  unused();
  // [/doc:unused]
}
]==])
file(WRITE "${bad}/tests/thing/not_built.cpp" [==[
// [doc:orphan]
orphan_call();
// [/doc:orphan]
]==])

execute_process(COMMAND "${CMAKE_COMMAND}" "-DROOT=${bad}" -P "${CHECK}"
                RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(text "${out}${err}")
if(result EQUAL 0)
  message(FATAL_ERROR "the docs check passed a tree full of problems:\n${text}")
endif()
foreach(expected IN ITEMS
        "docs: 1 of 3 code blocks in README, docs and headers are compiled by tests"
        # a block that differs from its region, with the closest region and the first difference
        "README.md:3: int answer = 6 * 7;"
        "closest: tests/thing/test_thing.cpp:2 (// [doc:answer])"
        "vs source 'std::cout << \"answer \" << answer << \"\\n\";'"
        # a block held by a source that no CMakeLists.txt compiles
        "README.md:8: orphan_call();"
        "held by tests/thing/not_built.cpp (// [doc:orphan]), but no test compiles that file"
        # a block right after a program, without a language
        "README.md:12: this block follows the C++ block at README.md:8 but has no language"
        # an output that differs from the one the test asserts
        "README.md:23: this output differs from what tests/thing/test_thing.cpp:10"
        # C++ hidden in a text block
        "README.md:27: this ```text block holds C++ code"
        # an Example without a fence
        "include/baton/thing.hpp:2: a comment announces an Example but shows no ```cpp block"
        # the old marker styles
        "tests/thing/test_thing.cpp:15: '// [example: ' is a marker style this check does not read"
        "tests/thing/test_thing.cpp:16: '// [end example]' is a marker style this check does not read"
        # a region no document shows
        "tests/thing/test_thing.cpp:17: // [doc:unused] is shown in no document")
  string(FIND "${text}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the docs check failed the bad tree, but its report lacks '${expected}':\n${text}")
  endif()
endforeach()
message("docs check self-test: the good tree passes, the bad tree fails with every problem named")
