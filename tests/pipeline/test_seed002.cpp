// Seed 002: torch aliased a persistent receive buffer as the stage's input activation, so
// hooks registered on it piled up across steps (fired 2, 4, 6, ...). Here buffers are pooled
// but every microbatch gets fresh hooks that die with it: a gradient hook registered on the
// stage input in forward fires exactly m times in each of 5 steps, while the pool is reused.
#include "catch.hpp"
#include "parity_support.hpp"

#include <atomic>

using namespace pipeline_test;

namespace {

using base = mlp_stage<double>;

// Registers a gradient hook on its input in every forward (a stage-level hook).
struct hooked_stage : base {
  std::atomic<int>* fired = nullptr;
  hooked_stage(int s, std::atomic<int>* counter) : base(4, 100 + static_cast<std::uint64_t>(s)), fired(counter) {}
  output forward(const input& x, const side& c, saved& st, baton::microbatch_hooks<input, output>& hooks) {
    hooks.on_input_grad([counter = fired](const tensor<double>&) { ++*counter; });
    return base::forward(x, c, st);
  }
};
static_assert(baton::split_backward_stage<hooked_stage>);

template <class Policy>
void check_hook_counts(int ranks, int m) {
  const auto shape = baton::shape_for<Policy>(ranks, m);
  const int stages = shape.num_stages();
  constexpr int steps = 5;
  // counts[step][stage], for the stage-level hook and for an executor-level forward hook.
  std::vector<std::vector<std::atomic<int>>> stage_counts(steps);
  std::vector<std::vector<std::atomic<int>>> exec_counts(steps);
  for (auto& v : stage_counts) v = std::vector<std::atomic<int>>(static_cast<std::size_t>(stages));
  for (auto& v : exec_counts) v = std::vector<std::atomic<int>>(static_cast<std::size_t>(stages));
  std::vector<std::atomic<int>> eval_counts(static_cast<std::size_t>(stages));
  std::vector<baton::buffer_pool_stats> after_first(static_cast<std::size_t>(ranks)), after_last(static_cast<std::size_t>(ranks));
  std::atomic<int> current_step{0};

  baton::run_local(ranks, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<Policy, baton::uniform_stages<hooked_stage>>(
        comm, shape, [&](int s) { return hooked_stage(s, &eval_counts[static_cast<std::size_t>(s)]); },
        mse_loss<double>{});
    int step = 0;
    exec.add_forward_hook([&](int s, int, const tensor<double>&, const tensor<double>&,
                              baton::microbatch_hooks<tensor<double>, tensor<double>>& hooks) {
      hooks.on_input_grad([&, s](const tensor<double>&) {
        ++exec_counts[static_cast<std::size_t>(step)][static_cast<std::size_t>(s)];
      });
    });
    const auto x = random_tensor<double>({2 * m, 4}, 5);
    // eval first: its hooks are registered but there is no backward, so they never fire and die.
    exec.eval(x, x);
    for (step = 0; step < steps; ++step) {
      exec.for_each_local_stage([&](int s, hooked_stage& st) {
        st.fired = &stage_counts[static_cast<std::size_t>(step)][static_cast<std::size_t>(s)];
        st.zero_grad();
      });
      exec.step(x, x);
      if (step == 0) after_first[static_cast<std::size_t>(comm.rank())] = exec.pool_stats();
    }
    after_last[static_cast<std::size_t>(comm.rank())] = exec.pool_stats();
  });

  for (int k = 0; k < steps; ++k) {
    for (int s = 0; s < stages; ++s) {
      INFO("step " << k << ", stage " << s);
      CHECK(stage_counts[static_cast<std::size_t>(k)][static_cast<std::size_t>(s)] == m);
      CHECK(exec_counts[static_cast<std::size_t>(k)][static_cast<std::size_t>(s)] == m);
    }
  }
  for (int s = 0; s < stages; ++s) CHECK(eval_counts[static_cast<std::size_t>(s)] == 0);
  // Pooled receive buffers are really in use: after the first step no new buffer is made,
  // and later steps are served from the pool.
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    CHECK(after_first[static_cast<std::size_t>(r)].allocations > 0);
    CHECK(after_last[static_cast<std::size_t>(r)].allocations == after_first[static_cast<std::size_t>(r)].allocations);
    CHECK(after_last[static_cast<std::size_t>(r)].reuses >= static_cast<std::size_t>((steps - 1) * m));
  }
}

}  // namespace

TEST_CASE("seed 002: gradient hooks on a stage input fire m times in each of 5 steps", "[pipeline][seed002]") {
  SECTION("1F1B, 2 ranks") { check_hook_counts<baton::one_f_one_b>(2, 4); }
  SECTION("interleaved 1F1B, 2 ranks x 2 stages (received and handed-over inputs)") {
    check_hook_counts<baton::interleaved_1f1b>(2, 4);
  }
  SECTION("ZBV, 2 ranks (split backward: hooks fire at I)") { check_hook_counts<baton::zbv>(2, 4); }
}
