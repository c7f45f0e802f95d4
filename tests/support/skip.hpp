// Skipping one test case when the machine lacks what it needs (a GPU, a rank count).
//
//   TEST_CASE("nccl: transfers on every visible GPU", "[comm][nccl][can-skip]") {
//     if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");  // cuda_devices.hpp
//     ...
//   }
//
// ctest's verdict is per process, so a skip must never share a process with another test
// case: a skip would then hide a sibling's failure or pass as that sibling's success. Hence:
//   - a test case that may skip carries the tag [can-skip]; baton_add_test gives each such
//     case its own ctest entry (selected by all of its tags) and runs the others without it;
//   - the run prints ctest's "SKIPPED:" marker only when every test case it ran skipped and
//     none failed; a skip in a run that also ran other cases fails the run, naming the fix.
#pragma once

#include <string>

namespace baton_test {

/// Records that the current test case skipped, with the reason; BATON_SKIP then returns.
void record_skip(const std::string& reason);

}  // namespace baton_test

#define BATON_SKIP(reason)                 \
  do {                                     \
    ::baton_test::record_skip(reason);     \
    return;                                \
  } while (false)
