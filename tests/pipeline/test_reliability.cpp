// Reliability (issue 13): a gradient of the wrong shape or element type, a target whose rows
// differ from the batch's, and a message header whose shapes overflow are named errors —
// never passed on to the next stage, never split unevenly, never allocated from.
#include "catch.hpp"
#include "test_stages.hpp"

#include <baton/pipeline/detail/gradient_check.hpp>
#include <baton/pipeline/detail/receives.hpp>
#include <baton/pipeline/detail/wire.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

using namespace pipeline_test;
using Catch::Matchers::Contains;

namespace {

using S = mlp_stage<double>;
constexpr std::int64_t features = 4;

// An mlp_stage whose backward returns a gradient with one extra row on its n-th backward call
// (= microbatch n for the schedules below, which run a stage's backwards in microbatch order).
struct extra_row_stage : S {
  int index;
  int bad_stage;
  int bad_call;
  int backward_calls = 0;
  extra_row_stage(int index_, int bad_stage_, int bad_call_)
      : S(features, 100 + static_cast<std::uint64_t>(index_)), index(index_), bad_stage(bad_stage_), bad_call(bad_call_) {}
  baton::grad_t<input> backward(saved& st, const baton::grad_t<output>& dy) {
    auto dx = S::backward(st, dy);
    if (index != bad_stage || backward_calls++ != bad_call) return dx;
    auto shape = dx.shape();
    ++shape[0];
    return tensor<double>(shape);
  }
};

// A stage over a record with an activation and a constant field; identity forward.
using hidden_and_positions = baton::record<baton::field<"hidden", tensor<double>>,
                                           baton::field<"positions", baton::constant<tensor<std::int64_t>>>>;
struct record_stage {
  using input = hidden_and_positions;
  using output = hidden_and_positions;
  using side = baton::no_side;
  struct saved {};
  int index;
  int bad_stage;
  int bad_call;
  int backward_calls = 0;
  output forward(const input& x, const side&, saved&) { return x; }
  baton::grad_t<input> backward(saved&, const baton::grad_t<output>& dy) {
    if (index != bad_stage || backward_calls++ != bad_call) return dy;
    auto shape = baton::get<"hidden">(dy).shape();
    ++shape[0];
    return baton::grad_t<input>(tensor<double>(shape));
  }
};

struct record_loss {
  baton::loss_result<baton::grad_t<hidden_and_positions>> operator()(const hidden_and_positions& y,
                                                                     const tensor<double>&) const {
    return {0.0, baton::grad_t<hidden_and_positions>(tensor<double>(baton::get<"hidden">(y).shape()))};
  }
};

// mse_loss, but the gradient it returns has one row too few.
struct short_gradient_loss {
  baton::loss_result<tensor<double>> operator()(const tensor<double>& y, const tensor<double>& target) const {
    auto r = mse_loss<double>{}(y, target);
    auto shape = r.grad.shape();
    --shape[0];
    r.grad = tensor<double>(shape);
    return r;
  }
};

}  // namespace

TEST_CASE("a backward that returns a gradient of another shape is named with stage, microbatch and field",
          "[pipeline][reliability]") {
  // Rank 1's stage 1 returns a [3, 4] gradient for the [2, 4] input of microbatch 2. Before
  // the check, rank 0 received it and stage 0's backward ran on it.
  const auto messages = errors_of(2, [](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<record_stage>>(
        comm, baton::schedule_shape{2, 1, 4}, [](int s) { return record_stage{s, 1, 2}; }, record_loss{});
    const hidden_and_positions x(random_tensor<double>({8, features}, 1),
                                 baton::constant(tensor<std::int64_t>({8, features})));
    exec.step(x, random_tensor<double>({8, features}, 2));
  });
  INFO(messages[0] << "\n" << messages[1]);
  CHECK_THAT(messages[1], Contains("rank 1") && Contains("(backward of stage 1, microbatch 2)") &&
                              Contains("the stage's backward returned the gradient of input field \"hidden\" with "
                                       "shape [3, 4] but the input activation has shape [2, 4]"));
  CHECK_FALSE(messages[0].empty());  // the other rank ends too, instead of running on it
}

TEST_CASE("a wrong gradient handed to a stage on the same rank is caught before that stage's backward",
          "[pipeline][reliability]") {
  // One rank holds both stages: the gradient goes from stage 1 to stage 0 without a message.
  const auto messages = errors_of(1, [](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::interleaved_1f1b, baton::uniform_stages<extra_row_stage>>(
        comm, baton::shape_for<baton::interleaved_1f1b>(1, 2, 2), [](int s) { return extra_row_stage(s, 1, 1); },
        mse_loss<double>{});
    exec.step(random_tensor<double>({4, features}, 1), random_tensor<double>({4, features}, 2));
  });
  CHECK_THAT(messages[0], Contains("backward of stage 1, microbatch 1") &&
                              Contains("returned the input gradient with shape [3, 4] but the input activation has "
                                       "shape [2, 4]"));
}

TEST_CASE("a loss that returns a gradient of another shape than the output is named", "[pipeline][reliability]") {
  const auto messages = errors_of(2, [](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<S>>(
        comm, baton::schedule_shape{2, 1, 2}, [](int s) { return S(features, static_cast<std::uint64_t>(s)); },
        short_gradient_loss{});
    const auto x = random_tensor<double>({4, features}, 1);
    exec.step(x, x);
  });
  CHECK_THAT(messages[1], Contains("(forward of stage 1, microbatch 0)") &&
                              Contains("the loss returned the output gradient with shape [1, 4] but the output "
                                       "activation has shape [2, 4]"));
}

namespace {
// A tensor whose element type is a run-time property, as in frameworks with a dtype field: it
// declares float elements, but a backward may hand back storage of another element size.
struct dtype_tensor {
  std::vector<std::int64_t> shape;
  std::vector<std::byte> storage;
};
}  // namespace

template <>
struct baton::payload_traits<dtype_tensor> {
  static constexpr payload_role role = payload_role::activation;
  using value_type = float;
  static const std::vector<std::int64_t>& shape(const dtype_tensor& t) { return t.shape; }
  static std::span<const std::byte> bytes(const dtype_tensor& t) { return t.storage; }
  static std::span<std::byte> mutable_bytes(dtype_tensor& t) { return t.storage; }
  static dtype_tensor allocate(std::span<const std::int64_t> s) {
    std::vector<std::int64_t> extents(s.begin(), s.end());
    const auto count = detail::payload::checked_element_count(extents, "dtype_tensor", sizeof(float));
    return {extents, std::vector<std::byte>(static_cast<std::size_t>(count) * sizeof(float))};
  }
  static dtype_tensor allocate_like(const dtype_tensor& t) { return allocate(t.shape); }
  static dtype_tensor slice(const dtype_tensor&, int, std::int64_t, std::int64_t) {
    throw std::logic_error("dtype_tensor: not sliced in this test");
  }
  static dtype_tensor concat(std::span<const dtype_tensor>, int) {
    throw std::logic_error("dtype_tensor: not concatenated in this test");
  }
};

TEST_CASE("a gradient whose element type differs from its activation's is named", "[pipeline][reliability]") {
  STATIC_REQUIRE(baton::activation_tensor<dtype_tensor>);
  const auto activation = baton::payload_traits<dtype_tensor>::allocate(std::vector<std::int64_t>{2, 3});
  auto same = baton::payload_traits<dtype_tensor>::allocate_like(activation);
  CHECK(baton::detail::pipeline::gradient_mismatch(activation, same, "the stage's backward", "input").empty());
  dtype_tensor doubles{{2, 3}, std::vector<std::byte>(6 * sizeof(double))};
  CHECK_THAT(baton::detail::pipeline::gradient_mismatch(activation, doubles, "the stage's backward", "input"),
             Contains("the input gradient of shape [2, 3] whose storage holds 48 bytes where 24 are needed at 4 "
                      "bytes per element: its element type (dtype) differs"));
}

TEST_CASE("a target with other rows than the batch is rejected on every rank, naming both counts",
          "[pipeline][reliability]") {
  // 8 batch rows into 4 microbatches are 2, 2, 2, 2; 6 target rows were cut 2, 2, 1, 1 and
  // the loss of microbatch 2 read a 1-row target for a 2-row output.
  for (const std::int64_t target_rows : {std::int64_t{6}, std::int64_t{10}}) {
    const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
      auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<S>>(
          comm, baton::schedule_shape{2, 1, 4}, [](int s) { return S(features, static_cast<std::uint64_t>(s)); },
          mse_loss<double>{});
      exec.step(random_tensor<double>({8, features}, 1), random_tensor<double>({target_rows, features}, 2));
    });
    const std::string expected = "the target has " + std::to_string(target_rows) + " rows but the batch has 8";
    for (const auto& m : messages) CHECK_THAT(m, Contains(expected) && Contains("4 microbatches"));
  }
}

TEST_CASE("without the agreement exchange, a rank holding the first and last stage still checks the target",
          "[pipeline][reliability]") {
  const auto messages = errors_of(1, [](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::interleaved_1f1b, baton::uniform_stages<S>>(
        comm, baton::shape_for<baton::interleaved_1f1b>(1, 2, 2),
        [](int s) { return S(features, static_cast<std::uint64_t>(s)); }, mse_loss<double>{},
        baton::pipeline_options{.check_agreement = false});
    exec.eval(random_tensor<double>({4, features}, 1), random_tensor<double>({3, features}, 2));
  });
  CHECK_THAT(messages[0], Contains("the target has 3 rows but the batch has 4"));
}

namespace {
using incoming_tensor = baton::detail::pipeline::incoming<int, tensor<double>>;

// A receive whose header announces one tensor of `shape` (8-byte elements), data inline or not.
incoming_tensor received_header(const std::vector<std::int64_t>& shape, bool data_inline, std::int64_t rank_word = -1) {
  namespace pl = baton::detail::pipeline;
  incoming_tensor in(1, 7, pl::message_id{3, 0, 2, 0});
  auto& w = in.header.words;
  w[0] = pl::wire_magic;
  w[1] = 3;  // call
  w[2] = 0;  // stage
  w[3] = 2;  // microbatch
  w[4] = 0;  // activation
  w[5] = 1;  // one tensor
  w[6] = data_inline ? 1 : 0;
  std::int64_t* t = w.data() + pl::wire_header::fixed_words;
  t[0] = rank_word >= 0 ? rank_word : static_cast<std::int64_t>(shape.size());
  t[1] = sizeof(double);
  std::copy(shape.begin(), shape.end(), t + 2);
  return in;
}
}  // namespace

TEST_CASE("a message header whose shapes overflow or exceed its data area is refused before allocating",
          "[pipeline][reliability]") {
  namespace pl = baton::detail::pipeline;
  CHECK_NOTHROW(pl::check_header(received_header({2, 4}, true)));
  CHECK_NOTHROW(pl::check_header(received_header({1000, 1000}, false)));
  CHECK_THROWS_WITH(pl::check_header(received_header({std::int64_t{1} << 40, std::int64_t{1} << 40}, false)),
                    Contains("corrupt header for the activation of stage 0, microbatch 2, call 3 from rank 1") &&
                        Contains("shape [1099511627776, 1099511627776] overflows"));
  CHECK_THROWS_WITH(pl::check_header(received_header({3, -1}, false)), Contains("negative extent in shape [3, -1]"));
  CHECK_THROWS_WITH(pl::check_header(received_header({100, 100}, true)),
                    Contains("carries its data inline but announces 80000 bytes, more than the 2048"));
  CHECK_THROWS_WITH(pl::check_header(received_header({2}, false, 9)), Contains("tensor 0 has rank 9"));
}
