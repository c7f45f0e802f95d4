// The examples of docs/pipeline.md, of README.md ("A first look at the API") and of the
// comment of baton/pipeline/stage.hpp, compiled and run. Each block between "// [doc:NAME]"
// and "// [/doc:NAME]" is shown verbatim in a document (ctest -L docs checks it); each run
// is compared with the same stages trained on one thread, written out below.
// [doc:readme_first_look]
#include <baton/baton.hpp>
// [/doc:readme_first_look]

#include "catch.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

// [doc:stage]
// y = tanh(x * w) elementwise, with one weight per feature: x is [rows, features].
struct scaled_tanh {
  using input = baton::host_tensor<double>;
  using output = baton::host_tensor<double>;
  using side = baton::no_side;  // no per-microbatch side input
  struct saved {                // what backward needs, one per microbatch in flight
    baton::host_tensor<double> x, y, dz;
    std::size_t bytes() const { return static_cast<std::size_t>(x.size() + y.size() + dz.size()) * sizeof(double); }
  };

  baton::host_tensor<double> w, dw;  // weights and their gradient accumulator
  explicit scaled_tanh(std::int64_t features, double init)
      : w(baton::host_tensor<double>::filled({features}, init)), dw({features}) {}

  output forward(const input& x, const side&, saved& st) {
    const std::int64_t f = w.size();
    st.x = x;
    st.y = output(x.shape());
    for (std::int64_t i = 0; i < x.size(); ++i) st.y[i] = std::tanh(x[i] * w[i % f]);
    return st.y;
  }
  // Split backward: the input gradient now (it unblocks the previous stage) ...
  baton::grad_t<input> backward_input(saved& st, const baton::grad_t<output>& dy) {
    const std::int64_t f = w.size();
    st.dz = output(dy.shape());
    input dx(dy.shape());
    for (std::int64_t i = 0; i < dy.size(); ++i) {
      st.dz[i] = dy[i] * (1 - st.y[i] * st.y[i]);
      dx[i] = st.dz[i] * w[i % f];
    }
    return dx;
  }
  // ... and the weight gradient later, accumulated over microbatches.
  void backward_weight(saved& st) {
    const std::int64_t f = w.size();
    for (std::int64_t i = 0; i < st.x.size(); ++i) dw[i % f] += st.x[i] * st.dz[i];
  }
  // The full backward, for schedules that do not split it.
  baton::grad_t<input> backward(saved& st, const baton::grad_t<output>& dy) {
    auto dx = backward_input(st, dy);
    backward_weight(st);
    return dx;
  }
};
static_assert(baton::split_backward_stage<scaled_tanh>);
// [/doc:stage]

namespace {

// Mean over rows of 0.5 * |y - target|^2; the executor scales by 1/m itself.
struct half_squared_error {
  baton::loss_result<baton::host_tensor<double>> operator()(const baton::host_tensor<double>& y,
                                                            const baton::host_tensor<double>& target) const {
    const double rows = static_cast<double>(y.shape()[0]);
    baton::loss_result<baton::host_tensor<double>> r{0.0, baton::host_tensor<double>(y.shape())};
    for (std::int64_t i = 0; i < y.size(); ++i) {
      const double d = y[i] - target[i];
      r.value += 0.5 * d * d / rows;
      r.grad[i] = d / rows;
    }
    return r;
  }
};

// README.md's batch and target: 16 rows of 3 features (docs/pipeline.md builds the same).
baton::host_tensor<double> example_batch() {
  baton::host_tensor<double> batch({16, 3});
  for (std::int64_t i = 0; i < batch.size(); ++i) batch[i] = 0.1 * static_cast<double>(i % 7);
  return batch;
}
baton::host_tensor<double> example_target() {
  baton::host_tensor<double> target({16, 3});
  for (std::int64_t i = 0; i < target.size(); ++i) target[i] = 0.05 * static_cast<double>(i % 5);
  return target;
}

// The oracle of the docs runs: the same 8 stages one after another on one thread, on the
// whole batch (with equal microbatches, the mean of the microbatch losses is the full-batch
// mean, and the weight gradients are the same sums), then the same clipping (norm over every
// stage, scaled by max_norm / (norm + 1e-6) when above max_norm) and SGD, written out here.
struct sequential_run {
  std::vector<double> losses;  // before each step, then after the last one
  std::vector<double> norms;   // of each step's gradient
};

sequential_run train_sequentially(const baton::host_tensor<double>& batch, const baton::host_tensor<double>& target,
                                  int steps) {
  std::vector<scaled_tanh> stages;
  for (int s = 0; s < 8; ++s) stages.emplace_back(3, 0.5 + 0.1 * s);
  const auto forward = [&](std::vector<scaled_tanh::saved>& saved) {
    baton::host_tensor<double> h = batch;
    for (std::size_t s = 0; s < stages.size(); ++s) h = stages[s].forward(h, {}, saved[s]);
    return half_squared_error{}(h, target);
  };
  sequential_run run;
  for (int step = 0; step < steps; ++step) {
    std::vector<scaled_tanh::saved> saved(stages.size());
    const auto loss = forward(saved);
    run.losses.push_back(loss.value);
    baton::host_tensor<double> g = loss.grad;
    for (auto& s : stages) s.dw = baton::host_tensor<double>({3});
    for (std::size_t s = stages.size(); s-- > 0;) g = stages[s].backward(saved[s], g);
    double sum = 0;
    for (const auto& s : stages)
      for (std::int64_t i = 0; i < 3; ++i) sum += s.dw[i] * s.dw[i];
    const double norm = std::sqrt(sum);
    run.norms.push_back(norm);
    const double scale = norm > 1.0 ? 1.0 / (norm + 1e-6) : 1.0;
    for (auto& s : stages)
      for (std::int64_t i = 0; i < 3; ++i) s.w[i] -= 0.5 * s.dw[i] * scale;
  }
  std::vector<scaled_tanh::saved> saved(stages.size());
  run.losses.push_back(forward(saved).value);
  return run;
}

double relative_error(double a, double b) { return std::abs(a - b) / std::abs(b); }

}  // namespace

TEST_CASE("docs/pipeline.md: training a 4-rank ZBV pipeline on the local world", "[pipeline][docs]") {
  // [doc:run]
  baton::host_tensor<double> batch({16, 3}), target({16, 3});
  for (std::int64_t i = 0; i < batch.size(); ++i) {
    batch[i] = 0.1 * static_cast<double>(i % 7);
    target[i] = 0.05 * static_cast<double>(i % 5);
  }
  const auto results = baton::run_local(4, [&](baton::local_communicator& comm) {
    // 4 ranks x 2 stages in a V, 8 microbatches; the stage factory runs only for this rank's stages.
    auto pipe = baton::make_pipeline<baton::zbv, baton::uniform_stages<scaled_tanh>>(
        comm, baton::shape_for<baton::zbv>(comm.size(), 8),
        [](int stage) { return scaled_tanh(3, 0.5 + 0.1 * stage); }, half_squared_error{},
        baton::pipeline_options{.loss_on_every_rank = true});
    std::vector<double> losses{*pipe.eval(batch, target).loss}, norms;  // eval: forward only, before any step
    for (int step = 0; step < 3; ++step) {
      pipe.for_each_local_stage([](int, scaled_tanh& s) { s.dw = baton::host_tensor<double>({3}); });
      const baton::step_report report = pipe.step(batch, target);  // report.loss on every rank
      std::vector<std::span<double>> grads;
      pipe.for_each_local_stage([&](int, scaled_tanh& s) { grads.emplace_back(s.dw.data(), 3); });
      norms.push_back(baton::clip_grad_norm(grads, 1.0, 2.0, comm));  // the norm over all stages
      pipe.for_each_local_stage([](int, scaled_tanh& s) {
        for (int i = 0; i < 3; ++i) s.w[i] -= 0.5 * s.dw[i];  // plain SGD
      });
      losses.push_back(*report.loss);  // the loss before this step's update
    }
    losses.push_back(*pipe.eval(batch, target).loss);  // and after the last one
    return std::pair{losses, norms};  // the same on every rank
  });
  // [/doc:run]
  // eval before any step and step 0 see the same weights; so do step s and the update before it.
  const sequential_run expected = train_sequentially(batch, target, 3);
  REQUIRE(results.size() == 4);
  for (const auto& [losses, norms] : results) {
    REQUIRE(losses.size() == 5);
    REQUIRE(norms.size() == 3);
    CHECK(relative_error(losses[0], expected.losses[0]) <= 1e-12);
    for (std::size_t step = 0; step < 3; ++step) {
      CHECK(relative_error(losses[step + 1], expected.losses[step]) <= 1e-12);
      CHECK(relative_error(norms[step], expected.norms[step]) <= 1e-12);
    }
    CHECK(relative_error(losses[4], expected.losses[3]) <= 1e-12);
  }
  CHECK(expected.losses[3] < expected.losses[0]);  // and training lowered the loss
}

TEST_CASE("baton/pipeline/executor.hpp: the example of its comment", "[pipeline][docs]") {
  const baton::host_tensor<double> batch = example_batch(), target = example_target();
  const auto losses = baton::run_local(4, [&](baton::local_communicator& comm) {
    // [doc:executor_comment]
    // ZBV runs two stages per rank in a V: shape_for<zbv> gives {comm.size(), 2, 8, placement::v}.
    auto exec = baton::make_pipeline<baton::zbv, baton::uniform_stages<scaled_tanh>>(
        comm, baton::shape_for<baton::zbv>(comm.size(), /*microbatches=*/8),
        [](int stage) { return scaled_tanh(3, 0.5 + 0.1 * stage); }, half_squared_error{});
    const baton::step_report report = exec.step(batch, target);  // report.loss on the last stage's rank
    // [/doc:executor_comment]
    return report.loss;
  });
  // ZBV's last stage (7, the V's end) is on rank 0.
  REQUIRE(losses[0].has_value());
  for (std::size_t r = 1; r < losses.size(); ++r) CHECK_FALSE(losses[r].has_value());
  CHECK(relative_error(*losses[0], train_sequentially(batch, target, 1).losses[0]) <= 1e-12);
}

// README.md's stage and loss: the stage above, built from its index, and the loss above,
// keeping each microbatch's value.
struct my_stage : scaled_tanh {
  explicit my_stage(int stage) : scaled_tanh(3, 0.5 + 0.1 * stage) {}
};

namespace {
std::mutex readme_mutex;
std::vector<double> readme_losses;
}  // namespace

struct my_loss {
  baton::loss_result<baton::host_tensor<double>> operator()(const baton::host_tensor<double>& y,
                                                            const baton::host_tensor<double>& target) const {
    auto r = half_squared_error{}(y, target);
    const std::lock_guard lock(readme_mutex);
    readme_losses.push_back(r.value);
    return r;
  }
};

TEST_CASE("README.md: a first look at the API", "[pipeline][docs]") {
  const baton::host_tensor<double> batch = example_batch(), target = example_target();
  readme_losses.clear();
  // [doc:readme_first_look]
  // A stage is a plain type: input/output payloads, a per-microbatch `saved` state, forward
  // and backward (split into backward_input / backward_weight for zero-bubble schedules).
  baton::run_local(4, [&](baton::local_communicator& comm) {            // 4 ranks as threads
    auto pipe = baton::make_pipeline<baton::zbv, baton::uniform_stages<my_stage>>(
        comm, baton::shape_for<baton::zbv>(comm.size(), /*microbatches=*/8),
        [](int stage) { return my_stage(stage); }, my_loss{});
    baton::step_report r = pipe.step(batch, target);                    // loss on the last stage
  });
  // [/doc:readme_first_look]
  // The loss of each of the 8 microbatches (on the last stage's rank): their mean is the loss
  // of the 8 stages run one after another.
  REQUIRE(readme_losses.size() == 8);
  double mean = 0;
  for (double l : readme_losses) mean += l / 8;
  CHECK(relative_error(mean, train_sequentially(batch, target, 1).losses[0]) <= 1e-12);
}

// The stage sketched in the comment of baton/pipeline/stage.hpp: its declarations are what
// the concepts check.
namespace stage_sketch {
// [doc:stage_sketch]
struct my_stage {
  using input = baton::host_tensor<double>;   // payloads (tensors or records)
  using output = baton::host_tensor<double>;
  using side = baton::no_side;                // per-microbatch inputs given locally
  struct saved { baton::host_tensor<double> x, y; };
  output forward(const input& x, const side&, saved& st);
  baton::grad_t<input> backward(saved& st, const baton::grad_t<output>& dy);
  // split backward (zero-bubble schedules) adds:
  baton::grad_t<input> backward_input(saved& st, const baton::grad_t<output>& dy);
  void backward_weight(saved& st);
};
// [/doc:stage_sketch]
static_assert(baton::stage<my_stage>);
static_assert(baton::split_backward_stage<my_stage>);
}  // namespace stage_sketch
