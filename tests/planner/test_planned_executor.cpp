// A synthesized program run by the real pipeline executor on the local world (ranks as
// threads): it runs, gives the loss and weight gradients of 1F1B's program and of the stages
// run one after another, holds what the simulator says it holds, and the executor's timings
// fit a cost model that plans the same program after a round trip through its JSON form.
//
// Nothing here depends on how loaded the machine is. How fast the planned program runs against
// 1F1B in wall time, and how close its step comes to the simulation, are benchmark figures
// (bench/planner/bench_planner.cpp, executor_*): measured in interleaved pairs, not asserted.
#include "../pipeline/parity_support.hpp"

#include "catch.hpp"

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

namespace {

// Stage costs in arbitrary units: the embedding's stage half a block, the head's 1.5 blocks.
// 1F1B's memory as the cap leaves the planner room to beat 1F1B by reordering alone.
baton::cost_model uneven_costs(double unit) {
  baton::cost_model c;
  c.forward = c.backward_input = c.backward_weight = {0.5 * unit, unit, unit, 1.5 * unit};
  c.backward = {unit, 2 * unit, 2 * unit, 3 * unit};
  return c;
}

}  // namespace

TEST_CASE("planned program on the executor: the loss and gradients of 1F1B's program and of the sequential run",
          "[planner][executor]") {
  using T = double;
  const baton::schedule_shape shape{4, 1, 8};
  const auto costs = uneven_costs(1.0);
  const auto one_f_one_b = baton::one_f_one_b::generate(shape);
  const double cap = baton::simulate(one_f_one_b, costs).peak_activation();
  const auto plan = baton::synthesize(shape, costs, cap);
  // The plan is another order than 1F1B's (10 % faster in the simulation), so the comparison
  // below is between two different programs.
  REQUIRE(plan.makespan < 0.95 * baton::simulate(one_f_one_b, costs).makespan);
  REQUIRE(baton::is_valid(baton::lower(plan.prog)));

  using namespace pipeline_test;
  constexpr std::int64_t width = 4;
  const int m = shape.microbatches;
  const auto batch = random_tensor<T>({2 * m, width}, 1);
  const auto target = random_tensor<T>({2 * m, width}, 2, 0.5);
  auto oracle = oracle_stages<T, baton::no_side>(shape.num_stages(), width);
  const double oracle_loss = sequential_step(oracle, batch, baton::no_side{}, target, mse_loss<T>{});
  const auto planned = run_pipeline<T>(plan.prog, width, batch, baton::no_side{}, target);
  const auto baseline = run_pipeline<T>(one_f_one_b, width, batch, baton::no_side{}, target);
  const int last_rank = baton::stage_rank(shape, shape.num_stages() - 1);

  CHECK(parity_error(planned, oracle_loss, oracle, last_rank) <= tolerance<T>());
  REQUIRE(planned.loss_by_rank[static_cast<std::size_t>(last_rank)].has_value());
  REQUIRE(baseline.loss_by_rank[static_cast<std::size_t>(last_rank)].has_value());
  CHECK(rel_err(*planned.loss_by_rank[static_cast<std::size_t>(last_rank)],
                *baseline.loss_by_rank[static_cast<std::size_t>(last_rank)]) <= tolerance<T>());
  for (int s = 0; s < shape.num_stages(); ++s) {
    INFO("stage " << s);
    const auto& mine = planned.grads_by_stage[static_cast<std::size_t>(s)];
    const auto& theirs = baseline.grads_by_stage[static_cast<std::size_t>(s)];
    REQUIRE(mine.has_value());
    REQUIRE(theirs.has_value());
    CHECK(rel_err(mine->dw, theirs->dw) <= tolerance<T>());
    CHECK(rel_err(mine->db, theirs->db) <= tolerance<T>());
  }
  // The executor holds a stage's saved state from F to W (or B): the plan's peak per rank is
  // the simulator's, within the cap the planner was given.
  const auto sim = baton::simulate(plan.prog, costs);
  for (int r = 0; r < shape.ranks; ++r) {
    INFO("rank " << r);
    CHECK(planned.peak_saved_by_rank[static_cast<std::size_t>(r)] ==
          static_cast<std::size_t>(sim.ranks[static_cast<std::size_t>(r)].peak_live));
    CHECK(sim.ranks[static_cast<std::size_t>(r)].peak_activation <= cap + 1e-9);
  }
}

namespace {

using tensor = baton::host_tensor<double>;

// Passes its input through unchanged; each action sleeps for its stage's modelled time.
struct sleeping_stage {
  using input = tensor;
  using output = tensor;
  using side = baton::no_side;
  struct saved {};
  double forward_seconds = 0, input_seconds = 0, weight_seconds = 0;

  static void nap(double seconds) { std::this_thread::sleep_for(std::chrono::duration<double>(seconds)); }
  output forward(const input& x, const side&, saved&) {
    nap(forward_seconds);
    return x;
  }
  baton::grad_t<input> backward_input(saved&, const baton::grad_t<output>& dy) {
    nap(input_seconds);
    return dy;
  }
  void backward_weight(saved&) { nap(weight_seconds); }
  baton::grad_t<input> backward(saved&, const baton::grad_t<output>& dy) {
    nap(input_seconds + weight_seconds);
    return dy;
  }
};
static_assert(baton::split_backward_stage<sleeping_stage>);

struct zero_loss {
  baton::loss_result<tensor> operator()(const tensor& y, const tensor&) const { return {0.0, tensor(y.shape())}; }
};

}  // namespace

TEST_CASE("planned program on the executor: its timings fit a cost model no faster than the stages, which plans the "
          "same program after a JSON round trip",
          "[planner][executor]") {
  // Distinct F, I and W per stage (1 to 4.5 ms), so that a timing booked under the wrong stage
  // or kind falls short of what that action sleeps.
  const double unit = 0.001;
  baton::cost_model seconds;
  seconds.forward = {0.5 * unit, unit, unit, 1.5 * unit};
  seconds.backward_input = {unit, 2 * unit, 2 * unit, 3 * unit};
  seconds.backward_weight = {1.5 * unit, 3 * unit, 3 * unit, 4.5 * unit};
  seconds.backward = {2.5 * unit, 5 * unit, 5 * unit, 7.5 * unit};
  const baton::schedule_shape shape{4, 1, 8};
  const double cap = baton::simulate(baton::one_f_one_b::generate(shape), seconds).peak_activation();
  const auto plan = baton::synthesize(shape, seconds, cap);

  std::mutex lock;
  std::vector<baton::step_report> reports;
  baton::run_local(shape.ranks, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::uniform_stages<sleeping_stage>>(
        comm, plan.prog,
        [&](int stage) {
          return sleeping_stage{seconds.cost(baton::action_kind::forward, stage),
                                seconds.cost(baton::action_kind::backward_input, stage),
                                seconds.cost(baton::action_kind::backward_weight, stage)};
        },
        zero_loss{});
    const tensor batch = tensor::filled({shape.microbatches, 2}, 1.0);
    for (int step = 0; step < 2; ++step) {
      const auto report = exec.step(batch, batch);
      const std::lock_guard guard(lock);
      reports.push_back(report);
    }
  });

  // A sleep lasts at least what it asks, however busy the machine: each fitted cost is at
  // least the stage's own (how much more is the load's, and not checked).
  const auto fitted = baton::fit_cost_model(reports, shape.num_stages());
  for (int s = 0; s < shape.num_stages(); ++s) {
    INFO("stage " << s);
    for (const auto kind : {baton::action_kind::forward, baton::action_kind::backward_input,
                            baton::action_kind::backward_weight})
      CHECK(fitted.costs.cost(kind, s) >= seconds.cost(kind, s));
  }

  // The fitted model saved and read back plans the same program.
  const auto reread = baton::cost_file_from_json(baton::to_json(fitted));
  CHECK(baton::synthesize(shape, reread.costs, cap).prog == baton::synthesize(shape, fitted.costs, cap).prog);
}

TEST_CASE("fit_cost_model: medians over steps, B split in halves, and a missing stage named", "[planner][executor]") {
  baton::step_report slow, fast1, fast2;
  slow.action_times = {{0, baton::action_kind::forward, 4, 4.0}, {0, baton::action_kind::backward, 4, 8.0}};
  fast1.action_times = {{0, baton::action_kind::forward, 4, 0.4}, {0, baton::action_kind::backward, 4, 0.8}};
  fast2.action_times = {{0, baton::action_kind::forward, 4, 0.44}, {0, baton::action_kind::backward, 4, 0.88}};
  const std::vector<baton::step_report> reports{slow, fast1, fast2};
  const auto fitted = baton::fit_cost_model(reports, 1, {0.001, 1e9, 1e6});
  CHECK(fitted.costs.forward[0] == Approx(0.11));  // the median of 1.0, 0.1, 0.11: the slow step is ignored
  CHECK(fitted.costs.backward[0] == Approx(0.22));
  CHECK(fitted.costs.backward_input[0] == Approx(0.11));
  CHECK(fitted.costs.backward_weight[0] == Approx(0.11));
  CHECK(fitted.costs.communication == Approx(0.001 + 1e6 / 1e9));
  CHECK(fitted.bytes_per_message == 1e6);
  CHECK_THROWS_WITH(baton::fit_cost_model(reports, 2), Catch::Matchers::Contains("stage 1 has no forward timing"));
}
