// baton/train/detail/memory_model.hpp — the bytes of each piece of a training step on one rank,
// read off the model layer's saved states (nn/block.hpp, nn/attention.hpp, nn/swiglu.hpp,
// nn/rms_norm.hpp, nn/head.hpp), the executor's per-microbatch state
// (pipeline/detail/microbatch_state.hpp) and the context-parallel buffers (cp/detail/ring_core.hpp,
// cp/ulysses.hpp); estimate_memory (train/memory.hpp) walks a rank's program with them, and
// plan_under_memory_cap (train/memory_plan.hpp) gives the planner the same figures.
#pragma once

#include <baton/nn/config.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

namespace baton::detail::train {

// Bytes of one element of each kind of state (docs/nn.md, "bf16 storage"). `stored`: what
// activation_storage::bf16 keeps and sends in bf16 (q, k, v, O, the norms' x̂, the attention's
// and the MLP's inputs, gate, up, product, the block's input under full; the messages between
// stages and their gradients; the ring's K/V blocks). `value`: all else, in the model's type
// (weights, gradients, AdamW, 1/rms, the LSE, what a block holds between I and W but O, the
// ring's dK/dV and O accumulators, the logits, every temporary). Equal without bf16 storage.
struct element_sizes {
  double value = 4, stored = 4;
  bool bf16() const noexcept { return stored != value; }
};

// Per-token sizes of one model, in elements.
struct token_sizes {
  double d = 0, q = 0, k = 0, f = 0, h = 0, vocab = 0;
  explicit token_sizes(const baton::nn::transformer_config& m)
      : d(static_cast<double>(m.d_model)), q(static_cast<double>(m.heads * m.head_dim)),
        k(static_cast<double>(m.kv_heads * m.head_dim)), f(static_cast<double>(m.ffn_hidden)),
        h(static_cast<double>(m.heads)), vocab(static_cast<double>(m.vocab)) {}

  // What a block keeps from its forward to its backward_input, per token (transformer_block::
  // saved): norms x̂ (d) and 1/rms (1) each; attention x (d), q, k, v, O, LSE (one per head);
  // MLP x (d), gate, up, product (f each). selective drops the norms' outputs (attention's and
  // the MLP's x) and the product; full keeps the block's input only.
  double block_forward(baton::nn::recompute_policy p) const {
    const double none = 2 * (d + 1) + d + 2 * q + 2 * k + h + d + 3 * f;
    switch (p) {
      case baton::nn::recompute_policy::none: return none;
      case baton::nn::recompute_policy::selective: return none - 2 * d - f;
      case baton::nn::recompute_policy::full: return d;
    }
    return none;
  }
  // What backward_input leaves for backward_weight, whatever the policy: norms x̂, 1/rms, dy;
  // attention x, O, dy, dq, dk, dv (q, k, v and the LSE are freed); MLP x, product, dy and the
  // gate's and up's gradients (written over the pre-activations).
  double block_after_input() const { return 2 * (2 * d + 1) + (2 * d + 2 * q + 2 * k) + (2 * d + 3 * f); }

  // In bytes per token, each term at its element size (`e`): the forward's state (the
  // elements of block_forward), the state backward_input leaves, and the part of a block's
  // state alive beyond what `p` keeps at the two moments of its forward that hold the most:
  // inside the attention (the norm's state and the attention's; temporaries: the previous
  // block's output, d) and when the MLP's output is made (the MLP norm's state and the MLP's;
  // temporaries: that, the residual stream h and the output y, 3 d). A bf16 forward
  // keeps its tensors in float until the block's end (pack), so at the forward's largest moments
  // the block being run holds them at float's size; its attention widens O for the output
  // projection. backward_input widens the packed tensors back: what it leaves for W is float
  // but O, which stays bf16 until W.
  double block_forward_bytes(baton::nn::recompute_policy p, element_sizes e) const {
    const double fp32 = (2 + h) * e.value;  // 1/rms of both norms, the LSE
    switch (p) {
      case baton::nn::recompute_policy::none: return (4 * d + 2 * q + 2 * k + 3 * f) * e.stored + fp32;
      case baton::nn::recompute_policy::selective: return (2 * d + 2 * q + 2 * k + 2 * f) * e.stored + fp32;
      case baton::nn::recompute_policy::full: return d * e.stored;
    }
    return block_forward_bytes(baton::nn::recompute_policy::none, e);
  }
  // Under bf16 storage O stays bf16 until W, and so do the MLP's input and the product
  // (packed by the forward or the recomputation, widened by the MLP's backward_weight),
  // whatever the policy.
  double block_after_input_bytes(element_sizes e) const {
    const double packed = q + d + f;
    return (block_after_input() - packed) * e.value + packed * e.stored;
  }

  // The most one block holds, per token, during its fused backward (transformer_block::backward:
  // each piece's backward_input then its backward_weight, the MLP first), its own temporaries
  // included and the incoming gradient not. Three moments:
  //  - the end of the MLP's backward_input: the whole state (recomputed under full) with the
  //    gate's and up's gradients written over them, the MLP's dy kept for W, its product
  //    gradient and its result;
  //  - the MLP's backward_weight: the same with the MLP's input and product widened (bf16
  //    storage, none) and the product gradient gone;
  //  - the end of the attention's backward_input, the MLP and its norm gone: the attention's
  //    norm, its input and state, the gradient reaching it, dO, dq, dk, dv (and under bf16
  //    storage their bf16 copies), its result and its dy kept for W.
  // What a tensor is held in: q, k, v and O in `stored` (the attention keeps them so under bf16
  // storage); the rest in `stored` from when the forward or the recomputation packed it to the
  // step that first reads it (bf16 storage), else in `value`. Selective recomputes the
  // attention's input only when the attention's backward needs it.
  double block_fused_peak_bytes(baton::nn::recompute_policy p, element_sizes e) const {
    using baton::nn::recompute_policy;
    const double v = e.value, s = e.stored;
    const double attention_input = p == recompute_policy::selective ? 0 : d * s;  // until its backward
    const double qkvo = (2 * q + 2 * k) * s + h * v;                              // with the LSE
    const double attention_side = d * s + v + attention_input + qkvo;             // its norm (x̂, 1/rms), input, state
    const double mlp_norm = d * s + v;
    const double mlp_end_of_input = (d + f) * s + 2 * f * v + d * v  // x and product (packed), d_gate, d_up, dy
                                    + f * v + d * v;                 // d_product, dx
    const double mlp_weight = (d + f) * v + 2 * f * v + d * v + d * v;                   // widened; its result kept
    const double moment_a = attention_side + mlp_norm + mlp_end_of_input;
    const double moment_b = attention_side + mlp_norm + mlp_weight;
    const double attention_end = (d + 1) * v + d * v + qkvo + d * v  // norm (widened), input, state, dh
                                   + q * v + (q + 2 * k) * v + 2 * d * v  // dO, dq dk dv, dx and its dy
                                   + (e.bf16() ? (2 * q + 2 * k) * s : 0);  // dO, dq, dk, dv in bf16
    return std::max({moment_a, moment_b, attention_end});
  }
  double forward_extra_bytes(baton::nn::recompute_policy p, element_sizes e) const {
    using baton::nn::recompute_policy;
    const double b = e.value, s = e.stored, widen = b - s;  // a kept tensor still in float
    const double o_widened = e.bf16() ? q * b : 0;
    double attention = 0, mlp = 0;
    switch (p) {
      case recompute_policy::none:
        attention = 2 * d * widen;                        // x̂ and the attention's input
        mlp = (4 * d + 3 * f) * widen;                    // every packed tensor of the block
        break;
      case recompute_policy::selective:
        attention = d * b + d * widen;                    // the attention's input (dropped); x̂
        mlp = (d + f) * b + (2 * d + 2 * f) * widen;      // the MLP's input and product (dropped); x̂ twice, gate, up
        break;
      case recompute_policy::full:
        attention = (d + 1) * b + d * b + (2 * q + 2 * k) * s + h * b + d * widen;  // norm, attention; the input
        mlp = (d + 1) * b + (d + 3 * f) * b + d * widen;
        break;
    }
    return std::max(attention + d * b + o_widened, mlp + 3 * d * b);
  }

  // Temporaries of a block's backward_input at its largest moment: the incoming gradient (d),
  // the result dx (d) and the MLP's product gradient (f) or the attention's output gradient (q).
  double backward_temporaries() const { return 2 * d + std::max(f, q); }
};

// Elements of one transformer block's weights (nn/block.hpp: two RMSNorm gains, wq wk wv wo,
// SwiGLU's gate, up and down).
inline double block_weights(const baton::nn::transformer_config& m) {
  const double d = static_cast<double>(m.d_model), hd = static_cast<double>(m.head_dim);
  const double h = static_cast<double>(m.heads), kv = static_cast<double>(m.kv_heads), f = static_cast<double>(m.ffn_hidden);
  const double bias = m.qkv_bias ? (h + 2 * kv) * hd : 0;
  return 2 * d + d * (h + 2 * kv) * hd + bias + h * hd * d + 3 * d * f;
}

// A stage's weights and what one of its microbatch-stages keeps, for `stages` stages of
// `per_stage` blocks each, `n` tokens per microbatch on a rank (rows x the cp shard of
// `seq_local` tokens) and `b` bytes per element: one place for the walk of estimate_memory and
// the planner's menu.
struct stage_sizes {
  token_sizes z;
  int stages = 1;
  double per_stage = 1, n = 0, positions = 0;
  element_sizes e{};
  stage_sizes(const baton::nn::transformer_config& m, int stage_count, double blocks_per_stage, double tokens,
              double seq_local, element_sizes sizes)
      : z(m), stages(stage_count), per_stage(blocks_per_stage), n(tokens), positions(seq_local * 8), e(sizes),
        block_elements(block_weights(m)) {}

  // Elements of stage s's weights.
  double weights(int s) const {
    double w = per_stage * block_elements;
    if (s == 0) w += z.vocab * z.d;                    // the embedding
    if (s == stages - 1) w += z.d + z.d * z.vocab;     // the final norm and the untied LM head
    return w;
  }
  // A microbatch-stage's saved state after its forward, and after its backward_input, in bytes.
  double forward_state(int s, baton::nn::recompute_policy p) const {
    double bytes = per_stage * (z.block_forward_bytes(p, e) * n + positions);
    if (s == 0) bytes += n * 8;                                        // the embedding's token ids
    if (s == stages - 1) bytes += (2 * z.d + 1) * n * e.value;         // the head's norm (x̂, 1/rms) and its linear's input
    return bytes;
  }
  double input_state(int s) const {
    double bytes = per_stage * (z.block_after_input_bytes(e) * n + positions);
    if (s == 0) bytes += n * 8 + n * z.d * e.value;                              // + the embedding's dy
    if (s == stages - 1) bytes += (3 * z.d + 1 + z.vocab) * n * e.value;         // + the norm's dy and the linear's dy (dlogits)
    return bytes;
  }
  // The most a microbatch-stage holds inside a fused backward (lm_stage::backward): each piece's
  // backward_input is followed by its backward_weight, which frees it, so at most one piece is
  // grown (the head first, then each block from the last, itself piece by piece:
  // block_fused_peak_bytes, temporaries included) while the others still hold what their
  // forward kept.
  double fused_backward_state(int s, baton::nn::recompute_policy p) const {
    double growth = (z.block_fused_peak_bytes(p, e) - z.block_forward_bytes(p, e)) * n;
    if (s == stages - 1) growth = std::max(growth, (z.d + z.vocab) * n * e.value);  // the head's dy and dlogits
    return forward_state(s, p) + std::max(0.0, growth);
  }
  // A stage's input or output, or its gradient (sent in bf16 under bf16 storage).
  double hidden() const { return n * z.d * e.stored; }

 private:
  double block_elements = 0;
};

// The bytes a workspace_pool (core/workspace.hpp) grows to when calls lease `a`, and other
// calls lease `b`, one call at a time: it hands a lease the smallest free buffer that fits and
// otherwise replaces the largest, so it ends with about one buffer per rank of the two lease
// lists in decreasing order, as large as the larger of the two.
inline double pool_bytes(std::vector<double> a, std::vector<double> b) {
  std::sort(a.begin(), a.end(), std::greater<>());
  std::sort(b.begin(), b.end(), std::greater<>());
  double sum = 0;
  for (std::size_t i = 0; i < std::max(a.size(), b.size()); ++i)
    sum += std::max(i < a.size() ? a[i] : 0.0, i < b.size() ? b[i] : 0.0);
  return sum;
}

// Ring attention's leases of one call (ring_forward, ring_backward for float or double, where
// the accumulators are the caller's tensors): K/V blocks in flight (2 x capacity each; a second
// once the ring has more than 2 ranks), the forward's block output and LSE for the merge, the
// backward's three dK/dV accumulators.
// In bytes, each at its element size (`e`). Under bf16 storage (the ring runs on bf16, its
// accumulators are float): the forward's running O is a float buffer beside the bf16 one
// given, and the backward's dQ accumulator too, with the bf16 dQ, dK, dV of each call, and
// the float sums of the owner's own dK and dV (which float and double sum in dk and dv).
// The ring computes head-major on tensors given dense (ring_attention on the host:
// ring_core.hpp). staged.q (more than one query head): q, and O and dO in the backward, are
// copied and the O and dQ accumulators are buffers; staged.kv (more than one kv head): K and
// V are packed into a block buffer of their own and the own dK, dV sums are buffers.
struct ring_staging {
  bool q = false, kv = false;
};
inline std::vector<double> ring_forward_leases(int ring, double kv_capacity, double q_elems, double lse_elems,
                                               element_sizes e, ring_staging staged = {}) {
  std::vector<double> l{2 * kv_capacity * e.stored, q_elems * e.stored, lse_elems * e.value};
  if (e.bf16() || staged.q) l.push_back(q_elems * e.value);
  if (staged.q) l.push_back(q_elems * e.stored);
  if (ring > 2 || staged.kv) l.push_back(2 * kv_capacity * e.stored);
  return l;
}
inline std::vector<double> ring_backward_leases(int ring, double kv_capacity, double q_elems, element_sizes e,
                                                ring_staging staged = {}) {
  std::vector<double> l{2 * kv_capacity * e.stored, 2 * kv_capacity * e.value, 2 * kv_capacity * e.value,
                        2 * kv_capacity * e.value};
  if (e.bf16()) l.insert(l.end(), {q_elems * e.stored, kv_capacity * e.stored, kv_capacity * e.stored});
  if (e.bf16() || staged.q) l.push_back(q_elems * e.value);
  if (e.bf16() || staged.kv) l.insert(l.end(), {kv_capacity * e.value, kv_capacity * e.value});
  if (staged.q) l.insert(l.end(), {q_elems * e.stored, q_elems * e.stored, q_elems * e.stored});
  if (ring > 2 || staged.kv) l.push_back(2 * kv_capacity * e.stored);
  return l;
}

}  // namespace baton::detail::train
