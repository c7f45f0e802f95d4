// baton/train/memory.hpp — how much memory a training run will take, estimated from its
// configuration, schedule and recompute policies before anything is allocated
// (estimate_memory; the model is docs/memory.md), and how much the machine has
// (available_memory), so that a run that cannot fit is refused at once instead of allocating
// for minutes and ending in std::bad_alloc.
#pragma once

#include <baton/cp/sharding.hpp>
#include <baton/nn/config.hpp>
#include <baton/nn/cp_attention.hpp>
#include <baton/schedule/action.hpp>
#include <baton/schedule/program.hpp>
#include <baton/train/config.hpp>
#include <baton/train/detail/memory_model.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <vector>

namespace baton::train {

/// The bytes one rank of a mesh holds at its peak, by what holds them (docs/memory.md). The
/// categories are their values at the moment of the peak, so they sum to it. Counted in
/// double: an absurd configuration gives an absurd number, not an overflow.
struct memory_estimate {
  double parameters = 0;   ///< this rank's stages' weights
  double gradients = 0;    ///< one gradient per weight
  double optimizer = 0;    ///< AdamW's two moments per weight
  /// Saved states of the microbatch-stages in flight: a forward's (by recompute policy), grown
  /// by backward_input to what backward_weight reads, until W (or B) frees them.
  double activations = 0;
  /// Between stages: each microbatch-stage's input, held until its saved state is freed; the
  /// outputs and input gradients not yet passed on; the receive pools; the token ids.
  double messages = 0;
  /// The last stage's logits: their gradient from the loss to the stage's backward (and the
  /// head's copy of it until W), the logits themselves while the loss is computed.
  double logits = 0;
  /// Context-parallel buffers (the ring's K/V blocks and accumulators, Ulysses' gathered
  /// tensors), kept between calls, and the temporaries of the action at the peak.
  double workspace = 0;
  /// Not part of total(): the most bytes of forward-saved states alive at once, what the
  /// pipeline executor reports as peak_saved_bytes.
  double peak_saved = 0;

  double total() const noexcept { return parameters + gradients + optimizer + activations + messages + logits + workspace; }

  /// "1.21 GiB (parameters 0.30, gradients 0.30, AdamW 0.61, activations 0.01, messages 0.00, logits 0.00, workspaces 0.01)"
  std::string text() const {
    const auto gib = [](double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); };
    char out[260];
    std::snprintf(out, sizeof out,
                  "%.3g GiB (parameters %.3g, gradients %.3g, AdamW %.3g, activations %.3g, messages %.3g, logits %.3g, "
                  "workspaces %.3g)",
                  gib(total()), gib(parameters), gib(gradients), gib(optimizer), gib(activations), gib(messages),
                  gib(logits), gib(workspace));
    return out;
  }
};

/// The memory of every pipeline rank (index: pp coordinate) of training `config` under
/// `parallelism` with `schedule`, for element type size `element_bytes` (sizeof(float) with
/// bf16 storage, config.model.storage: then each term at its own size, docs/memory.md), stage s keeping what
/// `stage_policies[s]` says (one per stage of the schedule), per rank of the mesh (every dp
/// and cp replica of a pp rank holds as much). Each rank's program is walked in order: a
/// forward adds its microbatch-stage's saved state, input and output; backward_input grows the
/// state to what backward_weight reads; W or a full backward frees it; the peak is the largest
/// total before, during or after an action (docs/memory.md gives every term). A step after the
/// first: the receive pools and context-parallel buffers are at their size from its start.
/// Throws config_error when the configuration is not valid (the model's sizes, the layers per
/// stage, the number of policies).
inline std::vector<memory_estimate> estimate_memory(const lm_config& config, const lm_parallelism& parallelism,
                                                    const program& schedule, std::size_t element_bytes,
                                                    std::span<const nn::recompute_policy> stage_policies) {
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
  if (static_cast<int>(stage_policies.size()) != stages)
    throw config_error("model", "estimate_memory: " + std::to_string(stage_policies.size()) +
                                    " recompute policies given for the schedule's " + std::to_string(stages) +
                                    " stages; give one per stage");
  for (nn::recompute_policy p : stage_policies)
    if (p != nn::recompute_policy::none && p != nn::recompute_policy::selective && p != nn::recompute_policy::full)
      throw config_error("model", "estimate_memory: recompute = " + std::to_string(static_cast<int>(p)) +
                                      " is not a recompute policy; choose recompute_policy::none, selective or full");
  const bool bf16 = m.storage == nn::activation_storage::bf16;
  if (bf16 && element_bytes != sizeof(float))
    throw config_error("model", "estimate_memory: bf16 storage (model.storage = activation_storage::bf16) keeps float "
                                "blocks' activations in bf16, but element_bytes is " + std::to_string(element_bytes) +
                                    "; give sizeof(float), or activation_storage::native for double");
  const double b = static_cast<double>(element_bytes);
  // Each term at its element size: bf16 storage halves what is kept after a forward and sent.
  const detail::train::element_sizes e{b, bf16 ? 2.0 : b};
  const double per_stage = static_cast<double>(config.layers / stages);
  const detail::train::token_sizes z(m);
  const double vocab = z.vocab;

  // Tokens of one microbatch on one rank: its rows (the largest microbatch) times its shard.
  const mesh_shape& mesh = parallelism.mesh;
  const bool sharded = parallelism.cp != nn::cp_mode::none && mesh.cp_ring * mesh.cp_ulysses > 1;
  const int cp = sharded ? mesh.cp_ring * mesh.cp_ulysses : 1;
  const double seq = static_cast<double>(config.seq);
  const double seq_local = static_cast<double>((config.seq + cp - 1) / cp);
  const int microbatches = std::max(1, shape.microbatches);
  const double rows = static_cast<double>((config.batch + microbatches - 1) / microbatches);
  const double n = rows * seq_local;
  const detail::train::stage_sizes sizes(m, stages, per_stage, n, seq_local, e);
  const double hidden = sizes.hidden();  // a stage's input or output, or its gradient

  const auto policy = [&](int s) { return stage_policies[static_cast<std::size_t>(s)]; };
  const auto stage_weights = [&](int s) { return sizes.weights(s); };
  // A microbatch-stage's saved state after its forward, and after its backward_input.
  const auto forward_state = [&](int s) { return sizes.forward_state(s, policy(s)); };
  const auto input_state = [&](int s) { return sizes.input_state(s); };

  // Context-parallel buffers, kept between calls (their pool and Ulysses' workspaces are
  // metered like tensors).
  const auto cp_workspace = [&](int blocks_here) {
    if (!sharded) return 0.0;
    const int ring = parallelism.cp == nn::cp_mode::ulysses ? 1 : mesh.cp_ring;
    const int ulysses = parallelism.cp == nn::cp_mode::ring ? 1 : mesh.cp_ulysses;
    const auto split = [](std::int64_t heads, int u) { return static_cast<double>((heads + u - 1) / u); };
    // After the Ulysses exchange a rank attends over the ring shard's tokens for its heads.
    const double ring_tokens = rows * static_cast<double>((config.seq + ring - 1) / ring);
    const double hd = static_cast<double>(m.head_dim);
    const double q_elems = ring_tokens * split(m.heads, ulysses) * hd, kv_elems = ring_tokens * split(m.kv_heads, ulysses) * hd;
    const double lse_elems = ring_tokens * split(m.heads, ulysses);
    double bytes = 0;
    // ring_attention stages its dense shards head-major (hybrid's ring computes on the
    // gathered tensors, head-major already); with one head the two layouts are one.
    const detail::train::ring_staging staged{ulysses == 1 && m.heads > 1, ulysses == 1 && m.kv_heads > 1};
    if (ring > 1)
      bytes += detail::train::pool_bytes(detail::train::ring_forward_leases(ring, kv_elems, q_elems, lse_elems, e, staged),
                                         detail::train::ring_backward_leases(ring, kv_elems, q_elems, e, staged));
    if (ulysses > 1) {
      // Per block (ulysses_workspace): q, O, dO, dq and k, v, dk, dv gathered, the LSE, and the
      // exchange's send and receive scratch (q, k and v of this rank's shard at once).
      const double exchange = n * (z.q + 2 * z.k);
      bytes += blocks_here * (e.stored * (4 * q_elems + 4 * kv_elems + 2 * exchange) + e.value * lse_elems);
    }
    return bytes;
  };

  std::vector<memory_estimate> out(static_cast<std::size_t>(shape.ranks));
  for (int r = 0; r < shape.ranks && r < static_cast<int>(schedule.ranks.size()); ++r) {
    memory_estimate fixed;
    int blocks_here = 0;
    bool first_here = false, last_here = false;
    for (int s = 0; s < stages; ++s) {
      if (stage_rank(shape, s) != r) continue;
      fixed.parameters += stage_weights(s) * b;
      blocks_here += static_cast<int>(per_stage);
      first_here = first_here || s == 0;
      last_here = last_here || s == stages - 1;
    }
    fixed.gradients = fixed.parameters;
    fixed.optimizer = 2 * fixed.parameters;
    fixed.workspace = cp_workspace(blocks_here);
    // The step's token ids: the global batch (tokens and targets, every rank), this rank's rows
    // of it, the microbatches of the first stage's input and of the loss's targets.
    const double ids = 8 * static_cast<double>(config.batch) * seq_local;
    fixed.messages = 2 * 8 * static_cast<double>(mesh.dp * config.batch) * seq + 2 * ids + (first_here ? ids : 0) +
                     (last_here ? ids : 0);

    // Per microbatch-stage: what the walk holds.
    const auto idx = [&](int s, int mb) { return static_cast<std::size_t>(s) * static_cast<std::size_t>(microbatches) + static_cast<std::size_t>(mb); };
    const std::size_t cells = static_cast<std::size_t>(stages) * static_cast<std::size_t>(microbatches);
    const std::vector<action>& actions = schedule.ranks[static_cast<std::size_t>(r)];
    const auto on_rank = [&](int s) { return s >= 0 && s < stages && stage_rank(shape, s) == r; };

    // Two passes: the first finds how many receive buffers each pool grows to, the second
    // walks with the pools at that size from the start (the steady state of every later step).
    double pool_in = 0, pool_grad = 0;
    memory_estimate best;
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<double> state(cells, 0), input(cells, 0), output(cells, 0), input_grad(cells, 0), loss_grad(cells, 0);
      std::vector<char> pooled(cells, 0);
      double saved = 0, saved_forward = 0, peak_saved = 0, loose = 0, held_logits = 0;
      int in_use_in = 0, in_use_grad = 0, most_in = 0, most_grad = 0;
      best = fixed;
      const auto consider = [&](double extra_activations, double extra_logits, double extra_workspace) {
        memory_estimate now = fixed;
        now.activations = saved + extra_activations;
        now.messages += loose + (pool_in + pool_grad) * hidden;
        now.logits = held_logits + extra_logits;
        now.workspace += extra_workspace;
        now.peak_saved = 0;
        if (now.total() > best.total()) best = now;
      };
      // W (or a full backward) ends a microbatch-stage: its state and its input go.
      const auto free_state = [&](std::size_t c) {
        saved -= state[c];
        state[c] = 0;
        if (pooled[c]) --in_use_in;
        loose -= input[c];
        input[c] = 0;
        pooled[c] = 0;
      };
      for (const action& a : actions) {
        const int s = a.stage, mb = a.microbatch;
        if (s < 0 || s >= stages || mb < 0 || mb >= microbatches) continue;
        const std::size_t c = idx(s, mb);
        const bool last = s == stages - 1;
        switch (a.kind) {
          case action_kind::forward: {
            // The input: the previous stage's output on this rank, or a received buffer.
            if (s > 0) {
              if (on_rank(s - 1)) {
                loose -= output[idx(s - 1, mb)];
                output[idx(s - 1, mb)] = 0;
                input[c] = hidden;
                loose += hidden;
              } else {
                pooled[c] = 1;
                most_in = std::max(most_in, ++in_use_in);
              }
            }
            const double kept = forward_state(s);
            const double extra = z.forward_extra_bytes(policy(s), e) * n;
            consider(kept, 0, extra);  // the last block's largest moment, every block before it kept
            if (last) {
              consider(kept, 2 * n * vocab * b, 0);  // the loss: logits and their gradient
              loss_grad[c] = n * vocab * b;
              held_logits += loss_grad[c];
            } else if (on_rank(s + 1)) {
              output[c] = hidden;
              loose += hidden;
            } else {
              consider(kept, 0, hidden);  // the output until it is sent
            }
            state[c] = kept;
            saved += kept;
            saved_forward += kept;
            peak_saved = std::max(peak_saved, saved_forward);
            break;
          }
          case action_kind::backward:
          case action_kind::backward_input: {
            // The output gradient: the loss's, the next stage's on this rank, or received.
            bool grad_pooled = false;
            if (!last) {
              if (on_rank(s + 1)) {
                loose -= input_grad[idx(s + 1, mb)];
                input_grad[idx(s + 1, mb)] = 0;
                loose += hidden;  // now this stage's dy, freed below
              } else {
                grad_pooled = true;
                most_grad = std::max(most_grad, ++in_use_grad);
              }
            }
            const double grown = a.kind == action_kind::backward ? sizes.fused_backward_state(s, policy(s)) : input_state(s);
            saved += grown - state[c];
            saved_forward -= state[c];
            state[c] = grown;
            // The end of backward_input: every block grown, its temporaries and the result dx;
            // a fused backward's temporaries are in its growth, beside the incoming gradient.
            const double temporaries = a.kind == action_kind::backward ? z.d : z.backward_temporaries();
            consider(0, 0, temporaries * n * b + (s > 0 ? hidden : 0));
            if (last) {
              held_logits -= loss_grad[c];
              loss_grad[c] = 0;
            } else if (grad_pooled) {
              --in_use_grad;
            } else {
              loose -= hidden;
            }
            if (s > 0) {
              if (on_rank(s - 1)) {
                input_grad[c] = hidden;
                loose += hidden;
              } else {
                consider(0, 0, hidden);  // dx until it is sent
              }
            }
            if (a.kind == action_kind::backward) free_state(c);
            break;
          }
          case action_kind::backward_weight: free_state(c); break;
          default: break;
        }
      }
      pool_in = most_in;
      pool_grad = most_grad;
      best.peak_saved = peak_saved;
    }
    out[static_cast<std::size_t>(r)] = best;
  }
  return out;
}

/// The same with the stages keeping what `config.stage_recompute` says (one per stage), or,
/// where it is empty, every stage what `config.model.recompute` says: what lm_trainer applies.
inline std::vector<memory_estimate> estimate_memory(const lm_config& config, const lm_parallelism& parallelism,
                                                    const program& schedule, std::size_t element_bytes) {
  if (!config.stage_recompute.empty())
    return estimate_memory(config, parallelism, schedule, element_bytes, config.stage_recompute);
  const std::vector<nn::recompute_policy> policies(static_cast<std::size_t>(std::max(0, schedule.shape.num_stages())),
                                                   config.model.recompute);
  return estimate_memory(config, parallelism, schedule, element_bytes, policies);
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
