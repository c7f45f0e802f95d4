// The examples of docs/pipeline.md, compiled and run. Keep the two in sync.
#include "catch.hpp"

#include <baton/comm.hpp>
#include <baton/payload.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>

#include <cmath>
#include <mutex>
#include <span>
#include <vector>

// [doc: stage]
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
// [doc: stage end]

TEST_CASE("docs/pipeline.md: training a 4-rank ZBV pipeline on the local world", "[pipeline][docs]") {
  std::vector<double> losses(4, -1), norms(4, -1);
  std::vector<int> improved(4, 0);  // Catch assertions are not thread-safe: check after the run
  std::mutex m;
  // [doc: run]
  baton::run_local(4, [&](baton::local_communicator& comm) {
    // 4 ranks x 2 stages in a V, 8 microbatches; the stage factory runs only for this rank's stages.
    auto pipe = baton::make_pipeline<baton::zbv, baton::uniform_stages<scaled_tanh>>(
        comm, baton::shape_for<baton::zbv>(comm.size(), 8),
        [](int stage) { return scaled_tanh(3, 0.5 + 0.1 * stage); }, half_squared_error{},
        baton::pipeline_options{.loss_on_every_rank = true});

    baton::host_tensor<double> batch({16, 3}), target({16, 3});
    for (std::int64_t i = 0; i < batch.size(); ++i) {
      batch[i] = 0.1 * static_cast<double>(i % 7);
      target[i] = 0.05 * static_cast<double>(i % 5);
    }
    const double before = *pipe.eval(batch, target).loss;  // forward only, before any step
    for (int step = 0; step < 3; ++step) {
      pipe.for_each_local_stage([](int, scaled_tanh& s) { s.dw = baton::host_tensor<double>({3}); });
      const baton::step_report report = pipe.step(batch, target);  // report.loss on every rank
      std::vector<std::span<double>> grads;
      pipe.for_each_local_stage([&](int, scaled_tanh& s) { grads.emplace_back(s.dw.data(), 3); });
      const double norm = baton::clip_grad_norm(grads, 1.0, 2.0, comm);  // over all stages
      pipe.for_each_local_stage([](int, scaled_tanh& s) {
        for (int i = 0; i < 3; ++i) s.w[i] -= 0.5 * s.dw[i];  // plain SGD
      });
      std::lock_guard lock(m);
      norms[static_cast<std::size_t>(comm.rank())] = norm;
      losses[static_cast<std::size_t>(comm.rank())] = *report.loss;
    }
    const bool lower = *pipe.eval(batch, target).loss < before;  // training lowered the loss
    std::lock_guard lock(m);
    improved[static_cast<std::size_t>(comm.rank())] = lower ? 1 : 0;
  });
  // [doc: run end]
  for (int r = 0; r < 4; ++r) CHECK(improved[static_cast<std::size_t>(r)] == 1);
  for (int r = 1; r < 4; ++r) {
    CHECK(losses[static_cast<std::size_t>(r)] == losses[0]);
    CHECK(norms[static_cast<std::size_t>(r)] == norms[0]);
  }
}
