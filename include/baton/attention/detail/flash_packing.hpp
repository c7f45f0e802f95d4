// baton/attention/detail/flash_packing.hpp — the packing of the host flash kernels' key
// blocks, shared by the forward and the backward: a round's K and V rows copied into
// contiguous, zero-padded operands (K^T and V^T per key block, K and V rows per kv head) with
// the non-finite flags of each key and key block, so that the tiles' inner loops read
// unit-stride memory whatever the caller's strides (flash_tiles.hpp says why).
#pragma once

#include <baton/attention/detail/flash_tiles.hpp>
#include <baton/core/tensor_view.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__GNUC__) && (defined(__SSE2__) || defined(__x86_64__))
#include <immintrin.h>
#endif

namespace baton::detail::attention {

/// dst[d * block_k + j] = rows[j][d] for j < count, 0 for count <= j < block_k: a key tile
/// transposed (K^T, V^T). 4 x 4 (float) or 2 x 2 (double) register transposes on x86; the
/// scalar loop it replaces showed in the profile of a short causal forward.
/// Rows of another storage type (bf16) are widened on the way, four keys at a time so that
/// each store writes a run of four.
template <class T, class S>
inline void transpose_rows(const S* const* rows, std::int64_t count, std::int64_t dim, T* dst) noexcept {
  std::int64_t j = 0;
  if constexpr (!std::is_same_v<S, T>) {
    for (; j + 4 <= count; j += 4)
      for (std::int64_t d = 0; d < dim; ++d)
        for (std::int64_t jj = j; jj < j + 4; ++jj) dst[d * block_k + jj] = widen<T>(rows[jj][d]);
  } else {
    const auto prefetch_ahead = [&](std::int64_t first, std::int64_t n) {
      for (std::int64_t r = first + prefetch_rows_ahead; r < std::min(count, first + prefetch_rows_ahead + n); ++r)
        prefetch_row(rows[r], dim);
    };
#if defined(__GNUC__) && (defined(__SSE2__) || defined(__x86_64__))
    if constexpr (std::is_same_v<T, float>) {
      for (; j + 4 <= count; j += 4) {
        prefetch_ahead(j, 4);
        std::int64_t d = 0;
        for (; d + 4 <= dim; d += 4) {
          __m128 r0 = _mm_loadu_ps(rows[j] + d), r1 = _mm_loadu_ps(rows[j + 1] + d);
          __m128 r2 = _mm_loadu_ps(rows[j + 2] + d), r3 = _mm_loadu_ps(rows[j + 3] + d);
          _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
          _mm_storeu_ps(dst + d * block_k + j, r0);
          _mm_storeu_ps(dst + (d + 1) * block_k + j, r1);
          _mm_storeu_ps(dst + (d + 2) * block_k + j, r2);
          _mm_storeu_ps(dst + (d + 3) * block_k + j, r3);
        }
        for (; d < dim; ++d)
          for (std::int64_t jj = j; jj < j + 4; ++jj) dst[d * block_k + jj] = rows[jj][d];
      }
    } else {
      for (; j + 2 <= count; j += 2) {
        prefetch_ahead(j, 2);
        std::int64_t d = 0;
        for (; d + 2 <= dim; d += 2) {
          const __m128d r0 = _mm_loadu_pd(rows[j] + d), r1 = _mm_loadu_pd(rows[j + 1] + d);
          _mm_storeu_pd(dst + d * block_k + j, _mm_unpacklo_pd(r0, r1));
          _mm_storeu_pd(dst + (d + 1) * block_k + j, _mm_unpackhi_pd(r0, r1));
        }
        for (; d < dim; ++d) {
          dst[d * block_k + j] = rows[j][d];
          dst[d * block_k + j + 1] = rows[j + 1][d];
        }
      }
    }
#endif
  }
  for (; j < count; ++j)
    for (std::int64_t d = 0; d < dim; ++d) dst[d * block_k + j] = widen<T>(rows[j][d]);
  if (count < block_k)
    for (std::int64_t d = 0; d < dim; ++d) std::fill(dst + d * block_k + count, dst + (d + 1) * block_k, T(0));
}

/// Work item (kv head, key block) of a round's packing pass; layout.kv_items(round) items.
template <class T, class TK, class TV>
inline void pack_kv_block(const flash_layout<T>& layout, const head_round& round, std::int64_t item,
                          const tensor_view<TK, 4>& k, const tensor_view<TV, 4>& v, T* kt_out, T* v_panels_out,
                          T* vt_out, T* k_rows_out, unsigned char* key_bad_out, unsigned char* block_bad_out) {
  const auto& call = layout.call;
  const auto [unit, b, hk, kb, k0, kc] = layout.kv_item_at(round, item);
  const std::int64_t blk = layout.kv_block_index(round, unit, kb);
  const std::int64_t row0 = layout.kv_row_index(round, unit, k0);
  const std::int64_t dim_padded = layout.dim_padded;
  // Every byte a tile reads is written here (the workspace is reused, not zeroed): key
  // columns past the sequence end are 0 in K^T/V^T, and row padding (columns dim..dim_padded, and
  // whole rows past the end) is 0 in the row-major copies and V's column panels.
  const std::remove_const_t<TK>* k_rows[block_k];
  const std::remove_const_t<TV>* v_rows[block_k];
  for (std::int64_t j = 0; j < kc; ++j) {
    k_rows[j] = &k(b, k0 + j, hk, 0);
    v_rows[j] = &v(b, k0 + j, hk, 0);
  }
  // Keys with a non-finite k or v: flagged for the non-finite rule, and packed as zeros, so
  // that no tile's arithmetic meets them (a masked pair must not turn NaN through 0 * inf).
  unsigned char bad[block_k] = {};
  bool any_bad = false;
  for (std::int64_t j = 0; j < kc; ++j) {
    // This is the first read of the rows (the copies below find them in cache): without the
    // prefetch it waited on memory row by row, 2 % of a D = 64 forward on the Intel machine.
    if (j + prefetch_rows_ahead < kc) {
      prefetch_row(k_rows[j + prefetch_rows_ahead], call.dim);
      prefetch_row(v_rows[j + prefetch_rows_ahead], call.dim);
    }
    bad[j] = !(all_finite(k_rows[j], call.dim) && all_finite(v_rows[j], call.dim));
    any_bad = any_bad || bad[j];
  }
  std::copy(bad, bad + block_k, key_bad_out + row0);
  block_bad_out[blk] = any_bad;
  if (kt_out) transpose_rows(k_rows, kc, call.dim, kt_out + blk * call.dim * block_k);
  if (vt_out) transpose_rows(v_rows, kc, call.dim, vt_out + blk * call.dim * block_k);
  // The forward's V by column panels: key j's columns c0 .. c0 + v_width (c0 a multiple of it).
  const std::int64_t v_width = layout.v_panel_width;
  const auto v_panel_row = [&](std::int64_t j, std::int64_t c0) {
    return v_panels_out + layout.v_panels_index(round, unit) + c0 / v_width * layout.v_panel_stride +
           (k0 + j) * v_width;
  };
  for (std::int64_t j = 0; j < block_k; ++j) {
    const bool real = j < kc;
    if (v_panels_out && j + prefetch_rows_ahead < kc) prefetch_row(v_rows[j + prefetch_rows_ahead], call.dim);
    if (v_panels_out)
      for (std::int64_t c0 = 0; c0 < dim_padded; c0 += v_width) {
        T* dst = v_panel_row(j, c0);
        const std::int64_t n = real ? std::clamp<std::int64_t>(call.dim - c0, 0, v_width) : 0;
        if (n > 0) load_row(v_rows[j] + c0, n, dst);
        std::fill(dst + n, dst + v_width, T(0));
      }
    if (k_rows_out) {
      T* dst = k_rows_out + (row0 + j) * dim_padded;
      if (real) load_row(k_rows[j], call.dim, dst);
      std::fill(dst + (real ? call.dim : 0), dst + dim_padded, T(0));
    }
  }
  if (any_bad)
    for (std::int64_t j = 0; j < kc; ++j) {
      if (!bad[j]) continue;
      for (T* t : {kt_out, vt_out})
        if (t)
          for (std::int64_t d = 0; d < call.dim; ++d) t[blk * call.dim * block_k + d * block_k + j] = T(0);
      if (v_panels_out)
        for (std::int64_t c0 = 0; c0 < dim_padded; c0 += v_width) std::fill_n(v_panel_row(j, c0), v_width, T(0));
      if (k_rows_out) std::fill(k_rows_out + (row0 + j) * dim_padded, k_rows_out + (row0 + j + 1) * dim_padded, T(0));
    }
}

}  // namespace baton::detail::attention
