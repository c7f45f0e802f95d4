// baton/pipeline/timing.hpp — what the executor measures of each step: the seconds spent in
// each stage's compute actions, and a cost model for the schedule simulator built from them.
//
// The simulator predicts a program's makespan from per-stage costs (T_F, T_B, T_I, T_W); the
// executor measures those costs while it runs, so a prediction can be made from the very
// step it is compared with (bench_train), or a schedule planned on real figures.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/simulate.hpp>

#include <chrono>
#include <cstddef>
#include <span>
#include <vector>

namespace baton {

namespace detail::pipeline {

// Where a compute kind's figures go among a stage's four: F, B, I, W.
constexpr int cost_slot(action_kind kind) noexcept {
  switch (kind) {
    case action_kind::forward: return 0;
    case action_kind::backward: return 1;
    case action_kind::backward_input: return 2;
    default: return 3;
  }
}

}  // namespace detail::pipeline

/// Time spent in the compute actions of one kind of one stage during a call: the stage's
/// forward (with the loss on the last stage), backward, backward_input or backward_weight,
/// summed over `count` microbatches. Waiting for a message is not included.
struct action_time {
  int stage = 0;
  action_kind kind = action_kind::forward;
  int count = 0;
  double seconds = 0;
  friend bool operator==(const action_time&, const action_time&) = default;
};

/// One compute action as it ran on this rank: stage, kind and microbatch, and when it started
/// and finished, in seconds since this rank began the call's actions. Ranks begin them right
/// after the call's agreement exchange, so the clocks of a pipeline's ranks start together
/// within a message's latency (a timeline drawn from every rank's events lines up).
struct action_event {
  int stage = 0;
  action_kind kind = action_kind::forward;
  int microbatch = 0;
  double start = 0;
  double finish = 0;
  friend bool operator==(const action_event&, const action_event&) = default;
};

/// A cost model whose per-stage T_F, T_B, T_I and T_W are the mean measured times of
/// `times` (every stage's entries, typically gathered from every rank of the pipeline). A
/// kind a stage never ran gets that stage's other costs' split: T_B = T_I + T_W, and I and W
/// half of a measured B. `communication` is the per-message latency to assume.
inline cost_model measured_cost_model(std::span<const action_time> times, int num_stages, double communication = 0) {
  std::vector<double> sum(static_cast<std::size_t>(4 * num_stages), 0.0), count(sum.size(), 0.0);
  for (const action_time& t : times) {
    if (t.stage < 0 || t.stage >= num_stages || t.count <= 0) continue;
    const auto i = static_cast<std::size_t>(4 * t.stage + detail::pipeline::cost_slot(t.kind));
    sum[i] += t.seconds;
    count[i] += t.count;
  }
  cost_model c;
  c.forward.assign(static_cast<std::size_t>(num_stages), 0.0);
  c.backward = c.backward_input = c.backward_weight = c.forward;
  c.communication = communication;
  for (int s = 0; s < num_stages; ++s) {
    const auto mean = [&](int k) {
      const auto i = static_cast<std::size_t>(4 * s + k);
      return count[i] > 0 ? sum[i] / count[i] : -1.0;
    };
    const auto u = static_cast<std::size_t>(s);
    const double f = mean(0), b = mean(1), in = mean(2), w = mean(3);
    c.forward[u] = f < 0 ? 0 : f;
    c.backward_input[u] = in >= 0 ? in : (b >= 0 ? b / 2 : 0);
    c.backward_weight[u] = w >= 0 ? w : (b >= 0 ? b / 2 : 0);
    c.backward[u] = b >= 0 ? b : c.backward_input[u] + c.backward_weight[u];
  }
  return c;
}

namespace detail::pipeline {

// Accumulates action_time entries for the stages of one rank during a call, and the call's
// action_event list (its capacity kept from call to call: no allocation after the first).
class action_clock {
 public:
  using clock = std::chrono::steady_clock;

  void reset(int num_stages) {
    origin_ = clock::now();
    events_.clear();
    entries_.assign(static_cast<std::size_t>(4 * num_stages), {});
    for (int s = 0; s < num_stages; ++s)
      for (int k = 0; k < 4; ++k) {
        auto& e = entries_[static_cast<std::size_t>(4 * s + k)];
        e.stage = s;
        e.kind = kinds[k];
      }
  }
  void add(int stage, action_kind kind, int microbatch, clock::time_point start, clock::time_point finish) {
    for (int k = 0; k < 4; ++k)
      if (kinds[k] == kind) {
        auto& e = entries_[static_cast<std::size_t>(4 * stage + k)];
        ++e.count;
        e.seconds += std::chrono::duration<double>(finish - start).count();
      }
    events_.push_back({stage, kind, microbatch, std::chrono::duration<double>(start - origin_).count(),
                       std::chrono::duration<double>(finish - origin_).count()});
  }
  const std::vector<action_event>& events() const noexcept { return events_; }
  // The entries that ran at least once, and their total seconds.
  std::vector<action_time> entries(double& total) const {
    std::vector<action_time> out;
    total = 0;
    for (const auto& e : entries_)
      if (e.count > 0) {
        out.push_back(e);
        total += e.seconds;
      }
    return out;
  }

 private:
  static constexpr action_kind kinds[4] = {action_kind::forward, action_kind::backward, action_kind::backward_input,
                                           action_kind::backward_weight};
  std::vector<action_time> entries_;
  std::vector<action_event> events_;
  clock::time_point origin_{};
};

}  // namespace detail::pipeline
}  // namespace baton
