// baton/attention/detail/flash_backward.hpp — the backward of the host flash kernels:
// D = rowsum(dO * O) and lse in log2 units, packed per query block; a key-block pass (per
// batch, kv head, key block: every query block of every query head of the group) that
// recomputes P and dS once per tile and accumulates all three products from them: dV += P^T dO
// and dK += dS^T Q into the item's own rows, and dQ += dS K into a partial dQ of its run of
// items (one per run, see kokkos.hpp); then a query-block pass that sums the runs' partials in
// run order and writes dQ. Each output element is written by exactly one work item, and every
// sum runs in a fixed order: deterministic, no atomics.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/detail/flash_tiles.hpp>
#include <baton/core/simd.hpp>
#include <baton/core/workspace.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/tensor_view.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numbers>

namespace baton::detail::attention {

/// One round's packed operands of the backward (query units: the round's kv units x group).
template <class T>
struct backward_packed {
  T* q = nullptr;      // per query unit: Q rows [seq_q_padded][dim_padded]
  T* dout = nullptr;   // per query unit: dO rows, same layout
  T* lse2 = nullptr;   // per query unit: [seq_q_padded], lse in log2 units (+inf: no gradient)
  T* delta = nullptr;  // per query unit: [seq_q_padded], D = rowsum(dO * O)
  T* kt = nullptr;     // per (kv unit, key block): K^T, [dim][block_k]
  T* vt = nullptr;     // per (kv unit, key block): V^T, [dim][block_k]
  T* k = nullptr;      // per kv unit: K rows [seq_k_padded][dim_padded]
  // Non-finite rule: per query row 0 (no gradient: lse -inf or padding), 1 (live) or 2 (live
  // and bad: lse NaN or +inf, or q, out or dout non-finite; packed as zeros, P = 0); per query
  // block whether it holds a bad row; per key whether k or v is non-finite, per key block any.
  unsigned char* row_state = nullptr;
  unsigned char* q_block_bad = nullptr;
  unsigned char* key_bad = nullptr;
  unsigned char* block_bad = nullptr;
  // dQ partial sums, one per run of key-pass items: [runs][query rows][dim_padded]; a run
  // zeroes its own before adding to it.
  T* dq_partial = nullptr;
  std::int64_t dq_runs = 0;
};

/// runs: how many key-pass runs (dQ partials) a round may have at most.
template <class T>
backward_packed<T> carve_backward_packing(const flash_layout<T>& layout, std::int64_t runs,
                                          core::workspace_carver& carver) {
  const std::int64_t q_rows = layout.round_units * layout.call.group() * layout.seq_q_padded;
  const std::int64_t kv_blocks = layout.round_units * layout.k_blocks;
  backward_packed<T> packed;
  packed.q = carver.take<T>(q_rows * layout.dim_padded);
  packed.dout = carver.take<T>(q_rows * layout.dim_padded);
  packed.lse2 = carver.take<T>(q_rows);
  packed.delta = carver.take<T>(q_rows);
  packed.kt = carver.take<T>(kv_blocks * layout.call.dim * block_k);
  packed.vt = carver.take<T>(kv_blocks * layout.call.dim * block_k);
  packed.k = carver.take<T>(layout.round_units * layout.seq_k_padded * layout.dim_padded);
  packed.row_state = carver.take<unsigned char>(q_rows);
  packed.q_block_bad = carver.take<unsigned char>(q_rows / block_q);
  packed.key_bad = carver.take<unsigned char>(layout.round_units * layout.seq_k_padded);
  packed.block_bad = carver.take<unsigned char>(kv_blocks);
  packed.dq_partial = carver.take<T>(runs * q_rows * layout.dim_padded);
  packed.dq_runs = runs;
  return packed;
}

/// Work item (query head, query block) of a round's backward packing pass: Q and dO rows,
/// lse in log2 units and D = rowsum(dO * O) (summed in double: it is subtracted from dP,
/// where cancellation would magnify its error). Padding rows get lse2 = +inf, so P = 0 there.
template <class T, class TQ, class TO, class TL, class TD>
inline void pack_q_block(const flash_layout<T>& layout, const head_round& round, std::int64_t item,
                         const tensor_view<TQ, 4>& q, const tensor_view<TO, 4>& out, const tensor_view<TL, 3>& lse,
                         const tensor_view<TD, 4>& dout, const backward_packed<T>& packed) {
  const auto& call = layout.call;
  const auto [unit, b, h, hk, qb, q0, qc, kv_unit] = layout.q_item_at(round, item, false);
  const std::int64_t dim_padded = layout.dim_padded;
  constexpr T inf = std::numeric_limits<T>::infinity();
  bool any_bad = false;
  for (std::int64_t i = 0; i < block_q; ++i) {
    const std::int64_t r = layout.q_row_index(round, unit, q0 + i);
    T* q_dst = packed.q + r * dim_padded;
    T* g_dst = packed.dout + r * dim_padded;
    if (i >= qc) {  // padding rows: zeros, and P = 0 through lse2 = +inf
      std::fill(q_dst, q_dst + dim_padded, T(0));
      std::fill(g_dst, g_dst + dim_padded, T(0));
      packed.lse2[r] = inf;
      packed.delta[r] = T(0);
      packed.row_state[r] = 0;
      continue;
    }
    const auto* qrow = &q(b, q0 + i, h, 0);
    const auto* orow = &out(b, q0 + i, h, 0);
    const auto* grow = &dout(b, q0 + i, h, 0);
    if (i + prefetch_rows_ahead < qc) {
      prefetch_row(&q(b, q0 + i + prefetch_rows_ahead, h, 0), call.dim);
      prefetch_row(&out(b, q0 + i + prefetch_rows_ahead, h, 0), call.dim);
      prefetch_row(&dout(b, q0 + i + prefetch_rows_ahead, h, 0), call.dim);
    }
    load_row(qrow, call.dim, q_dst);
    load_row(grow, call.dim, g_dst);
    std::fill(q_dst + call.dim, q_dst + dim_padded, T(0));
    std::fill(g_dst + call.dim, g_dst + dim_padded, T(0));
    // Independent partial sums: one running double sum is a chain of dependent adds (the
    // compiler may not reassociate it), which cost more than all the packing copies.
    // Eight lanes: one vector of doubles (AVX-512), which the compiler forms from the lanes.
    double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::int64_t d = 0;
    for (; d + 8 <= call.dim; d += 8)
      for (int u = 0; u < 8; ++u) partial[u] += widen<double>(grow[d + u]) * widen<double>(orow[d + u]);
    for (; d < call.dim; ++d) partial[0] += widen<double>(grow[d]) * widen<double>(orow[d]);
    packed.delta[r] = static_cast<T>(((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                                     ((partial[4] + partial[5]) + (partial[6] + partial[7])));
    const double l = static_cast<double>(lse(b, h, q0 + i));
    // A row that attends to nothing (lse = -inf) contributes no gradient: P = 2^(s - inf) = 0.
    const bool live = !(std::isinf(l) && l < 0);
    const bool nonfinite = !all_finite(q_dst, call.dim) || !all_finite(g_dst, call.dim) || !all_finite(orow, call.dim);
    const bool bad = live && (nonfinite || !(l < static_cast<double>(inf)));
    packed.lse2[r] = !live || bad ? inf : static_cast<T>(l * std::numbers::log2e);
    packed.row_state[r] = bad ? 2 : live ? 1 : 0;
    any_bad = any_bad || bad;
    // Zeros and P = 0: the arithmetic stays finite (also for a row without gradient, whose
    // P = 0 would otherwise meet a NaN dout); the rule writes NaN at the end.
    if (bad || nonfinite) {
      std::fill(q_dst, q_dst + call.dim, T(0));
      std::fill(g_dst, g_dst + call.dim, T(0));
      packed.delta[r] = T(0);
    }
  }
  packed.q_block_bad[layout.q_row_index(round, unit, q0) / block_q] = any_bad;
}

/// P and dS for one tile, in place: s holds scores on entry and P on exit; dprob holds dO V^T on
/// entry and dS = P * (dP - D) on exit. In a partial tile, entries outside a row group's
/// computed columns are set to 0, so the key-side products may contract over any rows.
template <class T>
inline void softmax_gradient_tile(const tile_extent<T>& t, T* s, T* dprob, T c, const T* lse2, const T* delta) {
  using V = vec_t<T>;
  constexpr int W = width_v<T>;
  const V cv = broadcast(c);
  for (std::int64_t i = 0; i < t.rows; ++i) {
    const std::int64_t j_begin = t.col_begin[i / tile_rows], j_end = t.col_end[i / tile_rows];
    T* srow = s + i * block_k;
    T* drow = dprob + i * block_k;
    if (t.partial) {
      std::fill(srow, srow + j_begin, T(0));
      std::fill(drow, drow + j_begin, T(0));
      std::fill(srow + std::max(j_begin, j_end), srow + t.kcols, T(0));
      std::fill(drow + std::max(j_begin, j_end), drow + t.kcols, T(0));
    }
    const V neg_lse = broadcast(-lse2[i]);
    const V dv = broadcast(delta[i]);
    for (std::int64_t j = j_begin; j < j_end; j += W) {
      const V prob = exp2_scores<false, T>(fma(load(srow + j), cv, neg_lse));
      store(srow + j, prob);
      store(drow + j, prob * (load(drow + j) - dv));
    }
  }
}

/// Work item (kv head, key block) of a round's key pass: dK and dV of 64 keys, summed over
/// every query head of the group and every query block, and these keys' share of dQ added to
/// dq_partial (the item's run's partial dQ, laid out as packed.q).
template <class T, class Mask, class TG>
inline void backward_kv_tile(const flash_layout<T>& layout, const head_round& round, std::int64_t item,
                             const Mask& mask, const backward_packed<T>& packed, T* dq_partial,
                             const tensor_view<TG, 4>& dk, const tensor_view<TG, 4>& dv, bool accumulate,
                             item_scratch<T>& work) {
  const auto& call = layout.call;
  const std::int64_t dim_padded = layout.dim_padded;
  const auto [unit, b, hk, kb, k0, kc] = layout.kv_item_at(round, item);
  const T c = static_cast<T>(call.scale * std::numbers::log2e);
  const T* kt = packed.kt + layout.kv_block_index(round, unit, kb) * call.dim * block_k;
  const T* vt = packed.vt + layout.kv_block_index(round, unit, kb) * call.dim * block_k;
  const T* k_rows = packed.k + layout.kv_row_index(round, unit, k0) * dim_padded;

  T* const s = work.scores.data();
  T* const dprob = s + block_q * block_k;
  T* const dk_acc = work.rows_a.data();
  T* const dv_acc = work.rows_b.data();
  std::fill(dk_acc, dk_acc + block_k * dim_padded, T(0));
  std::fill(dv_acc, dv_acc + block_k * dim_padded, T(0));
  const unsigned char* key_bad = packed.key_bad + layout.kv_row_index(round, unit, k0);
  const bool keys_bad = packed.block_bad[layout.kv_block_index(round, unit, kb)] != 0;
  unsigned char key_poisoned[block_k] = {};
  tile_extent<T>& tile = *work.tile;
  for (std::int64_t h = hk * call.group(); h < (hk + 1) * call.group(); ++h)
    for (std::int64_t qb = 0; qb < layout.q_blocks; ++qb) {
      const block_kind kind = mask.classify(layout.q_tiles[qb], layout.k_tiles[kb]);
      if (kind == block_kind::empty) continue;
      const std::int64_t q0 = qb * block_q;
      tile.set(kind, mask, layout.q_tiles[qb], layout.k_tiles[kb], std::min(block_q, call.seq_q - q0), kc);
      const std::int64_t r = layout.q_row_index(round, b * call.heads_q + h, q0);
      const T* qrows = packed.q + r * dim_padded;
      const T* grows = packed.dout + r * dim_padded;
      if (keys_bad || packed.q_block_bad[r / block_q]) {
        unsigned char row_bad[block_q], row_live[block_q];
        for (std::int64_t i = 0; i < block_q; ++i) {
          row_bad[i] = packed.row_state[r + i] == 2;
          row_live[i] = packed.row_state[r + i] != 0;
        }
        mark_bad_pairs(tile, std::min(block_q, call.seq_q - q0), row_bad, row_live, key_bad, nullptr, key_poisoned);
      }

      tile_scores(tile, s, qrows, dim_padded, kt, call.dim);
      tile_mask(tile, s);
      tile_scores(tile, dprob, grows, dim_padded, vt, call.dim);
      softmax_gradient_tile(tile, s, dprob, c, packed.lse2 + r, packed.delta + r);
      tile_accumulate_keys(tile, dv_acc, dim_padded, dim_padded, s, grows, dim_padded);   // dV += P^T dO
      tile_accumulate_keys(tile, dk_acc, dim_padded, dim_padded, dprob, qrows, dim_padded);  // dK += dS^T Q
      tile_accumulate_rows(tile, dq_partial + r * dim_padded, dim_padded, dim_padded, dprob, k_rows,
                           dim_padded);  // dQ += dS K
    }

  const T scale = static_cast<T>(call.scale);
  for (std::int64_t j = 0; j < kc; ++j) {
    if (key_poisoned[j]) {
      write_nan_row(row_of(dk, b, k0 + j, hk), call.dim);
      write_nan_row(row_of(dv, b, k0 + j, hk), call.dim);
      continue;
    }
    write_scaled_row(row_of(dk, b, k0 + j, hk), dk_acc + j * dim_padded, scale, call.dim, accumulate);
    write_scaled_row(row_of(dv, b, k0 + j, hk), dv_acc + j * dim_padded, T(1), call.dim, accumulate);
  }
}

/// Work item (query head, query block) of a round's query pass: dQ of 64 queries, the sum of
/// the key pass's runs' partials in run order (a fixed order: the same bits on every call).
/// The non-finite rule needs each row's allowed pairs: only for a block with a bad row or
/// next to a bad key block (rare) does it visit the key tiles, without any arithmetic.
template <class T, class Mask, class TG>
inline void backward_q_tile(const flash_layout<T>& layout, const head_round& round, std::int64_t item, const Mask& mask,
                            const backward_packed<T>& packed, std::int64_t runs, const tensor_view<TG, 4>& dq,
                            bool accumulate, item_scratch<T>& work) {
  using V = vec_t<T>;
  constexpr int W = width_v<T>;
  const auto& call = layout.call;
  const std::int64_t dim_padded = layout.dim_padded;
  const auto [unit, b, h, hk, qb, q0, qc, kv_unit] = layout.q_item_at(round, item, true);
  const std::int64_t r = layout.q_row_index(round, unit, q0);
  const std::int64_t run_stride = layout.round_units * call.group() * layout.seq_q_padded * dim_padded;

  const bool rows_bad = packed.q_block_bad[r / block_q] != 0;
  unsigned char row_bad[block_q], row_live[block_q], row_poisoned[block_q] = {};
  for (std::int64_t i = 0; i < block_q; ++i) {
    row_bad[i] = packed.row_state[r + i] == 2;
    row_live[i] = packed.row_state[r + i] != 0;
  }
  tile_extent<T>& tile = *work.tile;
  for (std::int64_t kb = 0; kb < layout.k_blocks; ++kb) {
    if (!rows_bad && !packed.block_bad[layout.kv_block_index(round, kv_unit, kb)]) continue;
    const block_kind kind = mask.classify(layout.q_tiles[qb], layout.k_tiles[kb]);
    if (kind == block_kind::empty) continue;
    const std::int64_t k0 = kb * block_k;
    tile.set(kind, mask, layout.q_tiles[qb], layout.k_tiles[kb], qc, std::min(block_k, call.seq_k - k0));
    mark_bad_pairs(tile, qc, row_bad, row_live, packed.key_bad + layout.kv_row_index(round, kv_unit, k0), row_poisoned,
                   nullptr);
  }

  const T scale = static_cast<T>(call.scale);
  T* const sum = work.rows_a.data();
  for (std::int64_t i = 0; i < qc; ++i) {
    if (row_poisoned[i]) {
      write_nan_row(row_of(dq, b, q0 + i, h), call.dim);
      continue;
    }
    const T* part = packed.dq_partial + (r + i) * dim_padded;
    if (runs > 1) {
      for (std::int64_t d = 0; d < dim_padded; d += W) {
        V acc = load(part + d);
        for (std::int64_t run = 1; run < runs; ++run) acc = acc + load(part + run * run_stride + d);
        store(sum + d, acc);
      }
      part = sum;
    }
    write_scaled_row(row_of(dq, b, q0 + i, h), part, scale, call.dim, accumulate);
  }
}

}  // namespace baton::detail::attention
