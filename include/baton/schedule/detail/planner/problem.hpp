// baton/schedule/detail/planner/problem.hpp — the planner's problem in flat arrays (one entry
// per stage), the checks of its inputs, and the least memory any schedule needs.
//
// synthesize, its lower bound and its searches all read the costs of a stage many thousand
// times; cost_model::cost() resolves "one value or one per stage" on every call, the arrays
// once.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/simulate.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

namespace baton::detail::schedule::planner {

struct problem {
  schedule_shape shape{};
  int stages = 0;
  int ranks = 0;
  int microbatches = 0;
  std::vector<double> tf, ti, tw, tb, act;
  double comm = 0;
  double cap = 0;
  std::vector<int> rank_of;                 // per stage
  std::vector<std::vector<int>> local;      // per rank, its stages ascending

  problem(const schedule_shape& s, const cost_model& costs, double memory_cap)
      : shape(s), stages(s.num_stages()), ranks(s.ranks), microbatches(s.microbatches), comm(costs.communication),
        cap(memory_cap) {
    for (int st = 0; st < stages; ++st) {
      tf.push_back(costs.cost(action_kind::forward, st));
      ti.push_back(costs.cost(action_kind::backward_input, st));
      tw.push_back(costs.cost(action_kind::backward_weight, st));
      tb.push_back(costs.cost(action_kind::backward, st));
      act.push_back(costs.activation_of(st));
      rank_of.push_back(stage_rank(s, st));
    }
    local.resize(static_cast<std::size_t>(ranks));
    for (int st = 0; st < stages; ++st) local[static_cast<std::size_t>(rank_of[static_cast<std::size_t>(st)])].push_back(st);
  }
  [[nodiscard]] double hop(int a, int b) const {
    return rank_of[static_cast<std::size_t>(a)] == rank_of[static_cast<std::size_t>(b)] ? 0.0 : comm;
  }
  [[nodiscard]] double duration(const action& a) const {
    const auto s = static_cast<std::size_t>(a.stage);
    switch (a.kind) {
      case action_kind::forward: return tf[s];
      case action_kind::backward_input: return ti[s];
      case action_kind::backward_weight: return tw[s];
      case action_kind::backward: return tb[s];
      default: return 0.0;
    }
  }
  // What must still run after a rank's last I on its first stage `first`: the I chain down to
  // stage 0 (with its messages) and stage 0's W. The lower bound and the branch-and-bound's
  // pruning both count it.
  [[nodiscard]] double tail_below(int first) const {
    double tail = 0;
    for (int s = first; s > 0; --s) tail += hop(s, s - 1) + ti[static_cast<std::size_t>(s - 1)];
    if (first > 0) tail += tw[0];
    return tail;
  }
};

inline double tolerance(double scale) { return 1e-9 * std::max(1.0, std::abs(scale)); }

// The least per-rank peak any training schedule needs: when the last stage's forward of a
// microbatch runs, every stage of that microbatch holds its activation (each W or B needs the
// I chain that starts there), so a rank holds at least the sum over its stages.
inline double least_peak(const problem& pb) {
  double least = 0;
  for (const auto& stages : pb.local) {
    double sum = 0;
    for (int s : stages) sum += pb.act[static_cast<std::size_t>(s)];
    least = std::max(least, sum);
  }
  return least;
}

inline void check_inputs(const schedule_shape& shape, const cost_model& costs, double memory_cap) {
  if (shape.ranks < 1 || shape.stages_per_rank < 1 || shape.microbatches < 1)
    throw schedule_error("baton::synthesize: ranks (" + std::to_string(shape.ranks) + "), stages_per_rank (" +
                         std::to_string(shape.stages_per_rank) + ") and microbatches (" +
                         std::to_string(shape.microbatches) + ") must all be at least 1");
  if (static_cast<long long>(shape.num_stages()) * shape.microbatches > (1LL << 20))
    throw schedule_error("baton::synthesize: " + std::to_string(shape.num_stages()) + " stages x " +
                         std::to_string(shape.microbatches) +
                         " microbatches is more than the planner searches (2^20 stage-microbatches); plan a smaller "
                         "shape");
  costs.check(shape.num_stages());
  if (std::isnan(memory_cap) || memory_cap < 0)
    throw schedule_error("baton::synthesize: memory_cap must be >= 0 (got " + std::to_string(memory_cap) +
                         "); pass std::numeric_limits<double>::infinity() for no cap");
}

}  // namespace baton::detail::schedule::planner
