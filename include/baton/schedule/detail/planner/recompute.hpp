// baton/schedule/detail/planner/recompute.hpp — synthesize_with_recompute's problem: the menu
// resolved per stage, the per-rank rooms and the scaling that turns them into one cap, the
// checks of its inputs, and the reduction of each stage's options to those worth trying.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/detail/planner/problem.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/recompute_menu.hpp>
#include <baton/schedule/simulate.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace baton::detail::schedule::planner {

inline double weight_of(const recompute_option& o) { return o.weight_bytes.value_or(o.saved_bytes); }

struct recompute_problem {
  problem base;                                     // times of the costs given, no recompute
  std::vector<std::vector<recompute_option>> menu;  // per stage
  std::vector<double> fixed;                        // per rank
  double cap = 0;
  std::vector<double> scale;  // per rank: activation factor (see recompute_plan.hpp)
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
  [[nodiscard]] const recompute_option& option(const std::vector<int>& choice, int s) const {
    return menu[static_cast<std::size_t>(s)][static_cast<std::size_t>(choice[static_cast<std::size_t>(s)])];
  }
  [[nodiscard]] double scale_of_stage(int s) const {
    return scale[static_cast<std::size_t>(base.rank_of[static_cast<std::size_t>(s)])];
  }

  // The assignment's costs. activation: saved bytes (what the planner schedules with: each
  // plan is then checked with weight bytes too), scaled for the planner or not; the larger of
  // saved and weight bytes (a plan under it fits); for the bound, the smaller, which the stage
  // holds at least from its F to its W.
  enum class memory { saved, saved_scaled, larger_scaled, bound_scaled };
  [[nodiscard]] cost_model costs_of(const std::vector<int>& choice, memory m) const {
    cost_model c;
    c.communication = base.comm;
    c.forward = base.tf;
    c.backward_weight = base.tw;
    c.backward_input.clear();
    c.backward.clear();
    c.activation.clear();
    for (int s = 0; s < base.stages; ++s) {
      const auto su = static_cast<std::size_t>(s);
      const recompute_option& o = option(choice, s);
      c.backward_input.push_back(base.ti[su] + o.extra_backward_input);
      c.backward.push_back(base.tb[su] + o.extra_backward_input);
      const double bytes = m == memory::bound_scaled    ? std::min(o.saved_bytes, weight_of(o))
                           : m == memory::larger_scaled ? std::max(o.saved_bytes, weight_of(o))
                                                        : o.saved_bytes;
      c.activation.push_back(bytes * (m == memory::saved ? 1.0 : scale_of_stage(s)));
    }
    return c;
  }
  [[nodiscard]] std::vector<double> saved_bytes(const std::vector<int>& choice) const {
    std::vector<double> out;
    for (int s = 0; s < base.stages; ++s) out.push_back(option(choice, s).saved_bytes);
    return out;
  }
  [[nodiscard]] std::vector<double> weight_bytes(const std::vector<int>& choice) const {
    std::vector<double> out;
    for (int s = 0; s < base.stages; ++s) out.push_back(weight_of(option(choice, s)));
    return out;
  }
  // What rank r needs at least in the sequential program (one microbatch at a time), which
  // the search falls back to: its fixed part, one microbatch on each of its stages, one of them
  // between its I and W.
  [[nodiscard]] double need(const std::vector<int>& choice, int r) const {
    double sum = fixed[static_cast<std::size_t>(r)], surplus = 0;
    for (int s : base.local[static_cast<std::size_t>(r)]) {
      sum += option(choice, s).saved_bytes;
      surplus = std::max(surplus, weight_of(option(choice, s)) - option(choice, s).saved_bytes);
    }
    return sum + surplus;
  }
  [[nodiscard]] double most_need(const std::vector<int>& choice, int* worst_rank = nullptr) const {
    double worst = -1;
    for (int r = 0; r < base.ranks; ++r)
      if (const double n = need(choice, r); n > worst) {
        worst = n;
        if (worst_rank != nullptr) *worst_rank = r;
      }
    return worst;
  }
  [[nodiscard]] bool fits(const std::vector<int>& choice) const { return most_need(choice) <= cap + tolerance(cap); }
  // How far the per-rank peaks (bytes of live state) pass the rooms, in the planner's unit.
  [[nodiscard]] double excess(const std::vector<double>& peak) const {
    double worst = -std::numeric_limits<double>::infinity();
    for (int r = 0; r < base.ranks; ++r) {
      const auto ru = static_cast<std::size_t>(r);
      worst = std::max(worst, (fixed[ru] + peak[ru] - cap) * scale[ru]);
    }
    return worst;
  }
};

// One microbatch at a time through every stage and back: fits whatever `need` says fits.
inline std::vector<std::vector<action>> sequential_rows(const problem& pb) {
  std::vector<std::vector<action>> rows(static_cast<std::size_t>(pb.ranks));
  for (int mb = 0; mb < pb.microbatches; ++mb) {
    for (int s = 0; s < pb.stages; ++s)
      rows[static_cast<std::size_t>(pb.rank_of[static_cast<std::size_t>(s)])].push_back({s, action_kind::forward, mb});
    for (int s = pb.stages - 1; s >= 0; --s) {
      auto& row = rows[static_cast<std::size_t>(pb.rank_of[static_cast<std::size_t>(s)])];
      row.push_back({s, action_kind::backward_input, mb});
      row.push_back({s, action_kind::backward_weight, mb});
    }
  }
  return rows;
}

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
      for (const auto& [field, x] : {std::pair<const char*, double>{"saved_bytes", o.saved_bytes}, {"weight_bytes", weight_of(o)}})
        if (!(x >= 0) || !std::isfinite(x))
          throw schedule_error(who + where + ": option '" + o.name + "' has " + field + " " + std::to_string(x) +
                               "; bytes must be finite and >= 0");
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

// Each stage's options that no other beats in time and both byte counts, fastest first (ties:
// fewer saved bytes first): the levels the greedy search moves along.
inline std::vector<std::vector<int>> pareto_levels(const std::vector<std::vector<recompute_option>>& menu) {
  std::vector<std::vector<int>> levels;
  for (const auto& options : menu) {
    std::vector<int> order(options.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = static_cast<int>(k);
    const auto at = [&](int k) -> const recompute_option& { return options[static_cast<std::size_t>(k)]; };
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
      return at(a).extra_backward_input != at(b).extra_backward_input ? at(a).extra_backward_input < at(b).extra_backward_input
                                                                      : at(a).saved_bytes < at(b).saved_bytes;
    });
    std::vector<int> kept;
    for (int k : order) {
      bool dominated = false;
      for (int j : kept)
        dominated = dominated || (at(j).saved_bytes <= at(k).saved_bytes && weight_of(at(j)) <= weight_of(at(k)));
      if (!dominated) kept.push_back(k);
    }
    levels.push_back(kept);
  }
  return levels;
}

}  // namespace baton::detail::schedule::planner
