// baton/train/metrics.hpp — one JSON line per training step (JSON Lines: a file any tool reads
// a line at a time, pandas.read_json(path, lines=True)): the step's loss, learning rate,
// throughput, gradient norm, measured bubble, peak saved memory, wall times of its parts and
// every stage's measured compute times (step_metrics, to_json_line).
#pragma once

#include <baton/pipeline/timing.hpp>
#include <baton/train/report.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace baton::detail::train {

// A JSON number; null for NaN and infinities, which JSON cannot hold.
inline std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char text[32];
  std::snprintf(text, sizeof text, "%.9g", x);
  return text;
}

}  // namespace baton::detail::train

namespace baton::train {

/// What one line of a metrics file holds. `stage_times` is gather_action_times' result (every
/// rank's, so every stage is there); `elapsed` is the run's wall time so far.
struct step_metrics {
  std::int64_t step = 0;
  const lm_step_report* report = nullptr;
  std::vector<action_time> stage_times;
  int num_stages = 0;
  double elapsed = 0;
  std::optional<double> eval_loss;
  /// The writing rank's peak as estimate_memory predicts it (train/memory.hpp), beside the
  /// measured peak_host_bytes.
  std::optional<double> predicted_peak_bytes;
};

/// The step as one line of JSON, no newline inside, keys in this order:
///
///   step, loss, lr, tokens, tokens_per_s, grad_norm, bubble, peak_saved_bytes,
///   peak_host_bytes, [predicted_peak_bytes], minor_faults (world rank 0's own),
///   step_s, data_s, pipeline_s, sync_s (gradient all-reduce), optimizer_s (clipping and
///   AdamW), report_s, elapsed_s, [eval_loss], stages: [{stage, F_s, B_s, I_s, W_s}, ...]
///
/// Times are seconds, of the rank that writes the line: step_s its whole step, cut end to
/// end into data_s (slicing the batch, zeroing the gradients), pipeline_s (its own pipeline
/// call), sync_s, optimizer_s and report_s (reducing the report's figures over the pp group),
/// which add up to step_s but for the clock reads between them (lm_step_report). A stage's
/// F_s ... W_s are its mean seconds per microbatch action over the ranks holding it (0 for a
/// kind its schedule does not run); bubble is the pp group's.
inline std::string to_json_line(const step_metrics& m) {
  using detail::train::json_number;
  const lm_step_report& r = *m.report;
  std::string out = "{\"step\":" + std::to_string(m.step) + ",\"loss\":" + json_number(r.loss) +
                    ",\"lr\":" + json_number(r.lr) + ",\"tokens\":" + std::to_string(r.tokens) +
                    ",\"tokens_per_s\":" + json_number(r.seconds > 0 ? static_cast<double>(r.tokens) / r.seconds : 0) +
                    ",\"grad_norm\":" + json_number(r.grad_norm) + ",\"bubble\":" + json_number(r.bubble_fraction) +
                    ",\"peak_saved_bytes\":" + std::to_string(r.peak_saved_bytes) +
                    ",\"peak_host_bytes\":" + std::to_string(r.peak_host_bytes) +
                    (m.predicted_peak_bytes ? ",\"predicted_peak_bytes\":" + json_number(*m.predicted_peak_bytes) : std::string()) +
                    ",\"minor_faults\":" + std::to_string(r.minor_faults) + ",\"step_s\":" + json_number(r.seconds) +
                    ",\"data_s\":" + json_number(r.data_seconds) + ",\"pipeline_s\":" + json_number(r.own_pipeline_seconds) +
                    ",\"sync_s\":" + json_number(r.sync_seconds) + ",\"optimizer_s\":" + json_number(r.optimizer_seconds) +
                    ",\"report_s\":" + json_number(r.report_seconds) + ",\"elapsed_s\":" + json_number(m.elapsed);
  if (m.eval_loss) out += ",\"eval_loss\":" + json_number(*m.eval_loss);
  out += ",\"stages\":[";
  for (int s = 0; s < m.num_stages; ++s) {
    double mean[4] = {0, 0, 0, 0};
    for (const action_time& t : m.stage_times) {
      if (t.stage != s || t.count <= 0) continue;
      const int k = t.kind == action_kind::forward ? 0 : t.kind == action_kind::backward ? 1 : t.kind == action_kind::backward_input ? 2 : 3;
      mean[k] = t.seconds / t.count;
    }
    out += std::string(s ? "," : "") + "{\"stage\":" + std::to_string(s) + ",\"F_s\":" + json_number(mean[0]) +
           ",\"B_s\":" + json_number(mean[1]) + ",\"I_s\":" + json_number(mean[2]) + ",\"W_s\":" + json_number(mean[3]) + "}";
  }
  return out + "]}";
}

}  // namespace baton::train
