// torch::Tensor as a payload: microbatch split and merge, dtypes carried across a stage
// boundary, and the errors for tensors baton cannot move.
#include "torch_test_util.hpp"  // first: see the comment there
#include "catch.hpp"

#include <baton/comm/local.hpp>
#include <baton/payload.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>
#include <baton/torch.hpp>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

using namespace torch_test;

static_assert(baton::activation_tensor<torch::Tensor>);
static_assert(baton::runtime_element_type<torch::Tensor>);
static_assert(!baton::static_element_type<torch::Tensor>);
static_assert(baton::constant_tensor<baton::constant<torch::Tensor>>);
static_assert(baton::runtime_element_type<baton::constant<torch::Tensor>>);
static_assert(baton::split_backward_stage<baton::torch_stage<torch::nn::Linear>>);

TEST_CASE("torch::Tensor: microbatches split along dim 0 and merge back to the batch", "[torch][payload]") {
  const torch::Tensor batch = torch::arange(7 * 3, torch::kDouble).view({7, 3});
  const auto parts = baton::split_microbatches(batch, 3);  // rows 3, 2, 2
  REQUIRE(parts.size() == 3);
  CHECK(parts[0].size(0) == 3);
  CHECK(parts[2].size(0) == 2);
  CHECK(parts[1].scalar_type() == torch::kDouble);
  CHECK(torch::equal(parts[1], batch.narrow(0, 3, 2)));
  // Owning copies: writing a part leaves the batch alone.
  parts[0].fill_(-1);
  CHECK(batch[0][0].item<double>() == 0.0);
  const torch::Tensor merged = baton::merge_microbatches(std::span<const torch::Tensor>(parts));
  CHECK(merged.sizes() == batch.sizes());
  CHECK(torch::equal(merged.narrow(0, 3, 4), batch.narrow(0, 3, 4)));
}

TEST_CASE("torch::Tensor: the element format names the dtype and allocates it", "[torch][payload]") {
  for (const auto dtype : {torch::kFloat, torch::kDouble, torch::kLong, torch::kInt, torch::kHalf, torch::kBFloat16}) {
    const torch::Tensor t = torch::zeros({2, 3}, torch::TensorOptions().dtype(dtype));
    const std::int64_t format = baton::element_format_of(t);
    CHECK(baton::element_format_bytes(format) == static_cast<std::int64_t>(t.element_size()));
    const std::vector<std::int64_t> shape{4, 5};
    const torch::Tensor made = baton::tensor_allocate<torch::Tensor>(shape, format);
    CHECK(made.scalar_type() == dtype);
    CHECK(made.sizes() == torch::IntArrayRef({4, 5}));
    CHECK(baton::tensor_bytes(made).size() == static_cast<std::size_t>(20 * t.element_size()));
  }
  // float and int32 have the same size but different formats.
  CHECK(baton::element_format_of(torch::zeros({1}, torch::kFloat)) != baton::element_format_of(torch::zeros({1}, torch::kInt)));
}

TEST_CASE("torch::Tensor: tensors baton cannot move are refused with the fix", "[torch][payload]") {
  const torch::Tensor transposed = torch::zeros({3, 4}).t();
  CHECK_THROWS_WITH(baton::tensor_bytes(transposed), Catch::Contains("not contiguous") && Catch::Contains(".contiguous()"));
  CHECK_THROWS_AS(baton::tensor_slice(torch::zeros({3, 4}), 0, 2, 5), baton::payload_error);
}

namespace {

// A stage that turns float activations into double ones and back, so the messages between
// ranks carry two dtypes; its gradient check sees the dtype of each.
struct cast_stageImpl : torch::nn::Module {
  explicit cast_stageImpl(torch::Dtype to) : to_(to) {
    torch::manual_seed(5);
    scale = register_parameter("scale", torch::rand({1}, torch::TensorOptions().dtype(to)) + 0.5);
  }
  torch::Tensor forward(const torch::Tensor& x) { return x.to(to_) * scale; }
  torch::Dtype to_;
  torch::Tensor scale;
};
TORCH_MODULE(cast_stage);

}  // namespace

TEST_CASE("torch::Tensor: dtypes cross stage boundaries in both directions", "[torch][payload][pipeline]") {
  using stage = baton::torch_stage<cast_stage>;
  const torch::Tensor batch = torch::randn({4, 3});
  const torch::Tensor target = torch::randn({4, 3});
  auto loss = baton::torch_loss([](const torch::Tensor& y, const torch::Tensor& t) { return (y - t).pow(2).mean(); });
  std::vector<std::string> seen;
  std::mutex lock;
  baton::run_local(2, [&](baton::local_communicator& comm) {
    one_torch_thread();
    // stage 0 (rank 0): float -> double; stage 1 (rank 1): double -> float.
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<stage>>(
        comm, baton::shape_for<baton::one_f_one_b>(2, 2),
        [](int s) { return stage(cast_stage(s == 0 ? torch::kDouble : torch::kFloat)); }, loss);
    exec.add_forward_hook([&](int s, int, const torch::Tensor& x, const torch::Tensor& y, auto&) {
      std::lock_guard guard(lock);
      seen.push_back(std::to_string(s) + ":" + std::string(c10::toString(x.scalar_type())) + "->" +
                     std::string(c10::toString(y.scalar_type())));
    });
    const auto report = exec.step(batch, target);
    exec.for_each_local_stage([&](int, stage& st) {
      const torch::Tensor g = st.module()->scale.grad();
      CHECK(g.defined());
      CHECK(g.scalar_type() == (comm.rank() == 0 ? torch::kDouble : torch::kFloat));
    });
    if (comm.rank() == 1) CHECK(report.loss.has_value());
  });
  std::sort(seen.begin(), seen.end());
  const std::vector<std::string> expected{"0:Float->Double", "0:Float->Double", "1:Double->Float", "1:Double->Float"};
  CHECK(seen == expected);
}

TEST_CASE("torch_loss: the value and the gradient with respect to the output", "[torch][payload][docs]") {
  // [doc:torch_loss_comment]
  auto loss = baton::torch_loss([](const torch::Tensor& y, const torch::Tensor& target) {
    return torch::mse_loss(y, target);
  });
  // [/doc:torch_loss_comment]
  const torch::Tensor y = torch::tensor({1.0, 2.0, 4.0}, torch::kDouble), target = torch::zeros({3}, torch::kDouble);
  const auto result = loss(y, target);
  CHECK(result.value == Approx(21.0 / 3));
  // d/dy mean((y - t)^2) = 2 (y - t) / n
  CHECK(torch::allclose(result.grad, torch::tensor({2.0 / 3, 4.0 / 3, 8.0 / 3}, torch::kDouble)));
  CHECK_FALSE(result.grad.requires_grad());
}

TEST_CASE("torch_loss: a loss that is not a scalar is refused", "[torch][payload]") {
  auto loss = baton::torch_loss([](const torch::Tensor& y, const torch::Tensor& t) { return y - t; });
  CHECK_THROWS_WITH(loss(torch::zeros({2, 2}), torch::zeros({2, 2})),
                    Catch::Contains("floating-point scalar") && Catch::Contains("reduce it"));
}

TEST_CASE("torch::Tensor: a gradient of another dtype than its activation is refused by name",
          "[torch][payload][pipeline]") {
  using stage = baton::torch_stage<torch::nn::Linear>;
  // A hand-written loss whose gradient is double for a float output.
  auto wrong_dtype = [](const torch::Tensor& y, const torch::Tensor&) {
    return baton::loss_result<torch::Tensor>{0.0, torch::zeros(y.sizes(), torch::kDouble)};
  };
  std::vector<std::string> messages(2);
  baton::run_local(2, [&](baton::local_communicator& comm) {
    one_torch_thread();
    torch::manual_seed(1);
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<stage>>(
        comm, baton::shape_for<baton::one_f_one_b>(2, 2), [](int) { return stage(torch::nn::Linear(3, 3)); },
        wrong_dtype);
    try {
      exec.step(torch::randn({4, 3}), torch::randn({4, 3}));
    } catch (const baton::pipeline_error& e) {
      messages[static_cast<std::size_t>(comm.rank())] = e.what();
    }
  });
  CHECK_THAT(messages[1], Catch::Contains("the loss returned the output gradient of element format") &&
                              Catch::Contains("element type (dtype) differs from the output activation's"));
  CHECK_FALSE(messages[0].empty());  // the other rank stops too, naming the failed peer
}

TEST_CASE("torch gradients: all-reduced over replicas and clipped by the norm over pipeline ranks",
          "[torch][payload]") {
  // Rank r's two parameters hold gradients (r + 1) x [1, 2, 3] and (r + 1) x [[4]]; a third
  // parameter never got a gradient on either rank.
  const auto make_params = [](int rank) {
    std::vector<torch::Tensor> params{torch::zeros({3}).requires_grad_(), torch::zeros({1, 1}).requires_grad_(),
                                      torch::zeros({2}).requires_grad_()};
    params[0].mutable_grad() = torch::tensor({1.0f, 2.0f, 3.0f}) * (rank + 1);
    params[1].mutable_grad() = torch::tensor({{4.0f}}) * (rank + 1);
    return params;
  };
  std::vector<std::vector<torch::Tensor>> summed(2), averaged(2);
  std::vector<double> norms(2);
  std::vector<std::vector<torch::Tensor>> clipped(2);
  baton::run_local(2, [&](baton::local_communicator& comm) {
    one_torch_thread();
    const auto r = static_cast<std::size_t>(comm.rank());
    summed[r] = make_params(comm.rank());
    baton::torch_all_reduce_gradients(summed[r], comm);
    averaged[r] = make_params(comm.rank());
    baton::torch_all_reduce_gradients(averaged[r], comm, baton::torch_gradient_reduction::mean);
    clipped[r] = make_params(comm.rank());
    norms[r] = baton::torch_clip_grad_norm(clipped[r], 1.0, 2.0, comm);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r);
    CHECK(torch::allclose(summed[r][0].grad(), torch::tensor({3.0f, 6.0f, 9.0f})));
    CHECK(torch::allclose(summed[r][1].grad(), torch::tensor({{12.0f}})));
    CHECK(torch::equal(summed[r][2].grad(), torch::zeros({2})));  // zero-filled, so every rank reduced the same sizes
    CHECK(torch::allclose(averaged[r][0].grad(), torch::tensor({1.5f, 3.0f, 4.5f})));
    // Norm over both ranks: sqrt((1 + 4 + 9 + 16) x (1 + 4)) = sqrt(150); each gradient scaled by 1 / norm.
    CHECK(norms[r] == Approx(std::sqrt(150.0)));
    const double scale = 1.0 / (std::sqrt(150.0) + 1e-6);
    CHECK(torch::allclose(clipped[r][0].grad(), torch::tensor({1.0f, 2.0f, 3.0f}) * static_cast<float>(static_cast<double>(r + 1) * scale)));
  }
  std::vector<torch::Tensor> mixed{torch::zeros({1}, torch::kFloat).requires_grad_(),
                                   torch::zeros({1}, torch::kDouble).requires_grad_()};
  CHECK_THROWS_WITH(baton::torch_clip_grad_norm(mixed, 1.0, 2.0), Catch::Contains("mix float and double"));
}
