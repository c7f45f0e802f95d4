// baton/schedule/recompute_plan.hpp — plan a schedule that spends a memory cap in bytes:
// choose, per stage, a recomputation option and the schedule with the smallest simulated
// makespan under the cap, with a lower bound valid over every choice and the gap to it.
//
// The schedule layer does not know the model: a stage's options come as a menu of
// recompute_option (a name, the bytes one live microbatch of the stage keeps, the time its
// backward-input pays to recompute the rest), filled in by whoever knows the model (the train
// layer from nn::recompute_policy, or measurements). A rank's memory is a fixed part
// (parameters, gradients, optimiser state, workspaces, receive pools: memory_budget::
// fixed_bytes) plus the saved bytes of its live microbatch-stages, which the simulator counts
// from each F to its W (or B).
//
// synthesize_with_recompute(shape, costs, menu, budget) assigns one option to every stage and
// plans that assignment with synthesize() (synthesize.hpp):
//   - exhaustive, when the menu has at most max_exhaustive_assignments assignments: every one
//     that fits is bounded with makespan_lower_bound, and they are planned best bound first
//     until the next bound is no less than the best makespan found (no later one can beat it),
//     so the result equals planning every assignment and keeping the fastest;
//   - otherwise greedy + descent: each stage's options reduced to those no other beats in both
//     time and bytes, ordered fastest first; the plans of the same level on every stage, and of
//     the path that starts from the fastest option everywhere and upgrades, one stage at a time,
//     the stage that saves the most of its rank's budget per unit of extra time; then
//     coordinate descent (one stage a level up or down) from the best of those.
// `method` says which ran. The lower bound is the least makespan_lower_bound over every
// assignment that fits when there are at most max_bound_assignments of them; else a relaxed
// bound, the bound of one cost model with each stage's least recompute time and least bytes.
// The relaxed bound is valid because makespan_lower_bound never decreases when a stage's T_I
// or activation grows (every term is a sum or maximum of such times, or grows with the
// activation: the memory-over-time term multiplies it, and the forwards held before the first
// gradient, floor(cap / activation), shrink as it grows), and recomputation changes only T_I,
// T_B (unused by the bound) and the activation; T_F and T_W are the same for every option.
//
// A microbatch-stage may hold more between its I and its W than before its I (W reads the GEMMs'
// inputs and output gradients, which I produced): recompute_option::weight_bytes. synthesize()
// counts one figure per stage from F to W, so each assignment is planned with the saved bytes,
// its plan's peak is then counted with both (live_bytes_peak), and where that passes the cap the
// assignment is planned again with each stage at the larger figure (which fits), and with the
// saved figure under lower caps (bisection_steps of a bisection), keeping the fastest that
// fits, and at last as the sequential program (one microbatch at a time: it fits whenever
// anything does). The bound counts the smaller of the two figures from F to W, which no
// schedule holds less.
//
// Per-rank fixed parts give ranks different room for activations; synthesize takes one cap.
// Each rank's activations are scaled by (least room) / (its room), which makes every rank's
// condition "peak <= its room" the one condition "scaled peak <= least room", exactly: the
// planner and its bound compare a rank's own activations only with the cap.
#pragma once

#include <baton/schedule/detail/planner/recompute.hpp>
#include <baton/schedule/makespan_bound.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/recompute_menu.hpp>
#include <baton/schedule/simulate.hpp>
#include <baton/schedule/synthesize.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace baton {

struct recompute_search_options {
  long long max_exhaustive_assignments = 256;  // plan every assignment up to this many (options^stages)
  long long max_bound_assignments = 4096;      // the bound's least over every assignment up to this many
  int descent_rounds = 3;                      // rounds of coordinate descent (greedy search)
  int bisection_steps = 4;                     // lower caps tried where a plan passes the room (I-to-W bytes)
  synthesis_options synthesis{};               // for each synthesize() call
};

struct recompute_plan {
  program prog;                           // as synthesize's: lower(), validate(), the executor take it
  std::vector<int> choice;                // per stage: the index of its option in its menu list
  std::vector<std::string> option_names;  // per stage: that option's name
  cost_model costs;                       // the chosen options' costs: T_I and T_B with the recompute
                                          // time, activation = saved bytes; simulate(prog, costs) times it
  std::vector<double> saved_bytes;        // per stage: the chosen option's bytes from F to I ...
  std::vector<double> weight_bytes;       // ... and from I to W (live_bytes_peak takes both)
  double makespan = 0;                    // simulate(prog, costs).makespan
  double lower_bound = 0;                 // no assignment of options with any schedule is faster
  double gap = 1;                         // makespan / lower_bound (1 when both are 0)
  std::vector<double> peak_bytes;         // per rank: fixed + live_bytes_peak, each <= cap_bytes
  std::string method;                     // how the options were chosen: "exhaustive: ..." or "greedy + descent: ..."
  std::string bound_method;               // "least over N assignments that fit" or "relaxed: ..."
  std::string schedule_method;            // synthesize's method for the chosen assignment, or "sequential"
  long long assignments = 0;              // options^stages (saturates at 2^62)
  long long planned = 0;                  // synthesize() calls made
};

// See the file comment. `costs` gives T_F, T_I, T_B, T_W without recomputation and the
// communication time; its activation is not read (the options' bytes replace it). Throws
// schedule_error on bad input, and when no assignment fits the cap, naming the least cap that
// would.
[[nodiscard]] inline recompute_plan synthesize_with_recompute(const schedule_shape& shape, const cost_model& costs,
                                                              const recompute_menu& menu, const memory_budget& budget,
                                                              const recompute_search_options& options = {}) {
  using namespace detail::schedule::planner;
  using memory = recompute_problem::memory;
  check_recompute_inputs(shape, costs, menu, budget);
  const recompute_problem rp(shape, costs, menu, budget);
  const int S = rp.base.stages;
  const auto levels = pareto_levels(rp.menu);
  const auto su = [](int s) { return static_cast<std::size_t>(s); };

  long long total = 1;
  for (const auto& m : rp.menu)
    total = total > (1LL << 62) / static_cast<long long>(m.size()) ? (1LL << 62) : total * static_cast<long long>(m.size());
  const bool enumerate = total <= std::max(options.max_bound_assignments, options.max_exhaustive_assignments);
  // Every assignment, in mixed radix over the menu lists.
  const auto all_assignments = [&] {
    std::vector<std::vector<int>> out;
    std::vector<int> choice(su(S), 0);
    while (true) {
      out.push_back(choice);
      int s = 0;
      for (; s < S; ++s) {
        if (++choice[su(s)] < static_cast<int>(rp.menu[su(s)].size())) break;
        choice[su(s)] = 0;
      }
      if (s == S) return out;
    }
  };

  // The assignment that needs the least: over every assignment when they are few, else each
  // stage's option with the fewest saved bytes (then weight bytes).
  std::vector<int> leanest(su(S));
  for (int s = 0; s < S; ++s) leanest[su(s)] = levels[su(s)].back();
  if (enumerate)
    for (const auto& choice : all_assignments())
      if (rp.most_need(choice) < rp.most_need(leanest)) leanest = choice;
  int worst_rank = 0;
  const double least_cap = rp.most_need(leanest, &worst_rank);
  if (!rp.fits(leanest))
    throw schedule_error(
        "baton::synthesize_with_recompute: cap_bytes " + bytes_text(budget.cap_bytes) +
        " is below what any plan needs, even keeping the fewest bytes on every stage ('" + rp.option(leanest, 0).name +
        "' on stage 0): rank " + std::to_string(worst_rank) + " holds its fixed part, " +
        bytes_text(rp.fixed[su(worst_rank)]) + ", and one microbatch on each of its stages, one of them between its I and "
        "its W; raise cap_bytes to at least " + bytes_text(least_cap) +
        ", or shrink the fixed part (shard the optimiser state) or the microbatch, or use more ranks");
  for (int r = 0; r < shape.ranks; ++r)
    if (rp.fixed[su(r)] >= budget.cap_bytes)
      throw schedule_error("baton::synthesize_with_recompute: rank " + std::to_string(r) + "'s fixed part, " +
                           bytes_text(rp.fixed[su(r)]) + ", leaves no room for live state under cap_bytes " +
                           bytes_text(budget.cap_bytes) + "; raise cap_bytes above it, or shrink the fixed part");

  const auto bound_of = [&](const std::vector<int>& choice) {
    return makespan_lower_bound(shape, rp.costs_of(choice, memory::bound_scaled), rp.scaled_cap);
  };
  recompute_plan result;
  result.assignments = total;
  double best = std::numeric_limits<double>::infinity();
  program best_prog;
  std::string best_method;
  std::set<std::vector<int>> tried;
  // Plans one assignment (see the file comment) unless it does not fit, was tried, or its bound
  // cannot beat the best; true when it became the best.
  const auto try_assignment = [&](const std::vector<int>& choice, double bound) {
    if (!rp.fits(choice) || !tried.insert(choice).second) return false;
    if (std::isnan(bound)) bound = bound_of(choice);
    if (bound >= best) return false;
    const cost_model scaled = rp.costs_of(choice, memory::saved_scaled);
    const auto saved = rp.saved_bytes(choice), weight = rp.weight_bytes(choice);
    std::optional<synthesis_result> plan;
    // Plans under `cap` (the planner's unit); keeps the plan if its peak of both figures fits.
    const auto consider = [&](const cost_model& c, double cap) {
      ++result.planned;
      synthesis_result p = synthesize(shape, c, cap, options.synthesis);
      if (rp.excess(live_bytes_peak(p.prog, saved, weight)) > tolerance(rp.scaled_cap)) return false;
      if (!plan || p.makespan < plan->makespan - tolerance(plan->makespan)) plan = std::move(p);
      return true;
    };
    if (!consider(scaled, rp.scaled_cap)) {
      // Each stage counted at the larger figure from F to W: fits whenever it can be planned.
      const cost_model cautious = rp.costs_of(choice, memory::larger_scaled);
      if (least_memory_cap(shape, cautious) <= rp.scaled_cap + tolerance(rp.scaled_cap)) consider(cautious, rp.scaled_cap);
      // The saved figure under caps between the least and the room, by bisection.
      double low = least_memory_cap(shape, scaled), high = rp.scaled_cap;
      for (int step = 0; step < options.bisection_steps; ++step) {
        const double mid = 0.5 * (low + high);
        (consider(scaled, mid) ? low : high) = mid;
      }
    }
    if (!plan) {
      synthesis_result p;
      p.prog = program{shape, sequential_rows(rp.base)};
      p.makespan = simulate(p.prog, scaled).makespan;
      p.method = "sequential";
      plan = std::move(p);  // fits: rp.fits(choice) is what it needs
    }
    if (!std::isfinite(best) || plan->makespan < best - tolerance(best)) {
      best = plan->makespan;
      best_prog = std::move(plan->prog);
      best_method = plan->method;
      result.choice = choice;
      return true;
    }
    return false;
  };
  constexpr double unknown = std::numeric_limits<double>::quiet_NaN();

  // The bound over every choice.
  if (enumerate) {
    result.lower_bound = std::numeric_limits<double>::infinity();
    long long fitting = 0;
    for (const auto& choice : all_assignments())
      if (rp.fits(choice)) {
        ++fitting;
        result.lower_bound = std::min(result.lower_bound, bound_of(choice));
      }
    result.bound_method = "least over the " + std::to_string(fitting) + " assignments that fit";
  } else {
    cost_model relaxed = rp.costs_of(leanest, memory::bound_scaled);
    for (int s = 0; s < S; ++s) {
      double extra = std::numeric_limits<double>::infinity(), bytes = extra;
      for (const recompute_option& o : rp.menu[su(s)]) {
        extra = std::min(extra, o.extra_backward_input);
        bytes = std::min({bytes, o.saved_bytes, weight_of(o)});
      }
      relaxed.backward_input[su(s)] = rp.base.ti[su(s)] + extra;
      relaxed.backward[su(s)] = rp.base.tb[su(s)] + extra;
      relaxed.activation[su(s)] = bytes * rp.scale_of_stage(s);
    }
    result.lower_bound = makespan_lower_bound(shape, relaxed, rp.scaled_cap);
    result.bound_method = "relaxed: each stage's least recompute time with its least bytes";
  }

  if (total <= options.max_exhaustive_assignments) {
    std::vector<std::pair<double, std::vector<int>>> ranked;
    for (auto& choice : all_assignments())
      if (rp.fits(choice)) ranked.emplace_back(bound_of(choice), std::move(choice));
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    std::size_t considered = 0;
    for (const auto& [bound, choice] : ranked) {
      if (bound >= best) break;  // sorted: no later assignment can beat the best either
      try_assignment(choice, bound);
      ++considered;
    }
    const std::size_t skipped = ranked.size() - considered;
    result.method = "exhaustive: " + std::to_string(ranked.size()) + " of " + std::to_string(total) +
                    " assignments fit; planned best bound first, " + std::to_string(skipped) +
                    " cut off by their lower bound";
  } else {
    const auto reached = [&] { return best <= result.lower_bound + tolerance(result.lower_bound); };
    const auto at_levels = [&](const std::vector<int>& level) {
      std::vector<int> choice(su(S));
      for (int s = 0; s < S; ++s) choice[su(s)] = levels[su(s)][su(level[su(s)])];
      return choice;
    };
    std::size_t most_levels = 0;
    for (const auto& l : levels) most_levels = std::max(most_levels, l.size());
    // The same level on every stage (the last where a stage has fewer), the leanest assignment.
    for (std::size_t j = 0; j < most_levels && !reached(); ++j) {
      std::vector<int> level(su(S));
      for (int s = 0; s < S; ++s) level[su(s)] = static_cast<int>(std::min(j, levels[su(s)].size() - 1));
      try_assignment(at_levels(level), unknown);
    }
    try_assignment(leanest, unknown);
    // The greedy path: upgrade the stage that frees the most of its rank's room per unit of time.
    std::vector<int> level(su(S), 0);
    while (!reached()) {
      int pick = -1;
      double pick_value = -std::numeric_limits<double>::infinity();
      for (int s = 0; s < S; ++s) {
        if (level[su(s)] + 1 >= static_cast<int>(levels[su(s)].size())) continue;
        const auto& now = rp.menu[su(s)][su(levels[su(s)][su(level[su(s)])])];
        const auto& next = rp.menu[su(s)][su(levels[su(s)][su(level[su(s)] + 1)])];
        const double freed = (now.saved_bytes - next.saved_bytes) * rp.scale_of_stage(s);
        const double cost = next.extra_backward_input - now.extra_backward_input;
        const double value = cost > 0 ? freed / cost : std::numeric_limits<double>::infinity();
        if (value > pick_value) {
          pick_value = value;
          pick = s;
        }
      }
      if (pick < 0) break;
      ++level[su(pick)];
      try_assignment(at_levels(level), unknown);
    }
    // Coordinate descent from the best: one stage a level up or down.
    std::vector<int> best_level(su(S), -1);
    for (int s = 0; s < S; ++s)
      for (std::size_t l = 0; l < levels[su(s)].size(); ++l)
        if (levels[su(s)][l] == result.choice[su(s)]) best_level[su(s)] = static_cast<int>(l);
    const bool on_levels = std::find(best_level.begin(), best_level.end(), -1) == best_level.end();
    for (int round = 0; on_levels && round < options.descent_rounds && !reached(); ++round) {
      bool improved = false;
      for (int s = 0; s < S && !reached(); ++s)
        for (int step : {1, -1}) {
          std::vector<int> near = best_level;
          int& l = near[su(s)];
          l += step;
          if (l < 0 || l >= static_cast<int>(levels[su(s)].size())) continue;
          if (try_assignment(at_levels(near), unknown)) {
            best_level = near;
            improved = true;
          }
        }
      if (!improved) break;
    }
    result.method = "greedy + descent: " + std::to_string(tried.size()) + " of " + std::to_string(total) +
                    " assignments tried";
  }

  result.prog = std::move(best_prog);
  result.schedule_method = best_method;
  result.costs = rp.costs_of(result.choice, memory::saved);
  result.saved_bytes = rp.saved_bytes(result.choice);
  result.weight_bytes = rp.weight_bytes(result.choice);
  for (int s = 0; s < S; ++s) result.option_names.push_back(rp.option(result.choice, s).name);
  result.makespan = simulate(result.prog, result.costs).makespan;
  const auto peak = live_bytes_peak(result.prog, result.saved_bytes, result.weight_bytes);
  for (int r = 0; r < shape.ranks; ++r) result.peak_bytes.push_back(rp.fixed[su(r)] + peak[su(r)]);
  result.gap = result.lower_bound > 0 ? result.makespan / result.lower_bound : 1.0;
  return result;
}

// The menu of the stages of a cut (partition's first_layer: stage k holds layers
// [first_layer[k], first_layer[k + 1])) from one menu per layer: option j of a stage sums option
// j of its layers (bytes and recompute time), named as the first layer's option j. Every layer
// lists the same options in the same order (a policy per stage applies to all its layers).
[[nodiscard]] inline recompute_menu stage_menu(const recompute_menu& layer_menus, const std::vector<int>& first_layer) {
  const std::string who = "baton::stage_menu: ";
  if (first_layer.size() < 2 || first_layer.front() != 0 ||
      first_layer.back() != static_cast<int>(layer_menus.size()) ||
      std::adjacent_find(first_layer.begin(), first_layer.end(), std::greater_equal<int>()) != first_layer.end())
    throw schedule_error(who + "first_layer must rise from 0 to the number of layers (" +
                         std::to_string(layer_menus.size()) + ") with every stage non-empty, as partition() gives it");
  recompute_menu stages;
  for (std::size_t k = 0; k + 1 < first_layer.size(); ++k) {
    std::vector<recompute_option> options = layer_menus[static_cast<std::size_t>(first_layer[k])];
    for (auto& o : options) o.weight_bytes = o.weight_bytes.value_or(o.saved_bytes);
    for (int l = first_layer[k] + 1; l < first_layer[k + 1]; ++l) {
      const auto& layer = layer_menus[static_cast<std::size_t>(l)];
      if (layer.size() != options.size())
        throw schedule_error(who + "layer " + std::to_string(l) + " has " + std::to_string(layer.size()) +
                             " options but layer " + std::to_string(first_layer[k]) + " has " +
                             std::to_string(options.size()) + "; give every layer the same options in the same order");
      for (std::size_t j = 0; j < options.size(); ++j) {
        options[j].saved_bytes += layer[j].saved_bytes;
        options[j].extra_backward_input += layer[j].extra_backward_input;
        *options[j].weight_bytes += layer[j].weight_bytes.value_or(layer[j].saved_bytes);
      }
    }
    stages.push_back(std::move(options));
  }
  return stages;
}

}  // namespace baton
