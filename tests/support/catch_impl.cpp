// Catch2's implementation, compiled once for every test executable (it is the slowest
// translation unit of the suite); the mains in main.cpp and mpi_main.cpp call run_catch.
// It also keeps the per-test-case skip rule of skip.hpp.
#define CATCH_CONFIG_RUNNER
#include "catch.hpp"
#include "catch_session.hpp"
#include "skip.hpp"

#include <cstdio>
#include <string>
#include <vector>

namespace {

struct skip_record {
  std::string test_case;
  std::string reason;
  bool tagged = false;  // carries [can-skip], so ctest runs it in an entry of its own
};

std::vector<skip_record>& skips() {
  static std::vector<skip_record> recorded;
  return recorded;
}

int test_cases_ended = 0;
bool current_case_can_skip = false;

// Counts the test cases that ran, so that a skip among passing cases can be told apart, and
// notes whether the running case carries [can-skip].
struct count_test_cases : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(const Catch::TestCaseInfo& info) override {
    current_case_can_skip = false;
    for (const std::string& tag : info.tags) current_case_can_skip = current_case_can_skip || tag == "can-skip";
    TestEventListenerBase::testCaseStarting(info);
  }
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    ++test_cases_ended;
    TestEventListenerBase::testCaseEnded(stats);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(count_test_cases)

void baton_test::record_skip(const std::string& reason) {
  const std::string name = Catch::getResultCapture().getCurrentTestName();
  skips().push_back({name, reason, current_case_can_skip});
  std::printf("test case '%s' skipped: %s\n", name.c_str(), reason.c_str());
}

int baton_test::run_catch(int argc, char** argv, bool report) {
  Catch::Session session;
  if (!report) session.configData().outputFilename = "%debug";
  if (const int parsed = session.applyCommandLine(argc, argv); parsed != 0) return parsed;
  const int failed = session.run();
  if (skips().empty() || failed != 0) return failed;  // a failure is never reported as a skip
  for (const skip_record& skip : skips()) {
    if (!skip.tagged) {
      if (report) {
        std::printf("error: test case '%s' skipped but is not tagged [can-skip]: ctest would report its whole "
                    "executable as skipped, hiding the other cases. Add the tag [can-skip] and one tag no other "
                    "test case has (baton_add_test then runs it as its own ctest entry).\n",
                    skip.test_case.c_str());
      }
      return 1;
    }
  }
  if (test_cases_ended > static_cast<int>(skips().size())) {
    // A run by hand of cases ctest keeps apart: not a skip of the whole run.
    if (report) std::printf("note: %zu test case(s) skipped; the others passed\n", skips().size());
    return 0;
  }
  if (report) {
    for (const skip_record& skip : skips()) {
      std::printf("SKIPPED: %s: %s\n", skip.test_case.c_str(), skip.reason.c_str());
    }
  }
  return 0;
}
