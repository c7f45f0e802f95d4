// The per-test-case skip rule of skip.hpp, checked from outside by ctest entries that run
// chosen cases of this executable and match its output (tests/CMakeLists.txt). The failing
// case exists to prove that a skip never hides a sibling's failure; no entry runs it alone.
#include "catch.hpp"
#include "skip.hpp"

TEST_CASE("skip rule: tagged", "[skip-rule][tagged][can-skip]") { BATON_SKIP("no widget"); }

TEST_CASE("skip rule: untagged", "[skip-rule][untagged]") { BATON_SKIP("no widget"); }

TEST_CASE("skip rule: failing sibling", "[skip-rule][failing]") { CHECK(1 + 1 == 3); }
