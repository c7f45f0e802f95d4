// baton/pipeline/measure_costs.hpp — a cost model for the planner fitted from what the executor
// measured over a few steps.
//
// Each step_report of a rank holds, per stage of that rank and per action kind, the seconds its
// compute took and how many microbatches ran (action_times). fit_cost_model takes the reports of
// every rank over a few steps and gives each stage the median over the steps of its per-
// microbatch time (one step's mean per report): the median ignores a step slowed by something
// else on the machine, where measured_cost_model's mean over everything would absorb it.
// Messages are not timed by the executor (their waits are), so the link is described by the
// caller: communication = latency + bytes_per_message / bytes_per_second.
#pragma once

#include <baton/pipeline/options.hpp>
#include <baton/pipeline/timing.hpp>
#include <baton/schedule/action.hpp>
#include <baton/schedule/cost_file.hpp>
#include <baton/schedule/simulate.hpp>

#include <algorithm>
#include <cmath>
#include <span>
#include <string>
#include <vector>

namespace baton {

struct link_model {
  double latency_seconds = 0;
  double bytes_per_second = 0;  // 0: messages cost only the latency
  double bytes_per_message = 0; // what one activation or gradient message carries
};

/// The cost model of `num_stages` stages from the reports of every rank over a few steps (any
/// order). A stage that ran full backwards (B) and no split halves gets I = W = B / 2; one that
/// ran split halves gets B = I + W. Throws schedule_error when a stage has no forward timing
/// (its rank's reports are missing) or the link is not finite and non-negative.
[[nodiscard]] inline cost_file fit_cost_model(std::span<const step_report> reports, int num_stages, link_model link = {}) {
  if (num_stages < 1) throw schedule_error("baton::fit_cost_model: num_stages must be at least 1");
  for (double x : {link.latency_seconds, link.bytes_per_second, link.bytes_per_message})
    if (!(x >= 0) || !std::isfinite(x))
      throw schedule_error("baton::fit_cost_model: the link's latency, bandwidth and message size must be finite and >= 0");
  // samples[4 * stage + kind]: one per report that ran it.
  std::vector<std::vector<double>> samples(static_cast<std::size_t>(4 * num_stages));
  for (const step_report& report : reports)
    for (const action_time& t : report.action_times)
      if (t.stage >= 0 && t.stage < num_stages && t.count > 0)
        samples[static_cast<std::size_t>(4 * t.stage + detail::pipeline::cost_slot(t.kind))].push_back(t.seconds / t.count);
  const auto median = [](std::vector<double> v) {
    if (v.empty()) return -1.0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };
  cost_file out;
  cost_model& c = out.costs;
  c.forward.assign(static_cast<std::size_t>(num_stages), 0);
  c.backward = c.backward_input = c.backward_weight = c.forward;
  for (int s = 0; s < num_stages; ++s) {
    const auto u = static_cast<std::size_t>(s);
    const double f = median(samples[4 * u]), b = median(samples[4 * u + 1]), in = median(samples[4 * u + 2]),
                 w = median(samples[4 * u + 3]);
    if (f < 0)
      throw schedule_error("baton::fit_cost_model: stage " + std::to_string(s) +
                           " has no forward timing in the reports; pass the step_report of every rank");
    c.forward[u] = f;
    c.backward_input[u] = in >= 0 ? in : (b >= 0 ? b / 2 : 0);
    c.backward_weight[u] = w >= 0 ? w : (b >= 0 ? b / 2 : 0);
    c.backward[u] = b >= 0 ? b : c.backward_input[u] + c.backward_weight[u];
  }
  c.communication =
      link.latency_seconds + (link.bytes_per_second > 0 ? link.bytes_per_message / link.bytes_per_second : 0.0);
  out.bytes_per_message = link.bytes_per_message;
  return out;
}

}  // namespace baton
