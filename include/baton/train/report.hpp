// baton/train/report.hpp — what one step or eval of a trainer reports (lm_step_report): the
// loss and its tokens, the gradient norm, wall times, the measured bubble and memory.
#pragma once

#include <baton/pipeline/timing.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace baton::train {

/// What one step (or eval) reports, the same on every rank unless said otherwise.
struct lm_step_report {
  /// Mean loss over the step's counted tokens (the whole global batch).
  double loss = 0;
  /// Tokens counted in the loss, whole mesh.
  std::int64_t tokens = 0;
  /// Gradient 2-norm over the whole model before clipping (step only).
  double grad_norm = 0;
  /// The learning rate this step's optimizer update used (lm_config::learning_rate; step only).
  double lr = 0;
  /// Wall seconds of the whole step on this rank (slicing, pipeline, reductions, optimizer).
  double seconds = 0;
  /// Wall seconds of the pipeline call, its longest over the pp group (0 from lm_reference,
  /// which runs no pipeline).
  double pipeline_seconds = 0;
  /// This rank's `seconds`, cut end to end into five measured parts (lm_trainer; they add up
  /// to it but for the clock reads between them): data_seconds (slicing the batch, zeroing
  /// the gradients), own_pipeline_seconds (this rank's pipeline call), sync_seconds,
  /// optimizer_seconds, and report_seconds (reducing this report's figures over the pp
  /// group: mostly waiting for its slowest rank).
  double data_seconds = 0;
  double own_pipeline_seconds = 0;
  double report_seconds = 0;
  /// This rank's wall seconds in the gradient all-reduce over the replicas, and in clipping
  /// and the optimizer step (step only).
  double sync_seconds = 0;
  double optimizer_seconds = 0;
  /// 1 - mean over the pp group of (compute seconds / pipeline seconds): the share of the
  /// pipeline call its ranks spent waiting (bubbles and communication).
  double bubble_fraction = 0;
  /// Peak bytes of saved state (activations kept for backward) on any rank of the pp group.
  std::size_t peak_saved_bytes = 0;
  /// This rank's measured memory in the step: the most bytes its thread's host_tensors and
  /// AdamW moments held at once (host_tensor_memory: parameters, gradients, activations,
  /// messages), and the minor page faults of its thread (0 where the system does not count
  /// them per thread). Measured where the rank is a thread of its own (the local world, one
  /// process per rank over MPI).
  std::int64_t peak_host_bytes = 0;
  std::int64_t minor_faults = 0;
  /// This rank's measured compute per stage and action kind (see measured_cost_model).
  std::vector<action_time> action_times;
  /// The same actions one by one with their start and finish on this rank (a measured
  /// timeline: train/timeline.hpp gathers every rank's and draws them).
  std::vector<action_event> action_events;
};

}  // namespace baton::train
