// baton/train/timeline.hpp — what a step measured, on every rank: each rank's compute actions
// with their start and finish (lm_step_report::action_events) gathered over the world and made
// a baton::simulation, so the schedule layer's renderers draw the measured step exactly as
// they draw a simulated one (a Chrome/Perfetto trace, an SVG Gantt chart); every stage's mean
// F / B / I / W time; and the measured step beside the simulator's prediction for the same
// costs, in one trace or one picture.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/pipeline/timing.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/render.hpp>
#include <baton/schedule/simulate.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace baton::detail::train {

inline std::string short_number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.4g", x);
  return text;
}

// Where a compute kind's figures go among a stage's four (F, B, I, W).
constexpr int kind_slot(action_kind kind) noexcept {
  switch (kind) {
    case action_kind::forward: return 0;
    case action_kind::backward: return 1;
    case action_kind::backward_input: return 2;
    default: return 3;
  }
}

}  // namespace baton::detail::train

namespace baton::train {

/// Every rank's action events, indexed by world rank, on every rank. Collective over `world`
/// (two all-reduces; sums of zeros and one rank's value, so exact).
template <class Comm>
std::vector<std::vector<action_event>> gather_action_events(Comm& world, std::span<const action_event> mine) {
  static_assert(all_reduce_communicator<Comm>,
                "baton::train::gather_action_events: Comm must all-reduce (local_communicator and mpi_communicator do)");
  const auto n = static_cast<std::size_t>(world.size());
  const auto me = static_cast<std::size_t>(world.rank());
  std::vector<double> counts(n, 0.0);
  counts[me] = static_cast<double>(mine.size());
  world.all_reduce(std::span<double>(counts), reduce_op::sum);
  const auto most = static_cast<std::size_t>(*std::max_element(counts.begin(), counts.end()));
  constexpr std::size_t fields = 5;
  std::vector<double> table(n * most * fields, 0.0);
  for (std::size_t i = 0; i < mine.size(); ++i) {
    double* row = table.data() + (me * most + i) * fields;
    row[0] = mine[i].stage;
    row[1] = static_cast<double>(static_cast<int>(mine[i].kind));
    row[2] = mine[i].microbatch;
    row[3] = mine[i].start;
    row[4] = mine[i].finish;
  }
  world.all_reduce(std::span<double>(table), reduce_op::sum);
  std::vector<std::vector<action_event>> out(n);
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t i = 0; i < static_cast<std::size_t>(counts[r]); ++i) {
      const double* row = table.data() + (r * most + i) * fields;
      out[r].push_back({static_cast<int>(row[0]), static_cast<action_kind>(static_cast<int>(row[1])),
                        static_cast<int>(row[2]), row[3], row[4]});
    }
  return out;
}

/// Every stage's measured compute times of a step, summed over every rank that holds the
/// stage: on every rank. Collective over `world`. measured_cost_model(result, stages) makes
/// the simulator's cost model of them (mean seconds per microbatch action).
template <class Comm>
std::vector<action_time> gather_action_times(Comm& world, std::span<const action_time> mine, int num_stages) {
  static_assert(all_reduce_communicator<Comm>,
                "baton::train::gather_action_times: Comm must all-reduce (local_communicator and mpi_communicator do)");
  constexpr action_kind kinds[4] = {action_kind::forward, action_kind::backward, action_kind::backward_input,
                                    action_kind::backward_weight};
  std::vector<double> table(static_cast<std::size_t>(num_stages) * 8, 0.0);  // per stage and kind: seconds, count
  for (const action_time& t : mine) {
    if (t.stage < 0 || t.stage >= num_stages) continue;
    const auto i = static_cast<std::size_t>(t.stage * 4 + detail::train::kind_slot(t.kind)) * 2;
    table[i] += t.seconds;
    table[i + 1] += t.count;
  }
  world.all_reduce(std::span<double>(table), reduce_op::sum);
  std::vector<action_time> out;
  for (int s = 0; s < num_stages; ++s)
    for (int k = 0; k < 4; ++k) {
      const auto i = static_cast<std::size_t>(s * 4 + k) * 2;
      if (table[i + 1] > 0) out.push_back({s, kinds[k], static_cast<int>(table[i + 1]), table[i]});
    }
  return out;
}

/// The measured step as a simulation, in milliseconds (the unit to_chrome_trace writes as
/// 1000 microseconds, so the trace's times are real): one row per world rank, each action
/// with its measured start and finish; busy, idle, finish and peak live microbatch-stages per
/// rank; makespan the latest finish; no messages (their waits are the gaps). `shape` is the
/// schedule's, for the labels and colours.
inline simulation measured_timeline(const std::vector<std::vector<action_event>>& per_rank, const schedule_shape& shape) {
  simulation sim;
  sim.shape = shape;
  sim.ranks.resize(per_rank.size());
  for (std::size_t r = 0; r < per_rank.size(); ++r) {
    int live = 0, step = 0;
    rank_figures& f = sim.ranks[r];
    for (const action_event& e : per_rank[r]) {
      timed_action t;
      t.rank = static_cast<int>(r);
      t.step = step++;
      t.act = action(e.stage, e.kind, e.microbatch);
      t.start = e.start * 1000.0;
      t.finish = e.finish * 1000.0;
      sim.timeline.push_back(t);
      f.busy += t.finish - t.start;
      f.finish = std::max(f.finish, t.finish);
      live += e.kind == action_kind::forward ? 1
              : (e.kind == action_kind::backward || e.kind == action_kind::backward_weight) ? -1
                                                                                           : 0;
      f.peak_live = std::max(f.peak_live, live);
      f.peak_activation = f.peak_live;
    }
    sim.makespan = std::max(sim.makespan, f.finish);
  }
  double idle = 0;
  for (rank_figures& f : sim.ranks) {
    f.idle = sim.makespan - f.busy;
    idle += f.idle;
  }
  sim.bubble_ratio = sim.makespan > 0 && !sim.ranks.empty() ? idle / (sim.makespan * static_cast<double>(sim.ranks.size())) : 0;
  return sim;
}

/// The simulator's timeline of `schedule` under the costs measured in the same step (`times`:
/// gather_action_times' result), in milliseconds like measured_timeline, no message cost.
inline simulation simulated_timeline(const program& schedule, std::span<const action_time> times) {
  cost_model costs = measured_cost_model(times, schedule.shape.num_stages());
  for (auto* v : {&costs.forward, &costs.backward, &costs.backward_input, &costs.backward_weight})
    for (double& x : *v) x *= 1000.0;
  return simulate(schedule, costs);
}

/// One Chrome/Perfetto trace holding the measured step (process 0, a track per world rank)
/// and the simulated one (process 1, a track per pipeline rank), in to_chrome_trace's format:
/// open it in ui.perfetto.dev or chrome://tracing to see both on one time axis.
inline std::string measured_vs_simulated_trace(const simulation& measured, const simulation& simulated,
                                               std::string_view title) {
  const std::string a = to_chrome_trace(measured, std::string(title) + ": measured");
  std::string b = to_chrome_trace(simulated, std::string(title) + ": simulated from the measured costs");
  // The second trace's events, moved to process 1: its pids are the only "pid":0 it holds
  // (the title is escaped, so it cannot contain that text).
  const std::string from = "\"pid\":0", to = "\"pid\":1";
  for (std::size_t at = b.find(from); at != std::string::npos; at = b.find(from, at + to.size())) b.replace(at, from.size(), to);
  const std::size_t a_end = a.rfind("\n]}");
  const std::size_t b_begin = b.find('[') + 1;
  return a.substr(0, a_end) + "," + b.substr(b_begin);
}

/// One SVG picture: the measured step's Gantt chart above the simulated one, on the same time
/// scale (to_svg's charts, stacked).
inline std::string measured_vs_simulated_svg(simulation measured, simulation simulated, std::string_view title) {
  const auto figures = [](const simulation& sim) {
    return "makespan " + detail::train::short_number(sim.makespan) + " ms, bubble " +
           detail::train::short_number(100 * sim.bubble_ratio) + " %";
  };
  svg_options options;
  options.show_figures = false;  // the figures go in each title: the common scale stretches one makespan
  const double span = std::max(measured.makespan, simulated.makespan);
  options.title = std::string(title) + ": measured, " + figures(measured);
  measured.makespan = span;
  const std::string top = to_svg(measured, options);
  options.title = std::string(title) + ": simulated from the same step's measured costs, " + figures(simulated);
  simulated.makespan = span;
  const std::string bottom = to_svg(simulated, options);
  const auto height_of = [](const std::string& svg) {
    const std::size_t at = svg.find("height=\"") + 8;
    return std::stod(svg.substr(at, svg.find('"', at) - at));
  };
  const double h1 = height_of(top), h2 = height_of(bottom);
  return "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(options.width) + "\" height=\"" +
         detail::train::short_number(h1 + h2) + "\">\n<svg y=\"0\">\n" + top + "</svg>\n<svg y=\"" +
         detail::train::short_number(h1) + "\">\n" + bottom + "</svg>\n</svg>\n";
}

}  // namespace baton::train
