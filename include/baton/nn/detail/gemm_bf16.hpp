// baton/nn/detail/gemm_bf16.hpp — the model layer's matrix product on bf16 operands.
//
// C[m x n] (float) = alpha op(A) op(B) + beta C, where every element of A and B is first
// rounded to bf16 (to nearest even, as bfloat16(float) rounds; bf16 operands are taken as
// they are) and the products are summed in float. This is what mixed-precision training
// computes its matrix products in: the float master weights and float activations enter as
// bf16, the sums stay float.
//
// Two implementations, chosen at run time:
//  - `bf16_gemm_kernel::avx512_bf16`: packs op(A) and op(B) into pairs of bf16 along k and
//    multiplies them with VDPBF16PS (two bf16 products added to a float per lane, 32 products
//    per instruction, twice the multiply-adds of a float FMA). Compiled wherever the compiler
//    takes `target("avx512bf16")` on x86-64 (GCC, Clang) whatever the build's -march; it runs
//    wherever the CPU has AVX512_BF16 (AMD Zen 4 and later, Intel Cooper Lake and Sapphire
//    Rapids and later), and `automatic` picks it where it is the faster kernel, on AMD's
//    (bf16_dot_products_fast: on Intel's the instruction is slower than float FMAs). The
//    instruction treats bf16 subnormals as zero and flushes subnormal results to zero; each
//    lane adds its two products to the sum one after the other, each addition rounded to
//    nearest even.
//  - `bf16_gemm_kernel::widened_sgemm` (`automatic` on every other CPU): the operands rounded
//    to bf16, widened back to float (exact) and multiplied by gemm<float> (cblas_sgemm when
//    linked). A bf16 times bf16 product is exact in float, so both sum the same exact
//    products in float; they differ only in the order of the additions and in subnormals.
// Both are deterministic for a given CPU and thread count (one thread each).
#pragma once

#include <baton/core/float16.hpp>
#include <baton/nn/detail/gemm.hpp>
#include <baton/nn/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <immintrin.h>
#define BATON_BF16_GEMM_X86 1
#else
#define BATON_BF16_GEMM_X86 0
#endif

namespace baton::detail::nn {

/// Which code gemm_bf16 runs (automatic: the AVX512_BF16 kernel where it is the faster one,
/// see bf16_dot_products_fast).
enum class bf16_gemm_kernel { automatic, avx512_bf16, widened_sgemm };

/// Whether this CPU runs the AVX512_BF16 kernel.
inline bool cpu_has_avx512_bf16() noexcept {
#if BATON_BF16_GEMM_X86
  static const bool has = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return has;
#else
  return false;
#endif
}

/// Whether VDPBF16PS multiplies faster than float FMAs on this CPU. On AMD's Zen 4 and Zen 5
/// one instruction adds 32 exact products at the FMA's rate: twice float's multiply-adds. On
/// Intel's Sapphire Rapids it issues at a quarter of the FMA's rate, so half float's
/// multiply-adds (39 against 82 G multiply-adds/s on one core, measured), and the kernel ran
/// the block's products at 0.52-0.56 of sgemm's speed; there the widened sgemm is the faster
/// way to the same exact products. Decided by the CPU's vendor, not by a timing, so a machine
/// runs the same kernel, and sums in the same order, on every run.
inline bool bf16_dot_products_fast() noexcept {
#if BATON_BF16_GEMM_X86
  static const bool fast = cpu_has_avx512_bf16() && __builtin_cpu_is("amd");
  return fast;
#else
  return false;
#endif
}

/// What gemm_bf16's automatic choice runs here: "avx512_bf16" or "widened sgemm" (with the
/// reason where the CPU has AVX512_BF16).
inline const char* bf16_gemm_implementation() noexcept {
  if (bf16_dot_products_fast()) return "avx512_bf16";
  return cpu_has_avx512_bf16() ? "widened sgemm (this CPU's VDPBF16PS is slower than its float FMAs)"
                               : "widened sgemm";
}

/// The bits of x rounded to bf16 (x itself when it is bf16).
template <class S>
inline std::uint16_t bf16_bits_of(S x) noexcept {
  if constexpr (std::is_same_v<S, bfloat16>)
    return x.bits;
  else
    return bfloat16(static_cast<float>(x)).bits;
}

namespace bf16_gemm {

// The register tile: MR rows of C by NR = 32 columns (two vectors of 16 floats), 2 * MR
// accumulators of the 32 vector registers; the A values are broadcast from memory.
inline constexpr int mr = 14;
inline constexpr int nr = 32;
// Blocks: a B micro-panel (kc x 32 bf16, 16 KiB) stays in L1 while an A block (mc x kc,
// 112 KiB) stays in L2 and the B panel (kc x nc, up to 1 MiB) in L2/L3.
inline constexpr std::int64_t kc = 256;   // a multiple of 2
inline constexpr std::int64_t mc = 224;   // a multiple of mr
inline constexpr std::int64_t nc = 2048;  // a multiple of nr

#if BATON_BF16_GEMM_X86
#define BATON_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
// GCC 12 warns that the "undefined" vector inside its own AVX-512 intrinsics may be used
// uninitialized once they are inlined here (a known false positive of those headers).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// 16 values from p (count of them, the rest zero) as bf16 bits in 16-bit lanes.
BATON_BF16_TARGET inline __m256i load16_bf16_bits(const float* p, int count) noexcept {
  const __mmask16 mask = count >= 16 ? __mmask16(0xffff) : __mmask16((1u << count) - 1u);
  const __m512i u = _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, p));
  // Round to nearest even as bfloat16(float) does; a NaN stays a quiet NaN with its sign.
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x0040));
  const __mmask16 is_nan =
      _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  return _mm512_cvtepi32_epi16(_mm512_mask_mov_epi32(rounded, is_nan, quiet_nan));
}
BATON_BF16_TARGET inline __m256i load16_bf16_bits(const bfloat16* p, int count) noexcept {
  const __mmask16 mask = count >= 16 ? __mmask16(0xffff) : __mmask16((1u << count) - 1u);
  return _mm256_maskz_loadu_epi16(mask, p);
}

// Pairs along k of rows p and p + 1 of a row-major matrix (row p + 1 absent: zeros), columns
// j .. j + count: dword t = bits(x[p][j + t]) | bits(x[p + 1][j + t]) << 16, 16 of them.
template <class S>
BATON_BF16_TARGET inline __m512i row_pairs16(const S* row0, const S* row1, int count) noexcept {
  const __m512i lo = _mm512_cvtepu16_epi32(load16_bf16_bits(row0, count));
  const __m512i hi = row1 ? _mm512_cvtepu16_epi32(load16_bf16_bits(row1, count)) : _mm512_setzero_si512();
  return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

// Pairs along one row: dword q = bits(x[2q]) | bits(x[2q + 1]) << 16 for the `count` values
// from p (an odd count pads with a zero), written to out[0 .. (count + 1) / 2).
template <class S>
BATON_BF16_TARGET inline void pairs_along_row(const S* p, std::int64_t count, std::uint32_t* out) noexcept {
  std::int64_t t = 0;
  for (; t + 32 <= count; t += 32) {
    const __m256i a = load16_bf16_bits(p + t, 16), b = load16_bf16_bits(p + t + 16, 16);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t / 2), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + t / 2 + 8), b);
  }
  for (; t < count; t += 2) {
    const std::uint32_t lo = bf16_bits_of(p[t]);
    const std::uint32_t hi = t + 1 < count ? bf16_bits_of(p[t + 1]) : 0u;
    out[t / 2] = lo | (hi << 16);
  }
}

// Packs op(X)[i0 .. i0 + rows) x [p0 .. p0 + depth) into panels of `width` rows (the last one
// padded with zero rows): panel after panel, each pair q of k as `width` dwords (row order).
// This is the A block (width mr) and the B panel (width nr, op(B)ᵀ's rows being C's columns).
// `row_major_pairs`: op(X)'s rows run along X's rows in memory (X not transposed for A,
// transposed for B), so a pair is two neighbours of one memory row.
template <class S>
BATON_BF16_TARGET void pack_panels(const S* x, std::int64_t ld, bool row_major_pairs, std::int64_t i0,
                                    std::int64_t rows, std::int64_t p0, std::int64_t depth, int width,
                                    std::uint32_t* out, std::vector<std::uint32_t>& scratch) {
  const std::int64_t pairs = (depth + 1) / 2;
  const std::int64_t panels = (rows + width - 1) / width;
  if (row_major_pairs) {
    // Each row's pairs are contiguous in memory; scatter them to the row's slot in its panel.
    scratch.resize(static_cast<std::size_t>(pairs));
    for (std::int64_t panel = 0; panel < panels; ++panel) {
      std::uint32_t* dst = out + panel * pairs * width;
      const std::int64_t in_panel = std::min<std::int64_t>(width, rows - panel * width);
      for (std::int64_t r = 0; r < in_panel; ++r) {
        pairs_along_row(x + (i0 + panel * width + r) * ld + p0, depth, scratch.data());
        for (std::int64_t q = 0; q < pairs; ++q) dst[q * width + r] = scratch[static_cast<std::size_t>(q)];
      }
      for (std::int64_t r = in_panel; r < width; ++r)
        for (std::int64_t q = 0; q < pairs; ++q) dst[q * width + r] = 0u;
    }
  } else {
    // op(X)'s rows are X's columns: a pair is the same column of two memory rows, and a panel's
    // `width` rows at one pair are contiguous in memory.
    for (std::int64_t panel = 0; panel < panels; ++panel) {
      std::uint32_t* dst = out + panel * pairs * width;
      const std::int64_t in_panel = std::min<std::int64_t>(width, rows - panel * width);
      const S* col = x + i0 + panel * width;
      for (std::int64_t q = 0; q < pairs; ++q) {
        const std::int64_t p = p0 + 2 * q;
        const S* row0 = col + p * ld;
        const S* row1 = 2 * q + 1 < depth ? col + (p + 1) * ld : nullptr;
        for (int r = 0; r < width; r += 16) {
          const int count = static_cast<int>(std::clamp<std::int64_t>(in_panel - r, 0, 16));
          const __m512i v = count > 0 ? row_pairs16(row0 + r, row1 ? row1 + r : nullptr, count) : _mm512_setzero_si512();
          if (width - r >= 16)
            _mm512_storeu_si512(dst + q * width + r, v);
          else
            _mm512_mask_storeu_epi32(dst + q * width + r, __mmask16((1u << (width - r)) - 1u), v);
        }
      }
    }
  }
}

// C[rows x cols] (cols <= 32, rows <= mr) = alpha (A panel . B panel) + (first ? beta C : C).
BATON_BF16_TARGET inline void micro_kernel(std::int64_t pairs, const std::uint32_t* a, const std::uint32_t* b,
                                           float* c, std::int64_t ldc, int rows, int cols, float alpha,
                                           float beta) noexcept {
  __m512 acc[mr][2];
#pragma GCC unroll 14
  for (int r = 0; r < mr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (std::int64_t q = 0; q < pairs; ++q) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 16);
#pragma GCC unroll 14
    for (int r = 0; r < mr; ++r) {
      const __m512bh av = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], av, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], av, b1);
    }
    a += mr;
    b += nr;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const __mmask16 m0 = cols >= 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1u);
  const __mmask16 m1 = cols >= 32 ? __mmask16(0xffff) : cols <= 16 ? __mmask16(0) : __mmask16((1u << (cols - 16)) - 1u);
#pragma GCC unroll 14
  for (int r = 0; r < mr; ++r) {
    if (r >= rows) break;
    float* row = c + r * ldc;
    __m512 y0 = _mm512_mul_ps(va, acc[r][0]), y1 = _mm512_mul_ps(va, acc[r][1]);
    if (beta != 0.0f) {  // beta 0 overwrites C (NaNs in C do not survive), as BLAS does
      y0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, row), y0);
      y1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16), y1);
    }
    _mm512_mask_storeu_ps(row, m0, y0);
    _mm512_mask_storeu_ps(row + 16, m1, y1);
  }
}

template <class SA, class SB>
BATON_BF16_TARGET void gemm_avx512(op op_a, op op_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                                   const SA* a, std::int64_t lda, const SB* b, std::int64_t ldb, float beta, float* c,
                                   std::int64_t ldc) {
  if (k == 0 || alpha == 0.0f) {
    for (std::int64_t i = 0; i < m; ++i) {
      float* row = c + i * ldc;
      for (std::int64_t j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
    }
    return;
  }
  // thread_local: the ranks of a thread world call this at once; each keeps its buffers from
  // one call to the next (no allocation in a steady state).
  thread_local std::vector<std::uint32_t> a_pack, b_pack, scratch;
  const std::int64_t nc_used = std::min(nc, (n + nr - 1) / nr * nr);
  const std::int64_t kc_pairs = std::min(kc, k + (k & 1)) / 2;
  const std::int64_t mc_used = std::min(mc, (m + mr - 1) / mr * mr);
  b_pack.resize(static_cast<std::size_t>(nc_used * kc_pairs));
  a_pack.resize(static_cast<std::size_t>(mc_used * kc_pairs));
  for (std::int64_t j0 = 0; j0 < n; j0 += nc) {
    const std::int64_t nb = std::min(nc, n - j0);
    for (std::int64_t p0 = 0; p0 < k; p0 += kc) {
      const std::int64_t kb = std::min(kc, k - p0);
      const std::int64_t pairs = (kb + 1) / 2;
      const float beta_here = p0 == 0 ? beta : 1.0f;
      // op(B)ᵀ[j][p] = op(B)[p][j]: its rows run along B's memory rows when B is transposed.
      pack_panels(b, ldb, op_b == op::transpose, j0, nb, p0, kb, nr, b_pack.data(), scratch);
      for (std::int64_t i0 = 0; i0 < m; i0 += mc) {
        const std::int64_t mb = std::min(mc, m - i0);
        pack_panels(a, lda, op_a == op::none, i0, mb, p0, kb, mr, a_pack.data(), scratch);
        for (std::int64_t jr = 0; jr < nb; jr += nr) {
          const std::uint32_t* bp = b_pack.data() + (jr / nr) * pairs * nr;
          const int cols = static_cast<int>(std::min<std::int64_t>(nr, nb - jr));
          for (std::int64_t ir = 0; ir < mb; ir += mr) {
            const int rows = static_cast<int>(std::min<std::int64_t>(mr, mb - ir));
            micro_kernel(pairs, a_pack.data() + (ir / mr) * pairs * mr, bp, c + (i0 + ir) * ldc + j0 + jr, ldc, rows,
                         cols, alpha, beta_here);
          }
        }
      }
    }
  }
}
#pragma GCC diagnostic pop
#undef BATON_BF16_TARGET
#endif  // BATON_BF16_GEMM_X86

template <class S>
void widen_rounded(const S* x, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::vector<float>& out) {
  out.resize(static_cast<std::size_t>(rows * cols));
  for (std::int64_t i = 0; i < rows; ++i)
    for (std::int64_t j = 0; j < cols; ++j)
      out[static_cast<std::size_t>(i * cols + j)] = bfloat16::from_bits(bf16_bits_of(x[i * ld + j])).to_float();
}

}  // namespace bf16_gemm

/// C[m x n] = alpha op(A)[m x k] op(B)[k x n] + beta C with A and B rounded to bf16 and the
/// products summed in float (see the top of this file); row-major, leading dimensions in
/// elements; beta = 0 overwrites C. SA and SB are float or bfloat16.
template <class SA, class SB>
void gemm_bf16(op op_a, op op_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const SA* a,
               std::int64_t lda, const SB* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc,
               bf16_gemm_kernel kernel = bf16_gemm_kernel::automatic) {
  static_assert((std::is_same_v<SA, float> || std::is_same_v<SA, bfloat16>) &&
                    (std::is_same_v<SB, float> || std::is_same_v<SB, bfloat16>),
                "baton::nn gemm_bf16: operands are float or baton::bfloat16");
  if (m == 0 || n == 0) return;
  if (kernel == bf16_gemm_kernel::automatic)
    kernel = bf16_dot_products_fast() ? bf16_gemm_kernel::avx512_bf16 : bf16_gemm_kernel::widened_sgemm;
  if (kernel == bf16_gemm_kernel::avx512_bf16) {
#if BATON_BF16_GEMM_X86
    if (!cpu_has_avx512_bf16())
      throw baton::nn::nn_error("baton::nn gemm_bf16: the avx512_bf16 kernel needs a CPU with AVX512_BF16; "
                                "use bf16_gemm_kernel::automatic");
    bf16_gemm::gemm_avx512(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
#else
    throw baton::nn::nn_error("baton::nn gemm_bf16: the avx512_bf16 kernel is built for x86-64 with GCC or Clang "
                              "only; use bf16_gemm_kernel::automatic");
#endif
  }
  thread_local std::vector<float> wa, wb;
  const bool ta = op_a == op::transpose, tb = op_b == op::transpose;
  bf16_gemm::widen_rounded(a, ta ? k : m, ta ? m : k, lda, wa);
  bf16_gemm::widen_rounded(b, tb ? n : k, tb ? k : n, ldb, wb);
  gemm<float>(op_a, op_b, m, n, k, alpha, wa.data(), ta ? m : k, wb.data(), tb ? k : n, beta, c, ldc);
}

}  // namespace baton::detail::nn
