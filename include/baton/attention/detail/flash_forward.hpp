// baton/attention/detail/flash_forward.hpp — the forward of the host flash kernels: per
// (batch, head, block of 64 queries), S = Q K^T for each key block the mask leaves, an online
// softmax in the log2 domain (a reference max m moved lazily, running sum l), and O += P V;
// at the end out = O / l and lse = (m + log2 l) ln 2. Key blocks are packed once per round
// (flash_tiles.hpp: pack_kv_block); each work item packs its own query block.
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

/// How far (log2 units) a score may pass its row's reference max before the forward rescales
/// (see forward_tile): P <= 2^8 keeps every sum far from overflow and loses no precision.
template <class T>
inline constexpr T lazy_rescale_log2 = T(8);

template <class T>
struct forward_packed {
  T* kt = nullptr;  // per (kv unit of the round, key block): K^T, [dim][block_k]
  T* v = nullptr;   // per kv unit of the round: V by column panels (flash_layout::v_panel_width)
  unsigned char* key_bad = nullptr;    // per kv unit: [seq_k_padded], 1 where k or v is non-finite
  unsigned char* block_bad = nullptr;  // per (kv unit, key block): any key_bad in it
};

/// Places the forward's packed arrays, one round's worth (carver with a null base: only
/// counts the bytes).
template <class T>
forward_packed<T> carve_forward_packing(const flash_layout<T>& layout, core::workspace_carver& carver) {
  forward_packed<T> packed;
  packed.kt = carver.take<T>(layout.round_units * layout.k_blocks * layout.call.dim * block_k);
  packed.v = carver.take<T>(layout.round_units * layout.v_unit_size);
  packed.key_bad = carver.take<unsigned char>(layout.round_units * layout.seq_k_padded);
  packed.block_bad = carver.take<unsigned char>(layout.round_units * layout.k_blocks);
  return packed;
}

/// Work item (query head, query block) of a round's forward pass; layout.q_items(round) items.
template <class T, class Mask, class TQ, class TO, class TL>
inline void forward_tile(const flash_layout<T>& layout, const head_round& round, std::int64_t item, const Mask& mask,
                         const tensor_view<TQ, 4>& q, const forward_packed<T>& packed, const tensor_view<TO, 4>& out,
                         const tensor_view<TL, 3>& lse, item_scratch<T>& work) {
  using V = vec_t<T>;
  constexpr int W = width_v<T>;
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  const auto& call = layout.call;
  const std::int64_t dim_padded = layout.dim_padded;
  const auto [unit, b, h, hk, qb, q0, qc, kv_unit] = layout.q_item_at(round, item, true);
  const std::int64_t rows = round_up(qc, tile_rows);
  // Scores in log2 units: Q is packed times scale * log2(e).
  const T c = static_cast<T>(call.scale * std::numbers::log2e);

  // Per row: running max m (log2 units) and the running sum kept as a vector of partial
  // sums, reduced once at the end instead of once per tile. The scores of a tile are
  // computed already shifted by shift[i] = -m[i] (0 while m[i] is -inf): the GEMM starts
  // each row's sums there.
  // The score tile is written before it is read (see tile_scores / softmax_gradient_tile).
  T* const qt = work.rows_a.data();
  T* const o = work.rows_b.data();
  T* const s = work.scores.data();  // [block_q][2 * block_k]: a pair of P tiles (below)
  T* const m = work.m.data();
  T* const l = work.l.data();
  // Non-finite rule: a query row with a non-finite value is packed as zeros and flagged;
  // poisoned[i] collects the rows an allowed bad pair makes NaN.
  unsigned char row_bad[block_q] = {}, poisoned[block_q] = {};
  bool any_row_bad = false;
  for (std::int64_t i = 0; i < block_q; ++i) {  // rows past qc are computed (then dropped): zero them
    T* dst = qt + i * dim_padded;
    if (i + prefetch_rows_ahead < qc) prefetch_row(row_of(q, b, q0 + i + prefetch_rows_ahead, h), call.dim);
    if (i < qc) {
      load_row(row_of(q, b, q0 + i, h), call.dim, dst);
      row_bad[i] = !all_finite(dst, call.dim);
      if (row_bad[i])
        std::fill(dst, dst + call.dim, T(0));
      else
        for (std::int64_t d = 0; d < call.dim; ++d) dst[d] *= c;
      any_row_bad = any_row_bad || row_bad[i];
    }
    std::fill(dst + (i < qc ? call.dim : 0), dst + dim_padded, T(0));
  }
  std::fill(o, o + block_q * dim_padded, T(0));
  std::fill(m, m + block_q, neg_inf);
  alignas(64) T shift[block_q] = {};
  std::fill(l, l + block_q * W, T(0));

  // V's rows for key j: v_panels + j * v_width, each column panel v_panel_stride further on.
  const T* v_panels = packed.v + layout.v_panels_index(round, kv_unit);
  const std::int64_t v_width = layout.v_panel_width, v_panel_stride = layout.v_panel_stride;
  tile_extent<T>& tile = *work.tile;
  // Consecutive query blocks walk the keys in opposite directions, so that each starts on the
  // key tiles the one before it ended on: a head's packed K and V (2 MiB at S = 2048,
  // D = 128) outgrow L2, and walked the same way every time they were all read from L3.
  // The direction is decided by the block's first query position, not by its index: a ring
  // call trimmed to whole tiles (cp/detail/ring_plan.hpp) numbers its blocks from another
  // first one, and each row must walk its keys as in the untrimmed call (the order of the
  // sums decides the bits).
  const bool descending = (layout.q_tiles[qb][0] / block_q) % 2 != 0;
  // Two full key tiles next to each other in the walk share one O += P V product over their
  // 128 keys (their V rows are adjacent): half the O loads and stores of two 64-key products.
  // Their P are side by side in s, [block_q][2 * block_k], in key order: a walk's first tile
  // of a pair takes the half its direction puts first. A full tile waits there for the next;
  // anything else runs the product of the one waiting alone first. Each row's sums run in
  // the order two products would run them, so pairing changes no bit unless a row's max moves
  // in the second tile: the waiting P is then rescaled beside O (unpaired, it would have been
  // in O already and rescaled with it).
  constexpr std::int64_t s_ld = 2 * block_k;
  const std::int64_t first_half = descending ? block_k : 0;
  std::int64_t waiting_kb = -1;  // the full tile whose P waits in s, or -1
  // O += P V for `keys` keys from key tile kb on, P at p (row stride s_ld); nothing waits after.
  const auto accumulate = [&](const T* p, std::int64_t kb, std::int64_t keys) {
    gemm<T, true>(o, dim_padded, rows, dim_padded, p, s_ld, 1, v_panels + kb * block_k * v_width, v_width, keys,
                  nullptr, v_panel_stride);
    waiting_kb = -1;
  };
  const auto accumulate_waiting = [&] { accumulate(s + first_half, waiting_kb, block_k); };
  for_each_key_tile(layout, mask, qb, qc, tile, [&](std::int64_t kb, std::int64_t k0) {
    const T* kt = packed.kt + layout.kv_block_index(round, kv_unit, kb) * call.dim * block_k;
    if (any_row_bad || packed.block_bad[layout.kv_block_index(round, kv_unit, kb)])
      mark_bad_pairs(tile, qc, row_bad, nullptr, packed.key_bad + layout.kv_row_index(round, kv_unit, k0), poisoned,
                     nullptr);

    const bool full = !tile.partial && tile.kc == block_k;
    const bool pairs = full && waiting_kb >= 0 && kb == waiting_kb + (descending ? -1 : 1);
    if (waiting_kb >= 0 && !pairs) accumulate_waiting();
    // This tile's scores: the second half next to a waiting tile, else the first half.
    T* const st = s + (pairs ? block_k - first_half : first_half);
    tile_scores(tile, st, qt, dim_padded, kt, call.dim, shift, s_ld);
    tile_mask(tile, st, s_ld);

    // Online softmax, one row at a time, in the log2 domain, over the columns computed.
    // Lazy rescaling: a row's scores are exponentiated against its reference max m[i], which
    // moves only when a score exceeds it by more than lazy_rescale_log2; P is then at most
    // 2^lazy_rescale_log2 (out = O / l and lse = m + log2 l do not depend on which m). So a
    // tile needs no pass for the row max and no horizontal max: one pass computes P, the
    // row's sum and whether a P went past 2^threshold (a score past m + threshold), and only
    // such a row (rare after a row's first tile), or a row's first tile, takes the exact
    // path: max, then P again, and rescale l and O when m moved.
    const V threshold = broadcast(lazy_rescale_log2<T>);
    const V threshold_power = broadcast(std::exp2(lazy_rescale_log2<T>));
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::int64_t j_begin = tile.col_begin[i / tile_rows], j_end = tile.col_end[i / tile_rows];
      if (j_begin >= j_end) continue;
      T* row = st + i * s_ld;
      T* li = l + i * W;
      if (m[i] != neg_inf) {  // the scores are x - m[i]
        V sum{};
        unsigned over = 0;
        // The row keeps its scores until it is known not to need the exact path, which
        // reads them again.
        if (j_begin == 0 && j_end == block_k) {  // a whole row: unrolled, P held in registers
          // The test is on the lane sums, one compare per row instead of one per vector: a
          // lane sum adds NV values of P >= 0, so no sum above 2^threshold means no P above
          // it. A sum can pass it with every P below (the exact path then runs for nothing and
          // gives the same result); an overflow to +inf passes it; a NaN does not, and reaches
          // the row's sum as before.
          constexpr int NV = static_cast<int>(block_k / W);
          V e[NV];
          for (int v = 0; v < NV; ++v) e[v] = exp2_scores<true, T>(load(row + v * W));
          sum = e[0];
          for (int v = 1; v < NV; ++v) sum = sum + e[v];
          over = greater_bits<T>(sum, threshold_power);
          if (over == 0)
            for (int v = 0; v < NV; ++v) store(row + v * W, e[v]);
        } else {  // a partial row: test first, then exponentiate in place
          for (std::int64_t j = j_begin; j < j_end; j += W)
            over |= greater_bits<T>(load(row + j), threshold);
          if (over == 0)
            for (std::int64_t j = j_begin; j < j_end; j += W) {
              const V e = exp2_scores<true, T>(load(row + j));
              store(row + j, e);
              sum = sum + e;
            }
        }
        if (over == 0) {
          store(li, load(li) + sum);
          continue;
        }
      }
      V vmx = load(row + j_begin);
      for (std::int64_t j = j_begin + W; j < j_end; j += W) vmx = vmax<T>(vmx, load(row + j));
      const T row_max = hmax<T>(vmx) - shift[i];
      const T m_new = std::max(m[i], row_max);
      const T m_sub = m_new == neg_inf ? T(0) : m_new;  // a row masked so far: exp2(-inf - 0) = 0
      const V msub = broadcast(-(m_sub + shift[i]));  // the scores are x + shift[i]
      V sum{};
      for (std::int64_t j = j_begin; j < j_end; j += W) {
        const V e = exp2_scores<true, T>(load(row + j) + msub);
        store(row + j, e);
        sum = sum + e;
      }
      if (m_new != m[i]) {  // the max moved: rescale the running sum and the output row
        const T alpha = std::exp2(m[i] - m_sub);
        const V av = broadcast(alpha);
        store(li, load(li) * av + sum);
        T* orow = o + i * dim_padded;
        for (std::int64_t d = 0; d < dim_padded; d += W) store(orow + d, load(orow + d) * av);
        if (pairs) {
          T* waiting = s + first_half + i * s_ld;
          for (std::int64_t j = 0; j < block_k; j += W) store(waiting + j, load(waiting + j) * av);
        }
        m[i] = m_new;
        shift[i] = -m_sub;
      } else {
        store(li, load(li) + sum);
      }
    }
    if (pairs) {
      accumulate(s, std::min(kb, waiting_kb), 2 * block_k);
    } else if (full) {
      waiting_kb = kb;
    } else {
      tile_accumulate_rows(tile, o, dim_padded, dim_padded, st, v_panels + k0 * v_width, v_width, s_ld,
                           v_panel_stride);
    }
  }, descending);
  if (waiting_kb >= 0) accumulate_waiting();

  for (std::int64_t i = 0; i < qc; ++i) {
    const T row_sum = hsum<T>(load(l + i * W));
    // NaN for a poisoned row, and for a score that overflowed to +inf or made a NaN (the
    // online softmax would otherwise drop it as "attends to nothing").
    if (poisoned[i] || !(m[i] < std::numeric_limits<T>::infinity()) || std::isnan(row_sum)) {
      write_nan_row(row_of(out, b, q0 + i, h), call.dim);
      lse(b, h, q0 + i) = std::numeric_limits<TL>::quiet_NaN();
      continue;
    }
    const bool attends = row_sum > T(0);
    const T inv = attends ? T(1) / row_sum : T(0);
    write_scaled_row(row_of(out, b, q0 + i, h), o + i * dim_padded, inv, call.dim, false);
    lse(b, h, q0 + i) = attends ? static_cast<TL>((static_cast<double>(m[i]) +
                                                   std::log2(static_cast<double>(row_sum))) *
                                                  std::numbers::ln2)
                                : -std::numeric_limits<TL>::infinity();
  }
}

}  // namespace baton::detail::attention
