// How good the planner's programs are, and what planning costs.
//
//   bench_planner [--pairs N]
//
// Quality (deterministic: the same on every machine):
//   synth_gap_p8_m32                 makespan / lower bound, uniform costs (T_F = T_I = T_W),
//                                    memory cap = 1F1B's peak; 1 means provably optimal
//   synth_vs_best_builtin_p8_m32     synthesized makespan / the best built-in's under the same cap
//   synth_gap_p8_m32_cap7, _cap5     the same with a cap of 7 and 5 microbatches (no built-in of
//                                    one stage per rank fits: their ratio has no denominator)
//   synth_gap_p16_m64                p = 16, m = 64, 1F1B's cap
//   synth_gap_v_p8_m32               V shape (2 stages per rank), cap = ZBV's peak
//   synth_vs_best_builtin_v_p8_m32   against zbv, dual_pipe_v and the other V built-ins
//   synth_vs_1f1b_uneven_p4_m16      stage costs 0.5, 1, 1, 1.5 (embedding, blocks, head),
//   synth_vs_zb1p_uneven_p4_m16      cap = 1F1B's peak
//   partition_vs_even_cut_p4_m16     partition + synthesize / zb1p on a cut by layer count, for
//                                    32 layers (embedding 0.2, 30 blocks, head 4.8 blocks)
//   partition_vs_1f1b_even_cut_p4_m16  the same against 1F1B
// Spending memory (issue 29; deterministic): synthesize_with_recompute on p = 8, m = 32, T_F =
// T_I = T_W = 1, with a menu shaped like nn's figures for a transformer block (docs/nn.md,
// "Recomputation": values per token kept after forward none 1030, selective 710, full 64, and
// 1282 between I and W under every policy); recompute times modelled, not measured: selective
// 0.15 (norms and element-wise parts), full 1.0 (the forward again). The cap is room for K
// microbatches' I-to-W state (K x 1282), no fixed part:
//   recompute_plan_vs_none_p8_m32_roomK   plan makespan / the best plan with none everywhere
//   recompute_plan_vs_full_p8_m32_roomK   ... / with full everywhere
//   recompute_plan_vs_selective_p8_m32_roomK  ... / with selective everywhere
//   recompute_plan_gap_p8_m32_roomK       plan makespan / lower bound over every choice (relaxed:
//                                         3^8 assignments)
//   recompute_plan_choice_p8_m32_roomK    the options chosen, stage 0 first (text)
//   recompute_plan_seconds_p8_m32_room4   median (min, max, n) of one synthesize_with_recompute,
//   recompute_plan_vs_simulate_p8_m32_room4  and per pair / one simulate() of zb1p's program
// Cost (timed, interleaved pairs against one simulate() of zb1p's program of the same shape,
// the unit of the search's work):
//   synth_seconds_p8_m32, synth_seconds_p16_m64     median (min, max, n) of synthesize() at 1F1B's
//                                                   cap (short: zb1p reaches the bound, the
//                                                   search stops there)
//   synth_seconds_p8_m32_cap7, ..._p16_m64_cap15    one microbatch less: the whole search runs
//   synth_vs_simulate_*                             per pair: synthesize / one simulation
// The planned program on the executor (the local world, ranks as threads; stages that sleep
// their modelled costs, T_F = T_I = T_W = 4, 8, 8, 12 ms for the 4 stages, p = 4, m = 8, cap =
// 1F1B's peak; each measurement one step after an untimed one, the slowest rank's wall time):
//   executor_step_seconds_plan_p4_m8, _1f1b_p4_m8   median (min, max, n) of the step
//   executor_plan_vs_1f1b_p4_m8                      per pair: the plan's step / 1F1B's
//   executor_plan_vs_1f1b_simulated_p4_m8            the same in the simulation (nominal costs)
//   executor_plan_vs_simulated_p4_m8                 per step: measured / simulated with the costs
//   executor_1f1b_vs_simulated_p4_m8                 fitted to the plan's runs (fit_cost_model),
//                                                    which leave out the executor's own time per
//                                                    action and message
//   executor_fitted_vs_nominal_p4_m8                 the largest fitted / modelled F, I or W: a
//                                                    sleep's overshoot (timer slack, wake-up)
#include "bench_common.hpp"

#include <baton/comm.hpp>
#include <baton/payload.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

double best_builtin(const baton::schedule_shape& shape, const baton::cost_model& costs, double cap) {
  double best = 1e300;
  for (const auto& info : baton::builtin_policies) {
    try {
      const auto prog = info.generate(shape);
      if (baton::is_forward_only(prog)) continue;
      const auto sim = baton::simulate(prog, costs);
      if (sim.peak_activation() <= cap + 1e-9) best = std::min(best, sim.makespan);
    } catch (const baton::schedule_error&) {
    }
  }
  return best;
}

void time_synthesis(const std::string& suffix, const baton::schedule_shape& shape, const baton::cost_model& costs,
                    double cap, int pairs) {
  const auto reference = baton::zb1p::generate(shape);
  bench::series synth_seconds, ratio;
  volatile double sink = 0;
  bench::interleave(
      pairs,
      [&] {
        const auto start = std::chrono::steady_clock::now();
        sink = sink + baton::simulate(reference, costs).makespan;
        return bench::seconds_since(start);
      },
      [&] {
        const auto start = std::chrono::steady_clock::now();
        sink = sink + baton::synthesize(shape, costs, cap).makespan;
        return bench::seconds_since(start);
      },
      [&](int, double simulate_seconds, double synthesize_seconds) {
        synth_seconds.add(synthesize_seconds);
        ratio.add(synthesize_seconds / simulate_seconds);
      });
  bench::print("synth_seconds_" + suffix, synth_seconds);
  bench::print("synth_vs_simulate_" + suffix, ratio, "%.0f");
}

void spend_memory(int pairs) {
  const baton::schedule_shape shape{8, 1, 32};
  const auto costs = baton::cost_model::uniform(1, 1, 1);
  const baton::recompute_menu menu{{{"none", 1030, 0.0, 1282.0}, {"selective", 710, 0.15, 1282.0}, {"full", 64, 1.0, 1282.0}}};
  for (int room : {2, 4, 8}) {
    const baton::memory_budget budget{room * 1282.0, {0.0}};
    const auto plan = baton::synthesize_with_recompute(shape, costs, menu, budget);
    const std::string suffix = "_p8_m32_room" + std::to_string(room);
    for (const auto& only : menu[0])
      bench::print_value("recompute_plan_vs_" + only.name + suffix,
                         plan.makespan / baton::synthesize_with_recompute(shape, costs, {{only}}, budget).makespan, "%.3f");
    bench::print_value("recompute_plan_gap" + suffix, plan.gap, "%.3f");
    std::string chosen;
    for (const auto& name : plan.option_names) chosen += (chosen.empty() ? "" : ",") + name;
    std::printf("recompute_plan_choice%s: %s (%s)\n", suffix.c_str(), chosen.c_str(), plan.method.c_str());
  }
  const auto reference = baton::zb1p::generate(shape);
  bench::series seconds, ratio;
  volatile double sink = 0;
  bench::interleave(
      pairs,
      [&] {
        const auto start = std::chrono::steady_clock::now();
        sink = sink + baton::simulate(reference, costs).makespan;
        return bench::seconds_since(start);
      },
      [&] {
        const auto start = std::chrono::steady_clock::now();
        sink = sink + baton::synthesize_with_recompute(shape, costs, menu, {4 * 1282.0, {0.0}}).makespan;
        return bench::seconds_since(start);
      },
      [&](int, double simulate_seconds, double plan_seconds) {
        seconds.add(plan_seconds);
        ratio.add(plan_seconds / simulate_seconds);
      });
  bench::print("recompute_plan_seconds_p8_m32_room4", seconds);
  bench::print("recompute_plan_vs_simulate_p8_m32_room4", ratio, "%.0f");
}

using tensor = baton::host_tensor<double>;

// Passes its input through unchanged; each action sleeps for its stage's modelled time (a
// sleep, not a spin: 4 ranks spinning on 2 cores would time the operating system's scheduler).
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

struct zero_loss {
  baton::loss_result<tensor> operator()(const tensor& y, const tensor&) const { return {0.0, tensor(y.shape())}; }
};

// One step of `prog` after an untimed one (which allocates the receive pools): the slowest
// rank's wall time; every rank's report of the timed step goes to `reports`.
double step_seconds(const baton::program& prog, const baton::cost_model& seconds, std::vector<baton::step_report>& reports) {
  std::mutex lock;
  double slowest = 0;
  baton::run_local(prog.shape.ranks, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::uniform_stages<sleeping_stage>>(
        comm, prog,
        [&](int stage) {
          return sleeping_stage{seconds.cost(baton::action_kind::forward, stage),
                                seconds.cost(baton::action_kind::backward_input, stage),
                                seconds.cost(baton::action_kind::backward_weight, stage)};
        },
        zero_loss{});
    const tensor batch = tensor::filled({prog.shape.microbatches, 2}, 1.0);
    (void)exec.step(batch, batch);
    const auto report = exec.step(batch, batch);
    const std::lock_guard guard(lock);
    slowest = std::max(slowest, report.wall_seconds);
    reports.push_back(report);
  });
  return slowest;
}

void time_executor(int pairs) {
  // 8 ms: what the simulator leaves out (the executor's own time per action and per message)
  // shrinks against the step as the actions get longer.
  const double unit = 0.008;
  baton::cost_model seconds;
  seconds.forward = seconds.backward_input = seconds.backward_weight = {0.5 * unit, unit, unit, 1.5 * unit};
  seconds.backward = {unit, 2 * unit, 2 * unit, 3 * unit};
  const baton::schedule_shape shape{4, 1, 8};
  const auto one_f_one_b = baton::one_f_one_b::generate(shape);
  const double cap = baton::simulate(one_f_one_b, seconds).peak_activation();
  const auto plan = baton::synthesize(shape, seconds, cap);

  std::vector<baton::step_report> plan_reports, baseline_reports;
  bench::series plan_step, baseline_step, ratio;
  bench::interleave(
      pairs, [&] { return step_seconds(one_f_one_b, seconds, baseline_reports); },
      [&] { return step_seconds(plan.prog, seconds, plan_reports); },
      [&](int, double baseline, double planned) {
        baseline_step.add(baseline);
        plan_step.add(planned);
        ratio.add(planned / baseline);
      });
  const auto fitted = baton::fit_cost_model(plan_reports, shape.num_stages());
  const double predicted_plan = baton::simulate(plan.prog, fitted.costs).makespan;
  const double predicted_baseline = baton::simulate(one_f_one_b, fitted.costs).makespan;
  bench::series plan_vs_simulated, baseline_vs_simulated;
  for (double t : plan_step.values) plan_vs_simulated.add(t / predicted_plan);
  for (double t : baseline_step.values) baseline_vs_simulated.add(t / predicted_baseline);
  double overshoot = 0;
  for (int s = 0; s < shape.num_stages(); ++s)
    for (const auto kind : {baton::action_kind::forward, baton::action_kind::backward_input,
                            baton::action_kind::backward_weight})
      overshoot = std::max(overshoot, fitted.costs.cost(kind, s) / seconds.cost(kind, s));

  bench::print("executor_step_seconds_plan_p4_m8", plan_step);
  bench::print("executor_step_seconds_1f1b_p4_m8", baseline_step);
  bench::print("executor_plan_vs_1f1b_p4_m8", ratio, "%.3f");
  bench::print_value("executor_plan_vs_1f1b_simulated_p4_m8",
                     plan.makespan / baton::simulate(one_f_one_b, seconds).makespan, "%.3f");
  bench::print("executor_plan_vs_simulated_p4_m8", plan_vs_simulated, "%.3f");
  bench::print("executor_1f1b_vs_simulated_p4_m8", baseline_vs_simulated, "%.3f");
  bench::print_value("executor_fitted_vs_nominal_p4_m8", overshoot, "%.3f");
}

}  // namespace

int main(int argc, char** argv) {
  const int pairs = bench::pairs_from_args(argc, argv, 5);
  bench::print_build();
  bench::print_load("before");
  const auto uniform = baton::cost_model::uniform(1, 1, 1);

  {
    const baton::schedule_shape shape{8, 1, 32};
    const double cap = baton::simulate(baton::one_f_one_b::generate(shape), uniform).peak_activation();
    const auto plan = baton::synthesize(shape, uniform, cap);
    bench::print_value("synth_gap_p8_m32", plan.gap);
    bench::print_value("synth_vs_best_builtin_p8_m32", plan.makespan / best_builtin(shape, uniform, cap));
    bench::print_value("synth_gap_p8_m32_cap7", baton::synthesize(shape, uniform, 7).gap);
    bench::print_value("synth_gap_p8_m32_cap5", baton::synthesize(shape, uniform, 5).gap);
    time_synthesis("p8_m32", shape, uniform, cap, pairs);
    time_synthesis("p8_m32_cap7", shape, uniform, 7, pairs);
  }
  {
    const baton::schedule_shape shape{16, 1, 64};
    const double cap = baton::simulate(baton::one_f_one_b::generate(shape), uniform).peak_activation();
    bench::print_value("synth_gap_p16_m64", baton::synthesize(shape, uniform, cap).gap);
    time_synthesis("p16_m64", shape, uniform, cap, pairs);
    time_synthesis("p16_m64_cap15", shape, uniform, 15, pairs);
  }
  {
    const baton::schedule_shape shape{8, 2, 32, baton::placement::v};
    const auto costs = uniform.per_rank_share(2);
    const double cap = baton::simulate(baton::zbv::generate(shape), costs).peak_activation();
    const auto plan = baton::synthesize(shape, costs, cap);
    bench::print_value("synth_gap_v_p8_m32", plan.gap);
    bench::print_value("synth_vs_best_builtin_v_p8_m32", plan.makespan / best_builtin(shape, costs, cap));
  }
  {
    baton::cost_model costs;
    costs.forward = costs.backward_input = costs.backward_weight = {0.5, 1.0, 1.0, 1.5};
    costs.backward = {1.0, 2.0, 2.0, 3.0};
    const baton::schedule_shape shape{4, 1, 16};
    const auto one_f_one_b = baton::simulate(baton::one_f_one_b::generate(shape), costs);
    const double zb1p = baton::simulate(baton::zb1p::generate(shape), costs).makespan;
    const auto plan = baton::synthesize(shape, costs, one_f_one_b.peak_activation());
    bench::print_value("synth_vs_1f1b_uneven_p4_m16", plan.makespan / one_f_one_b.makespan);
    bench::print_value("synth_vs_zb1p_uneven_p4_m16", plan.makespan / zb1p);
    bench::print_value("synth_gap_uneven_p4_m16", plan.gap);
  }
  {
    std::vector<baton::layer_cost> layers{{0.2, 0.2, 0.2}};
    std::vector<double> memory{0.2};
    for (int i = 0; i < 30; ++i) {
      layers.push_back({1, 1, 1});
      memory.push_back(1);
    }
    layers.push_back({4.8, 4.8, 4.8});
    memory.push_back(2);
    const baton::schedule_shape shape{4, 1, 16};
    const auto even = baton::stage_costs(layers, memory, {0, 8, 16, 24, 32});
    const auto one_f_one_b = baton::simulate(baton::one_f_one_b::generate(shape), even);
    const double zb1p = baton::simulate(baton::zb1p::generate(shape), even).makespan;
    const double cap = one_f_one_b.peak_activation();
    const auto cut = baton::partition(layers, memory, 4, 1, cap, 16);
    const auto plan = baton::synthesize(shape, cut.costs, cap);
    bench::print_value("partition_vs_even_cut_p4_m16", plan.makespan / zb1p);
    bench::print_value("partition_vs_1f1b_even_cut_p4_m16", plan.makespan / one_f_one_b.makespan);
    bench::print_value("partition_gap_p4_m16", plan.gap);
  }
  spend_memory(pairs);
  time_executor(pairs);
  bench::print_load("after");
  return 0;
}
