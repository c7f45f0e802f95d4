// baton/attention/detail/flash_cpu.hpp — tiled flash attention on the host: the tiles only.
//
// The Kokkos backend (attention/kokkos.hpp) launches these per work item; nothing here
// knows about Kokkos, and nothing here is shared between work items except read-only
// packed inputs, so any number of items (and any number of calling threads) may run at once.
//
// Algorithm (FlashAttention-2, on a CPU):
//   forward, per (batch, head, block of 64 queries): S = Q K^T for a block of 64 keys as a
//     register-tiled GEMM, an online softmax in the log2 domain (running max m, sum l), and
//     O += P V; out = O / l, lse = (m + log2 l) ln 2.
//   backward: D = rowsum(dO * O); a key-block pass (per batch, kv head, key block: loop over
//     every query block of every query head of the group) accumulating dV += P^T dO and
//     dK += dS^T Q; and a query-block pass accumulating dQ += dS K. Each output element is
//     written by exactly one work item: deterministic, no atomics.
// Inputs are packed into contiguous, zero-padded blocks (K^T per key block, V rows, ...), so
// the inner loops read unit-stride memory that stays in L1/L2 whatever the caller's strides
// (a [batch, seq, heads, dim] row is heads*dim elements from the next). A call runs in
// rounds of a few kv heads (with their query heads): each round packs its heads into the
// same buffer and runs every pass over them, so packed operands are read back from cache,
// not from memory, and the buffer is one round's size, not the whole problem's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>
#include <vector>

#include <baton/attention/backend.hpp>
#include <baton/attention/detail/simd.hpp>
#include <baton/attention/detail/workspace.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/tensor_view.hpp>

#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"
#define BATON_ATTN_UNROLL _Pragma("GCC unroll 16")
#else
#define BATON_ATTN_UNROLL
#endif

namespace baton::detail::attn {

inline constexpr std::int64_t block_q = 64;  // queries per tile
inline constexpr std::int64_t block_k = 64;  // keys per tile
inline constexpr int tile_rows = 4;          // rows of the register tile
// Vectors per register-tile row: 4 x 4 accumulators + 4 operands fit 32 registers (AVX-512);
// with 16 registers, 4 x 2.
inline constexpr int tile_vectors = vector_registers >= 32 ? 4 : 2;
// Contraction chunk: keeps a 128 x (tile_vectors * width) panel of B in L1.
inline constexpr std::int64_t contraction_chunk = 128;

[[nodiscard]] constexpr std::int64_t round_up(std::int64_t n, std::int64_t m) noexcept { return (n + m - 1) / m * m; }

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

// ---------------------------------------------------------------------------------------
// GEMM tiles. C[rows x cols] (= or +=) A[rows x kdim] * B[kdim x cols], where
// A(r, k) = a[r * a_row + k * a_k] (so A^T is the same call with the strides swapped) and B
// is row-major with leading dimension ldb. rows is a multiple of tile_rows and cols of the
// vector width: callers pad their packed operands with zeros.

template <class T, int R, int NV, bool Accumulate>
BATON_ATTN_INLINE void gemm_micro_tile(T* c, std::int64_t ldc, const T* a, std::int64_t a_row, std::int64_t a_k,
                                       const T* b, std::int64_t ldb, std::int64_t kdim) noexcept {
  using V = vec_t<T>;
  constexpr int W = width_v<T>;
  V acc[R][NV];
  BATON_ATTN_UNROLL
  for (int r = 0; r < R; ++r) {
    BATON_ATTN_UNROLL
    for (int v = 0; v < NV; ++v) acc[r][v] = Accumulate ? load(c + r * ldc + v * W) : V{};
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
BATON_ATTN_NOINLINE void gemm_column_panel(T* c, std::int64_t ldc, std::int64_t rows, const T* a, std::int64_t a_row,
                              std::int64_t a_k, const T* b, std::int64_t ldb, std::int64_t kdim) noexcept {
  // Narrow panels (a partial tile's few key columns, small head dims) take more rows per
  // register tile, so that enough independent accumulators hide the FMA latency.
  constexpr int R = std::max(tile_rows, vector_registers / 2 / NV / tile_rows * tile_rows);
  std::int64_t r0 = 0;
  if constexpr (R > tile_rows)
    for (; r0 + R <= rows; r0 += R)
      gemm_micro_tile<T, R, NV, Accumulate>(c + r0 * ldc, ldc, a + r0 * a_row, a_row, a_k, b, ldb, kdim);
  for (; r0 < rows; r0 += tile_rows)
    gemm_micro_tile<T, tile_rows, NV, Accumulate>(c + r0 * ldc, ldc, a + r0 * a_row, a_row, a_k, b, ldb, kdim);
}

template <class T, bool Accumulate>
inline void gemm_panel_dispatch(int nv, T* c, std::int64_t ldc, std::int64_t rows, const T* a, std::int64_t a_row,
                                std::int64_t a_k, const T* b, std::int64_t ldb, std::int64_t kdim) noexcept {
  static_assert(tile_vectors == 4 || tile_vectors == 2);
  switch (nv) {
    case 4:
      if constexpr (tile_vectors >= 4) gemm_column_panel<T, 4, Accumulate>(c, ldc, rows, a, a_row, a_k, b, ldb, kdim);
      break;
    case 3:
      if constexpr (tile_vectors >= 3) gemm_column_panel<T, 3, Accumulate>(c, ldc, rows, a, a_row, a_k, b, ldb, kdim);
      break;
    case 2: gemm_column_panel<T, 2, Accumulate>(c, ldc, rows, a, a_row, a_k, b, ldb, kdim); break;
    default: gemm_column_panel<T, 1, Accumulate>(c, ldc, rows, a, a_row, a_k, b, ldb, kdim); break;
  }
}

template <class T, bool Accumulate>
inline void gemm(T* c, std::int64_t ldc, std::int64_t rows, std::int64_t cols, const T* a, std::int64_t a_row,
                 std::int64_t a_k, const T* b, std::int64_t ldb, std::int64_t kdim) noexcept {
  constexpr int W = width_v<T>;
  if (kdim <= 0) {
    if constexpr (!Accumulate)
      for (std::int64_t r = 0; r < rows; ++r) std::fill(c + r * ldc, c + r * ldc + cols, T(0));
    return;
  }
  for (std::int64_t k0 = 0; k0 < kdim; k0 += contraction_chunk) {
    const std::int64_t kc = std::min(contraction_chunk, kdim - k0);
    const T* ak = a + k0 * a_k;
    const T* bk = b + k0 * ldb;
    for (std::int64_t c0 = 0; c0 < cols; c0 += tile_vectors * W) {
      const int nv = static_cast<int>(std::min<std::int64_t>(tile_vectors, (cols - c0) / W));
      if (Accumulate || k0 > 0)
        gemm_panel_dispatch<T, true>(nv, c + c0, ldc, rows, ak, a_row, a_k, bk + c0, ldb, kc);
      else
        gemm_panel_dispatch<T, false>(nv, c + c0, ldc, rows, ak, a_row, a_k, bk + c0, ldb, kc);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Shared per-call data: the problem, packed operands and the position blocks masks classify.

/// A round: the kv heads [begin, end) of the flattened (batch, kv head) index b * heads_kv + hk,
/// with their query heads. Packed operands hold one round's heads.
struct head_round {
  std::int64_t begin = 0, end = 0;
  [[nodiscard]] std::int64_t units() const noexcept { return end - begin; }
};

/// kv heads per round: enough work items (4 per thread) in a round's smallest pass, and no
/// more, so that what a round packs is still in cache when its passes read it back. At
/// S = 1024, one head per round instead of all 8 made a single-threaded backward ~7% faster
/// (a causal one: its packing is a larger share of it).
[[nodiscard]] inline std::int64_t round_units_for(std::int64_t units, std::int64_t k_blocks,
                                                  std::int64_t threads) noexcept {
  const std::int64_t wanted_items = 4 * std::max<std::int64_t>(threads, 1);
  const std::int64_t per_unit = std::max<std::int64_t>(k_blocks, 1);
  return std::clamp<std::int64_t>((wanted_items + per_unit - 1) / per_unit, 1, std::max<std::int64_t>(units, 1));
}

/// What one work item works on: a kv head's key block, or a query head's query block.
struct kv_item {
  std::int64_t unit, b, hk, kb;
};
struct q_item {
  std::int64_t unit, b, h, hk, qb;
};

template <class T>
struct flash_layout {
  problem p;
  std::int64_t dim_padded = 0;  // head dim rounded up to the vector width (packed rows)
  std::int64_t q_blocks = 0, k_blocks = 0;
  std::int64_t seq_q_padded = 0, seq_k_padded = 0;
  std::int64_t units = 0;        // batch * heads_kv
  std::int64_t round_units = 1;  // kv heads per round (the packed buffers' capacity)
  std::vector<position_block> q_tiles, k_tiles;

  flash_layout(const problem& prob, std::int64_t threads) : p(prob) {
    dim_padded = round_up(std::max<std::int64_t>(p.dim, 1), width_v<T>);
    q_blocks = (p.seq_q + block_q - 1) / block_q;
    k_blocks = (p.seq_k + block_k - 1) / block_k;
    seq_q_padded = q_blocks * block_q;
    seq_k_padded = k_blocks * block_k;
    units = p.batch * p.heads_kv;
    round_units = round_units_for(units, k_blocks, threads);
    // position_block keeps a pointer to its positions: they live in this->p, which does not
    // move while the layout is used (the layout is neither copied nor moved).
    q_tiles.reserve(static_cast<std::size_t>(q_blocks));
    for (std::int64_t i = 0; i < q_blocks; ++i)
      q_tiles.emplace_back(p.q_pos, i * block_q, std::min(block_q, p.seq_q - i * block_q));
    k_tiles.reserve(static_cast<std::size_t>(k_blocks));
    for (std::int64_t j = 0; j < k_blocks; ++j)
      k_tiles.emplace_back(p.k_pos, j * block_k, std::min(block_k, p.seq_k - j * block_k));
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
  [[nodiscard]] std::int64_t q_row_index(const head_round& r, std::int64_t q_unit, std::int64_t i) const noexcept {
    return (q_unit - r.begin * p.group()) * seq_q_padded + i;
  }

  // A round's work items: one per (kv head, key block), or one per (query head, query block).
  [[nodiscard]] std::int64_t kv_items(const head_round& r) const noexcept { return r.units() * k_blocks; }
  [[nodiscard]] std::int64_t q_items(const head_round& r) const noexcept { return r.units() * p.group() * q_blocks; }
  [[nodiscard]] kv_item kv_item_at(const head_round& r, std::int64_t item) const noexcept {
    const std::int64_t unit = r.begin + item / k_blocks;
    return {unit, unit / p.heads_kv, unit % p.heads_kv, item % k_blocks};
  }
  /// Query blocks in descending order when asked: each item of a head then reads a subset of
  /// the key tiles the item before it read, so under a causal mask its diagonal tile is warm.
  [[nodiscard]] q_item q_item_at(const head_round& r, std::int64_t item, bool descending) const noexcept {
    const std::int64_t unit = r.begin * p.group() + item / q_blocks;
    const std::int64_t h = unit % p.heads_q;
    const std::int64_t qb = descending ? q_blocks - 1 - item % q_blocks : item % q_blocks;
    return {unit, unit / p.heads_q, h, h / p.group(), qb};
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
/// item: heap allocation and zeroing per item cost ~2% of a short causal pass, where items
/// hold half the tiles. Each item re-initialises what it reads before writing it.
template <class T>
struct item_scratch {
  scratch<T> rows_a, rows_b;  // [block_q][dim_padded]: forward Q and O; key pass dK and dV; query pass dQ
  scratch<T> s, dp;           // [block_q][block_k] score tiles
  scratch<T> m, l;            // forward: running max, running sums (block_q x width)
  std::unique_ptr<tile_extent<T>> tile = std::make_unique_for_overwrite<tile_extent<T>>();  // 16-32 KiB

  explicit item_scratch(std::int64_t dim_padded)
      : rows_a(block_q * dim_padded, false), rows_b(block_q * dim_padded, false), s(block_q * block_k, false),
        dp(block_q * block_k, false), m(block_q, false), l(block_q * width_v<T>, false) {}
};

/// Asks for the cache lines holding n elements from row on. The packing loops read rows that
/// lie heads * dim elements apart, a stride the hardware prefetcher does not run ahead on, so
/// each row waited on memory: prefetching a few rows ahead made packing ~2x faster
/// (S = 1024, 8 heads, D = 128).
template <class TT>
BATON_ATTN_INLINE void prefetch_row(const TT* row, std::int64_t n) noexcept {
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

/// Whether x[0..n) holds only finite values: an integer test of the exponent bits that the
/// compiler vectorises (one pass over a packed row; never inside a tile loop).
template <class T>
BATON_ATTN_INLINE bool all_finite(const T* x, std::int64_t n) noexcept {
  static_assert(sizeof(T) == 4 || sizeof(T) == 8);
  using U = std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint64_t>;
  constexpr U exponent = sizeof(T) == 4 ? U(0x7f800000u) : U(0x7ff0000000000000ull);
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
  std::fill(dst, dst + n, std::numeric_limits<TD>::quiet_NaN());
}

/// dst[d] = src[d] * factor (+ dst[d] when accumulating), d < n: the final write of a gradient.
template <class TD, class T>
inline void write_scaled_row(TD* dst, const T* src, T factor, std::int64_t n, bool accumulate) noexcept {
  if (accumulate)
    for (std::int64_t d = 0; d < n; ++d) dst[d] = static_cast<TD>(dst[d] + src[d] * factor);
  else
    for (std::int64_t d = 0; d < n; ++d) dst[d] = static_cast<TD>(src[d] * factor);
}

/// Calls body(kb, k0) for each key tile of query block qb that the mask does not classify
/// empty, in ascending order, with `tile` set for it (which rows and columns to compute).
template <class T, class Mask, class F>
inline void for_each_key_tile(const flash_layout<T>& L, const Mask& mask, std::int64_t qb, std::int64_t qc,
                              tile_extent<T>& tile, F&& body) {
  for (std::int64_t kb = 0; kb < L.k_blocks; ++kb) {
    const block_kind kind = mask.classify(L.q_tiles[qb], L.k_tiles[kb]);
    if (kind == block_kind::empty) continue;
    const std::int64_t k0 = kb * block_k;
    tile.set(kind, mask, L.q_tiles[qb], L.k_tiles[kb], qc, std::min(block_k, L.p.seq_k - k0));
    body(kb, k0);
  }
}

/// C (=) A B^T-style products whose output columns are the tile's keys: S = Q K^T and
/// dP = dO V^T. a: packed rows [rows][a_ld]; bt: the key tile transposed, [dim][block_k].
template <class T>
inline void tile_scores(const tile_extent<T>& t, T* c, const T* a, std::int64_t a_ld, const T* bt, std::int64_t dim) {
  if (!t.partial) {
    gemm<T, false>(c, block_k, t.rows, t.kcols, a, a_ld, 1, bt, block_k, dim);
    return;
  }
  for (std::int64_t g = 0; g < t.groups();) {
    const std::int64_t run = t.same_columns_run(g);
    if (t.col_end[g] > t.col_begin[g]) {
      const std::int64_t r0 = g * tile_rows, c0 = t.col_begin[g];
      gemm<T, false>(c + r0 * block_k + c0, block_k, run * tile_rows, t.col_end[g] - c0, a + r0 * a_ld, a_ld, 1,
                     bt + c0, block_k, dim);
    }
    g += run;
  }
}

/// Masks the scores just computed: -inf for disallowed pairs and key columns past the end.
template <class T>
inline void tile_mask(const tile_extent<T>& t, T* s) {
  constexpr int W = width_v<T>;
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  if (!t.partial) {
    if (t.kc < t.kcols)
      for (std::int64_t i = 0; i < t.rows; ++i) std::fill(s + i * block_k + t.kc, s + i * block_k + t.kcols, neg_inf);
    return;
  }
  for (std::int64_t i = 0; i < t.rows; ++i) {  // adding -inf masks, adding 0 keeps
    const std::int64_t g = i / tile_rows;
    T* row = s + i * block_k;
    for (std::int64_t j = t.col_begin[g]; j < t.col_end[g]; j += W) store(row + j, load(row + j) + load(t.bias[i] + j));
  }
}

/// C[rows][cols] += P B, contracting over the tile's keys: O += P V and dQ += dS K.
/// p: [rows][block_k]; b: the key tile's rows [kc][b_ld] (zero past kc).
template <class T>
inline void tile_accumulate_rows(const tile_extent<T>& t, T* c, std::int64_t ldc, std::int64_t cols, const T* p,
                                 const T* b, std::int64_t b_ld) {
  if (!t.partial) {
    gemm<T, true>(c, ldc, t.rows, cols, p, block_k, 1, b, b_ld, t.kc);
    return;
  }
  for (std::int64_t g = 0; g < t.groups();) {
    const std::int64_t run = t.same_columns_run(g);
    if (t.col_end[g] > t.col_begin[g]) {
      const std::int64_t r0 = g * tile_rows, k0 = t.col_begin[g];
      gemm<T, true>(c + r0 * ldc, ldc, run * tile_rows, cols, p + r0 * block_k + k0, block_k, 1, b + k0 * b_ld, b_ld,
                    std::min(t.col_end[g], t.kc) - k0);
    }
    g += run;
  }
}

/// C[keys][cols] += P^T B, contracting over the tile's query rows: dV += P^T dO and
/// dK += dS^T Q. p: [rows][block_k] with zeros wherever it was not computed.
template <class T>
inline void tile_accumulate_keys(const tile_extent<T>& t, T* c, std::int64_t ldc, std::int64_t cols, const T* p,
                                 const T* b, std::int64_t b_ld) {
  if (!t.partial) {
    gemm<T, true>(c, ldc, round_up(t.kc, tile_rows), cols, p, 1, block_k, b, b_ld, t.rows);
    return;
  }
  for (std::int64_t g = 0; g < t.key_groups_used(); ++g)
    if (t.row_end[g] > t.row_begin[g]) {
      const std::int64_t j0 = g * tile_rows, i0 = t.row_begin[g];
      gemm<T, true>(c + j0 * ldc, ldc, tile_rows, cols, p + i0 * block_k + j0, 1, block_k, b + i0 * b_ld, b_ld,
                    t.row_end[g] - i0);
    }
}

// ---------------------------------------------------------------------------------------
// Forward.

template <class T>
struct forward_packed {
  T* kt = nullptr;  // per (kv unit of the round, key block): K^T, [dim][block_k]
  T* v = nullptr;   // per kv unit of the round: V rows [seq_k_padded][dim_padded]
  unsigned char* key_bad = nullptr;    // per kv unit: [seq_k_padded], 1 where k or v is non-finite
  unsigned char* block_bad = nullptr;  // per (kv unit, key block): any key_bad in it
};

/// Places the forward's packed arrays, one round's worth (carver with a null base: only
/// counts the bytes).
template <class T>
forward_packed<T> carve_forward_packing(const flash_layout<T>& L, workspace_carver& carver) {
  forward_packed<T> packed;
  packed.kt = carver.take<T>(L.round_units * L.k_blocks * L.p.dim * block_k);
  packed.v = carver.take<T>(L.round_units * L.seq_k_padded * L.dim_padded);
  packed.key_bad = carver.take<unsigned char>(L.round_units * L.seq_k_padded);
  packed.block_bad = carver.take<unsigned char>(L.round_units * L.k_blocks);
  return packed;
}

/// dst[d * block_k + j] = rows[j][d] for j < count, 0 for count <= j < block_k: a key tile
/// transposed (K^T, V^T). 4 x 4 (float) or 2 x 2 (double) register transposes on x86; the
/// scalar loop it replaces cost ~5% of a short causal forward.
template <class T>
inline void transpose_rows(const T* const* rows, std::int64_t count, std::int64_t dim, T* dst) noexcept {
  std::int64_t j = 0;
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
  for (; j < count; ++j)
    for (std::int64_t d = 0; d < dim; ++d) dst[d * block_k + j] = rows[j][d];
  if (count < block_k)
    for (std::int64_t d = 0; d < dim; ++d) std::fill(dst + d * block_k + count, dst + (d + 1) * block_k, T(0));
}

/// Work item (kv head, key block) of a round's packing pass; L.kv_items(round) items.
template <class T, class TK, class TV>
inline void pack_kv_block(const flash_layout<T>& L, const head_round& round, std::int64_t item,
                          const tensor_view<TK, 4>& k, const tensor_view<TV, 4>& v, T* kt_out, T* v_rows_out,
                          T* vt_out, T* k_rows_out, unsigned char* key_bad_out, unsigned char* block_bad_out) {
  const auto& p = L.p;
  const auto [unit, b, hk, kb] = L.kv_item_at(round, item);
  const std::int64_t k0 = kb * block_k;
  const std::int64_t kc = std::min(block_k, p.seq_k - k0);
  const std::int64_t blk = L.kv_block_index(round, unit, kb);
  const std::int64_t row0 = L.kv_row_index(round, unit, k0);
  const std::int64_t dp = L.dim_padded;
  // Every byte a tile reads is written here (the workspace is reused, not zeroed): key
  // columns past the sequence end are 0 in K^T/V^T, and row padding (columns dim..dp, and
  // whole rows past the end) is 0 in the row-major copies.
  const T* k_rows[block_k];
  const T* v_rows[block_k];
  for (std::int64_t j = 0; j < kc; ++j) {
    k_rows[j] = &k(b, k0 + j, hk, 0);
    v_rows[j] = &v(b, k0 + j, hk, 0);
  }
  // Keys with a non-finite k or v: flagged for the non-finite rule, and packed as zeros, so
  // that no tile's arithmetic meets them (a masked pair must not turn NaN through 0 * inf).
  unsigned char bad[block_k] = {};
  bool any_bad = false;
  for (std::int64_t j = 0; j < kc; ++j) {
    bad[j] = !(all_finite(k_rows[j], p.dim) && all_finite(v_rows[j], p.dim));
    any_bad = any_bad || bad[j];
  }
  std::copy(bad, bad + block_k, key_bad_out + row0);
  block_bad_out[blk] = any_bad;
  if (kt_out) transpose_rows(k_rows, kc, p.dim, kt_out + blk * p.dim * block_k);
  if (vt_out) transpose_rows(v_rows, kc, p.dim, vt_out + blk * p.dim * block_k);
  for (std::int64_t j = 0; j < block_k; ++j) {
    const bool real = j < kc;
    const auto copy_row = [&](const T* src, T* dst) {
      if (real) std::copy(src, src + p.dim, dst);
      std::fill(dst + (real ? p.dim : 0), dst + dp, T(0));
    };
    if (v_rows_out && j + prefetch_rows_ahead < kc) prefetch_row(v_rows[j + prefetch_rows_ahead], p.dim);
    if (v_rows_out) copy_row(real ? v_rows[j] : nullptr, v_rows_out + (row0 + j) * dp);
    if (k_rows_out) copy_row(real ? k_rows[j] : nullptr, k_rows_out + (row0 + j) * dp);
  }
  if (any_bad)
    for (std::int64_t j = 0; j < kc; ++j) {
      if (!bad[j]) continue;
      for (T* t : {kt_out, vt_out})
        if (t)
          for (std::int64_t d = 0; d < p.dim; ++d) t[blk * p.dim * block_k + d * block_k + j] = T(0);
      for (T* rows : {v_rows_out, k_rows_out})
        if (rows) std::fill(rows + (row0 + j) * dp, rows + (row0 + j + 1) * dp, T(0));
    }
}

/// Work item (query head, query block) of a round's forward pass; L.q_items(round) items.
template <class T, class Mask, class TQ, class TO, class TL>
inline void forward_tile(const flash_layout<T>& L, const head_round& round, std::int64_t item, const Mask& mask,
                         const tensor_view<TQ, 4>& q, const forward_packed<T>& packed, const tensor_view<TO, 4>& out,
                         const tensor_view<TL, 3>& lse, item_scratch<T>& work) {
  using V = vec_t<T>;
  constexpr int W = width_v<T>;
  constexpr T neg_inf = -std::numeric_limits<T>::infinity();
  const auto& p = L.p;
  const std::int64_t dp = L.dim_padded;
  const auto [unit, b, h, hk, qb] = L.q_item_at(round, item, true);
  const std::int64_t kv_unit = b * p.heads_kv + hk;
  const std::int64_t q0 = qb * block_q;
  const std::int64_t qc = std::min(block_q, p.seq_q - q0);
  const std::int64_t rows = round_up(qc, tile_rows);
  const T c = static_cast<T>(p.scale * 1.4426950408889634074);  // scores in log2 units

  // Per row: running max m (log2 units) and the running sum kept as a vector of partial
  // sums, reduced once at the end instead of once per tile.
  // The score tile is written before it is read (see tile_scores / softmax_gradient_tile).
  T* const qt = work.rows_a.data();
  T* const o = work.rows_b.data();
  T* const s = work.s.data();
  T* const m = work.m.data();
  T* const l = work.l.data();
  // Non-finite rule: a query row with a non-finite value is packed as zeros and flagged;
  // poisoned[i] collects the rows an allowed bad pair makes NaN.
  unsigned char row_bad[block_q] = {}, poisoned[block_q] = {};
  bool any_row_bad = false;
  for (std::int64_t i = 0; i < block_q; ++i) {  // rows past qc are computed (then dropped): zero them
    T* dst = qt + i * dp;
    if (i + prefetch_rows_ahead < qc) prefetch_row(row_of(q, b, q0 + i + prefetch_rows_ahead, h), p.dim);
    if (i < qc) {
      std::copy_n(row_of(q, b, q0 + i, h), p.dim, dst);
      row_bad[i] = !all_finite(dst, p.dim);
      if (row_bad[i]) std::fill(dst, dst + p.dim, T(0));
      any_row_bad = any_row_bad || row_bad[i];
    }
    std::fill(dst + (i < qc ? p.dim : 0), dst + dp, T(0));
  }
  std::fill(o, o + block_q * dp, T(0));
  std::fill(m, m + block_q, neg_inf);
  std::fill(l, l + block_q * W, T(0));

  const T* v_rows = packed.v + L.kv_row_index(round, kv_unit, 0) * dp;
  tile_extent<T>& tile = *work.tile;
  for_each_key_tile(L, mask, qb, qc, tile, [&](std::int64_t kb, std::int64_t k0) {
    const T* kt = packed.kt + L.kv_block_index(round, kv_unit, kb) * p.dim * block_k;
    if (any_row_bad || packed.block_bad[L.kv_block_index(round, kv_unit, kb)])
      mark_bad_pairs(tile, qc, row_bad, nullptr, packed.key_bad + L.kv_row_index(round, kv_unit, k0), poisoned,
                     nullptr);

    tile_scores(tile, s, qt, dp, kt, p.dim);
    tile_mask(tile, s);

    // Online softmax, one row at a time, in the log2 domain, over the columns computed.
    const V cv = broadcast(c);
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::int64_t j_begin = tile.col_begin[i / tile_rows], j_end = tile.col_end[i / tile_rows];
      if (j_begin >= j_end) continue;
      T* row = s + i * block_k;
      V vmx = load(row + j_begin);
      for (std::int64_t j = j_begin + W; j < j_end; j += W) vmx = vmax<T>(vmx, load(row + j));
      const T row_max = hmax<T>(vmx) * c;
      const T m_new = std::max(m[i], row_max);
      const T m_sub = m_new == neg_inf ? T(0) : m_new;  // a row masked so far: exp2(-inf - 0) = 0
      const V msub = broadcast(-m_sub);
      V sum{};
      for (std::int64_t j = j_begin; j < j_end; j += W) {
        const V e = exp2(fma(load(row + j), cv, msub));
        store(row + j, e);
        sum = sum + e;
      }
      T* li = l + i * W;
      if (m_new != m[i]) {  // the max moved: rescale the running sum and the output row
        const T alpha = std::exp2(m[i] - m_sub);
        const V av = broadcast(alpha);
        store(li, load(li) * av + sum);
        T* orow = o + i * dp;
        for (std::int64_t d = 0; d < dp; d += W) store(orow + d, load(orow + d) * av);
        m[i] = m_new;
      } else {
        store(li, load(li) + sum);
      }
    }
    tile_accumulate_rows(tile, o, dp, dp, s, v_rows + k0 * dp, dp);
  });

  for (std::int64_t i = 0; i < qc; ++i) {
    const T row_sum = hsum<T>(load(l + i * W));
    // NaN for a poisoned row, and for a score that overflowed to +inf or made a NaN (the
    // online softmax would otherwise drop it as "attends to nothing").
    if (poisoned[i] || !(m[i] < std::numeric_limits<T>::infinity()) || std::isnan(row_sum)) {
      write_nan_row(row_of(out, b, q0 + i, h), p.dim);
      lse(b, h, q0 + i) = std::numeric_limits<TL>::quiet_NaN();
      continue;
    }
    const bool attends = row_sum > T(0);
    const T inv = attends ? T(1) / row_sum : T(0);
    write_scaled_row(row_of(out, b, q0 + i, h), o + i * dp, inv, p.dim, false);
    lse(b, h, q0 + i) = attends ? static_cast<TL>((static_cast<double>(m[i]) + std::log2(static_cast<double>(row_sum))) *
                                                  0.6931471805599453094)
                                : -std::numeric_limits<TL>::infinity();
  }
}

// ---------------------------------------------------------------------------------------
// Backward.

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
};

template <class T>
backward_packed<T> carve_backward_packing(const flash_layout<T>& L, workspace_carver& carver) {
  const std::int64_t q_rows = L.round_units * L.p.group() * L.seq_q_padded;
  const std::int64_t kv_blocks = L.round_units * L.k_blocks;
  backward_packed<T> packed;
  packed.q = carver.take<T>(q_rows * L.dim_padded);
  packed.dout = carver.take<T>(q_rows * L.dim_padded);
  packed.lse2 = carver.take<T>(q_rows);
  packed.delta = carver.take<T>(q_rows);
  packed.kt = carver.take<T>(kv_blocks * L.p.dim * block_k);
  packed.vt = carver.take<T>(kv_blocks * L.p.dim * block_k);
  packed.k = carver.take<T>(L.round_units * L.seq_k_padded * L.dim_padded);
  packed.row_state = carver.take<unsigned char>(q_rows);
  packed.q_block_bad = carver.take<unsigned char>(q_rows / block_q);
  packed.key_bad = carver.take<unsigned char>(L.round_units * L.seq_k_padded);
  packed.block_bad = carver.take<unsigned char>(kv_blocks);
  return packed;
}

/// Work item (query head, query block) of a round's backward packing pass: Q and dO rows,
/// lse in log2 units and D = rowsum(dO * O) (summed in double: it is subtracted from dP,
/// where cancellation would magnify its error). Padding rows get lse2 = +inf, so P = 0 there.
template <class T, class TQ, class TO, class TL, class TD>
inline void pack_q_block(const flash_layout<T>& L, const head_round& round, std::int64_t item,
                         const tensor_view<TQ, 4>& q, const tensor_view<TO, 4>& out, const tensor_view<TL, 3>& lse,
                         const tensor_view<TD, 4>& dout, const backward_packed<T>& packed) {
  const auto& p = L.p;
  const auto [unit, b, h, hk, qb] = L.q_item_at(round, item, false);
  const std::int64_t q0 = qb * block_q;
  const std::int64_t qc = std::min(block_q, p.seq_q - q0);
  const std::int64_t dp = L.dim_padded;
  constexpr T inf = std::numeric_limits<T>::infinity();
  bool any_bad = false;
  for (std::int64_t i = 0; i < block_q; ++i) {
    const std::int64_t r = L.q_row_index(round, unit, q0 + i);
    T* q_dst = packed.q + r * dp;
    T* g_dst = packed.dout + r * dp;
    if (i >= qc) {  // padding rows: zeros, and P = 0 through lse2 = +inf
      std::fill(q_dst, q_dst + dp, T(0));
      std::fill(g_dst, g_dst + dp, T(0));
      packed.lse2[r] = inf;
      packed.delta[r] = T(0);
      packed.row_state[r] = 0;
      continue;
    }
    const auto* qrow = &q(b, q0 + i, h, 0);
    const auto* orow = &out(b, q0 + i, h, 0);
    const auto* grow = &dout(b, q0 + i, h, 0);
    if (i + prefetch_rows_ahead < qc) {
      prefetch_row(&q(b, q0 + i + prefetch_rows_ahead, h, 0), p.dim);
      prefetch_row(&out(b, q0 + i + prefetch_rows_ahead, h, 0), p.dim);
      prefetch_row(&dout(b, q0 + i + prefetch_rows_ahead, h, 0), p.dim);
    }
    std::copy(qrow, qrow + p.dim, q_dst);
    std::copy(grow, grow + p.dim, g_dst);
    std::fill(q_dst + p.dim, q_dst + dp, T(0));
    std::fill(g_dst + p.dim, g_dst + dp, T(0));
    // Independent partial sums: one running double sum is a chain of dependent adds (the
    // compiler may not reassociate it), which cost more than all the packing copies.
    // Eight lanes: one vector of doubles (AVX-512), which the compiler forms from the lanes.
    double partial[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    std::int64_t d = 0;
    for (; d + 8 <= p.dim; d += 8)
      for (int u = 0; u < 8; ++u) partial[u] += static_cast<double>(grow[d + u]) * static_cast<double>(orow[d + u]);
    for (; d < p.dim; ++d) partial[0] += static_cast<double>(grow[d]) * static_cast<double>(orow[d]);
    packed.delta[r] = static_cast<T>(((partial[0] + partial[1]) + (partial[2] + partial[3])) +
                                     ((partial[4] + partial[5]) + (partial[6] + partial[7])));
    const double l = static_cast<double>(lse(b, h, q0 + i));
    // A row that attends to nothing (lse = -inf) contributes no gradient: P = 2^(s - inf) = 0.
    const bool live = !(std::isinf(l) && l < 0);
    const bool nonfinite = !all_finite(q_dst, p.dim) || !all_finite(g_dst, p.dim) || !all_finite(orow, p.dim);
    const bool bad = live && (nonfinite || !(l < static_cast<double>(inf)));
    packed.lse2[r] = !live || bad ? inf : static_cast<T>(l * 1.4426950408889634074);
    packed.row_state[r] = bad ? 2 : live ? 1 : 0;
    any_bad = any_bad || bad;
    // Zeros and P = 0: the arithmetic stays finite (also for a row without gradient, whose
    // P = 0 would otherwise meet a NaN dout); the rule writes NaN at the end.
    if (bad || nonfinite) {
      std::fill(q_dst, q_dst + p.dim, T(0));
      std::fill(g_dst, g_dst + p.dim, T(0));
      packed.delta[r] = T(0);
    }
  }
  packed.q_block_bad[L.q_row_index(round, unit, q0) / block_q] = any_bad;
}

/// P and dS for one tile, in place: s holds scores on entry and P on exit; dp holds dO V^T on
/// entry and dS = P * (dP - D) on exit. In a partial tile, entries outside a row group's
/// computed columns are set to 0, so the key-side products may contract over any rows.
template <class T>
inline void softmax_gradient_tile(const tile_extent<T>& t, T* s, T* dp, T c, const T* lse2, const T* delta) {
  using V = vec_t<T>;
  constexpr int W = width_v<T>;
  const V cv = broadcast(c);
  for (std::int64_t i = 0; i < t.rows; ++i) {
    const std::int64_t j_begin = t.col_begin[i / tile_rows], j_end = t.col_end[i / tile_rows];
    T* srow = s + i * block_k;
    T* drow = dp + i * block_k;
    if (t.partial) {
      std::fill(srow, srow + j_begin, T(0));
      std::fill(drow, drow + j_begin, T(0));
      std::fill(srow + std::max(j_begin, j_end), srow + t.kcols, T(0));
      std::fill(drow + std::max(j_begin, j_end), drow + t.kcols, T(0));
    }
    const V neg_lse = broadcast(-lse2[i]);
    const V dv = broadcast(delta[i]);
    for (std::int64_t j = j_begin; j < j_end; j += W) {
      const V prob = exp2(fma(load(srow + j), cv, neg_lse));
      store(srow + j, prob);
      store(drow + j, prob * (load(drow + j) - dv));
    }
  }
}

/// Work item (kv head, key block) of a round's key pass: dK and dV of 64 keys, summed over
/// every query head of the group and every query block.
template <class T, class Mask, class TG>
inline void backward_kv_tile(const flash_layout<T>& L, const head_round& round, std::int64_t item, const Mask& mask,
                             const backward_packed<T>& packed, const tensor_view<TG, 4>& dk,
                             const tensor_view<TG, 4>& dv, bool accumulate, item_scratch<T>& work) {
  const auto& p = L.p;
  const std::int64_t dp = L.dim_padded;
  const auto [unit, b, hk, kb] = L.kv_item_at(round, item);
  const std::int64_t k0 = kb * block_k;
  const std::int64_t kc = std::min(block_k, p.seq_k - k0);
  const T c = static_cast<T>(p.scale * 1.4426950408889634074);
  const T* kt = packed.kt + L.kv_block_index(round, unit, kb) * p.dim * block_k;
  const T* vt = packed.vt + L.kv_block_index(round, unit, kb) * p.dim * block_k;

  T* const s = work.s.data();
  T* const dpt = work.dp.data();
  T* const dk_acc = work.rows_a.data();
  T* const dv_acc = work.rows_b.data();
  std::fill(dk_acc, dk_acc + block_k * dp, T(0));
  std::fill(dv_acc, dv_acc + block_k * dp, T(0));
  const unsigned char* key_bad = packed.key_bad + L.kv_row_index(round, unit, k0);
  const bool keys_bad = packed.block_bad[L.kv_block_index(round, unit, kb)] != 0;
  unsigned char key_poisoned[block_k] = {};
  tile_extent<T>& tile = *work.tile;
  for (std::int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h)
    for (std::int64_t qb = 0; qb < L.q_blocks; ++qb) {
      const block_kind kind = mask.classify(L.q_tiles[qb], L.k_tiles[kb]);
      if (kind == block_kind::empty) continue;
      const std::int64_t q0 = qb * block_q;
      tile.set(kind, mask, L.q_tiles[qb], L.k_tiles[kb], std::min(block_q, p.seq_q - q0), kc);
      const std::int64_t r = L.q_row_index(round, b * p.heads_q + h, q0);
      const T* qrows = packed.q + r * dp;
      const T* grows = packed.dout + r * dp;
      if (keys_bad || packed.q_block_bad[r / block_q]) {
        unsigned char row_bad[block_q], row_live[block_q];
        for (std::int64_t i = 0; i < block_q; ++i) {
          row_bad[i] = packed.row_state[r + i] == 2;
          row_live[i] = packed.row_state[r + i] != 0;
        }
        mark_bad_pairs(tile, std::min(block_q, p.seq_q - q0), row_bad, row_live, key_bad, nullptr, key_poisoned);
      }

      tile_scores(tile, s, qrows, dp, kt, p.dim);
      tile_mask(tile, s);
      tile_scores(tile, dpt, grows, dp, vt, p.dim);
      softmax_gradient_tile(tile, s, dpt, c, packed.lse2 + r, packed.delta + r);
      tile_accumulate_keys(tile, dv_acc, dp, dp, s, grows, dp);   // dV += P^T dO
      tile_accumulate_keys(tile, dk_acc, dp, dp, dpt, qrows, dp);  // dK += dS^T Q
    }

  const T scale = static_cast<T>(p.scale);
  for (std::int64_t j = 0; j < kc; ++j) {
    if (key_poisoned[j]) {
      write_nan_row(row_of(dk, b, k0 + j, hk), p.dim);
      write_nan_row(row_of(dv, b, k0 + j, hk), p.dim);
      continue;
    }
    write_scaled_row(row_of(dk, b, k0 + j, hk), dk_acc + j * dp, scale, p.dim, accumulate);
    write_scaled_row(row_of(dv, b, k0 + j, hk), dv_acc + j * dp, T(1), p.dim, accumulate);
  }
}

/// Work item (query head, query block) of a round's query pass: dQ of 64 queries.
template <class T, class Mask, class TG>
inline void backward_q_tile(const flash_layout<T>& L, const head_round& round, std::int64_t item, const Mask& mask,
                            const backward_packed<T>& packed, const tensor_view<TG, 4>& dq, bool accumulate,
                            item_scratch<T>& work) {
  const auto& p = L.p;
  const std::int64_t dp = L.dim_padded;
  const auto [unit, b, h, hk, qb] = L.q_item_at(round, item, true);
  const std::int64_t kv_unit = b * p.heads_kv + hk;
  const std::int64_t q0 = qb * block_q;
  const std::int64_t qc = std::min(block_q, p.seq_q - q0);
  const T c = static_cast<T>(p.scale * 1.4426950408889634074);
  const std::int64_t r = L.q_row_index(round, unit, q0);
  const T* qrows = packed.q + r * dp;
  const T* grows = packed.dout + r * dp;
  const T* k_rows = packed.k + L.kv_row_index(round, kv_unit, 0) * dp;

  T* const s = work.s.data();
  T* const dpt = work.dp.data();
  T* const dq_acc = work.rows_a.data();
  std::fill(dq_acc, dq_acc + block_q * dp, T(0));
  const bool rows_bad = packed.q_block_bad[r / block_q] != 0;
  unsigned char row_bad[block_q], row_live[block_q], row_poisoned[block_q] = {};
  for (std::int64_t i = 0; i < block_q; ++i) {
    row_bad[i] = packed.row_state[r + i] == 2;
    row_live[i] = packed.row_state[r + i] != 0;
  }
  tile_extent<T>& tile = *work.tile;
  for_each_key_tile(L, mask, qb, qc, tile, [&](std::int64_t kb, std::int64_t k0) {
    const T* kt = packed.kt + L.kv_block_index(round, kv_unit, kb) * p.dim * block_k;
    const T* vt = packed.vt + L.kv_block_index(round, kv_unit, kb) * p.dim * block_k;
    if (rows_bad || packed.block_bad[L.kv_block_index(round, kv_unit, kb)])
      mark_bad_pairs(tile, qc, row_bad, row_live, packed.key_bad + L.kv_row_index(round, kv_unit, k0), row_poisoned,
                     nullptr);

    tile_scores(tile, s, qrows, dp, kt, p.dim);
    tile_mask(tile, s);
    tile_scores(tile, dpt, grows, dp, vt, p.dim);
    softmax_gradient_tile(tile, s, dpt, c, packed.lse2 + r, packed.delta + r);
    tile_accumulate_rows(tile, dq_acc, dp, dp, dpt, k_rows + k0 * dp, dp);  // dQ += dS K
  });

  const T scale = static_cast<T>(p.scale);
  for (std::int64_t i = 0; i < qc; ++i) {
    if (row_poisoned[i])
      write_nan_row(row_of(dq, b, q0 + i, h), p.dim);
    else
      write_scaled_row(row_of(dq, b, q0 + i, h), dq_acc + i * dp, scale, p.dim, accumulate);
  }
}

}  // namespace baton::detail::attn

#undef BATON_ATTN_UNROLL
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif
