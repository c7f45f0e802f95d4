// baton/schedule/simulate.hpp — time a program under a cost model.
//
// Each rank runs its program in order. A compute action starts when the rank is free and
// its input is there: an input from a stage on another rank arrives `communication` after
// the producing compute finished (after its SEND in a lowered program); co-located stages
// hand over instantly. Sends never block; a receive of a lowered program is posted where it
// stands and waited for by the compute it feeds, as baton's executor and torch's runtime do,
// so a lowered program times like its compute-only one. Communication does not occupy the
// rank. An overlapped F/B pair runs F then B, each when its own input is there, as both run it
// on a CPU, and its outputs leave when the pair ends (its sends follow both actions); the
// overlap a GPU backend could give is not modelled. Stage-level actions take no time.
#pragma once

#include <baton/schedule/detail/analysis.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/validate.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace baton {

// Costs per stage: each vector holds one value for every stage, or a single value used for
// all of them. backward is the full backward B; I and W are its split halves. activation is
// the memory one live microbatch of a stage holds, in whatever unit you like (the default 1
// counts microbatch-stages).
struct cost_model {
  std::vector<double> forward{1.0};
  std::vector<double> backward{2.0};
  std::vector<double> backward_input{1.0};
  std::vector<double> backward_weight{1.0};
  double communication = 0.0;
  std::vector<double> activation{1.0};

  // The same costs for every stage; T_B = T_I + T_W unless given.
  [[nodiscard]] static cost_model uniform(double forward, double backward_input, double backward_weight,
                                          double communication = 0.0) {
    cost_model c;
    c.forward = {forward};
    c.backward_input = {backward_input};
    c.backward_weight = {backward_weight};
    c.backward = {backward_input + backward_weight};
    c.communication = communication;
    return c;
  }

  // Scales compute costs and activation memory by 1 / stages_per_rank: the costs then describe
  // one rank's share of the model (what a 1F1B stage costs), split evenly over its stages, so
  // schedules with different stages per rank compare fairly.
  [[nodiscard]] cost_model per_rank_share(int stages_per_rank) const {
    cost_model c = *this;
    const double f = 1.0 / stages_per_rank;
    for (auto* v : {&c.forward, &c.backward, &c.backward_input, &c.backward_weight, &c.activation})
      for (double& x : *v) x *= f;
    return c;
  }

  [[nodiscard]] double cost(action_kind kind, int stage) const {
    switch (kind) {
      case action_kind::forward: return pick(forward, stage);
      case action_kind::backward: return pick(backward, stage);
      case action_kind::backward_input: return pick(backward_input, stage);
      case action_kind::backward_weight: return pick(backward_weight, stage);
      default: return 0.0;
    }
  }
  [[nodiscard]] double activation_of(int stage) const { return pick(activation, stage); }

  // Throws schedule_error when a vector has the wrong length or a cost is negative.
  void check(int stages) const {
    const std::pair<const char*, const std::vector<double>*> fields[] = {
        {"forward", &forward},         {"backward", &backward},     {"backward_input", &backward_input},
        {"backward_weight", &backward_weight}, {"activation", &activation}};
    for (const auto& [name, values] : fields) {
      if (values->size() != 1 && values->size() != static_cast<std::size_t>(stages))
        throw schedule_error(std::string("baton::cost_model: ") + name + " has " + std::to_string(values->size()) +
                             " values; give one for all stages or one per stage (" + std::to_string(stages) + ")");
      for (double x : *values)
        if (!(x >= 0.0) || !std::isfinite(x))
          throw schedule_error(std::string("baton::cost_model: ") + name + " has a negative, infinite or NaN cost (" +
                               std::to_string(x) + "); costs must be finite and >= 0");
    }
    if (!(communication >= 0.0) || !std::isfinite(communication))
      throw schedule_error("baton::cost_model: communication must be finite and >= 0 (got " +
                           std::to_string(communication) + ")");
  }

 private:
  static double pick(const std::vector<double>& values, int stage) {
    if (values.empty()) return 0.0;
    return values.size() == 1 ? values.front() : values[static_cast<std::size_t>(stage)];
  }
};

struct timed_action {
  int rank = 0;
  int step = 0;
  action act{};
  double start = 0;
  double finish = 0;
};

struct message_timing {
  int from_rank = 0;
  int to_rank = 0;
  action sent_by{};  // the SEND, or in a compute-only program the compute whose output travels
  double sent = 0;
  double arrived = 0;
};

struct rank_figures {
  double busy = 0;             // time computing
  double idle = 0;             // makespan - busy
  double finish = 0;           // when the rank's last action ends
  int peak_live = 0;           // most (stage, microbatch) activations alive at once (saved for a backward)
  double peak_activation = 0;  // the same, weighted by cost_model::activation
};

struct simulation {
  schedule_shape shape{};
  double makespan = 0;
  double bubble_ratio = 0;  // total idle / (ranks x makespan)
  std::vector<rank_figures> ranks;
  std::vector<timed_action> timeline;  // compute actions, by rank then start time
  std::vector<message_timing> messages;

  [[nodiscard]] double total_idle() const {
    double sum = 0;
    for (const auto& r : ranks) sum += r.idle;
    return sum;
  }
  [[nodiscard]] int peak_live() const {
    int peak = 0;
    for (const auto& r : ranks) peak = std::max(peak, r.peak_live);
    return peak;
  }
  [[nodiscard]] double peak_activation() const {
    double peak = 0;
    for (const auto& r : ranks) peak = std::max(peak, r.peak_activation);
    return peak;
  }
};

// Validates the program (throws schedule_error if invalid), then times it.
[[nodiscard]] inline simulation simulate(const program& prog, const cost_model& costs = {}) {
  validate(prog);
  costs.check(prog.shape.num_stages());
  using K = action_kind;
  const bool lowered = is_lowered(prog);
  detail::schedule::action_index index(prog, lowered);
  for (int r = 0; r < static_cast<int>(prog.ranks.size()); ++r)
    for (int t = 0; t < static_cast<int>(prog.ranks[static_cast<std::size_t>(r)].size()); ++t)
      index.at(index.key(prog.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)])) = {r, t};

  const std::size_t ranks = prog.ranks.size();
  simulation result;
  result.shape = prog.shape;
  result.ranks.resize(ranks);
  std::vector<double> finish(index.size(), 0.0);
  std::vector<double> clock(ranks, 0.0);
  detail::schedule::walk_in_dependency_order(
      prog, index, [&](int r, int step, const action& a, const std::optional<action>& dependency) {
        double ready = clock[static_cast<std::size_t>(r)];
        if (dependency) {
          const double sent = finish[index.key(*dependency)];
          const double arrived = sent + costs.communication;
          result.messages.push_back({stage_rank(prog.shape, dependency->stage), r, *dependency, sent, arrived});
          if (is_communication(a.kind)) {  // a receive is posted here; the compute it feeds waits for it
            finish[index.key(a)] = arrived;
            return;
          }
          ready = std::max(ready, arrived);
        }
        if (lowered) {
          const K received = a.kind == K::forward ? K::recv_forward : K::recv_backward;
          if ((a.kind == K::forward || is_input_backward(a.kind)) && index.has(received, a.stage, a.microbatch))
            ready = std::max(ready, finish[index.key(received, a.stage, a.microbatch)]);
        }
        const double duration = costs.cost(a.kind, a.stage);
        const double end = ready + duration;
        finish[index.key(a)] = end;
        // A pair's outputs leave when the pair ends: its sends follow both actions.
        const auto& row = prog.ranks[static_cast<std::size_t>(r)];
        if (step > 0 && row[static_cast<std::size_t>(step) - 1].overlaps_next)
          finish[index.key(row[static_cast<std::size_t>(step) - 1])] = end;
        clock[static_cast<std::size_t>(r)] = end;
        if (is_compute(a.kind)) {
          result.ranks[static_cast<std::size_t>(r)].busy += duration;
          result.timeline.push_back({r, step, a, ready, end});
        }
      });

  for (std::size_t r = 0; r < ranks; ++r) {
    result.ranks[r].finish = clock[r];
    result.makespan = std::max(result.makespan, clock[r]);
  }
  for (auto& figures : result.ranks) figures.idle = result.makespan - figures.busy;
  if (result.makespan > 0) result.bubble_ratio = result.total_idle() / (static_cast<double>(ranks) * result.makespan);

  // Activations live from F to the end of the backward (B, or W when split); program order
  // on a rank is execution order, so no timing is needed. A forward-only program saves
  // nothing for a backward: none are live.
  const bool saves_activations = !is_forward_only(prog);
  for (std::size_t r = 0; r < ranks && saves_activations; ++r) {
    int live = 0;
    double weighted = 0;
    auto& figures = result.ranks[r];
    for (const action& a : prog.ranks[r]) {
      if (a.kind == action_kind::forward) {
        ++live;
        weighted += costs.activation_of(a.stage);
        figures.peak_live = std::max(figures.peak_live, live);
        figures.peak_activation = std::max(figures.peak_activation, weighted);
      } else if (a.kind == action_kind::backward || a.kind == action_kind::backward_weight) {
        --live;
        weighted -= costs.activation_of(a.stage);
      }
    }
  }
  std::stable_sort(result.timeline.begin(), result.timeline.end(), [](const timed_action& x, const timed_action& y) {
    return x.rank != y.rank ? x.rank < y.rank : x.start < y.start;
  });
  return result;
}

}  // namespace baton
