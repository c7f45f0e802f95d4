// baton/train/memory.hpp — how much memory a training run will take, estimated from its
// configuration and schedule before anything is allocated (estimate_memory), and how much the
// machine has (available_memory), so that a run that cannot fit is refused at once instead of
// allocating for minutes and ending in std::bad_alloc.
#pragma once

#include <baton/cp/sharding.hpp>
#include <baton/nn/config.hpp>
#include <baton/nn/cp_attention.hpp>
#include <baton/schedule/action.hpp>
#include <baton/schedule/program.hpp>
#include <baton/train/config.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace baton::detail::train {

// Elements of one transformer block's weights (nn/block.hpp: two RMSNorm gains, wq wk wv wo,
// SwiGLU's gate, up and down).
inline double block_weights(const baton::nn::transformer_config& m) {
  const double d = static_cast<double>(m.d_model), hd = static_cast<double>(m.head_dim);
  const double h = static_cast<double>(m.heads), kv = static_cast<double>(m.kv_heads), f = static_cast<double>(m.ffn_hidden);
  const double bias = m.qkv_bias ? (h + 2 * kv) * hd : 0;
  return 2 * d + d * (h + 2 * kv) * hd + bias + h * hd * d + 3 * d * f;
}

// Elements a block saves per token after its forward (the saved states of nn/block.hpp: each
// norm's normalised input and 1 / rms; attention's input, q, k, v, output and log-sum-exp per
// head; the MLP's input, gate, up and their product).
inline double block_saved_per_token(const baton::nn::transformer_config& m) {
  const double d = static_cast<double>(m.d_model), hd = static_cast<double>(m.head_dim);
  const double h = static_cast<double>(m.heads), kv = static_cast<double>(m.kv_heads), f = static_cast<double>(m.ffn_hidden);
  return 2 * (d + 1) + d + (2 * h + 2 * kv) * hd + h + d + 3 * f;
}

}  // namespace baton::detail::train

namespace baton::train {

/// The bytes one rank of a mesh will hold at its peak, by what holds them. Counted in double:
/// an absurd configuration gives an absurd number, not an overflow.
struct memory_estimate {
  double parameters = 0;   ///< this rank's stages' weights
  double gradients = 0;    ///< one gradient per weight
  double optimizer = 0;    ///< AdamW's two moments per weight
  double activations = 0;  ///< saved states of the microbatch-stages in flight at the schedule's peak
  double workspace = 0;    ///< transient buffers: logits and their gradient, backward scratch, messages
  double total() const noexcept { return parameters + gradients + optimizer + activations + workspace; }

  /// "1.21 GiB (parameters 0.30, gradients 0.30, AdamW 0.61, activations 0.01, workspaces 0.01)"
  std::string text() const {
    const auto gib = [](double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); };
    char out[200];
    std::snprintf(out, sizeof out,
                  "%.3g GiB (parameters %.3g, gradients %.3g, AdamW %.3g, activations %.3g, workspaces %.3g)",
                  gib(total()), gib(parameters), gib(gradients), gib(optimizer), gib(activations), gib(workspace));
    return out;
  }
};


/// The memory of every pipeline rank (index: pp coordinate) of training `config` under
/// `parallelism` with `schedule`, for element type size `element_bytes`, per rank of the mesh
/// (every dp and cp replica of a pp rank holds as much). Activations follow the schedule: each
/// rank's program is walked in order, a forward adds its microbatch-stage's saved state, a
/// full backward or a weight-gradient action frees it, and the peak is kept. Throws
/// config_error when the configuration is not valid (the model's sizes, the layers per stage).
inline std::vector<memory_estimate> estimate_memory(const lm_config& config, const lm_parallelism& parallelism,
                                                    const program& schedule, std::size_t element_bytes) {
  nn::transformer_config m;
  try {
    m = config.model.resolved();
  } catch (const nn::nn_error& e) {
    throw config_error("model", e.what());
  }
  const schedule_shape& shape = schedule.shape;
  const int stages = shape.num_stages();
  if (stages < 1 || config.layers < stages || config.layers % stages != 0)
    throw config_error("layers", std::to_string(config.layers) + " layers cannot be split evenly into the schedule's " +
                                     std::to_string(stages) + " stages");
  const double bytes = static_cast<double>(element_bytes);
  const double per_stage = static_cast<double>(config.layers / stages);
  const double d = static_cast<double>(m.d_model), vocab = static_cast<double>(m.vocab);

  // Tokens of one microbatch on one rank: its rows (the largest microbatch) times its shard.
  const int cp = parallelism.mesh.cp_ring * parallelism.mesh.cp_ulysses;
  const double seq_local = parallelism.cp == nn::cp_mode::none || cp <= 1
                               ? static_cast<double>(config.seq)
                               : static_cast<double>((config.seq + cp - 1) / cp);
  const int microbatches = std::max(1, shape.microbatches);
  const double rows = static_cast<double>((config.batch + microbatches - 1) / microbatches);
  const double tokens = rows * seq_local;

  const auto stage_weights = [&](int s) {
    double w = per_stage * detail::train::block_weights(m);
    if (s == 0) w += vocab * d;                   // the embedding
    if (s == stages - 1) w += d + d * vocab;      // the final norm and the untied LM head
    return w;
  };
  const auto stage_saved = [&](int s) {  // bytes one microbatch-stage keeps from F to its (W or B)
    double e = per_stage * (detail::train::block_saved_per_token(m) * tokens * bytes + seq_local * 8);  // + positions
    if (s == 0) e += tokens * 8;                             // the token ids
    if (s == stages - 1) e += (2 * d + 1) * tokens * bytes;  // the head's norm and its linear's input
    return e;
  };
  const double logits = vocab * tokens * bytes;  // one microbatch's logits, or their gradient

  std::vector<memory_estimate> out(static_cast<std::size_t>(shape.ranks));
  for (int r = 0; r < shape.ranks && r < static_cast<int>(schedule.ranks.size()); ++r) {
    memory_estimate& e = out[static_cast<std::size_t>(r)];
    double largest_stage = 0;
    for (int s = 0; s < stages; ++s) {
      if (stage_rank(shape, s) != r) continue;
      e.parameters += stage_weights(s) * bytes;
      largest_stage = std::max(largest_stage, stage_saved(s));
    }
    e.gradients = e.parameters;
    e.optimizer = 2 * e.parameters;
    double live = 0, peak = 0;
    int live_count = 0, peak_count = 0, live_last = 0, peak_last = 0;
    for (const action& a : schedule.ranks[static_cast<std::size_t>(r)]) {
      if (a.stage < 0 || a.stage >= stages) continue;
      const int delta = a.kind == action_kind::forward ? 1
                        : (a.kind == action_kind::backward || a.kind == action_kind::backward_weight) ? -1
                                                                                                     : 0;
      live += delta * stage_saved(a.stage);
      live_count += delta;
      // The last stage's loss gradient (the logits' size) lives from its F to its B or I.
      if (a.stage == stages - 1) {
        if (a.kind == action_kind::forward) ++live_last;
        if (a.kind == action_kind::backward || a.kind == action_kind::backward_input) --live_last;
      }
      peak = std::max(peak, live);
      peak_count = std::max(peak_count, live_count);
      peak_last = std::max(peak_last, live_last);
    }
    e.activations = peak;
    // Transients: the backward of the largest microbatch-stage allocates about as much again
    // (a gradient of each saved tensor); the logits' gradients in flight, and the logits and
    // their softmax of the forward being computed; one activation and one gradient message
    // buffer per microbatch in flight.
    e.workspace = largest_stage + static_cast<double>(peak_count) * 2 * d * tokens * bytes;
    if (stage_rank(shape, stages - 1) == r) e.workspace += static_cast<double>(peak_last + 2) * logits;
  }
  return out;
}

/// MemAvailable of /proc/meminfo in bytes (what the kernel can give without swapping), or
/// nothing where that file is missing or unreadable (not Linux).
inline std::optional<double> available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (in && std::getline(in, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    double kib = 0;
    std::string unit;
    if (fields >> kib >> unit && unit == "kB") return kib * 1024.0;
  }
  return std::nullopt;
}

}  // namespace baton::train
