// baton/attention/detail/flash_tiles.hpp — the tiles of the host flash kernels, shared by the
// forward and the backward: the layout of a call (blocks of 64 queries and 64 keys, rounds of
// kv heads, work items), which part of a tile a mask leaves, the products and masking of one
// tile through cpu_gemm.hpp, and the non-finite rule at tile granularity. The packing of key
// blocks is in flash_packing.hpp.
//
// Nothing here knows about Kokkos, and nothing here is shared between work items except
// read-only packed inputs, so any number of items (and any number of calling threads) may
// run at once.
//
// Algorithm (FlashAttention-2, on a CPU):
//   forward, per (batch, head, block of 64 queries): S = Q K^T for a block of 64 keys as a
//     register-tiled GEMM, an online softmax in the log2 domain (a lazily moved reference
//     max m, sum l), and O += P V; out = O / l, lse = (m + log2 l) ln 2.
//   backward: D = rowsum(dO * O); a key-block pass (per batch, kv head, key block: loop over
//     every query block of every query head of the group) accumulating dV += P^T dO and
//     dK += dS^T Q, and dQ += dS K into its run's dQ partial; and a query-block pass summing
//     the partials in run order. Each output element is written by exactly one work item and
//     every sum runs in a fixed order: deterministic, no atomics.
// Inputs are packed into contiguous, zero-padded blocks (K^T per key block, V rows, ...), so
// the inner loops read unit-stride memory that stays in L1/L2 whatever the caller's strides
// (a [batch, seq, heads, dim] row is heads*dim elements from the next). A call runs in
// rounds of a few kv heads (with their query heads): each round packs its heads into the
// same buffer and runs every pass over them, so packed operands are read back from cache,
// not from memory, and the buffer is one round's size, not the whole call's.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/detail/cpu_gemm.hpp>
#include <baton/core/float16.hpp>
#include <baton/core/simd.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/tensor_view.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__GNUC__) && defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace baton::detail::attention {

inline constexpr std::int64_t block_q = 64;  // queries per tile
inline constexpr std::int64_t block_k = 64;  // keys per tile

// Key columns of a score tile are computed in whole vectors and read in whole register-tile
// rows (P^T as the A operand): round up to both. Both are powers of two.
template <class T>
inline constexpr std::int64_t key_column_multiple = std::max<std::int64_t>(width_v<T>, tile_rows);

/// Zero-initialised, 64-byte aligned heap array: per-call and per-item scratch (never global).
template <class T>
class scratch {
 public:
  scratch() = default;
  explicit scratch(std::int64_t n, bool zeroed = true) : n_(n) {
    if (n_ > 0) {
      p_ = static_cast<T*>(::operator new(static_cast<std::size_t>(n_) * sizeof(T), std::align_val_t{64}));
      if (zeroed) std::memset(static_cast<void*>(p_), 0, static_cast<std::size_t>(n_) * sizeof(T));
    }
  }
  scratch(const scratch&) = delete;
  scratch& operator=(const scratch&) = delete;
  scratch(scratch&& o) noexcept : n_(o.n_), p_(o.p_) { o.p_ = nullptr; o.n_ = 0; }
  scratch& operator=(scratch&& o) noexcept {
    std::swap(n_, o.n_);
    std::swap(p_, o.p_);
    return *this;
  }
  ~scratch() {
    if (p_) ::operator delete(static_cast<void*>(p_), std::align_val_t{64});
  }
  [[nodiscard]] T* data() const noexcept { return p_; }
  T& operator[](std::int64_t i) const noexcept { return p_[i]; }

 private:
  std::int64_t n_ = 0;
  T* p_ = nullptr;
};

// ---- the layout of a call ----------------------------------------------------------------

/// A round: the kv heads [begin, end) of the flattened (batch, kv head) index b * heads_kv + hk,
/// with their query heads. Packed operands hold one round's heads.
struct head_round {
  std::int64_t begin = 0, end = 0;
  [[nodiscard]] std::int64_t units() const noexcept { return end - begin; }
};

/// kv heads per round: enough work items (4 per thread) in a round's smallest pass, and no
/// more, so that what a round packs is still in cache when its passes read it back (a causal
/// backward gains most: its packing is the larger share of it; bench_attention measures it).
[[nodiscard]] inline std::int64_t round_units_for(std::int64_t units, std::int64_t k_blocks,
                                                  std::int64_t threads) noexcept {
  const std::int64_t wanted_items = 4 * std::max<std::int64_t>(threads, 1);
  const std::int64_t per_unit = std::max<std::int64_t>(k_blocks, 1);
  return std::clamp<std::int64_t>((wanted_items + per_unit - 1) / per_unit, 1, std::max<std::int64_t>(units, 1));
}

/// What one work item works on: a kv head's key block (keys k0 .. k0 + kc - 1), or a query
/// head's query block (queries q0 .. q0 + qc - 1; its kv head's unit kv_unit).
struct kv_item {
  std::int64_t unit, b, hk, kb, k0, kc;
};
struct q_item {
  std::int64_t unit, b, h, hk, qb, q0, qc, kv_unit;
};

template <class T>
struct flash_layout {
  checked_call call;
  std::int64_t dim_padded = 0;  // head dim rounded up to the vector width (packed rows)
  std::int64_t q_blocks = 0, k_blocks = 0;
  std::int64_t seq_q_padded = 0, seq_k_padded = 0;
  // The forward's packed V, stored by column panels of the P V GEMM (gemm's b_panel_stride):
  // per kv unit, panel p of row j at p * v_panel_stride + j * v_panel_width.
  std::int64_t v_panel_width = 0, v_panel_stride = 0, v_unit_size = 0;
  std::int64_t units = 0;        // batch * heads_kv
  std::int64_t round_units = 1;  // kv heads per round (the packed buffers' capacity)
  std::vector<position_block> q_tiles, k_tiles;

  flash_layout(const checked_call& checked, std::int64_t threads) : call(checked) {
    dim_padded = round_up(std::max<std::int64_t>(call.dim, 1), width_v<T>);
    q_blocks = (call.seq_q + block_q - 1) / block_q;
    k_blocks = (call.seq_k + block_k - 1) / block_k;
    seq_q_padded = q_blocks * block_q;
    seq_k_padded = k_blocks * block_k;
    v_panel_width = std::min(panel_columns<T>, dim_padded);
    v_panel_stride = seq_k_padded * v_panel_width;
    v_unit_size = (dim_padded + v_panel_width - 1) / v_panel_width * v_panel_stride;
    units = call.batch * call.heads_kv;
    round_units = round_units_for(units, k_blocks, threads);
    // position_block keeps a pointer to its positions: they live in this->call, which does not
    // move while the layout is used (the layout is neither copied nor moved).
    q_tiles.reserve(static_cast<std::size_t>(q_blocks));
    for (std::int64_t i = 0; i < q_blocks; ++i)
      q_tiles.emplace_back(call.q_pos, i * block_q, std::min(block_q, call.seq_q - i * block_q));
    k_tiles.reserve(static_cast<std::size_t>(k_blocks));
    for (std::int64_t j = 0; j < k_blocks; ++j)
      k_tiles.emplace_back(call.k_pos, j * block_k, std::min(block_k, call.seq_k - j * block_k));
  }
  flash_layout(const flash_layout&) = delete;
  flash_layout& operator=(const flash_layout&) = delete;

  [[nodiscard]] std::int64_t rounds() const noexcept { return (units + round_units - 1) / round_units; }
  [[nodiscard]] head_round round(std::int64_t r) const noexcept {
    return {r * round_units, std::min(units, (r + 1) * round_units)};
  }

  // Positions in a round's packed buffers. A kv unit is b * heads_kv + hk; a query unit is
  // b * heads_q + h, and the query units of kv unit u are u * group .. u * group + group - 1.
  [[nodiscard]] std::int64_t kv_block_index(const head_round& r, std::int64_t kv_unit, std::int64_t kb) const noexcept {
    return (kv_unit - r.begin) * k_blocks + kb;
  }
  [[nodiscard]] std::int64_t kv_row_index(const head_round& r, std::int64_t kv_unit, std::int64_t j) const noexcept {
    return (kv_unit - r.begin) * seq_k_padded + j;
  }
  /// Where kv unit kv_unit's packed V begins (its panel 0, row 0) in a round's array.
  [[nodiscard]] std::int64_t v_panels_index(const head_round& r, std::int64_t kv_unit) const noexcept {
    return (kv_unit - r.begin) * v_unit_size;
  }
  [[nodiscard]] std::int64_t q_row_index(const head_round& r, std::int64_t q_unit, std::int64_t i) const noexcept {
    return (q_unit - r.begin * call.group()) * seq_q_padded + i;
  }

  // A round's work items: one per (kv head, key block), or one per (query head, query block).
  [[nodiscard]] std::int64_t kv_items(const head_round& r) const noexcept { return r.units() * k_blocks; }
  [[nodiscard]] std::int64_t q_items(const head_round& r) const noexcept { return r.units() * call.group() * q_blocks; }
  [[nodiscard]] kv_item kv_item_at(const head_round& r, std::int64_t item) const noexcept {
    const std::int64_t unit = r.begin + item / k_blocks, kb = item % k_blocks;
    return {unit, unit / call.heads_kv, unit % call.heads_kv, kb, kb * block_k, std::min(block_k, call.seq_k - kb * block_k)};
  }
  /// Query blocks in descending order when asked: each item of a head then reads a subset of
  /// the key tiles the item before it read, so under a causal mask its diagonal tile is warm.
  [[nodiscard]] q_item q_item_at(const head_round& r, std::int64_t item, bool descending) const noexcept {
    const std::int64_t unit = r.begin * call.group() + item / q_blocks;
    const std::int64_t h = unit % call.heads_q;
    const std::int64_t qb = descending ? q_blocks - 1 - item % q_blocks : item % q_blocks;
    const std::int64_t b = unit / call.heads_q, hk = h / call.group();
    return {unit, b, h, hk, qb, qb * block_q, std::min(block_q, call.seq_q - qb * block_q), b * call.heads_kv + hk};
  }
};

/// Which part of a 64 x 64 tile a mask leaves, at the granularity of register-tile row groups.
/// Full tiles are computed whole. In a partial tile every pair is tested once, up front;
/// each group of 4 query rows then computes only the key columns (rounded out to whole
/// vectors) holding an allowed pair, and each group of 4 keys contracts only over the query
/// rows holding one. On a causal diagonal tile that skips ~40% of the GEMM work; elsewhere
/// it costs one pass over the tile's pairs, which a partial tile needed anyway.
template <class T>
struct tile_extent {
  static constexpr std::int64_t row_groups = block_q / tile_rows;
  static constexpr std::int64_t key_groups = block_k / tile_rows;

  std::int64_t rows = 0;   // query rows computed: qc rounded up to tile_rows (padding rows are masked)
  std::int64_t kc = 0;     // keys in the tile
  std::int64_t kcols = 0;  // key columns computed at most (vector and tile_rows multiple)
  bool partial = false;
  std::int64_t col_begin[row_groups], col_end[row_groups];  // per query row group; empty when equal
  std::int64_t row_begin[key_groups], row_end[key_groups];  // per key group
  alignas(64) T bias[block_q][block_k];                      // partial tiles: 0 allowed, -inf masked

  template <class Mask>
  void set(block_kind kind, const Mask& mask, const position_block& qt, const position_block& kt, std::int64_t qc,
           std::int64_t key_count) {
    constexpr std::int64_t W = width_v<T>;
    constexpr T neg_inf = -std::numeric_limits<T>::infinity();
    rows = round_up(qc, tile_rows);
    kc = key_count;
    kcols = round_up(kc, key_column_multiple<T>);
    partial = kind == block_kind::partial;
    const std::int64_t groups = rows / tile_rows, kgroups = round_up(kc, tile_rows) / tile_rows;
    if (!partial) {
      for (std::int64_t g = 0; g < groups; ++g) {
        col_begin[g] = 0;
        col_end[g] = kcols;
      }
      for (std::int64_t g = 0; g < kgroups; ++g) {
        row_begin[g] = 0;
        row_end[g] = rows;
      }
      return;
    }
    std::int64_t kpos[block_k];
    // A mask that knows each row's allowed keys as an interval is not tested pair by pair
    // (on a causal diagonal tile the tests cost about as much as the masked GEMM work saved).
    bool by_interval = false;
    if constexpr (mask_with_key_intervals<Mask>) by_interval = kt.is_contiguous();
    if (!by_interval)
      for (std::int64_t j = 0; j < kc; ++j) kpos[j] = kt[j];
    for (std::int64_t g = 0; g < kgroups; ++g) {
      row_begin[g] = rows;
      row_end[g] = 0;
    }
    for (std::int64_t g = 0; g < groups; ++g) {
      std::int64_t lo = kc, hi = 0;
      for (std::int64_t i = g * tile_rows; i < (g + 1) * tile_rows; ++i) {
        T* row = bias[i];
        std::int64_t first = kc, last = -1;
        if (i >= qc) {
          std::fill(row, row + kcols, neg_inf);
          continue;
        }
        if constexpr (mask_with_key_intervals<Mask>) {
          if (by_interval) {
            const key_interval keys = mask.allowed_keys(qt[i], kt.min(), kt.min() + kc);
            first = keys.begin - kt.min();
            last = keys.end - kt.min() - 1;
            if (last < first) first = kc, last = -1;
            std::fill(row, row + std::min(first, kc), neg_inf);
            if (last >= first) std::fill(row + first, row + last + 1, T(0));
            std::fill(row + std::max(first, last + 1), row + kcols, neg_inf);
          }
        }
        if (!by_interval) {
          std::fill(row + kc, row + kcols, neg_inf);
          const std::int64_t qpos = qt[i];
          for (std::int64_t j = 0; j < kc; ++j) {  // branch-free: vectorises for the built-in masks
            const bool a = mask.allowed(qpos, kpos[j]);
            row[j] = a ? T(0) : neg_inf;
            first = a && j < first ? j : first;
            last = a && j > last ? j : last;
          }
        }
        if (last < 0) continue;
        // The row's first and last allowed key bound everything below: a key group's row
        // range may then include rows with no allowed key in it (their P is 0, which is
        // harmless), never exclude one that has.
        lo = std::min(lo, first);
        hi = std::max(hi, last + 1);
        for (std::int64_t kg = first / tile_rows; kg <= last / tile_rows; ++kg) {
          row_begin[kg] = std::min(row_begin[kg], i);
          row_end[kg] = std::max(row_end[kg], i + 1);
        }
      }
      col_begin[g] = lo < hi ? lo / W * W : 0;
      col_end[g] = lo < hi ? round_up(hi, W) : 0;
    }
    for (std::int64_t g = 0; g < kgroups; ++g)
      if (row_begin[g] >= row_end[g]) row_begin[g] = row_end[g] = 0;
  }

  [[nodiscard]] std::int64_t groups() const noexcept { return rows / tile_rows; }
  /// Number of consecutive row groups from g with g's column range (one GEMM call for them).
  [[nodiscard]] std::int64_t same_columns_run(std::int64_t g) const noexcept {
    std::int64_t n = 1;
    while (g + n < groups() && col_begin[g + n] == col_begin[g] && col_end[g + n] == col_end[g]) ++n;
    return n;
  }
  [[nodiscard]] std::int64_t key_groups_used() const noexcept { return round_up(kc, tile_rows) / tile_rows; }
};

/// A work item's scratch, allocated once per run of items (a launch chunk) instead of per
/// item: heap allocation and zeroing per item show in the profile of a short causal pass,
/// where items hold half the tiles. Each item re-initialises what it reads before writing it.
template <class T>
struct item_scratch {
  scratch<T> rows_a, rows_b;  // [block_q][dim_padded]: forward Q and O; key pass dK and dV; query pass dQ
  // Two score tiles: the backward's S (then P) and dP (then dS), [block_q][block_k] each; the
  // forward's pair of P tiles side by side, [block_q][2 * block_k].
  scratch<T> scores;
  scratch<T> m, l;  // forward: running max, running sums (block_q x width)
  std::unique_ptr<tile_extent<T>> tile = std::make_unique_for_overwrite<tile_extent<T>>();  // 16-32 KiB

  explicit item_scratch(std::int64_t dim_padded)
      : rows_a(block_q * dim_padded, false), rows_b(block_q * dim_padded, false),
        scores(2 * block_q * block_k, false), m(block_q, false), l(block_q * width_v<T>, false) {}
};

/// Asks for the cache lines holding n elements from row on. The packing loops read rows that
/// lie heads * dim elements apart, a stride the hardware prefetcher does not run ahead on, so
/// each row waited on memory until the packing asked for a few rows ahead.
template <class TT>
BATON_ALWAYS_INLINE void prefetch_row(const TT* row, std::int64_t n) noexcept {
#if defined(__GNUC__)
  constexpr std::int64_t per_line = std::max<std::int64_t>(1, 64 / static_cast<std::int64_t>(sizeof(TT)));
  for (std::int64_t x = 0; x < n; x += per_line) __builtin_prefetch(row + x);
#else
  (void)row;
  (void)n;
#endif
}

/// How many rows ahead the packing loops prefetch.
inline constexpr std::int64_t prefetch_rows_ahead = 8;

/// Row r of a 4-D tensor whose last axis is contiguous (checked by the backend).
template <class TT>
[[nodiscard]] inline TT* row_of(const tensor_view<TT, 4>& t, std::int64_t b, std::int64_t s, std::int64_t h) noexcept {
  return &t(b, s, h, 0);
}

// ---- the softmax's exponential ----------------------------------------------------------

/// 2^f for f in [0, 1): the softmax tiles' polynomial, a degree-5 minimax fit of the
/// relative error (7.5e-8 in exact arithmetic, 1.5e-7 evaluated in float over every f on a
/// 2^-24 grid). Its argument carries more: a score in log2 units is a float dot product
/// of D terms, off by some 2^-24 times their magnitudes summed (and 1.6e-7 relative in 2^x
/// for each 4 log2 units of magnitude from one rounding alone). A degree-6 fit (6.2e-8) cost
/// one more operation per 16 scores for no accuracy a caller could see.
BATON_ALWAYS_INLINE vec_t<float> exp2_unit_fraction(vec_t<float> f) noexcept {
  static constexpr float c[] = {0.99999992506358777f, 0.69315307320262605f, 0.24015361702112632f,
                                0.0558263181162335f, 0.0089893400235819068f, 0.001877576700019989f};
  return horner(f, c);
}

/// 2^f for f in [-1/2, 1/2] as 1 + f q(f), q of degree 4: a minimax fit of the relative
/// error (9.2e-8 in exact arithmetic, 1.7e-7 evaluated in float with FMAs over every f on a
/// 2^-24 grid; the exact 1 added last keeps the rounding of the terms before it small).
BATON_ALWAYS_INLINE vec_t<float> exp2_centred_fraction(vec_t<float> f) noexcept {
  static constexpr float q[] = {0.693147004f, 0.240222424f, 0.0555073358f, 0.00967151672f, 0.00132647366f};
  return fma(horner(f, q), f, broadcast(1.0f));
}

/// 2^x per lane for the softmax tiles (forward and backward use this one, so the backward's
/// P is the forward's): relative error ~1.5e-7 on every x >= -126; below that, and -inf (a
/// masked score), 0 (no subnormal P reaches the P V product, where a subnormal result would
/// cost a microcode assist). A NaN gives NaN when NanToNan (the forward: it then reaches the
/// row's sum, and the non-finite rule makes the row NaN), else 0.
/// With AVX-512 (DQ) it is 8 operations: the range test as a mask, vreduceps for
/// f = x - floor(x) (0 for +-inf, so -inf needs no test), the degree-5 polynomial, and
/// vscalefps for p * 2^floor(x). Every one of them competes with the tile GEMMs' FMAs for the
/// same two ports on Intel's cores; the former 12 (round, subtract, degree 7) cost ~3 % of a
/// D = 64 forward there.
/// Elsewhere (AVX2, SSE) it is 12: the clamps to [-127, 128], core::simd's split_exp2 (x =
/// round(x) + f; 2^round(x) is 0 at -127, +inf at 128) and 1 + f q(f) above; relative error
/// ~1.7e-7, and x in [-126.5, -126) gives a subnormal instead of 0. core::simd's exp2 (the
/// same split, degree 7) takes 14, and the softmax was 14.5 % of a D = 64 forward built for
/// AVX2 when it took 15.
template <bool NanToNan, class T>
BATON_ALWAYS_INLINE vec_t<T> exp2_scores(vec_t<T> x) noexcept {
#if defined(__GNUC__) && defined(__AVX512F__) && defined(__AVX512DQ__)
  if constexpr (std::is_same_v<T, float> && width_v<T> == 16) {
    // x in a register: GCC otherwise folds the score's load into vreduceps and vscalefps
    // (three loads of it), and on Zen 5 those memory forms made a D = 64 forward ~8 % slower
    // (docs/attention.md).
    pin_register(x);
    // The masked form with x as its own source: GCC 12's unmasked one passes an undefined
    // operand that -Wmaybe-uninitialized reports.
    const __m512 f = _mm512_mask_reduce_ps(x, 0xffff, x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    const __mmask16 live = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-126.0f), NanToNan ? _CMP_NLT_UQ : _CMP_GE_OQ);
    return _mm512_maskz_scalef_ps(live, exp2_unit_fraction(f), x);
  }
#endif
#if defined(__GNUC__)
  if constexpr (std::is_same_v<T, float>) {
    // vmax and vmin return their second operand where either is NaN: x second keeps a NaN.
    x = NanToNan ? vmax<float>(broadcast(-127.0f), x) : vmax<float>(x, broadcast(-127.0f));
    x = vmin<float>(broadcast(128.0f), x);
    const exp2_split parts = split_exp2(x);
    return exp2_centred_fraction(parts.fraction) * parts.power;
  }
#endif
  return exp2(x);  // double, and any type without GCC's vector extensions: core::simd's (NaN gives 0)
}

/// A bit per lane of x that is greater than y (0 for NaN lanes): where the target has mask
/// registers, the bits stay in one and rows OR them there.
template <class T>
BATON_ALWAYS_INLINE unsigned greater_bits(const vec_t<T>& x, const vec_t<T>& y) noexcept {
#if defined(__GNUC__) && defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float> && width_v<T> == 16) return _mm512_cmp_ps_mask(x, y, _CMP_GT_OQ);
  if constexpr (std::is_same_v<T, double> && width_v<T> == 8) return _mm512_cmp_pd_mask(x, y, _CMP_GT_OQ);
#endif
  unsigned bits = 0;
  for (int i = 0; i < width_v<T>; ++i) bits |= static_cast<unsigned>(x[i] > y[i]) << i;
  return bits;
}

// ---- storage and compute types ----------------------------------------------------------
// The kernels compute in compute_t<S> for storage S: float and double in themselves, bfloat16
// in float. A bf16 value is widened when it is packed (the packed operands are always the
// compute type) and an output is rounded to bf16 once, when its row is written.

template <class S>
struct compute_type {
  using type = S;
};
template <>
struct compute_type<bfloat16> {
  using type = float;
};
template <class S>
using compute_t = typename compute_type<std::remove_const_t<S>>::type;

/// A stored value in compute type T (exact: bf16 is the top half of a float).
template <class T, class S>
BATON_ALWAYS_INLINE T widen(const S& x) noexcept {
  if constexpr (std::is_same_v<std::remove_const_t<S>, bfloat16>)
    return static_cast<T>(x.to_float());
  else
    return static_cast<T>(x);
}
/// A computed value rounded to storage S (to nearest even for bf16).
template <class S, class T>
BATON_ALWAYS_INLINE S narrow(T x) noexcept {
  if constexpr (std::is_same_v<S, bfloat16>)
    return bfloat16(static_cast<float>(x));
  else
    return static_cast<S>(x);
}
/// dst[0..n) = src[0..n) in the compute type: the packing's one load of a stored row.
template <class S, class T>
BATON_ALWAYS_INLINE void load_row(const S* src, std::int64_t n, T* dst) noexcept {
  if constexpr (std::is_same_v<S, T>)
    std::copy(src, src + n, dst);
  else
    for (std::int64_t i = 0; i < n; ++i) dst[i] = widen<T>(src[i]);
}

/// Whether x[0..n) holds only finite values: an integer test of the exponent bits that the
/// compiler vectorises (one pass over a packed row; never inside a tile loop).
template <class T>
BATON_ALWAYS_INLINE bool all_finite(const T* x, std::int64_t n) noexcept {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8 || std::is_same_v<T, bfloat16>);
  using U = std::conditional_t<sizeof(T) == 2, std::uint16_t,
                               std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>>;
  constexpr U exponent = sizeof(T) == 2 ? U(0x7f80u) : sizeof(T) == 4 ? U(0x7f800000u) : U(0x7ff0000000000000ull);
  U bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    U bits;
    std::memcpy(&bits, x + i, sizeof bits);
    bad |= static_cast<U>((bits & exponent) == exponent);
  }
  return bad == 0;
}

/// The non-finite rule (docs/attention.md) at tile granularity, for tiles that hold a bad query
/// row or a bad key (rare: every other tile skips this). For each pair of the tile the mask
/// allows, with row i live: when row_bad[i] or key_bad[j], marks row_hit[i] and key_hit[j]
/// (either may be null). row_live null: every row is live.
template <class T>
inline void mark_bad_pairs(const tile_extent<T>& t, std::int64_t qc, const unsigned char* row_bad,
                           const unsigned char* row_live, const unsigned char* key_bad, unsigned char* row_hit,
                           unsigned char* key_hit) noexcept {
  for (std::int64_t i = 0; i < qc; ++i) {
    if (row_live && !row_live[i]) continue;
    for (std::int64_t j = 0; j < t.kc; ++j) {
      if (!(row_bad[i] || key_bad[j])) continue;
      if (t.partial && t.bias[i][j] != T(0)) continue;  // masked: never read
      if (row_hit) row_hit[i] = 1;
      if (key_hit) key_hit[j] = 1;
    }
  }
}

/// Writes NaN over a row of n elements (the non-finite rule's result).
template <class TD>
inline void write_nan_row(TD* dst, std::int64_t n) noexcept {
  if constexpr (std::is_same_v<TD, bfloat16>)
    std::fill(dst, dst + n, narrow<TD>(std::numeric_limits<float>::quiet_NaN()));
  else
    std::fill(dst, dst + n, std::numeric_limits<TD>::quiet_NaN());
}

/// dst[d] = src[d] * factor (+ dst[d] when accumulating), d < n: the final write of a gradient
/// (or an output), rounded once to the storage type (a bf16 sum is formed in the compute type).
template <class TD, class T>
inline void write_scaled_row(TD* dst, const T* src, T factor, std::int64_t n, bool accumulate) noexcept {
  if constexpr (std::is_same_v<TD, T>) {
    if (accumulate)
      for (std::int64_t d = 0; d < n; ++d) dst[d] = static_cast<TD>(dst[d] + src[d] * factor);
    else
      for (std::int64_t d = 0; d < n; ++d) dst[d] = static_cast<TD>(src[d] * factor);
  } else {
    if (accumulate)
      for (std::int64_t d = 0; d < n; ++d) dst[d] = narrow<TD>(widen<T>(dst[d]) + src[d] * factor);
    else
      for (std::int64_t d = 0; d < n; ++d) dst[d] = narrow<TD>(src[d] * factor);
  }
}

/// Calls body(kb, k0) for each key tile of query block qb that the mask does not classify
/// empty, in ascending order (descending when asked), with `tile` set for it (which rows and
/// columns to compute).
template <class T, class Mask, class F>
inline void for_each_key_tile(const flash_layout<T>& layout, const Mask& mask, std::int64_t qb, std::int64_t qc,
                              tile_extent<T>& tile, F&& body, bool descending = false) {
  for (std::int64_t step = 0; step < layout.k_blocks; ++step) {
    const std::int64_t kb = descending ? layout.k_blocks - 1 - step : step;
    const block_kind kind = mask.classify(layout.q_tiles[qb], layout.k_tiles[kb]);
    if (kind == block_kind::empty) continue;
    const std::int64_t k0 = kb * block_k;
    tile.set(kind, mask, layout.q_tiles[qb], layout.k_tiles[kb], qc, std::min(block_k, layout.call.seq_k - k0));
    body(kb, k0);
  }
}

/// C (=) A B^T-style products whose output columns are the tile's keys: S = Q K^T and
/// dP = dO V^T. a: packed rows [rows][a_ld]; bt: the key tile transposed, [dim][block_k];
/// row_init: a value per row that C starts from (null: 0); c_ld: C's leading dimension.
template <class T>
inline void tile_scores(const tile_extent<T>& t, T* c, const T* a, std::int64_t a_ld, const T* bt, std::int64_t dim,
                        const T* row_init = nullptr, std::int64_t c_ld = block_k) {
  if (!t.partial) {
    gemm<T, false>(c, c_ld, t.rows, t.kcols, a, a_ld, 1, bt, block_k, dim, row_init);
    return;
  }
  for (std::int64_t g = 0; g < t.groups();) {
    const std::int64_t run = t.same_columns_run(g);
    if (t.col_end[g] > t.col_begin[g]) {
      const std::int64_t r0 = g * tile_rows, c0 = t.col_begin[g];
      gemm<T, false>(c + r0 * c_ld + c0, c_ld, run * tile_rows, t.col_end[g] - c0, a + r0 * a_ld, a_ld, 1, bt + c0,
                     block_k, dim, row_init ? row_init + r0 : nullptr);
    }
    g += run;
  }
}

/// Masks the scores just computed: -inf for disallowed pairs and key columns past the end.
template <class T>
inline void tile_mask(const tile_extent<T>& t, T* s, std::int64_t s_ld = block_k) {
  constexpr int W = width_v<T>;
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  if (!t.partial) {
    if (t.kc < t.kcols)
      for (std::int64_t i = 0; i < t.rows; ++i) std::fill(s + i * s_ld + t.kc, s + i * s_ld + t.kcols, neg_inf);
    return;
  }
  for (std::int64_t i = 0; i < t.rows; ++i) {  // adding -inf masks, adding 0 keeps
    const std::int64_t g = i / tile_rows;
    T* row = s + i * s_ld;
    for (std::int64_t j = t.col_begin[g]; j < t.col_end[g]; j += W) store(row + j, load(row + j) + load(t.bias[i] + j));
  }
}

/// C[rows][cols] += P B, contracting over the tile's keys: O += P V and dQ += dS K.
/// lhs: P or dS, [rows][lhs_ld]; b: the key tile's rows [kc][b_ld] (zero past kc), or with
/// b_panel_stride > 0 stored by column panels as gemm takes them (the forward's V).
template <class T>
inline void tile_accumulate_rows(const tile_extent<T>& t, T* c, std::int64_t ldc, std::int64_t cols, const T* lhs,
                                 const T* b, std::int64_t b_ld, std::int64_t lhs_ld = block_k,
                                 std::int64_t b_panel_stride = 0) {
  if (!t.partial) {
    gemm<T, true>(c, ldc, t.rows, cols, lhs, lhs_ld, 1, b, b_ld, t.kc, nullptr, b_panel_stride);
    return;
  }
  for (std::int64_t g = 0; g < t.groups();) {
    const std::int64_t run = t.same_columns_run(g);
    if (t.col_end[g] > t.col_begin[g]) {
      const std::int64_t r0 = g * tile_rows, k0 = t.col_begin[g];
      gemm<T, true>(c + r0 * ldc, ldc, run * tile_rows, cols, lhs + r0 * lhs_ld + k0, lhs_ld, 1, b + k0 * b_ld, b_ld,
                    std::min(t.col_end[g], t.kc) - k0, nullptr, b_panel_stride);
    }
    g += run;
  }
}

/// C[keys][cols] += P^T B, contracting over the tile's query rows: dV += P^T dO and
/// dK += dS^T Q. lhs: P or dS, [rows][block_k], with zeros wherever it was not computed.
template <class T>
inline void tile_accumulate_keys(const tile_extent<T>& t, T* c, std::int64_t ldc, std::int64_t cols, const T* lhs,
                                 const T* b, std::int64_t b_ld) {
  if (!t.partial) {
    gemm<T, true>(c, ldc, round_up(t.kc, tile_rows), cols, lhs, 1, block_k, b, b_ld, t.rows);
    return;
  }
  for (std::int64_t g = 0; g < t.key_groups_used(); ++g)
    if (t.row_end[g] > t.row_begin[g]) {
      const std::int64_t j0 = g * tile_rows, i0 = t.row_begin[g];
      gemm<T, true>(c + j0 * ldc, ldc, tile_rows, cols, lhs + i0 * block_k + j0, 1, block_k, b + i0 * b_ld, b_ld,
                    t.row_end[g] - i0);
    }
}

}  // namespace baton::detail::attention
