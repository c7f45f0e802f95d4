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
// Per-rank fixed parts give ranks different room for activations; synthesize takes one cap.
// Each rank's activations are scaled by (least room) / (its room), which makes every rank's
// condition "peak <= its room" the one condition "scaled peak <= least room", exactly: the
// planner and its bound compare a rank's own activations only with the cap.
#pragma once

#include <baton/schedule/makespan_bound.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/simulate.hpp>
#include <baton/schedule/synthesize.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <vector>

namespace baton {

// One way to run a stage's backward. saved_bytes is the most one live microbatch of the stage
// holds at any time between its F and its W (or B): after an I that recomputed, count what W
// still needs if that is more than what the F kept. extra_backward_input is the time the I
// (and a fused B) pays to recompute; F and W cost the same under every option.
struct recompute_option {
  std::string name;  // e.g. "none", "selective", "full"
  double saved_bytes = 0;
  double extra_backward_input = 0;
};

// One list of options for every stage, or one list per stage.
using recompute_menu = std::vector<std::vector<recompute_option>>;

// What a rank may hold: cap_bytes = fixed_bytes (one value for every rank, or one per rank) +
// the peak of its live microbatch-stages' saved bytes.
struct memory_budget {
  double cap_bytes = std::numeric_limits<double>::infinity();
  std::vector<double> fixed_bytes{0.0};
};

struct recompute_search_options {
  long long max_exhaustive_assignments = 256;  // plan every assignment up to this many (options^stages)
  long long max_bound_assignments = 4096;      // the bound's least over every assignment up to this many
  int descent_rounds = 3;                      // rounds of coordinate descent (greedy search)
  synthesis_options synthesis{};               // for each synthesize() call
};

struct recompute_plan {
  program prog;                           // as synthesize's: lower(), validate(), the executor take it
  std::vector<int> choice;                // per stage: the index of its option in its menu list
  std::vector<std::string> option_names;  // per stage: that option's name
  cost_model costs;                       // the chosen options' costs: T_I and T_B with the recompute
                                          // time, activation = saved bytes; simulate(prog, costs) times it
  double makespan = 0;                    // simulate(prog, costs).makespan
  double lower_bound = 0;                 // no assignment of options with any schedule is faster
  double gap = 1;                         // makespan / lower_bound (1 when both are 0)
  std::vector<double> peak_bytes;         // per rank: fixed + simulated peak of saved bytes, each <= cap
  std::string method;                     // how the options were chosen: "exhaustive: ..." or "greedy + descent: ..."
  std::string bound_method;               // "least over N assignments" or "relaxed: ..."
  std::string schedule_method;            // synthesize's method for the chosen assignment
  long long assignments = 0;              // options^stages (saturates at 2^62)
  long long planned = 0;                  // synthesize() calls made
};

namespace detail::schedule::planner {

struct recompute_problem {
  problem base;                                     // times of the costs given, no recompute
  std::vector<std::vector<recompute_option>> menu;  // per stage
  std::vector<double> fixed;                        // per rank
  double cap = 0;
  std::vector<double> scale;  // per rank: activation factor (see the file comment)
  double scaled_cap = 0;

  recompute_problem(const schedule_shape& shape, const cost_model& costs, const recompute_menu& m,
                    const memory_budget& budget)
      : base(shape, costs, 0), cap(budget.cap_bytes) {
    for (int s = 0; s < base.stages; ++s) menu.push_back(m.size() == 1 ? m[0] : m[static_cast<std::size_t>(s)]);
    for (int r = 0; r < base.ranks; ++r)
      fixed.push_back(budget.fixed_bytes.size() == 1 ? budget.fixed_bytes[0] : budget.fixed_bytes[static_cast<std::size_t>(r)]);
    scale.assign(static_cast<std::size_t>(base.ranks), 1.0);
    scaled_cap = cap;
    if (std::isfinite(cap)) {
      const double least_room = cap - *std::max_element(fixed.begin(), fixed.end());
      scaled_cap = std::max(0.0, least_room);
      if (least_room > 0)
        for (int r = 0; r < base.ranks; ++r) {
          const double room = cap - fixed[static_cast<std::size_t>(r)];
          if (room != least_room) scale[static_cast<std::size_t>(r)] = least_room / room;
        }
    }
  }

  // The assignment's costs; activation in bytes, or scaled for the planner.
  [[nodiscard]] cost_model costs_of(const std::vector<int>& choice, bool scaled) const {
    cost_model c;
    c.communication = base.comm;
    c.forward = base.tf;
    c.backward_weight = base.tw;
    c.backward_input.clear();
    c.backward.clear();
    c.activation.clear();
    for (int s = 0; s < base.stages; ++s) {
      const auto su = static_cast<std::size_t>(s);
      const recompute_option& o = menu[su][static_cast<std::size_t>(choice[su])];
      c.backward_input.push_back(base.ti[su] + o.extra_backward_input);
      c.backward.push_back(base.tb[su] + o.extra_backward_input);
      c.activation.push_back(o.saved_bytes * (scaled ? scale[static_cast<std::size_t>(base.rank_of[su])] : 1.0));
    }
    return c;
  }
  // Each rank's least need: its fixed part and one microbatch on each of its stages.
  [[nodiscard]] double least_need(const std::vector<int>& choice, int& worst_rank) const {
    double worst = -1;
    for (int r = 0; r < base.ranks; ++r) {
      double need = fixed[static_cast<std::size_t>(r)];
      for (int s : base.local[static_cast<std::size_t>(r)])
        need += menu[static_cast<std::size_t>(s)][static_cast<std::size_t>(choice[static_cast<std::size_t>(s)])].saved_bytes;
      if (need > worst) {
        worst = need;
        worst_rank = r;
      }
    }
    return worst;
  }
  [[nodiscard]] bool fits(const std::vector<int>& choice) const {
    int ignored = 0;
    return least_need(choice, ignored) <= cap + tolerance(cap);
  }
};

inline std::string bytes_text(double bytes) {
  char text[64];
  if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(text, sizeof text, "%.0f bytes (%.3f GiB)", bytes, bytes / (1024.0 * 1024 * 1024));
  else if (bytes >= 1024.0 * 1024)
    std::snprintf(text, sizeof text, "%.0f bytes (%.3f MiB)", bytes, bytes / (1024.0 * 1024));
  else
    std::snprintf(text, sizeof text, "%.0f bytes", bytes);
  return text;
}

inline void check_recompute_inputs(const schedule_shape& shape, const cost_model& costs, const recompute_menu& menu,
                                   const memory_budget& budget) {
  const std::string who = "baton::synthesize_with_recompute: ";
  check_inputs(shape, costs, 0);
  const int S = shape.num_stages();
  if (menu.empty())
    throw schedule_error(who + "the recompute menu is empty; give one list of options for every stage, or one per stage (" +
                         std::to_string(S) + ")");
  if (menu.size() != 1 && menu.size() != static_cast<std::size_t>(S))
    throw schedule_error(who + "the recompute menu has " + std::to_string(menu.size()) +
                         " lists; give one for every stage or one per stage (" + std::to_string(S) + ")");
  for (std::size_t s = 0; s < menu.size(); ++s) {
    const std::string where = menu.size() == 1 ? std::string("the menu") : "stage " + std::to_string(s) + "'s menu";
    if (menu[s].empty())
      throw schedule_error(who + where + " has no options; give at least one (e.g. {\"none\", bytes, 0})");
    for (const recompute_option& o : menu[s]) {
      if (o.name.empty()) throw schedule_error(who + where + " has an option without a name; name each (\"none\", \"full\"...)");
      if (!(o.saved_bytes >= 0) || !std::isfinite(o.saved_bytes))
        throw schedule_error(who + where + ": option '" + o.name + "' has saved_bytes " + std::to_string(o.saved_bytes) +
                             "; saved bytes must be finite and >= 0");
      if (!(o.extra_backward_input >= 0) || !std::isfinite(o.extra_backward_input))
        throw schedule_error(who + where + ": option '" + o.name + "' has extra_backward_input " +
                             std::to_string(o.extra_backward_input) + "; recompute time must be finite and >= 0");
    }
  }
  if (budget.fixed_bytes.size() != 1 && budget.fixed_bytes.size() != static_cast<std::size_t>(shape.ranks))
    throw schedule_error(who + "fixed_bytes has " + std::to_string(budget.fixed_bytes.size()) +
                         " values; give one for every rank or one per rank (" + std::to_string(shape.ranks) + ")");
  for (double f : budget.fixed_bytes)
    if (!(f >= 0) || !std::isfinite(f))
      throw schedule_error(who + "fixed_bytes has " + std::to_string(f) + "; a rank's fixed bytes must be finite and >= 0");
  if (std::isnan(budget.cap_bytes) || budget.cap_bytes <= 0)
    throw schedule_error(who + "cap_bytes must be > 0 (got " + std::to_string(budget.cap_bytes) +
                         "); pass std::numeric_limits<double>::infinity() for no cap");
}

// Each stage's options that no other beats in both time and bytes, fastest first (ties: fewer
// bytes first); each later one keeps strictly fewer bytes.
inline std::vector<std::vector<int>> pareto_levels(const std::vector<std::vector<recompute_option>>& menu) {
  std::vector<std::vector<int>> levels;
  for (const auto& options : menu) {
    std::vector<int> order(options.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      const auto& x = options[static_cast<std::size_t>(a)];
      const auto& y = options[static_cast<std::size_t>(b)];
      return x.extra_backward_input != y.extra_backward_input ? x.extra_backward_input < y.extra_backward_input
                                                              : x.saved_bytes < y.saved_bytes;
    });
    std::vector<int> kept;
    for (int k : order)
      if (kept.empty() || options[static_cast<std::size_t>(k)].saved_bytes < options[static_cast<std::size_t>(kept.back())].saved_bytes)
        kept.push_back(k);
    levels.push_back(kept);
  }
  return levels;
}

}  // namespace detail::schedule::planner

// See the file comment. `costs` gives T_F, T_I, T_B, T_W without recomputation and the
// communication time; its activation is not read (each option's saved_bytes replace it).
// Throws schedule_error on bad input, and when even the option that keeps the fewest bytes on
// every stage does not fit, naming the least cap that would.
[[nodiscard]] inline recompute_plan synthesize_with_recompute(const schedule_shape& shape, const cost_model& costs,
                                                              const recompute_menu& menu, const memory_budget& budget,
                                                              const recompute_search_options& options = {}) {
  using namespace detail::schedule::planner;
  check_recompute_inputs(shape, costs, menu, budget);
  const recompute_problem rp(shape, costs, menu, budget);
  const int S = rp.base.stages;
  const auto levels = pareto_levels(rp.menu);

  // The assignment that keeps the fewest bytes everywhere: if it does not fit, nothing does.
  std::vector<int> leanest(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) leanest[static_cast<std::size_t>(s)] = levels[static_cast<std::size_t>(s)].back();
  int worst_rank = 0;
  const double least_cap = rp.least_need(leanest, worst_rank);
  if (!rp.fits(leanest)) {
    double saved = 0;
    for (int s : rp.base.local[static_cast<std::size_t>(worst_rank)])
      saved += rp.menu[static_cast<std::size_t>(s)][static_cast<std::size_t>(leanest[static_cast<std::size_t>(s)])].saved_bytes;
    throw schedule_error(
        "baton::synthesize_with_recompute: cap_bytes " + bytes_text(budget.cap_bytes) +
        " is below what any plan needs, even keeping the fewest bytes on every stage ('" +
        rp.menu[0][static_cast<std::size_t>(leanest[0])].name + "' on stage 0): rank " + std::to_string(worst_rank) +
        " holds its fixed part, " + bytes_text(rp.fixed[static_cast<std::size_t>(worst_rank)]) +
        ", plus one microbatch on each of its stages, " + bytes_text(saved) + "; raise cap_bytes to at least " +
        bytes_text(least_cap) + ", or shrink the fixed part (shard the optimiser state) or the microbatch, or use more ranks");
  }
  for (int r = 0; r < shape.ranks; ++r)
    if (rp.fixed[static_cast<std::size_t>(r)] >= budget.cap_bytes)
      throw schedule_error("baton::synthesize_with_recompute: rank " + std::to_string(r) + "'s fixed part, " +
                           bytes_text(rp.fixed[static_cast<std::size_t>(r)]) + ", leaves no room for activations under cap_bytes " +
                           bytes_text(budget.cap_bytes) + "; raise cap_bytes above it, or shrink the fixed part");

  long long total = 1;
  for (const auto& m : rp.menu) total = total > (1LL << 62) / static_cast<long long>(m.size()) ? (1LL << 62) : total * static_cast<long long>(m.size());

  const auto bound_of = [&](const std::vector<int>& choice) {
    return makespan_lower_bound(shape, rp.costs_of(choice, true), rp.scaled_cap);
  };
  // Every assignment, in mixed radix over the menu lists.
  const auto all_assignments = [&] {
    std::vector<std::vector<int>> out;
    std::vector<int> choice(static_cast<std::size_t>(S), 0);
    while (true) {
      out.push_back(choice);
      int s = 0;
      for (; s < S; ++s) {
        auto& c = choice[static_cast<std::size_t>(s)];
        if (++c < static_cast<int>(rp.menu[static_cast<std::size_t>(s)].size())) break;
        c = 0;
      }
      if (s == S) return out;
    }
  };

  recompute_plan result;
  result.assignments = total;
  double best = std::numeric_limits<double>::infinity();
  synthesis_result best_plan;
  std::set<std::vector<int>> tried;
  // Plans one assignment unless it does not fit, was planned, or its bound cannot beat the best.
  const auto try_assignment = [&](const std::vector<int>& choice, double bound) {
    if (!rp.fits(choice) || !tried.insert(choice).second) return false;
    if (std::isnan(bound)) bound = bound_of(choice);
    if (bound >= best) return false;
    ++result.planned;
    synthesis_result plan = synthesize(shape, rp.costs_of(choice, true), rp.scaled_cap, options.synthesis);
    if (!std::isfinite(best) || plan.makespan < best - tolerance(best)) {
      best = plan.makespan;
      best_plan = std::move(plan);
      result.choice = choice;
      return true;
    }
    return false;
  };
  constexpr double unknown = std::numeric_limits<double>::quiet_NaN();

  // The bound over every choice.
  if (total <= std::max(options.max_bound_assignments, options.max_exhaustive_assignments)) {
    result.lower_bound = std::numeric_limits<double>::infinity();
    long long fitting = 0;
    for (const auto& choice : all_assignments())
      if (rp.fits(choice)) {
        ++fitting;
        result.lower_bound = std::min(result.lower_bound, bound_of(choice));
      }
    result.bound_method = "least over the " + std::to_string(fitting) + " assignments that fit";
  } else {
    cost_model relaxed = rp.costs_of(leanest, true);
    for (int s = 0; s < S; ++s) {
      const auto su = static_cast<std::size_t>(s);
      const auto& fastest = rp.menu[su][static_cast<std::size_t>(levels[su].front())];
      relaxed.backward_input[su] = rp.base.ti[su] + fastest.extra_backward_input;
      relaxed.backward[su] = rp.base.tb[su] + fastest.extra_backward_input;
    }
    result.lower_bound = makespan_lower_bound(shape, relaxed, rp.scaled_cap);
    result.bound_method = "relaxed: each stage's least recompute time with its least bytes";
  }

  if (total <= options.max_exhaustive_assignments) {
    std::vector<std::pair<double, std::vector<int>>> ranked;
    for (auto& choice : all_assignments())
      if (rp.fits(choice)) ranked.emplace_back(bound_of(choice), std::move(choice));
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
    for (const auto& [bound, choice] : ranked) {
      if (bound >= best) break;  // sorted: no later assignment can beat the best either
      try_assignment(choice, bound);
    }
    result.method = "exhaustive: " + std::to_string(ranked.size()) + " of " + std::to_string(total) +
                    " assignments fit, " + std::to_string(result.planned) +
                    " planned best bound first, the rest cut off by their lower bound";
  } else {
    const auto reached = [&] { return best <= result.lower_bound + tolerance(result.lower_bound); };
    const auto at_levels = [&](const std::vector<int>& level) {
      std::vector<int> choice(static_cast<std::size_t>(S));
      for (int s = 0; s < S; ++s) choice[static_cast<std::size_t>(s)] = levels[static_cast<std::size_t>(s)][static_cast<std::size_t>(level[static_cast<std::size_t>(s)])];
      return choice;
    };
    std::size_t most_levels = 0;
    for (const auto& l : levels) most_levels = std::max(most_levels, l.size());
    // The same level on every stage (the last where a stage has fewer).
    for (std::size_t j = 0; j < most_levels && !reached(); ++j) {
      std::vector<int> level(static_cast<std::size_t>(S));
      for (int s = 0; s < S; ++s) level[static_cast<std::size_t>(s)] = static_cast<int>(std::min(j, levels[static_cast<std::size_t>(s)].size() - 1));
      try_assignment(at_levels(level), unknown);
    }
    // The greedy path: upgrade the stage that frees the most of its rank's room per unit of time.
    std::vector<int> level(static_cast<std::size_t>(S), 0);
    while (!reached()) {
      int pick = -1;
      double pick_value = -1;
      for (int s = 0; s < S; ++s) {
        const auto su = static_cast<std::size_t>(s);
        if (level[su] + 1 >= static_cast<int>(levels[su].size())) continue;
        const auto& now = rp.menu[su][static_cast<std::size_t>(levels[su][static_cast<std::size_t>(level[su])])];
        const auto& next = rp.menu[su][static_cast<std::size_t>(levels[su][static_cast<std::size_t>(level[su] + 1)])];
        const double freed = (now.saved_bytes - next.saved_bytes) * rp.scale[static_cast<std::size_t>(rp.base.rank_of[su])];
        const double cost = next.extra_backward_input - now.extra_backward_input;
        const double value = cost > 0 ? freed / cost : std::numeric_limits<double>::infinity();
        if (value > pick_value) {
          pick_value = value;
          pick = s;
        }
      }
      if (pick < 0) break;
      ++level[static_cast<std::size_t>(pick)];
      try_assignment(at_levels(level), unknown);
    }
    // Coordinate descent from the best: one stage a level up or down.
    std::vector<int> best_level(static_cast<std::size_t>(S));
    for (std::size_t s = 0; s < static_cast<std::size_t>(S); ++s)
      best_level[s] = static_cast<int>(std::find(levels[s].begin(), levels[s].end(), result.choice[s]) - levels[s].begin());
    for (int round = 0; round < options.descent_rounds && !reached(); ++round) {
      bool improved = false;
      for (int s = 0; s < S && !reached(); ++s)
        for (int step : {1, -1}) {
          std::vector<int> near = best_level;
          int& l = near[static_cast<std::size_t>(s)];
          l += step;
          if (l < 0 || l >= static_cast<int>(levels[static_cast<std::size_t>(s)].size())) continue;
          if (try_assignment(at_levels(near), unknown)) {
            best_level = near;
            improved = true;
          }
        }
      if (!improved) break;
    }
    result.method = "greedy + descent: " + std::to_string(total) + " assignments, " + std::to_string(tried.size()) +
                    " tried, " + std::to_string(result.planned) + " planned";
  }

  result.prog = best_plan.prog;
  result.schedule_method = best_plan.method;
  result.costs = rp.costs_of(result.choice, false);
  for (int s = 0; s < S; ++s)
    result.option_names.push_back(rp.menu[static_cast<std::size_t>(s)][static_cast<std::size_t>(result.choice[static_cast<std::size_t>(s)])].name);
  const simulation sim = simulate(result.prog, result.costs);  // in bytes, as the caller will
  result.makespan = sim.makespan;
  for (int r = 0; r < shape.ranks; ++r)
    result.peak_bytes.push_back(rp.fixed[static_cast<std::size_t>(r)] + sim.ranks[static_cast<std::size_t>(r)].peak_activation);
  result.gap = result.lower_bound > 0 ? result.makespan / result.lower_bound : 1.0;
  return result;
}

}  // namespace baton
