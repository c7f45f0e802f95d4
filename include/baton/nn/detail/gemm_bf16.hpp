// baton/nn/detail/gemm_bf16.hpp — the model layer's matrix product on bf16 operands.
//
// C[m x n] (float) = alpha op(A) op(B) + beta C, where every element of A and B is first
// rounded to bf16 (to nearest even, as bfloat16(float) rounds; bf16 operands are taken as
// they are) and the products are summed in float. This is what mixed-precision training
// computes its matrix products in: the float master weights and float activations enter as
// bf16, the sums stay float.
//
// Three implementations, chosen at run time:
//  - `bf16_gemm_kernel::amx_bf16` (`automatic` wherever it runs): Intel's tile unit (Sapphire
//    Rapids and later, on Linux 5.16 or later, which must grant the process the tile state).
//    The operands are packed as pairs of bf16 along k into 16-row A tiles and 16-column B
//    tiles, and TDPBF16PS adds 16 x 16 x 32 exact products per instruction into a 32 x 32
//    block of C held in four tile registers. Rounding as VDPBF16PS's below (Intel: each
//    accumulation to nearest even, bf16 subnormals as zero, subnormal results flushed).
//  - `bf16_gemm_kernel::avx512_bf16`: packs op(A) and op(B) into pairs of bf16 along k and
//    multiplies them with VDPBF16PS (two bf16 products added to a float per lane, 32 products
//    per instruction, twice the multiply-adds of a float FMA). Compiled wherever the compiler
//    takes `target("avx512bf16")` on x86-64 (GCC, Clang) whatever the build's -march; it runs
//    wherever the CPU has AVX512_BF16 (AMD Zen 4 and later, Intel Cooper Lake and Sapphire
//    Rapids and later), and `automatic` picks it where it is the faster kernel and AMX is
//    absent, on AMD's (bf16_dot_products_fast: on Intel's the instruction is slower than float
//    FMAs). The instruction treats bf16 subnormals as zero and flushes subnormal results to
//    zero; each lane adds its two products to the sum one after the other, each addition
//    rounded to nearest even.
//  - `bf16_gemm_kernel::widened_sgemm` (`automatic` on every other CPU): the operands rounded
//    to bf16, widened back to float (exact) and multiplied by gemm<float> (cblas_sgemm when
//    linked). A bf16 times bf16 product is exact in float, so both sum the same exact
//    products in float; they differ only in the order of the additions and in subnormals.
// All are deterministic for a given CPU and thread count (one thread each).
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
#include <utility>
#include <vector>

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define BATON_BF16_GEMM_X86 1
#else
#define BATON_BF16_GEMM_X86 0
#endif
#if BATON_BF16_GEMM_X86 && defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#define BATON_BF16_GEMM_AMX 1
#else
#define BATON_BF16_GEMM_AMX 0
#endif

namespace baton::detail::nn {

/// Which code gemm_bf16 runs (automatic: the AMX kernel where the CPU and the OS allow it,
/// else the AVX512_BF16 kernel where it is the faster one, see bf16_dot_products_fast, else the
/// widened sgemm).
enum class bf16_gemm_kernel { automatic, avx512_bf16, widened_sgemm, amx_bf16 };

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

/// Whether this process can run the AMX kernel: the CPU has AMX-TILE and AMX-BF16 (Intel
/// Sapphire Rapids and later) and AVX512_BF16 (the packing), and Linux (5.16 or later) grants
/// the process the tile registers' state, asked once (arch_prctl ARCH_REQ_XCOMP_PERM).
inline bool cpu_has_amx_bf16() noexcept {
#if BATON_BF16_GEMM_AMX
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!cpu_has_avx512_bf16() || !__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool tile = (edx >> 24) & 1u, bf16 = (edx >> 22) & 1u;
    constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    return tile && bf16 && syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
  }();
  return has;
#else
  return false;
#endif
}

/// The kernel gemm_bf16's automatic choice runs on this machine.
inline bf16_gemm_kernel bf16_gemm_automatic_kernel() noexcept {
  if (cpu_has_amx_bf16()) return bf16_gemm_kernel::amx_bf16;
  return bf16_dot_products_fast() ? bf16_gemm_kernel::avx512_bf16 : bf16_gemm_kernel::widened_sgemm;
}

/// What gemm_bf16's automatic choice runs here: "amx_bf16", "avx512_bf16" or "widened sgemm"
/// (with the reason where the CPU has AVX512_BF16).
inline const char* bf16_gemm_implementation() noexcept {
  if (cpu_has_amx_bf16()) return "amx_bf16";
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
  if (t < count) {  // 1 to 31 values left, as masked loads (a row as short as 16 values, a head's,
                    // was all tail, converted one value at a time)
    const int rest = static_cast<int>(count - t);
    const int dwords = (rest + 1) / 2;
    const __m256i a = load16_bf16_bits(p + t, std::min(rest, 16));
    _mm256_mask_storeu_epi32(out + t / 2, __mmask8((1u << std::min(dwords, 8)) - 1u), a);
    if (dwords > 8) {
      const __m256i b = load16_bf16_bits(p + t + 16, rest - 16);
      _mm256_mask_storeu_epi32(out + t / 2 + 8, __mmask8((1u << (dwords - 8)) - 1u), b);
    }
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

// C = beta C (no products: k = 0 or alpha = 0); beta 0 writes zeros, as BLAS does.
inline void scale_only(std::int64_t m, std::int64_t n, float beta, float* c, std::int64_t ldc) noexcept {
  for (std::int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    for (std::int64_t j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : beta * row[j];
  }
}

// The kernels' epilogue: C's rows [0, rows) of up to 32 columns = alpha (sum0, sum1 of the
// row) + beta C; beta 0 overwrites C (NaNs in C do not survive), as BLAS does.
template <class RowSums>
BATON_BF16_TARGET __attribute__((always_inline)) inline void write_c_rows(float* c, std::int64_t ldc, int rows,
                                                                          int cols, float alpha, float beta,
                                                                          const RowSums& sums) noexcept {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const __mmask16 m0 = cols >= 16 ? __mmask16(0xffff) : __mmask16((1u << cols) - 1u);
  const __mmask16 m1 = cols >= 32 ? __mmask16(0xffff) : cols <= 16 ? __mmask16(0) : __mmask16((1u << (cols - 16)) - 1u);
#pragma GCC unroll 14
  for (int r = 0; r < rows; ++r) {
    float* row = c + r * ldc;
    const auto [s0, s1] = sums(r);
    __m512 y0 = _mm512_mul_ps(va, s0), y1 = _mm512_mul_ps(va, s1);
    if (beta != 0.0f) {
      y0 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m0, row), y0);
      y1 = _mm512_fmadd_ps(vb, _mm512_maskz_loadu_ps(m1, row + 16), y1);
    }
    _mm512_mask_storeu_ps(row, m0, y0);
    _mm512_mask_storeu_ps(row + 16, m1, y1);
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
  write_c_rows(c, ldc, rows, cols, alpha, beta, [&](int r) BATON_BF16_TARGET { return std::pair{acc[r][0], acc[r][1]}; });
}

template <class SA, class SB>
BATON_BF16_TARGET void gemm_avx512(op op_a, op op_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                                   const SA* a, std::int64_t lda, const SB* b, std::int64_t ldb, float beta, float* c,
                                   std::int64_t ldc) {
  if (k == 0 || alpha == 0.0f) return scale_only(m, n, beta, c, ldc);
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
#if BATON_BF16_GEMM_AMX
// ---- AMX: TDPBF16PS on 16 x 16 tiles ------------------------------------------------------
// One instruction multiplies a 16-row A tile (16 pairs of bf16 along k per row) by a B tile
// (16 pairs along k, each the pair of 16 columns): 8192 exact products summed into 16 x 16
// floats. A register block of C is 32 x 32: four C tiles, two A and two B tiles per step of 32
// k. Operands are packed with the AVX-512 helpers above, k padded with zero pairs to 16 and
// rows and columns to 32, so that every tile is whole and one tile configuration serves.
#define BATON_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))
inline constexpr std::int64_t amx_kc = 512;  // k per block (256 pairs): an A row of a block is 1 KiB
inline constexpr std::int64_t amx_mc = 128;  // rows per A block (128 KiB, in L2)
inline constexpr std::int64_t amx_nc = 512;  // columns per B block (512 KiB)

struct alignas(64) amx_tile_config {
  std::uint8_t palette = 1, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t bytes_per_row[16] = {};
  std::uint8_t rows[16] = {};
};

// op(X)'s rows [i0, i0 + rows) over k [p0, p0 + depth) as tile rows: row r's pairs at
// out[r * padded_pairs ..], zero past depth, and rows up to rows_padded zero.
template <class S>
BATON_AMX_TARGET void pack_tile_rows(const S* x, std::int64_t ld, bool row_major_pairs, std::int64_t i0,
                                     std::int64_t rows, std::int64_t rows_padded, std::int64_t p0, std::int64_t depth,
                                     std::int64_t padded_pairs, std::uint32_t* out, std::vector<std::uint32_t>& panel) {
  const std::int64_t pairs = (depth + 1) / 2;
  std::memset(out, 0, static_cast<std::size_t>(rows_padded * padded_pairs) * sizeof(std::uint32_t));
  if (row_major_pairs) {
    for (std::int64_t r = 0; r < rows; ++r) pairs_along_row(x + (i0 + r) * ld + p0, depth, out + r * padded_pairs);
    return;
  }
  // A row's pairs are one column of two memory rows: pack 16 rows at a time pair-major, then
  // put each row's pairs together.
  panel.resize(static_cast<std::size_t>(pairs * 16));
  std::vector<std::uint32_t> unused;  // pack_panels reads rows through it only for row-major pairs
  for (std::int64_t r0 = 0; r0 < rows; r0 += 16) {
    const std::int64_t in_panel = std::min<std::int64_t>(16, rows - r0);
    pack_panels(x, ld, false, i0 + r0, in_panel, p0, depth, 16, panel.data(), unused);
    for (std::int64_t q = 0; q < pairs; ++q)
      for (std::int64_t r = 0; r < in_panel; ++r)
        out[(r0 + r) * padded_pairs + q] = panel[static_cast<std::size_t>(q * 16 + r)];
  }
}

// op(B)'s columns [j0, j0 + cols) as B tiles: per 16 columns, padded_pairs pairs of 16 dwords,
// zero past depth and past cols (up to cols_padded).
template <class S>
BATON_AMX_TARGET void pack_tile_columns(const S* x, std::int64_t ld, bool row_major_pairs, std::int64_t j0,
                                        std::int64_t cols, std::int64_t cols_padded, std::int64_t p0,
                                        std::int64_t depth, std::int64_t padded_pairs, std::uint32_t* out,
                                        std::vector<std::uint32_t>& scratch) {
  for (std::int64_t c0 = 0; c0 < cols_padded; c0 += 16) {
    std::uint32_t* panel = out + (c0 / 16) * padded_pairs * 16;
    std::memset(panel, 0, static_cast<std::size_t>(padded_pairs * 16) * sizeof(std::uint32_t));
    if (c0 < cols) pack_panels(x, ld, row_major_pairs, j0 + c0, std::min<std::int64_t>(16, cols - c0), p0, depth, 16,
                               panel, scratch);
  }
}

// C[rows x cols] (rows, cols <= 32) = alpha (A rows . B columns) + (beta C, or nothing for beta 0).
BATON_AMX_TARGET inline void amx_block(std::int64_t padded_pairs, const std::uint32_t* a, const std::uint32_t* b,
                                       float* c, std::int64_t ldc, int rows, int cols, float alpha, float beta) noexcept {
  alignas(64) float sum[32 * 32];
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const std::int64_t a_stride = padded_pairs * 4;
  const std::uint32_t* b1 = b + padded_pairs * 16;
  for (std::int64_t q = 0; q < padded_pairs; q += 16) {
    _tile_loadd(4, a + q, a_stride);
    _tile_loadd(5, a + 16 * padded_pairs + q, a_stride);
    _tile_loadd(6, b + q * 16, 64);
    _tile_loadd(7, b1 + q * 16, 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, sum, 128);
  _tile_stored(1, sum + 16, 128);
  _tile_stored(2, sum + 16 * 32, 128);
  _tile_stored(3, sum + 16 * 32 + 16, 128);
  write_c_rows(c, ldc, rows, cols, alpha, beta,
               [&](int r) BATON_AMX_TARGET {
                 return std::pair{_mm512_load_ps(sum + r * 32), _mm512_load_ps(sum + r * 32 + 16)};
               });
}

template <class SA, class SB>
BATON_AMX_TARGET void gemm_amx(op op_a, op op_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                               const SA* a, std::int64_t lda, const SB* b, std::int64_t ldb, float beta, float* c,
                               std::int64_t ldc) {
  if (k == 0 || alpha == 0.0f) return scale_only(m, n, beta, c, ldc);
  const auto round32 = [](std::int64_t x) { return (x + 31) / 32 * 32; };
  // thread_local as in gemm_avx512: no allocation in a steady state.
  thread_local std::vector<std::uint32_t> a_pack, b_pack, scratch;
  const std::int64_t padded_pairs_max = (std::min(amx_kc, k + (k & 1)) / 2 + 15) / 16 * 16;
  a_pack.resize(static_cast<std::size_t>(round32(std::min(amx_mc, m)) * padded_pairs_max));
  b_pack.resize(static_cast<std::size_t>(round32(std::min(amx_nc, n)) * padded_pairs_max));
  amx_tile_config config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&config);
  for (std::int64_t j0 = 0; j0 < n; j0 += amx_nc) {
    const std::int64_t nb = std::min(amx_nc, n - j0);
    for (std::int64_t p0 = 0; p0 < k; p0 += amx_kc) {
      const std::int64_t kb = std::min(amx_kc, k - p0);
      const std::int64_t padded_pairs = ((kb + 1) / 2 + 15) / 16 * 16;
      const float beta_here = p0 == 0 ? beta : 1.0f;
      pack_tile_columns(b, ldb, op_b == op::transpose, j0, nb, round32(nb), p0, kb, padded_pairs, b_pack.data(), scratch);
      for (std::int64_t i0 = 0; i0 < m; i0 += amx_mc) {
        const std::int64_t mb = std::min(amx_mc, m - i0);
        pack_tile_rows(a, lda, op_a == op::none, i0, mb, round32(mb), p0, kb, padded_pairs, a_pack.data(), scratch);
        for (std::int64_t jr = 0; jr < nb; jr += 32) {
          const std::uint32_t* bp = b_pack.data() + (jr / 16) * padded_pairs * 16;
          const int cols = static_cast<int>(std::min<std::int64_t>(32, nb - jr));
          for (std::int64_t ir = 0; ir < mb; ir += 32)
            amx_block(padded_pairs, a_pack.data() + ir * padded_pairs, bp, c + (i0 + ir) * ldc + j0 + jr, ldc,
                      static_cast<int>(std::min<std::int64_t>(32, mb - ir)), cols, alpha, beta_here);
        }
      }
    }
  }
  _tile_release();
}
#undef BATON_AMX_TARGET
#endif  // BATON_BF16_GEMM_AMX

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
  if (kernel == bf16_gemm_kernel::automatic) kernel = bf16_gemm_automatic_kernel();
  if (kernel == bf16_gemm_kernel::amx_bf16) {
#if BATON_BF16_GEMM_AMX
    if (!cpu_has_amx_bf16())
      throw baton::nn::nn_error("baton::nn gemm_bf16: the amx_bf16 kernel needs a CPU with AMX-BF16 and an OS that "
                                "grants the tile registers (Linux 5.16 or later); use bf16_gemm_kernel::automatic");
    bf16_gemm::gemm_amx(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
#else
    throw baton::nn::nn_error("baton::nn gemm_bf16: the amx_bf16 kernel is built for x86-64 Linux with GCC or Clang "
                              "only; use bf16_gemm_kernel::automatic");
#endif
  }
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
