// baton/schedule/synthesize.hpp — plan a pipeline schedule for a cost model and a memory cap,
// and say how far it can be from the best possible.
//
// synthesize(shape, costs, memory_cap) searches orders of F, I and W (split backward) for the
// smallest simulated makespan whose per-rank peak of live activations (simulation::
// rank_figures::peak_activation, weighted by cost_model::activation) stays at or under the cap:
//   1. list scheduling: the ranks are advanced in time order and each, when free, picks one of
//      its ready actions by a priority rule. The rules vary what the policies of the literature
//      fix: I before F or F before I, how long W may be deferred to fill bubbles (0: right after
//      its I; unbounded: only when nothing else is ready), whether a W may delay an I known to
//      arrive while it runs, which local stage goes first (V shapes), and how many microbatches
//      a rank admits ahead of its backwards (its warm-up depth), always within the memory cap;
//   2. local improvement: coordinate descent over each rank's warm-up depth from the best rule;
//   3. the programs of the built-in policies (the registry, for this very shape) that fit the
//      cap, so the result never loses to them;
//   4. for tiny shapes (3 x stages x microbatches <= 36 actions), branch-and-bound over the
//      per-rank orders, which proves the optimum among programs that run each stage's F, I and
//      W in microbatch order (proven_optimal says whether it finished within its node budget).
// Everything is deterministic (no clock, no randomness): the same input gives the same program.
//
// makespan_lower_bound(shape, costs, memory_cap) (makespan_bound.hpp) is what no schedule can
// beat; gap = makespan / lower_bound, so a gap of 1.03 means the plan is at most 3 % slower than
// the best possible one, whatever schedule that would be.
//
// This header gathers the candidates and keeps the best; the searches that make them are in
// detail/planner/ (list_schedule.hpp: step 1; exact_search.hpp: step 4), which time them with
// evaluate.hpp.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/detail/planner/evaluate.hpp>
#include <baton/schedule/detail/planner/exact_search.hpp>
#include <baton/schedule/detail/planner/list_schedule.hpp>
#include <baton/schedule/detail/planner/problem.hpp>
#include <baton/schedule/makespan_bound.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/registry.hpp>
#include <baton/schedule/simulate.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace baton {

struct synthesis_options {
  // Branch-and-bound runs when the shape has at most this many compute actions (3 per stage
  // and microbatch), and explores at most max_search_nodes partial programs.
  int exact_search_max_actions = 36;
  long long max_search_nodes = 3'000'000;
  // Take the built-in policies' programs as candidates too.
  bool include_builtins = true;
  // Rounds of coordinate descent over the ranks' warm-up depths.
  int improvement_rounds = 3;
};

struct synthesis_result {
  program prog;                      // compute-only; lower(), validate(), to_csv(), the executor apply
  double makespan = 0;               // simulate(prog, costs).makespan
  double lower_bound = 0;            // makespan_lower_bound(shape, costs, memory_cap)
  double gap = 1;                    // makespan / lower_bound (1 when both are 0)
  std::vector<double> peak_memory;   // per rank: peak_activation, each <= memory_cap
  std::string method;                // which candidate won, e.g. "list(I-first, W lag 2, depth p-r+1)" or "zb1p"
  bool proven_optimal = false;       // the branch-and-bound finished: no F/I/W program in stage-wise
                                     // microbatch order is faster
  double best_builtin_makespan = std::numeric_limits<double>::infinity();  // inf: none fits
  std::string best_builtin;          // its name, empty when none fits
};

// Plans a program for `shape` (placement::loop with any stages per rank, or placement::v) that
// minimises the simulated makespan under `costs` with every rank's peak_activation at or under
// `memory_cap` (the simulator's unit: cost_model::activation per live microbatch-stage). Throws
// schedule_error when the cap is below what any schedule needs, naming that least cap.
[[nodiscard]] inline synthesis_result synthesize(const schedule_shape& shape, const cost_model& costs, double memory_cap,
                                                 const synthesis_options& options = {}) {
  using namespace detail::schedule::planner;
  check_inputs(shape, costs, memory_cap);
  const problem pb(shape, costs, memory_cap);
  const double least = least_peak(pb);
  if (memory_cap < least - tolerance(least))
    throw schedule_error("baton::synthesize: memory_cap " + std::to_string(memory_cap) +
                         " is below what any schedule of this shape needs: a rank holds one microbatch on each of "
                         "its stages at once, " + std::to_string(least) +
                         " here; raise memory_cap to at least that, or split the model over more ranks");

  synthesis_result result;
  result.lower_bound = makespan_lower_bound(shape, costs, memory_cap);
  result.makespan = std::numeric_limits<double>::infinity();
  std::vector<std::vector<action>> best_rows;
  const auto consider = [&](const std::vector<std::vector<action>>& rows, const std::string& how) {
    if (rows.empty()) return false;
    const evaluation e = evaluate(pb, rows);
    if (!e.complete) return false;
    for (double peak : e.peak)
      if (peak > memory_cap + tolerance(memory_cap)) return false;
    if (e.makespan < result.makespan - tolerance(e.makespan)) {
      result.makespan = e.makespan;
      result.method = how;
      best_rows = rows;
      return true;
    }
    return false;
  };

  // 1. The rules. Depths: the 1F1B family (the rank's distance to the end, in stages, plus a
  // few) and constant depths.
  const int P = shape.ranks, M = shape.microbatches, V = shape.stages_per_rank;
  std::vector<std::pair<std::vector<int>, std::string>> depths;
  for (int extra : {-1, 0, 1, 2, 3, 4, P / 2, P, 2 * P, M}) {
    std::vector<int> d(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) d[static_cast<std::size_t>(r)] = std::clamp(V * (P - r) + extra, 1, M);
    depths.emplace_back(d, "depth " + std::to_string(V) + "(p-r)" + (extra >= 0 ? "+" : "") + std::to_string(extra));
  }
  for (int c : {1, 2, P, 2 * P}) depths.emplace_back(std::vector<int>(static_cast<std::size_t>(P), std::clamp(c, 1, M)),
                                                     "depth " + std::to_string(std::clamp(c, 1, M)));
  rule best_rule;
  // Once a candidate reaches the lower bound nothing can beat it: stop searching.
  const auto reached_bound = [&] { return result.makespan <= result.lower_bound + tolerance(result.lower_bound); };
  for (const auto& [depth, depth_name] : depths)
    for (bool input_first : {true, false})
      for (int lag : {0, 1, 2, P, 1 << 30})
        for (bool lookahead : {false, true})
          for (bool deep_first : {true, false})
            for (bool when_full : {false, true}) {
              if (lookahead && lag == 0) continue;
              if (!deep_first && V == 1) continue;
              if (when_full && (lag == 0 || !std::isfinite(memory_cap))) continue;
              if (reached_bound()) break;
              rule ru{input_first, lag, lookahead, deep_first, when_full, depth, "", {}, {}};
              ru.name = std::string("list(") + (input_first ? "I-first" : "F-first") + ", W lag " +
                        (lag >= (1 << 30) ? std::string("unbounded") : std::to_string(lag)) +
                        (lookahead ? " + lookahead" : "") + (when_full ? " + W when full" : "") +
                        (V > 1 ? (deep_first ? ", later stage first" : ", earlier stage first") : "") + ", " +
                        depth_name + ")";
              if (consider(list_schedule(pb, ru), ru.name)) best_rule = ru;
            }

  // 2. Coordinate descent from the best rule over each rank's own depth, W lag and I/F order.
  if (!best_rule.depth.empty()) {
    best_rule.lag_of.assign(static_cast<std::size_t>(P), best_rule.weight_lag);
    best_rule.input_first_of.assign(static_cast<std::size_t>(P), best_rule.input_first ? 1 : 0);
    const std::string base_name = best_rule.name;
    for (int round = 0; round < options.improvement_rounds && !reached_bound(); ++round) {
      bool improved = false;
      for (int r = 0; r < P && !reached_bound(); ++r) {
        const auto ru_ = static_cast<std::size_t>(r);
        std::vector<rule> neighbours;
        for (int delta : {-1, 1, -2, 2}) {
          rule ru = best_rule;
          int& d = ru.depth[ru_];
          if (d + delta < 1 || d + delta > M) continue;
          d += delta;
          neighbours.push_back(ru);
        }
        for (int lag : {0, 1, 2, P, 1 << 30}) {
          if (lag == best_rule.lag_of[ru_]) continue;
          rule ru = best_rule;
          ru.lag_of[ru_] = lag;
          neighbours.push_back(ru);
        }
        rule flipped = best_rule;
        flipped.input_first_of[ru_] = static_cast<char>(!flipped.input_first_of[ru_]);
        neighbours.push_back(flipped);
        for (rule& ru : neighbours) {
          ru.name = base_name + " + per-rank tuning";
          if (consider(list_schedule(pb, ru), ru.name)) {
            best_rule = ru;
            improved = true;
          }
        }
      }
      if (!improved) break;
    }
  }
  // Where a full backward is cheaper than its halves, fuse each I that is followed by its W.
  if (!best_rows.empty() && !reached_bound()) consider(fuse_backwards(pb, best_rows), result.method + " + fused backwards");

  // 3. The built-in policies for this very shape.
  if (options.include_builtins) {
    for (const auto& info : builtin_policies) {
      program prog;
      try {
        prog = info.generate(shape);
      } catch (const schedule_error&) {
        continue;  // the policy does not serve this shape
      }
      if (is_forward_only(prog)) continue;
      const simulation sim = simulate(prog, costs);
      if (sim.peak_activation() > memory_cap + tolerance(memory_cap)) continue;
      if (sim.makespan < result.best_builtin_makespan) {
        result.best_builtin_makespan = sim.makespan;
        result.best_builtin = std::string(info.name);
      }
      consider(prog.ranks, std::string(info.name));
    }
  }

  // The sequential program (one microbatch at a time) fits any cap the check above let through.
  if (best_rows.empty()) {
    std::vector<std::vector<action>> rows(static_cast<std::size_t>(P));
    for (int mb = 0; mb < M; ++mb) {
      for (int s = 0; s < pb.stages; ++s) rows[static_cast<std::size_t>(pb.rank_of[static_cast<std::size_t>(s)])].push_back({s, action_kind::forward, mb});
      for (int s = pb.stages - 1; s >= 0; --s) {
        auto& row = rows[static_cast<std::size_t>(pb.rank_of[static_cast<std::size_t>(s)])];
        row.push_back({s, action_kind::backward_input, mb});
        row.push_back({s, action_kind::backward_weight, mb});
      }
    }
    consider(rows, "sequential");
  }

  // 4. Branch-and-bound on tiny shapes, seeded with the best so far.
  bool all_take_time = true;
  for (int s = 0; s < pb.stages; ++s) {
    const auto su = static_cast<std::size_t>(s);
    if (!(pb.tf[su] > 0 && pb.ti[su] > 0 && pb.tw[su] > 0)) all_take_time = false;
  }
  if (all_take_time && 3LL * pb.stages * M <= options.exact_search_max_actions &&
      result.makespan > result.lower_bound + tolerance(result.lower_bound)) {
    exact_search search(pb, result.makespan, options.max_search_nodes);
    const bool finished = search.run();
    if (search.found()) consider(search.best_rows(), "branch-and-bound");
    result.proven_optimal = finished;
  }
  if (result.makespan <= result.lower_bound + tolerance(result.lower_bound)) result.proven_optimal = true;

  result.prog = program{shape, best_rows};
  const simulation sim = simulate(result.prog, costs);  // validates, and times it as everyone else will
  result.makespan = sim.makespan;
  for (const auto& f : sim.ranks) result.peak_memory.push_back(f.peak_activation);
  result.gap = result.lower_bound > 0 ? result.makespan / result.lower_bound : 1.0;
  return result;
}

}  // namespace baton
