// Reliability: shapes whose element count or byte count overflows are refused with a
// payload_error that names the shape (issue 13, item 1), never a tensor with size() == 0 or
// a std::bad_array_new_length; and the shapes that are fine at the edges stay fine.
#include "catch.hpp"
#include "payload_test_util.hpp"

#include <baton/payload.hpp>

#include <cstdint>
#include <limits>
#include <vector>

using namespace baton;
using baton_test::iota_tensor;
using Catch::Matchers::Contains;

namespace {
constexpr std::int64_t two_to(int n) { return std::int64_t{1} << n; }
constexpr std::int64_t int64_max = std::numeric_limits<std::int64_t>::max();
}  // namespace

TEST_CASE("a shape whose element count overflows is a payload_error naming the shape", "[payload][reliability]") {
  // 2^40 x 2^40 wrapped to 0 elements: size() was 0 and at(0, 1) wrote out of bounds.
  CHECK_THROWS_MATCHES(host_tensor<double>({two_to(40), two_to(40)}), payload_error,
                       Catch::Matchers::Message(
                           "baton::host_tensor: shape [1099511627776, 1099511627776] overflows: its size in "
                           "bytes (8 per element) exceeds the largest object size, 9223372036854775807; check "
                           "the extents (an uninitialised or wrapped-around value?)"));
  // 3 x 2^62 wrapped to a negative count: std::bad_array_new_length.
  CHECK_THROWS_WITH(host_tensor<double>({3, two_to(62)}), Contains("[3, 4611686018427387904] overflows"));
  CHECK_THROWS_AS(host_tensor<float>({two_to(62), 2}), payload_error);
  CHECK_THROWS_AS(host_tensor<std::int32_t>({int64_max, int64_max, int64_max}), payload_error);
  CHECK_THROWS_AS(host_tensor<std::int64_t>::for_overwrite({two_to(31), two_to(31), two_to(31)}), payload_error);
  CHECK_THROWS_AS(host_tensor<double>::filled({two_to(32), two_to(32)}, 1.0), payload_error);
}

TEST_CASE("an element count that fits but whose bytes overflow is a payload_error", "[payload][reliability]") {
  // 2^61 doubles are 2^64 bytes; 2^62 floats are 2^64 bytes.
  CHECK_THROWS_WITH(host_tensor<double>({two_to(61)}), Contains("[2305843009213693952] overflows"));
  CHECK_THROWS_WITH(host_tensor<float>({two_to(31), two_to(31)}), Contains("overflows"));
  const std::vector<std::int64_t> shape{two_to(20), two_to(20), two_to(20)};
  CHECK_THROWS_AS(payload_traits<host_tensor<double>>::allocate(shape), payload_error);
}

TEST_CASE("an empty shape may have huge other extents; slicing and concatenating it stays exact",
          "[payload][reliability]") {
  const host_tensor<double> empty({0, two_to(62), two_to(62)});
  CHECK(empty.size() == 0);
  CHECK(empty.values().empty());
  CHECK_THROWS_AS(empty.at(0, 0, 0), payload_error);
  const auto part = tensor_slice(empty, 2, 3, 5);
  CHECK(part.shape() == std::vector<std::int64_t>{0, two_to(62), 5});
  // Two parts of 2^62 along dim 1 sum to 2^63: the concatenated shape overflows.
  const std::vector<host_tensor<double>> halves{empty, empty};
  CHECK_THROWS_WITH(merge_microbatches(halves, 1), Contains("overflows the extent along dim 1"));
  const std::vector<host_tensor<double>> slices{part, part};
  CHECK(merge_microbatches(slices, 2).shape() == std::vector<std::int64_t>{0, two_to(62), 10});
}

TEST_CASE("a slice range whose end overflows is reported without overflowing", "[payload][reliability]") {
  const auto t = iota_tensor<float>({4, 3});
  CHECK_THROWS_WITH(tensor_slice(t, 0, int64_max, 5),
                    Contains("rows [9223372036854775807, 9223372036854775807 + 5) along dim 0 are outside"));
  CHECK_THROWS_WITH(payload_traits<host_tensor<float>>::slice(t, 1, 2, int64_max),
                    Contains("rows [2, 2 + 9223372036854775807) along dim 1"));
  CHECK_THROWS_WITH(tensor_slice(t, 0, 1, 2 - 4), Contains("rows [1, -1) along dim 0"));
}

TEST_CASE("the largest shapes that fit are still accepted", "[payload][reliability]") {
  // Only the count is checked here (no allocation), at the edge of what fits.
  namespace pi = detail::payload;
  const std::vector<std::int64_t> fits{two_to(30), two_to(30), 7};
  CHECK(pi::checked_element_count(fits, "test", 1) == 7 * two_to(60));
  CHECK_THROWS_AS(pi::checked_element_count(fits, "test", 2), payload_error);
  const std::vector<std::int64_t> largest{int64_max / 8};
  CHECK(pi::checked_element_count(largest, "test", 8) == int64_max / 8);
  const std::vector<std::int64_t> one_more{int64_max / 8 + 1};
  CHECK_THROWS_AS(pi::checked_element_count(one_more, "test", 8), payload_error);
  const std::vector<std::int64_t> scalar{};
  CHECK(pi::checked_element_count(scalar, "test", 8) == 1);
  CHECK(host_tensor<double>(std::vector<std::int64_t>{}).size() == 1);
  CHECK_THROWS_WITH(host_tensor<double>({2, -3}), Contains("negative extent in shape [2, -3]"));
}
