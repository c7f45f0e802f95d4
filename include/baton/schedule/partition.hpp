// baton/schedule/partition.hpp — split a chain of layers into pipeline stages.
//
// partition(layers, layer_memory, ranks, stages_per_rank, memory_cap) cuts the chain (the
// embedding first and the head last are layers like the others, with their own costs) into
// ranks x stages_per_rank contiguous stages. It minimises, exactly, by dynamic programming over
// (stages used, layers covered):
//
//     bottleneck = max over stages k of (T_F(k) + T_I(k) + T_W(k)),
//
// the time one microbatch takes on the slowest stage, subject to each stage's activation
// (the sum of its layers' layer_memory) being at most memory_cap / stages_per_rank (with one
// stage per rank that is exactly the condition for any schedule to fit the cap: see
// least_memory_cap). Among the partitions that reach the least bottleneck it returns the one
// whose stages are cut as late as possible: the steady state of every schedule runs at the
// bottleneck's pace, which is what the DP minimises.
//
// Given `microbatches`, it then plans each of a few candidate cuts with synthesize() under the
// cap and keeps the fastest simulated one, which may have a larger bottleneck: the earliest
// optimal cut, and the least-bottleneck cuts under tighter per-stage memory (room for d
// microbatches in flight on every stage, or for as many as 1F1B keeps on each). A stage heavy
// in activations holds fewer microbatches under the cap, and the DP's objective cannot see what
// that costs the schedule; the simulator can.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/simulate.hpp>
#include <baton/schedule/synthesize.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <vector>

namespace baton {

// One layer's compute times for one microbatch: forward, input gradient, weight gradient.
struct layer_cost {
  double forward = 0;
  double backward_input = 0;
  double backward_weight = 0;
};

struct partition_result {
  std::vector<int> first_layer;  // stage k holds layers [first_layer[k], first_layer[k + 1]); size stages + 1
  double bottleneck = 0;         // max over stages of T_F + T_I + T_W
  cost_model costs;              // per stage: the sums of its layers (activation too); communication 0

  [[nodiscard]] int stages() const noexcept { return static_cast<int>(first_layer.size()) - 1; }
};

namespace detail::schedule::planner {

inline void check_partition_inputs(std::span<const layer_cost> layers, std::span<const double> layer_memory, int ranks,
                                   int stages_per_rank, double memory_cap) {
  if (ranks < 1 || stages_per_rank < 1)
    throw schedule_error("baton::partition: ranks (" + std::to_string(ranks) + ") and stages_per_rank (" +
                         std::to_string(stages_per_rank) + ") must be at least 1");
  const long long stages = static_cast<long long>(ranks) * stages_per_rank;
  if (static_cast<long long>(layers.size()) < stages)
    throw schedule_error("baton::partition: " + std::to_string(stages) + " stages (ranks x stages_per_rank) but only " +
                         std::to_string(layers.size()) +
                         " layers; every stage needs at least one layer: use fewer ranks or stages per rank, or "
                         "describe the model in finer layers");
  if (layer_memory.size() != layers.size())
    throw schedule_error("baton::partition: " + std::to_string(layer_memory.size()) + " layer_memory values for " +
                         std::to_string(layers.size()) + " layers; give one per layer");
  for (std::size_t i = 0; i < layers.size(); ++i) {
    for (double x : {layers[i].forward, layers[i].backward_input, layers[i].backward_weight, layer_memory[i]})
      if (!(x >= 0) || !std::isfinite(x))
        throw schedule_error("baton::partition: layer " + std::to_string(i) + " has a negative, infinite or NaN cost or memory (" +
                             std::to_string(x) + "); costs and memory must be finite and >= 0");
  }
  if (std::isnan(memory_cap) || memory_cap < 0)
    throw schedule_error("baton::partition: memory_cap must be >= 0 (got " + std::to_string(memory_cap) +
                         "); pass std::numeric_limits<double>::infinity() for no cap");
}

// The least bottleneck over all cuts, cutting late (latest = true) or early among the optima.
inline std::vector<int> least_bottleneck_cuts(const std::vector<double>& prefix_time, const std::vector<double>& prefix_mem,
                                              const std::vector<double>& stage_cap, bool latest, double& bottleneck) {
  const int stages = static_cast<int>(stage_cap.size());
  const int n = static_cast<int>(prefix_time.size()) - 1;
  constexpr double none = std::numeric_limits<double>::infinity();
  // best[k][i]: least bottleneck of the first i layers in k stages.
  std::vector<std::vector<double>> best(static_cast<std::size_t>(stages + 1), std::vector<double>(static_cast<std::size_t>(n + 1), none));
  std::vector<std::vector<int>> cut(best.size(), std::vector<int>(static_cast<std::size_t>(n + 1), -1));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int i = k; i <= n - (stages - k); ++i)
      for (int j = k - 1; j < i; ++j) {
        const double prev = best[static_cast<std::size_t>(k - 1)][static_cast<std::size_t>(j)];
        if (prev == none) continue;
        const double cap = stage_cap[static_cast<std::size_t>(k - 1)];
        if (prefix_mem[static_cast<std::size_t>(i)] - prefix_mem[static_cast<std::size_t>(j)] > cap + 1e-9 * std::max(1.0, cap))
          continue;
        const double value = std::max(prev, prefix_time[static_cast<std::size_t>(i)] - prefix_time[static_cast<std::size_t>(j)]);
        double& slot = best[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)];
        const double tol = 1e-12 * std::max(1.0, value);
        if (value < slot - tol || (latest && value <= slot + tol)) {
          slot = value;
          cut[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)] = j;
        }
      }
  bottleneck = best[static_cast<std::size_t>(stages)][static_cast<std::size_t>(n)];
  if (bottleneck == none) return {};
  std::vector<int> first(static_cast<std::size_t>(stages + 1));
  first[static_cast<std::size_t>(stages)] = n;
  for (int k = stages, i = n; k > 0; --k) {
    i = cut[static_cast<std::size_t>(k)][static_cast<std::size_t>(i)];
    first[static_cast<std::size_t>(k - 1)] = i;
  }
  return first;
}

}  // namespace detail::schedule::planner

// The per-stage cost model of a cut: the sums of the layers of each stage.
[[nodiscard]] inline cost_model stage_costs(std::span<const layer_cost> layers, std::span<const double> layer_memory,
                                            const std::vector<int>& first_layer) {
  cost_model c;
  c.forward.clear();
  c.backward.clear();
  c.backward_input.clear();
  c.backward_weight.clear();
  c.activation.clear();
  for (std::size_t k = 0; k + 1 < first_layer.size(); ++k) {
    double f = 0, in = 0, w = 0, mem = 0;
    for (int l = first_layer[k]; l < first_layer[k + 1]; ++l) {
      f += layers[static_cast<std::size_t>(l)].forward;
      in += layers[static_cast<std::size_t>(l)].backward_input;
      w += layers[static_cast<std::size_t>(l)].backward_weight;
      mem += layer_memory[static_cast<std::size_t>(l)];
    }
    c.forward.push_back(f);
    c.backward_input.push_back(in);
    c.backward_weight.push_back(w);
    c.backward.push_back(in + w);
    c.activation.push_back(mem);
  }
  return c;
}

// See the file comment. `microbatches` > 0 also checks the two extreme optimal cuts with
// synthesize() under the cap (placement `place`) and keeps the faster; 0 skips that.
[[nodiscard]] inline partition_result partition(std::span<const layer_cost> layers, std::span<const double> layer_memory,
                                                int ranks, int stages_per_rank, double memory_cap, int microbatches = 0,
                                                placement place = placement::loop) {
  detail::schedule::planner::check_partition_inputs(layers, layer_memory, ranks, stages_per_rank, memory_cap);
  const int stages = ranks * stages_per_rank;
  std::vector<double> prefix_time{0}, prefix_mem{0};
  double largest_layer = 0;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    prefix_time.push_back(prefix_time.back() + layers[i].forward + layers[i].backward_input + layers[i].backward_weight);
    prefix_mem.push_back(prefix_mem.back() + layer_memory[i]);
    largest_layer = std::max(largest_layer, layer_memory[i]);
  }
  const double stage_cap = memory_cap / stages_per_rank;
  const std::vector<double> caps(static_cast<std::size_t>(stages), stage_cap);
  partition_result result;
  const auto late = detail::schedule::planner::least_bottleneck_cuts(prefix_time, prefix_mem, caps, true, result.bottleneck);
  if (late.empty())
    throw schedule_error("baton::partition: no cut into " + std::to_string(stages) +
                         " stages keeps every stage's activation under memory_cap / stages_per_rank = " +
                         std::to_string(stage_cap) + " (the largest layer alone holds " + std::to_string(largest_layer) +
                         "); raise memory_cap, or use more ranks");
  result.first_layer = late;
  result.costs = stage_costs(layers, layer_memory, late);
  if (microbatches > 0) {
    // Candidates: the earliest optimal cut, and the least-bottleneck cuts that leave each stage
    // room for d microbatches in flight (d = 1 .. ranks x stages_per_rank), or for as many as
    // 1F1B keeps on it (the stages after it, plus one).
    std::vector<std::vector<double>> cap_sets;
    for (int depth = 1; depth <= stages; ++depth) cap_sets.emplace_back(static_cast<std::size_t>(stages), memory_cap / depth);
    std::vector<double> one_f_one_b_room;
    for (int k = 0; k < stages; ++k) one_f_one_b_room.push_back(memory_cap / (stages - k));
    cap_sets.push_back(one_f_one_b_room);
    std::vector<std::vector<int>> candidates;
    double ignored = 0;
    candidates.push_back(detail::schedule::planner::least_bottleneck_cuts(prefix_time, prefix_mem, caps, false, ignored));
    for (const auto& set : cap_sets)
      for (bool latest : {true, false})
        candidates.push_back(detail::schedule::planner::least_bottleneck_cuts(prefix_time, prefix_mem, set, latest, ignored));
    const schedule_shape shape{ranks, stages_per_rank, microbatches, place};
    double best = synthesize(shape, result.costs, memory_cap).makespan;
    std::vector<std::vector<int>> tried{late};
    for (const auto& cut : candidates) {
      if (cut.empty() || std::find(tried.begin(), tried.end(), cut) != tried.end()) continue;
      tried.push_back(cut);
      const cost_model costs = stage_costs(layers, layer_memory, cut);
      const double makespan = synthesize(shape, costs, memory_cap).makespan;
      if (makespan < best - 1e-9 * std::max(1.0, best)) {
        best = makespan;
        result.first_layer = cut;
        result.costs = costs;
      }
    }
    double slowest = 0;
    for (std::size_t k = 0; k + 1 < result.first_layer.size(); ++k)
      slowest = std::max(slowest, prefix_time[static_cast<std::size_t>(result.first_layer[k + 1])] -
                                      prefix_time[static_cast<std::size_t>(result.first_layer[k])]);
    result.bottleneck = slowest;
  }
  return result;
}

}  // namespace baton
