// baton/pipeline/options.hpp — what a pipeline executor is configured with
// (pipeline_options, loss_scaling) and what each of its calls reports (step_report,
// buffer_pool_stats).
#pragma once

#include <baton/pipeline/timing.hpp>

#include <cstddef>
#include <optional>
#include <vector>

namespace baton {

/// How per-microbatch losses are combined into the step's loss.
enum class loss_scaling {
  /// Every microbatch counts 1/m: equal to the full-batch mean when microbatches are equal.
  mean_over_microbatches,
  /// Microbatch i counts tokens_i / sum(tokens), with tokens_i = loss.tokens(target_i): the
  /// full-batch token mean when the loss returns its microbatch's token mean.
  by_token_count,
};

struct pipeline_options {
  loss_scaling scaling = loss_scaling::mean_over_microbatches;
  /// step() and eval() return the loss on every pipeline rank, not only on the last stage's.
  bool loss_on_every_rank = false;
  /// Exchange a fingerprint (program, call, side-input shapes, batch and target rows) among
  /// the ranks at the start of each call, so ranks that disagree fail at once with a message
  /// instead of hanging. Without it a target whose rows differ from the batch's is only
  /// caught on a rank that holds both the first and the last stage.
  bool check_agreement = true;
  /// Added to every message tag (the executor's tags start at tags::pipeline::first, see
  /// core/tags.hpp): lets two executors share one communicator, the second with a
  /// tag_offset of at least the first one's tag_offset + tag_count().
  int tag_offset = 0;
};

/// What one step() or eval() reports on this rank.
struct step_report {
  /// The step's loss: on the last stage's rank, or on every rank with loss_on_every_rank.
  std::optional<double> loss;
  /// Peak number of saved states alive at once on this rank during the call, and their bytes
  /// at that moment (saved_state_bytes of each).
  std::size_t peak_live_saved = 0;
  std::size_t peak_saved_bytes = 0;
  /// Actions this rank executed (compute and communication).
  std::size_t actions = 0;
  /// Seconds this rank spent inside its stages' compute, per stage and action kind (forward
  /// with the loss, backward, backward_input, backward_weight; waiting for messages excluded):
  /// the measured costs of the schedule's actions (see measured_cost_model).
  std::vector<action_time> action_times;
  /// The same actions one by one, in the order they ran, with their start and finish (a
  /// measured timeline of this rank: baton::train draws it like a simulated schedule).
  std::vector<action_event> action_events;
  /// The sum of action_times, and the wall time of the whole call on this rank: on a rank of
  /// a pipeline, 1 - compute_seconds / wall_seconds is the share it spent idle or
  /// communicating (its bubble).
  double compute_seconds = 0;
  double wall_seconds = 0;
};

/// Counters of an executor's receive-buffer pools (pipeline_executor::pool_stats()).
struct buffer_pool_stats {
  std::size_t allocations = 0;  // buffers created because none of the right shape was idle
  std::size_t reuses = 0;       // receives served by an idle buffer
  std::size_t idle = 0;         // buffers waiting in the pool now
};

}  // namespace baton
