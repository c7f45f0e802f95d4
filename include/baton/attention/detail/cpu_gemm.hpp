// baton/attention/detail/cpu_gemm.hpp — the register-tiled GEMM of the host flash kernels.
//
// C[rows x cols] (= or +=) A[rows x kdim] * B[kdim x cols], where A(r, k) = a[r * a_row +
// k * a_k] (so A^T is the same call with the strides swapped) and B is row-major with leading
// dimension ldb, or stored by column panels (gemm's b_panel_stride). rows is a multiple of
// tile_rows and cols of the vector width: callers pad their packed operands with zeros. Each
// register tile keeps R x NV vector accumulators (rows_per_register_tile) and loads each B
// vector once per contraction step, for one broadcast and NV FMAs per A element; the
// contraction runs in chunks that keep a panel of B in L1.
// A product that does not accumulate may start from a value per row instead of 0 (row_init:
// the forward's scores start at minus their row's reference max, which the softmax would
// otherwise subtract with one more vector operation per 16 scores).
// Tested against a naive triple loop in tests/attention/test_cpu_gemm.cpp.
#pragma once

#include <baton/core/simd.hpp>

#include <algorithm>
#include <cstdint>

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#endif
// nvcc's front end defines __GNUC__ but warns at GCC's unroll pragma: a .cu file that reaches
// these kernels (through cp/choose.hpp's tile model) runs them without it.
#if defined(__GNUC__) && !defined(__CUDACC__)
#define BATON_ATTN_UNROLL _Pragma("GCC unroll 16")
#else
#define BATON_ATTN_UNROLL
#endif

namespace baton::detail::attention {

// The attention kernels are written in the core's vector operations (vec_t, load, fma, ...).
using namespace core::simd;

inline constexpr int tile_rows = 4;  // rows of the register tile
// Vectors per register-tile row: 4 x 4 accumulators + 4 operands fit 32 registers (AVX-512);
// with 16 registers, 2 (6 x 2 tiles: rows_per_register_tile).
inline constexpr int tile_vectors = vector_registers >= 32 ? 4 : 2;
// Contraction chunk: keeps a 128 x (tile_vectors * width) panel of B in L1.
inline constexpr std::int64_t contraction_chunk = 128;
// Columns of C (and B) one register tile covers: the GEMM walks C in panels this wide.
template <class T>
inline constexpr std::int64_t panel_columns = tile_vectors * width_v<T>;

[[nodiscard]] constexpr std::int64_t round_up(std::int64_t n, std::int64_t m) noexcept { return (n + m - 1) / m * m; }

/// Rows of a register tile NV vectors wide: tile_rows, or more where the registers allow, so
/// that enough independent accumulators hide the FMA latency: narrow panels (a partial
/// tile's few key columns, small head dims) take 8 or 16; with 16 registers a panel of 2
/// vectors takes 6 (12 accumulators, 2 operands and the broadcast), not 4. Two FMA ports of
/// 4 cycles' latency need 8 FMAs in flight, and 8 accumulators left no slack: built for AVX2
/// the forward gained ~8 % and the backward ~9 % on the Intel machine. (With 32 registers,
/// 6 x 4 measured no better than 4 x 4: performance.md.)
[[nodiscard]] constexpr int rows_per_register_tile(int nv) noexcept {
  if (vector_registers == 16 && nv == 2) return 6;
  return std::max(tile_rows, vector_registers / 2 / nv / tile_rows * tile_rows);
}

template <class T, int R, int NV, bool Accumulate>
BATON_ALWAYS_INLINE void gemm_micro_tile(T* c, std::int64_t ldc, const T* a, std::int64_t a_row, std::int64_t a_k,
                                       const T* b, std::int64_t ldb, std::int64_t kdim, const T* row_init) noexcept {
  using V = vec_t<T>;
  constexpr int W = width_v<T>;
  V acc[R][NV];
  BATON_ATTN_UNROLL
  for (int r = 0; r < R; ++r) {
    const V init = Accumulate || !row_init ? V{} : broadcast(row_init[r]);
    BATON_ATTN_UNROLL
    for (int v = 0; v < NV; ++v) acc[r][v] = Accumulate ? load(c + r * ldc + v * W) : init;
  }
  for (std::int64_t k = 0; k < kdim; ++k) {
    const T* bk = b + k * ldb;
    V bv[NV];
    BATON_ATTN_UNROLL
    for (int v = 0; v < NV; ++v) {
      bv[v] = load(bk + v * W);
      pin_register(bv[v]);
    }
    const T* ak = a + k * a_k;
    BATON_ATTN_UNROLL
    for (int r = 0; r < R; ++r) {
      const V ar = broadcast(ak[r * a_row]);
      BATON_ATTN_UNROLL
      for (int v = 0; v < NV; ++v) acc[r][v] = fma(ar, bv[v], acc[r][v]);
    }
  }
  BATON_ATTN_UNROLL
  for (int r = 0; r < R; ++r) {
    BATON_ATTN_UNROLL
    for (int v = 0; v < NV; ++v) store(c + r * ldc + v * W, acc[r][v]);
  }
}

// Not inlined on purpose: inlined into a large caller, GCC spills the pinned operand
// registers to the stack on every iteration.
template <class T, int NV, bool Accumulate>
BATON_NEVER_INLINE void gemm_column_panel(T* c, std::int64_t ldc, std::int64_t rows, const T* a, std::int64_t a_row,
                              std::int64_t a_k, const T* b, std::int64_t ldb, std::int64_t kdim,
                              const T* row_init) noexcept {
  constexpr int R = rows_per_register_tile(NV);
  std::int64_t r0 = 0;
  if constexpr (R > tile_rows) {
    // Tiles of R rows while what they leave is still whole tiles of tile_rows (R = 6 leaves
    // 2 rows of 8: those take two tiles of 4 instead).
    std::int64_t wide = rows / R;
    while ((rows - wide * R) % tile_rows != 0) --wide;
    for (; r0 < wide * R; r0 += R)
      gemm_micro_tile<T, R, NV, Accumulate>(c + r0 * ldc, ldc, a + r0 * a_row, a_row, a_k, b, ldb, kdim,
                                            row_init ? row_init + r0 : nullptr);
  }
  for (; r0 < rows; r0 += tile_rows)
    gemm_micro_tile<T, tile_rows, NV, Accumulate>(c + r0 * ldc, ldc, a + r0 * a_row, a_row, a_k, b, ldb, kdim,
                                                  row_init ? row_init + r0 : nullptr);
}

template <class T, bool Accumulate>
inline void gemm_panel_dispatch(int nv, T* c, std::int64_t ldc, std::int64_t rows, const T* a, std::int64_t a_row,
                                std::int64_t a_k, const T* b, std::int64_t ldb, std::int64_t kdim,
                                const T* row_init) noexcept {
  static_assert(tile_vectors == 4 || tile_vectors == 2);
  switch (nv) {
    case 4:
      if constexpr (tile_vectors >= 4)
        gemm_column_panel<T, 4, Accumulate>(c, ldc, rows, a, a_row, a_k, b, ldb, kdim, row_init);
      break;
    case 3:
      if constexpr (tile_vectors >= 3)
        gemm_column_panel<T, 3, Accumulate>(c, ldc, rows, a, a_row, a_k, b, ldb, kdim, row_init);
      break;
    case 2: gemm_column_panel<T, 2, Accumulate>(c, ldc, rows, a, a_row, a_k, b, ldb, kdim, row_init); break;
    default: gemm_column_panel<T, 1, Accumulate>(c, ldc, rows, a, a_row, a_k, b, ldb, kdim, row_init); break;
  }
}

// b_panel_stride: 0 for a row-major B (the panel of columns c0.. starts at b + c0); else B is
// stored panel by panel, each panel_columns<T> wide and row-major with leading dimension ldb,
// panel p at b + p * b_panel_stride. A panel is then contiguous: on a B whose rows are wider
// than a panel, the row-major panel's lines fall in a fraction of L1's sets (rows 512 bytes
// apart use half of them), which it outgrows.
template <class T, bool Accumulate>
inline void gemm(T* c, std::int64_t ldc, std::int64_t rows, std::int64_t cols, const T* a, std::int64_t a_row,
                 std::int64_t a_k, const T* b, std::int64_t ldb, std::int64_t kdim,
                 const T* row_init = nullptr, std::int64_t b_panel_stride = 0) noexcept {
  constexpr int W = width_v<T>;
  if (kdim <= 0) {
    if constexpr (!Accumulate)
      for (std::int64_t r = 0; r < rows; ++r) std::fill(c + r * ldc, c + r * ldc + cols, row_init ? row_init[r] : T(0));
    return;
  }
  for (std::int64_t k0 = 0; k0 < kdim; k0 += contraction_chunk) {
    const std::int64_t kc = std::min(contraction_chunk, kdim - k0);
    const T* ak = a + k0 * a_k;
    const T* bk = b + k0 * ldb;
    for (std::int64_t c0 = 0; c0 < cols; c0 += panel_columns<T>) {
      const int nv = static_cast<int>(std::min<std::int64_t>(tile_vectors, (cols - c0) / W));
      const T* bp = b_panel_stride == 0 ? bk + c0 : bk + c0 / panel_columns<T> * b_panel_stride;
      if (Accumulate || k0 > 0)
        gemm_panel_dispatch<T, true>(nv, c + c0, ldc, rows, ak, a_row, a_k, bp, ldb, kc, nullptr);
      else
        gemm_panel_dispatch<T, false>(nv, c + c0, ldc, rows, ak, a_row, a_k, bp, ldb, kc, row_init);
    }
  }
}

}  // namespace baton::detail::attention

#undef BATON_ATTN_UNROLL
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
