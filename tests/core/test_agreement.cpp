// The one agreement protocol (core/agreement.hpp): which disagreement a table of descriptors
// reports first, and how its sentence names both ranks, both values and the fix.
#include "catch.hpp"

#include <baton/core/agreement.hpp>
#include <baton/core/hash.hpp>
#include <baton/core/sizes.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

using descriptor = baton::agreement_descriptor<3, 64>;
constexpr std::int64_t protocol = 77;

std::vector<descriptor> table(int ranks) {
  std::vector<descriptor> all(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& d = all[static_cast<std::size_t>(r)];
    d.protocol = protocol;
    d.operation = 5;
    d.rank = r;
    d.values = {10, 20, 30};
  }
  return all;
}

}  // namespace

TEST_CASE("agreement: equal descriptors agree, in any order", "[core][agreement]") {
  auto all = table(4);
  std::swap(all[0], all[3]);
  CHECK_FALSE(baton::compare_descriptors<3, 64>(all, protocol, 2));
}

TEST_CASE("agreement: a failure wins over a difference, and the lowest failed rank is named", "[core][agreement]") {
  auto all = table(4);
  all[3].fail(2, "rank 3: bad input");
  all[2].fail(1, "rank 2: worse input");
  all[1].values[0] = 11;
  const auto v = baton::compare_descriptors<3, 64>(all, protocol, 0);
  CHECK(v.what == baton::agreement_verdict::kind::failed);
  CHECK(v.rank == 2);
  CHECK(all[2].failure_text() == "rank 2: worse input");
  std::string longer(200, 'x');
  all[1].fail(1, longer);
  CHECK(all[1].failure_text().size() == 63);  // cut to fit, terminated
}

TEST_CASE("agreement: a message of another protocol is foreign, not compared", "[core][agreement]") {
  auto all = table(3);
  all[1].protocol = protocol + 1;
  CHECK(baton::compare_descriptors<3, 64>(all, protocol, 0).what == baton::agreement_verdict::kind::foreign);
  all[1].protocol = protocol;
  all[2].magic = 0;
  CHECK(baton::compare_descriptors<3, 64>(all, protocol, 0).what == baton::agreement_verdict::kind::foreign);
}

TEST_CASE("agreement: the first field of the lowest differing rank, with both values", "[core][agreement]") {
  auto all = table(4);
  all[3].values[0] = 99;
  all[2].values[2] = 31;
  all[2].values[1] = 21;
  const auto v = baton::compare_descriptors<3, 64>(all, protocol, 0);
  REQUIRE(v.what == baton::agreement_verdict::kind::field);
  CHECK(v.rank == 2);
  CHECK(v.field == 1);
  CHECK(v.value == 21);
  CHECK(v.reference_value == 20);
  const baton::agreement_field field{"the head dim", "every rank must pass the same head dim"};
  CHECK(baton::agreement_field_text(field, v) ==
        "ranks 0 and 2 disagree on the head dim (20 on rank 0, 21 on rank 2); every rank must pass the same head dim");
  const baton::agreement_field hashed{"the mask", "pass the same mask", nullptr, false};
  CHECK(baton::agreement_field_text(hashed, v) == "ranks 0 and 2 disagree on the mask; pass the same mask");
  // A field left out of the comparison may differ (a shard's length).
  CHECK_FALSE(baton::compare_descriptors<3, 64>(table(2), protocol, 1, 0b101));
  auto uneven = table(2);
  uneven[1].values[1] = 7;
  CHECK_FALSE(baton::compare_descriptors<3, 64>(uneven, protocol, 1, 0b101));
  uneven[0].operation = 6;
  CHECK(baton::compare_descriptors<3, 64>(uneven, protocol, 1, 0b101).what == baton::agreement_verdict::kind::operation);
}

TEST_CASE("core hash and sizes", "[core][hash][sizes]") {
  using baton::detail::core::hasher;
  CHECK(hasher().add(1).add(2).value() != hasher().add(2).add(1).value());  // order matters
  CHECK(hasher().add("ab").add("c").value() != hasher().add("a").add("bc").value());
  CHECK(hasher().add(std::uint64_t{3}).value() >= 0);
  CHECK(baton::detail::core::fnv1a("") == baton::detail::core::fnv_offset_basis);
  CHECK(baton::detail::core::fnv1a("a") == 0xaf63dc4c8601ec8cULL);  // FNV-1a's published value for "a"
  std::int64_t bytes = -1;
  const std::vector<std::int64_t> shape{3, 4};
  CHECK(baton::detail::core::byte_count(shape, 8, bytes));
  CHECK(bytes == 96);
  const std::vector<std::int64_t> huge{std::int64_t{1} << 40, std::int64_t{1} << 40};
  CHECK_FALSE(baton::detail::core::byte_count(huge, 1, bytes));
  CHECK_THROWS_WITH(baton::detail::core::checked_element_count<std::length_error>(huge, "t"),
                    Catch::Contains("t: shape [1099511627776, 1099511627776] overflows"));
  const std::vector<std::int64_t> negative{2, -1};
  CHECK(baton::detail::core::count_problem(negative, "t") == "t: negative extent in shape [2, -1]");
  CHECK(baton::detail::core::checked_element_count<std::length_error>(shape, "t", 8) == 12);
}
