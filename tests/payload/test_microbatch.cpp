// split_microbatches / merge_microbatches: tensor_split sizes, every dim, ranks 1-4, round
// trips, opaque hooks and replication, custom reducers, and the errors.
#include "catch.hpp"
#include "payload_test_types.hpp"
#include "payload_test_util.hpp"

#include <baton/payload.hpp>

#include <cstdint>
#include <functional>
#include <numeric>
#include <span>
#include <type_traits>
#include <vector>

using namespace baton;
using baton_test::block_mask_like;
using baton_test::iota_tensor;
using baton_test::naive_slice;
using baton_test::run_config;
using baton_test::same_values;
using baton_test::scalar_loss;

TEST_CASE("microbatch_sizes matches torch.tensor_split", "[payload][microbatch]") {
  // torch.tensor_split(torch.arange(n), k) sizes, written out by hand.
  CHECK(microbatch_sizes(10, 3) == std::vector<std::int64_t>{4, 3, 3});
  CHECK(microbatch_sizes(11, 3) == std::vector<std::int64_t>{4, 4, 3});
  CHECK(microbatch_sizes(12, 3) == std::vector<std::int64_t>{4, 4, 4});
  CHECK(microbatch_sizes(7, 7) == std::vector<std::int64_t>{1, 1, 1, 1, 1, 1, 1});
  CHECK(microbatch_sizes(5, 1) == std::vector<std::int64_t>{5});
  CHECK_THROWS_WITH(microbatch_sizes(3, 4), Catch::Contains("use at most 3 microbatches"));
  CHECK_THROWS_WITH(microbatch_sizes(3, 0), Catch::Contains("must be positive"));
}

TEST_CASE("microbatch_bounds lays torch.tensor_split's sizes end to end", "[payload][microbatch]") {
  // torch.tensor_split(torch.arange(10), 4): [0,1,2] [3,4,5] [6,7] [8,9], written out by hand.
  CHECK(microbatch_bounds(10, 4) == std::vector<row_range>{{0, 3}, {3, 3}, {6, 2}, {8, 2}});
  CHECK(microbatch_bounds(3, 3) == std::vector<row_range>{{0, 1}, {1, 1}, {2, 1}});
  CHECK(microbatch_bounds(5, 1) == std::vector<row_range>{{0, 5}});
  CHECK_THROWS_WITH(microbatch_bounds(2, 3), Catch::Contains("use at most 2 microbatches"));
}

TEMPLATE_TEST_CASE("split then merge is the identity for every dim of ranks 1 to 4", "[payload][microbatch]", float,
                   double, std::int32_t, std::int64_t) {
  const auto shape = GENERATE(std::vector<std::int64_t>{9}, std::vector<std::int64_t>{7, 3},
                              std::vector<std::int64_t>{5, 4, 3}, std::vector<std::int64_t>{4, 3, 5, 2});
  const auto t = iota_tensor<TestType>(shape, 1000);
  for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
    const auto extent = shape[static_cast<std::size_t>(dim)];
    for (std::int64_t chunks = 1; chunks <= extent; ++chunks) {
      INFO("rank " << shape.size() << " dim " << dim << " chunks " << chunks);
      const auto parts = split_microbatches(t, chunks, dim);
      REQUIRE(static_cast<std::int64_t>(parts.size()) == chunks);
      const auto sizes = microbatch_sizes(extent, chunks);
      std::int64_t begin = 0;  // laid end to end here, independently of microbatch_bounds
      for (std::size_t c = 0; c < parts.size(); ++c) {
        CHECK(same_values(parts[c], naive_slice(t, dim, begin, sizes[c])));
        begin += sizes[c];
      }
      CHECK(same_values(merge_microbatches(parts, dim), t));
    }
  }
}

TEST_CASE("uneven splits put the extra rows first; negative dims count from the end", "[payload][microbatch]") {
  const auto t = iota_tensor<std::int64_t>({5, 2});
  const auto parts = split_microbatches(t, 2);
  CHECK(parts[0].shape() == std::vector<std::int64_t>{3, 2});
  CHECK(parts[1].shape() == std::vector<std::int64_t>{2, 2});
  CHECK(parts[1](0, 0) == 6);
  const auto cols = split_microbatches(t, 2, -1);
  CHECK(cols[1].shape() == std::vector<std::int64_t>{5, 1});
  CHECK(cols[1](4, 0) == 9);
  CHECK(same_values(merge_microbatches(cols, -1), t));
  // Large int64 values survive untouched (no float round trip anywhere).
  host_tensor<std::int64_t> big({3}, {std::int64_t{1} << 62, -(std::int64_t{1} << 61) - 7, 123456789012345});
  CHECK(same_values(merge_microbatches(split_microbatches(big, 3)), big));
}

TEST_CASE("records split field by field", "[payload][microbatch]") {
  using input = record<field<"hidden", host_tensor<float>>, field<"positions", constant<host_tensor<std::int64_t>>>,
                       field<"config", run_config>>;
  input x{iota_tensor<float>({5, 4}), constant{iota_tensor<std::int64_t>({5, 4}, 100)}, run_config{0.1, 42}};
  const auto parts = split_microbatches(x, 3);
  REQUIRE(parts.size() == 3);
  CHECK(get<"hidden">(parts[0]).shape() == std::vector<std::int64_t>{2, 4});
  CHECK(get<"hidden">(parts[2]).shape() == std::vector<std::int64_t>{1, 4});
  CHECK(get<"positions">(parts[1])->at(0, 0) == 108);  // row 2 of the batch
  for (const auto& p : parts) {
    CHECK(get<"config">(p).seed == 42);  // replicated: no split hook
  }
  const auto merged = merge_microbatches(parts);
  CHECK(same_values(get<"hidden">(merged), get<"hidden">(x)));
  CHECK(same_values(get<"positions">(merged).value, get<"positions">(x).value));
  CHECK(get<"config">(merged).dropout == 0.1);

  SECTION("along another dim") {
    const auto by_seq = split_microbatches(x, 4, 1);
    CHECK(get<"positions">(by_seq[3])->shape() == std::vector<std::int64_t>{5, 1});
    CHECK(same_values(get<"hidden">(merge_microbatches(by_seq, 1)), get<"hidden">(x)));
  }
  SECTION("a std::span of parts merges too") {
    const auto merged2 = merge_microbatches(std::span<const input>(parts));
    CHECK(same_values(get<"hidden">(merged2), get<"hidden">(x)));
  }
}

TEST_CASE("a custom reducer merges a scalar loss by summing", "[payload][microbatch]") {
  std::vector<scalar_loss> losses{{1.5}, {2.0}, {0.25}};
  CHECK(merge_microbatches(losses).value == 3.75);
  using out = record<field<"loss", scalar_loss>, field<"logits", host_tensor<float>>>;
  std::vector<out> parts{out{scalar_loss{1.0}, iota_tensor<float>({1, 2})}, out{scalar_loss{2.0}, iota_tensor<float>({2, 2})}};
  const auto merged = merge_microbatches(parts);
  CHECK(get<"loss">(merged).value == 3.0);
  CHECK(get<"logits">(merged).shape() == std::vector<std::int64_t>{3, 2});
}

TEST_CASE("split and merge report misuse with messages", "[payload][microbatch]") {
  using input = record<field<"hidden", host_tensor<float>>, field<"positions", constant<host_tensor<std::int64_t>>>>;
  input x{iota_tensor<float>({4, 3}), constant{iota_tensor<std::int64_t>({2, 3})}};
  CHECK_THROWS_WITH(split_microbatches(x, 0), Catch::Contains("must be positive, got 0"));
  CHECK_THROWS_WITH(split_microbatches(x, -2), Catch::Contains("must be positive, got -2"));
  CHECK_THROWS_WITH(split_microbatches(x, 3),
                    Catch::Contains("field \"positions\"") && Catch::Contains("use at most 2 microbatches"));
  CHECK_THROWS_WITH(split_microbatches(x, 2, 2),
                    Catch::Contains("field \"hidden\"") && Catch::Contains("dim 2 is out of range for a tensor of rank 2"));
  CHECK_THROWS_WITH(split_microbatches(iota_tensor<float>({3}), 4), Catch::Contains("use at most 3 microbatches"));
  CHECK_THROWS_AS(split_microbatches(iota_tensor<float>({3}), 2, -2), payload_error);

  std::vector<input> none;
  CHECK_THROWS_WITH(merge_microbatches(none), Catch::Contains("no parts to merge"));
  std::vector<input> bad{input{iota_tensor<float>({2, 3}), constant{iota_tensor<std::int64_t>({1, 3})}},
                         input{iota_tensor<float>({2, 4}), constant{iota_tensor<std::int64_t>({1, 3})}}};
  CHECK_THROWS_WITH(merge_microbatches(bad),
                    Catch::Contains("field \"hidden\"") && Catch::Contains("part 1 has shape [2, 4] but part 0 has [2, 3]"));
  CHECK_NOTHROW(merge_microbatches(bad, 1));
  std::vector<host_tensor<float>> ranks{iota_tensor<float>({2, 3}), iota_tensor<float>({6})};
  CHECK_THROWS_WITH(merge_microbatches(ranks), Catch::Contains("part 1 has shape [6]"));
  CHECK_THROWS_WITH(merge_microbatches(ranks, 5), Catch::Contains("dim 5 is out of range"));
}

TEST_CASE("records without tensors still split and merge", "[payload][microbatch]") {
  record<> empty;
  const auto parts = split_microbatches(empty, 3);
  CHECK(parts.size() == 3);
  // Merging gives the empty record back; merging no parts is refused like for any record
  // (a record without tensors has nothing else to compare).
  STATIC_REQUIRE(std::is_same_v<decltype(merge_microbatches(parts)), record<>>);
  CHECK_NOTHROW(merge_microbatches(parts));
  CHECK_THROWS_WITH(merge_microbatches(std::vector<record<>>{}), Catch::Contains("no parts to merge"));
  using only_config = record<field<"config", run_config>>;
  const auto configs = split_microbatches(only_config{run_config{0.5, 7}}, 4);
  REQUIRE(configs.size() == 4);
  CHECK(get<"config">(configs[3]).seed == 7);
  CHECK(get<"config">(merge_microbatches(configs)).dropout == 0.5);
  using only_positions = record<field<"positions", constant<host_tensor<std::int64_t>>>>;
  const only_positions p{constant{iota_tensor<std::int64_t>({3})}};
  STATIC_REQUIRE(std::is_same_v<decltype(grad_like(p)), record<>>);
}

// A user's own "data pointer + shape" tensor, given payload_traits through
// row_major_payload_traits: the four members are all it writes.
// [doc:row_major_tensor]
namespace mylib {
struct flat_tensor {  // row-major, contiguous, host memory
  std::vector<std::int64_t> shape;
  std::vector<float> values;
  explicit flat_tensor(std::span<const std::int64_t> s)
      : shape(s.begin(), s.end()),
        values(static_cast<std::size_t>(std::accumulate(s.begin(), s.end(), std::int64_t{1}, std::multiplies<>{}))) {}
};
}  // namespace mylib

template <>
struct baton::payload_traits<mylib::flat_tensor> : baton::row_major_payload_traits<mylib::flat_tensor> {
  using value_type = float;
  static const std::vector<std::int64_t>& shape(const mylib::flat_tensor& t) { return t.shape; }
  static const float* data(const mylib::flat_tensor& t) { return t.values.data(); }
  static float* data(mylib::flat_tensor& t) { return t.values.data(); }
  static mylib::flat_tensor allocate(std::span<const std::int64_t> s) { return mylib::flat_tensor(s); }
};

static_assert(baton::activation_tensor<mylib::flat_tensor>);
// [/doc:row_major_tensor]

TEST_CASE("row_major_payload_traits: a user's data-pointer-and-shape tensor splits, merges and sends",
          "[payload][microbatch]") {
  using mylib::flat_tensor;
  STATIC_REQUIRE(baton::activation_tensor<flat_tensor>);
  STATIC_REQUIRE(baton::pointer_concatenable<flat_tensor>);
  const std::vector<std::int64_t> shape{2, 5, 3};
  flat_tensor t(shape);
  for (std::size_t i = 0; i < t.values.size(); ++i) t.values[i] = static_cast<float>(i);
  CHECK(baton::payload_traits<flat_tensor>::bytes(t).size() == 30 * sizeof(float));

  // Rows 3 and 4 of dim 1, i.e. element (b, r, c) = b*15 + r*3 + c for r in {3, 4}, by hand.
  const auto parts = split_microbatches(t, 2, 1);
  REQUIRE(parts.size() == 2);
  CHECK(parts[1].shape == std::vector<std::int64_t>{2, 2, 3});
  CHECK(parts[1].values == std::vector<float>{9, 10, 11, 12, 13, 14, 24, 25, 26, 27, 28, 29});
  CHECK(merge_microbatches(parts, 1).values == t.values);

  CHECK_THROWS_WITH(baton::payload_traits<flat_tensor>::slice(t, 1, 4, 2),
                    Catch::Contains("rows [4, 6) along dim 1 are outside shape [2, 5, 3]"));
  const std::vector<flat_tensor> mismatched{flat_tensor(std::vector<std::int64_t>{2, 3}),
                                            flat_tensor(std::vector<std::int64_t>{3, 3})};
  CHECK_THROWS_WITH(baton::payload_traits<flat_tensor>::concat(mismatched, 1),
                    Catch::Contains("part 1 has shape [3, 3] but part 0 has [2, 3]"));
}
