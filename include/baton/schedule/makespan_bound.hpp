// baton/schedule/makespan_bound.hpp — what no schedule of a shape can beat: the least makespan
// (makespan_lower_bound) under a cost model and a memory cap, and the least memory cap
// (least_memory_cap). synthesize() measures its plans against them.
#pragma once

#include <baton/schedule/detail/planner/problem.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/simulate.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace baton {

// What no program of this shape can beat under these costs and memory cap: the largest of
//   - the critical path of one microbatch: F through every stage, then I back through every
//     stage, then stage 0's W, with `communication` wherever consecutive stages sit on
//     different ranks;
//   - for each rank r, with head_r the earliest time an F of its first stage can start (the F
//     of the stages before it, and their messages) and work_r all its F, I and W:
//       head_r + work_r (the rank cannot start before its first input, and must do it all);
//       head_r + F_r + I_r + tail_r, where tail_r is the I chain below the rank's first stage and
//       stage 0's W, which follow the rank's last I there;
//       head_r + (sum over its stages of m x activation x chain) / memory_cap, where chain is the
//       least time from an F of the stage to its W (through the later stages and back): the
//       memory a rank holds over time can be no less, and at no moment more than the cap;
//       headI_r + I_r + W_r + (F_r - k_r x max F), where headI_r is the earliest any of its I
//       can start (every F, then the I of the later stages) and k_r the most forwards the cap
//       lets it hold before then (each stays live until its W, after headI_r).
[[nodiscard]] inline double makespan_lower_bound(const schedule_shape& shape, const cost_model& costs,
                                                 double memory_cap = std::numeric_limits<double>::infinity()) {
  detail::schedule::planner::check_inputs(shape, costs, memory_cap);
  const detail::schedule::planner::problem pb(shape, costs, memory_cap);
  const int S = pb.stages;
  const double M = pb.microbatches;
  // Earliest start of F on stage s, and of I on stage s.
  std::vector<double> early_f(static_cast<std::size_t>(S), 0), early_i(static_cast<std::size_t>(S), 0);
  for (int s = 1; s < S; ++s)
    early_f[static_cast<std::size_t>(s)] =
        early_f[static_cast<std::size_t>(s - 1)] + pb.tf[static_cast<std::size_t>(s - 1)] + pb.hop(s - 1, s);
  early_i[static_cast<std::size_t>(S - 1)] = early_f[static_cast<std::size_t>(S - 1)] + pb.tf[static_cast<std::size_t>(S - 1)];
  for (int s = S - 2; s >= 0; --s)
    early_i[static_cast<std::size_t>(s)] =
        early_i[static_cast<std::size_t>(s + 1)] + pb.ti[static_cast<std::size_t>(s + 1)] + pb.hop(s + 1, s);
  double bound = early_i[0] + pb.ti[0] + pb.tw[0];
  for (int r = 0; r < pb.ranks; ++r) {
    const auto& stages = pb.local[static_cast<std::size_t>(r)];
    double f = 0, i = 0, w = 0, max_f = 0, min_act = std::numeric_limits<double>::infinity();
    for (int s : stages) {
      const auto su = static_cast<std::size_t>(s);
      f += M * pb.tf[su];
      i += M * pb.ti[su];
      w += M * pb.tw[su];
      max_f = std::max(max_f, pb.tf[su]);
      min_act = std::min(min_act, pb.act[su]);
    }
    const int first = stages.front(), last = stages.back();
    const double head = early_f[static_cast<std::size_t>(first)];
    const double tail = pb.tail_below(first);
    bound = std::max({bound, head + f + i + w, head + f + i + tail});
    const double head_i = early_i[static_cast<std::size_t>(last)];
    double held = M * static_cast<double>(stages.size());  // forwards that could run before head_i
    if (min_act > 0 && std::isfinite(memory_cap)) held = std::min(held, std::floor(memory_cap / min_act + 1e-9));
    bound = std::max(bound, head_i + i + w + std::max(0.0, f - held * max_f));
    // Memory over time: stage s's activation of a microbatch lives from its F to its W, at
    // least the chain between them; the cap bounds how much of it the rank holds at once.
    if (std::isfinite(memory_cap) && memory_cap > 0) {
      double held_time = 0;
      for (int s : stages) {
        const auto su = static_cast<std::size_t>(s);
        const double chain = early_i[su] - early_f[su] + pb.ti[su] + pb.tw[su];
        held_time += M * pb.act[su] * chain;
      }
      bound = std::max(bound, head + held_time / memory_cap);
    }
  }
  return bound;
}

// The least memory cap any training program of this shape fits under (see least_peak).
[[nodiscard]] inline double least_memory_cap(const schedule_shape& shape, const cost_model& costs) {
  detail::schedule::planner::check_inputs(shape, costs, 0);
  return detail::schedule::planner::least_peak(detail::schedule::planner::problem(shape, costs, 0));
}

}  // namespace baton
