// Bad input to the schedule layer (issue 13, item 8): each is refused at once with a message
// that names the problem — never minutes of work, a bad_alloc, or "inf" and "nan" figures.
#include <baton/schedule.hpp>

#include "catch.hpp"

#include <chrono>
#include <filesystem>
#include <limits>
#include <string>

using Catch::Matchers::Contains;

TEST_CASE("a shape too large to build is refused before anything is allocated", "[schedule][reliability]") {
  const auto start = std::chrono::steady_clock::now();
  for (const auto& info : baton::builtin_policies) {
    INFO(info.name);
    const auto shape = info.shape(1024, 1048576);
    CHECK_THROWS_WITH(info.generate(shape), Contains("the shape is too large") && Contains("x microbatches = ") &&
                                                Contains("use fewer microbatches or ranks"));
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  // The limit itself still builds.
  CHECK_NOTHROW(baton::one_f_one_b::generate({4096, 1, 1024}));
}

TEST_CASE("non-finite costs are refused, naming the field", "[schedule][reliability]") {
  const auto prog = baton::one_f_one_b::generate({2, 1, 2});
  const double inf = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(baton::simulate(prog, baton::cost_model::uniform(inf, 1, 1, 0)),
                    Contains("forward has a negative, infinite or NaN cost"));
  CHECK_THROWS_WITH(baton::simulate(prog, baton::cost_model::uniform(1, 1, 1, inf)),
                    Contains("communication must be finite and >= 0"));
}

TEST_CASE("a directory given as a schedule file is named", "[schedule][reliability]") {
  const auto dir = std::filesystem::temp_directory_path();
  CHECK_THROWS_WITH(baton::csv_schedule::from_file(dir),
                    Contains("cannot read schedule file '" + dir.string() + "': it is a directory"));
}

TEST_CASE("rows that do not divide the stages name the counts, not a rank", "[schedule][reliability]") {
  try {
    (void)baton::parse_csv("0F0,2F0,2B0,0B0\n1F0,1B0\n");
    FAIL("accepted");
  } catch (const baton::schedule_error& e) {
    CHECK_THAT(e.what(), Contains("the schedule has 2 rows (one per rank) but uses 3 stages (0..2), which is not a "
                                  "multiple of 2"));
    CHECK_THAT(e.what(), !Contains("rank 2"));
    CHECK(e.rank() == -1);  // a whole-schedule problem: no place to point at
  }
}
