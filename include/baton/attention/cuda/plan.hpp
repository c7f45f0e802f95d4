// baton/attention/cuda/plan.hpp — host-side planning of the CUDA attention kernels: the tile
// grid of one call with every tile classified by the mask, the bitmasks of partial tiles,
// lists of non-empty tiles, launch configurations and workspace sizes. Plain C++.
//
// Why a plan: the kernels are ONE instantiation per (storage, head dim) for every mask. The
// mask never reaches the device; the host asks it, once per call, the same questions the CPU
// kernels ask (mask.classify on position_blocks of the tiles; detail/flash_tiles.hpp), and
// for partial tiles only, mask.allowed per pair, stored as bits. The kernels then read
//   kind[q_tile * k_tiles + k_tile]    empty (skipped), full (no per-element test) or partial
//   bits of a partial tile              which pairs are allowed
// and walk the lists of non-empty tiles instead of scanning a row or column of the grid.
//
// Sequence edges: tile t holds rows [t * tile, min((t + 1) * tile, seq)). Its position_block
// has only the rows that exist, so an edge tile is partial only if the mask says so. Rows
// and keys past the sequence end are the kernels' business, by bounds, in every tile kind:
// keys at or past seq_k are masked (their K/V rows are zero-filled in shared memory), query
// rows at or past seq_q are computed and never stored. Bits past the end are 0.
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include <baton/attention/error.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/attention/cuda/storage.hpp>  // BATON_HD
#include <baton/core/block_cache.hpp>

namespace baton::detail::attention::cuda {

/// A call's tile plan as the kernels read it: arrays in host memory (emulation) or device
/// memory (a copy of tile_plan::blob(), rebased by tile_plan::view(base)).
struct tile_plan_view {
  std::int32_t q_tiles = 0, k_tiles = 0, tile_q = 0, tile_k = 0, seq_q = 0, seq_k = 0;
  /// [q_tiles * k_tiles] row-major: static_cast<std::uint8_t>(baton::block_kind).
  const std::uint8_t* kind = nullptr;
  /// [q_tiles * k_tiles]: index of the tile's bitmask in `bits`, -1 if the tile is not partial.
  const std::int32_t* partial_slot = nullptr;
  /// Per partial tile: tile_q rows x words_per_row words; bit c of word w of row r is
  /// allowed(q_pos[q0 + r], k_pos[k0 + 64 w + c]), 0 past either sequence end.
  const std::uint64_t* bits = nullptr;
  std::int32_t words_per_row = 0;  // ceil(tile_k / 64)
  /// Non-empty tiles per query tile (CSR): the key tiles of query tile i are
  /// q_list[q_list_begin[i] .. q_list_begin[i + 1]), ascending.
  const std::int32_t* q_list_begin = nullptr;  // [q_tiles + 1]
  const std::int32_t* q_list = nullptr;
  /// Non-empty tiles per key tile (CSR): the query tiles of key tile j are
  /// k_list[k_list_begin[j] .. k_list_begin[j + 1]), ascending.
  const std::int32_t* k_list_begin = nullptr;  // [k_tiles + 1]
  const std::int32_t* k_list = nullptr;
  std::int32_t partial_tiles = 0;

  [[nodiscard]] BATON_HD block_kind kind_at(std::int32_t qt, std::int32_t kt) const noexcept {
    return static_cast<block_kind>(kind[qt * k_tiles + kt]);
  }
  /// The bit words of row r of partial tile (qt, kt).
  [[nodiscard]] BATON_HD const std::uint64_t* bit_row(std::int32_t qt, std::int32_t kt, std::int32_t r) const noexcept {
    return bits + (static_cast<std::int64_t>(partial_slot[qt * k_tiles + kt]) * tile_q + r) * words_per_row;
  }
  /// Whether pair (row r, key c) of tile (qt, kt) is computed: in range and allowed.
  [[nodiscard]] BATON_HD bool allowed(std::int32_t qt, std::int32_t kt, std::int32_t r, std::int32_t c) const noexcept {
    if (qt * tile_q + r >= seq_q || kt * tile_k + c >= seq_k) return false;
    switch (kind_at(qt, kt)) {
      case block_kind::empty: return false;
      case block_kind::full: return true;
      default: return ((bit_row(qt, kt, r)[c / 64] >> (c % 64)) & 1u) != 0;
    }
  }
};

/// A host-owned plan: every array in one 8-byte aligned blob (one copy to the device).
class tile_plan {
 public:
  tile_plan() = default;

  /// The view of the plan's arrays at `base`: blob().data() for the host, or a device copy
  /// of blob() (same bytes, any 8-byte aligned address).
  [[nodiscard]] tile_plan_view view(const void* base) const noexcept {
    tile_plan_view v = header_;
    const auto* b = static_cast<const std::byte*>(base);
    v.kind = reinterpret_cast<const std::uint8_t*>(b + kind_at_);
    v.partial_slot = reinterpret_cast<const std::int32_t*>(b + slot_at_);
    v.bits = reinterpret_cast<const std::uint64_t*>(b + bits_at_);
    v.q_list_begin = reinterpret_cast<const std::int32_t*>(b + q_begin_at_);
    v.q_list = reinterpret_cast<const std::int32_t*>(b + q_list_at_);
    v.k_list_begin = reinterpret_cast<const std::int32_t*>(b + k_begin_at_);
    v.k_list = reinterpret_cast<const std::int32_t*>(b + k_list_at_);
    return v;
  }
  [[nodiscard]] tile_plan_view view() const noexcept { return view(blob_.get()); }
  /// The plan's bytes (size_bytes() of them).
  [[nodiscard]] const std::uint64_t* blob() const noexcept { return blob_.get(); }
  [[nodiscard]] std::size_t size_bytes() const noexcept { return blob_.size() * sizeof(std::uint64_t); }
  /// Number of non-empty tiles (the work of a pass) and of partial ones.
  [[nodiscard]] std::int64_t nonempty_tiles() const noexcept { return nonempty_; }
  [[nodiscard]] std::int64_t partial_tiles() const noexcept { return header_.partial_tiles; }

  template <attention_mask Mask>
  friend tile_plan make_tile_plan(const Mask& mask, const positions& q_pos, const positions& k_pos,
                                  std::int64_t seq_q, std::int64_t seq_k, std::int32_t tile_q, std::int32_t tile_k);

 private:
  tile_plan_view header_{};
  std::size_t kind_at_ = 0, slot_at_ = 0, bits_at_ = 0, q_begin_at_ = 0, q_list_at_ = 0, k_begin_at_ = 0,
              k_list_at_ = 0;
  std::int64_t nonempty_ = 0;
  // From the thread's block cache: a plan per call (forward and backward, every ring step)
  // would otherwise fault in fresh pages each time.
  core::cached_array<std::uint64_t> blob_;
};

namespace plan_detail {
// Sets bits [begin, end) of the row, a word at a time (a bit at a time was 84 % of planning a
// causal S = 8192 call).
inline void set_bit_range(std::uint64_t* row, std::int64_t begin, std::int64_t end) noexcept {
  if (begin >= end) return;
  const auto ones_from = [](std::int64_t bit) { return ~std::uint64_t{0} << bit; };  // bits [bit, 64)
  const std::int64_t first = begin / 64, last = (end - 1) / 64;
  const std::uint64_t head = ones_from(begin % 64), tail = ~std::uint64_t{0} >> (63 - (end - 1) % 64);
  if (first == last) {
    row[first] |= head & tail;
    return;
  }
  row[first] |= head;
  for (std::int64_t w = first + 1; w < last; ++w) row[w] = ~std::uint64_t{0};
  row[last] |= tail;
}
}  // namespace plan_detail

/// Plans one call: q_pos / k_pos resolved (checked_call's), tiles of tile_q queries and
/// tile_k keys. Costs q_tiles * k_tiles classify calls plus, per partial tile, one
/// allowed_keys call per row (masks with key intervals, contiguous key tiles) or
/// tile_q * tile_k allowed calls.
template <attention_mask Mask>
[[nodiscard]] tile_plan make_tile_plan(const Mask& mask, const positions& q_pos, const positions& k_pos,
                                       std::int64_t seq_q, std::int64_t seq_k, std::int32_t tile_q,
                                       std::int32_t tile_k) {
  if (tile_q <= 0 || tile_k <= 0)
    throw attention_error("baton cuda plan: tile sizes must be positive (got " + std::to_string(tile_q) + " x " +
                          std::to_string(tile_k) + ")");
  constexpr std::int64_t int32_max = std::numeric_limits<std::int32_t>::max();
  if (seq_q < 0 || seq_k < 0 || seq_q > int32_max || seq_k > int32_max)
    throw attention_error("baton cuda plan: sequence lengths must be in [0, 2^31) (got seq_q " + std::to_string(seq_q) +
                          ", seq_k " + std::to_string(seq_k) + ")");
  if (q_pos.size() != seq_q || k_pos.size() != seq_k)
    throw attention_error("baton cuda plan: positions must be resolved to the sequence lengths first");
  tile_plan plan;
  tile_plan_view& h = plan.header_;
  h.tile_q = tile_q;
  h.tile_k = tile_k;
  h.seq_q = static_cast<std::int32_t>(seq_q);
  h.seq_k = static_cast<std::int32_t>(seq_k);
  h.q_tiles = static_cast<std::int32_t>((seq_q + tile_q - 1) / tile_q);
  h.k_tiles = static_cast<std::int32_t>((seq_k + tile_k - 1) / tile_k);
  h.words_per_row = (tile_k + 63) / 64;
  const std::int64_t cells = static_cast<std::int64_t>(h.q_tiles) * h.k_tiles;
  // The kernels index the grid with 32-bit integers.
  if (cells > int32_max)
    throw attention_error("baton cuda plan: " + std::to_string(h.q_tiles) + " x " + std::to_string(h.k_tiles) +
                          " tiles exceed the plan's limit of 2^31 - 1 tiles (about 3M tokens per side at the default "
                          "tiles); split the call along the sequence (context parallelism, or several calls)");
  const auto at = [](std::int64_t i) { return static_cast<std::size_t>(i); };

  // Pass 1: classify every tile (the kinds go straight into the blob below), count the
  // partial and non-empty ones per query and key tile.
  std::vector<position_block> k_blocks;
  k_blocks.reserve(at(h.k_tiles));
  for (std::int32_t j = 0; j < h.k_tiles; ++j)
    k_blocks.emplace_back(k_pos, std::int64_t{j} * tile_k, std::min<std::int64_t>(tile_k, seq_k - std::int64_t{j} * tile_k));
  std::vector<std::uint8_t> kinds(at(cells));
  std::vector<std::int32_t> q_count(at(h.q_tiles) + 1, 0), k_count(at(h.k_tiles) + 1, 0);
  std::int64_t partial = 0;
  for (std::int32_t i = 0; i < h.q_tiles; ++i) {
    const std::int64_t q0 = std::int64_t{i} * tile_q;
    const position_block qb(q_pos, q0, std::min<std::int64_t>(tile_q, seq_q - q0));
    for (std::int32_t j = 0; j < h.k_tiles; ++j) {
      const block_kind kind = mask.classify(qb, k_blocks[at(j)]);
      kinds[at(std::int64_t{i} * h.k_tiles + j)] = static_cast<std::uint8_t>(kind);
      if (kind == block_kind::empty) continue;
      ++q_count[at(i) + 1];
      ++k_count[at(j) + 1];
      partial += kind == block_kind::partial;
    }
  }
  if (partial > int32_max)
    throw attention_error("baton cuda plan: " + std::to_string(partial) +
                          " partial tiles exceed the plan's 2^31 - 1 limit; split the call along the sequence");
  h.partial_tiles = static_cast<std::int32_t>(partial);
  for (std::size_t i = 1; i < q_count.size(); ++i) q_count[i] += q_count[i - 1];  // now CSR begins
  for (std::size_t j = 1; j < k_count.size(); ++j) k_count[j] += k_count[j - 1];
  plan.nonempty_ = q_count.back();

  // One blob, each array 8-byte aligned, allocated once; only the bits need zeroing.
  const std::int64_t words_per_tile = std::int64_t{tile_q} * h.words_per_row;
  std::size_t bytes = 0;
  const auto place = [&bytes](std::size_t n) {
    const std::size_t where = bytes;
    bytes += (n + 7) / 8 * 8;
    return where;
  };
  const std::size_t bit_words = at(partial * words_per_tile);
  plan.bits_at_ = place(bit_words * sizeof(std::uint64_t));
  plan.kind_at_ = place(kinds.size());
  plan.slot_at_ = place(at(cells) * sizeof(std::int32_t));
  plan.q_begin_at_ = place(q_count.size() * sizeof(std::int32_t));
  plan.q_list_at_ = place(at(plan.nonempty_) * sizeof(std::int32_t));
  plan.k_begin_at_ = place(k_count.size() * sizeof(std::int32_t));
  plan.k_list_at_ = place(at(plan.nonempty_) * sizeof(std::int32_t));
  const std::size_t blob_words = std::max<std::size_t>(bytes / 8, 1);
  plan.blob_ = core::cached_array<std::uint64_t>(blob_words);
  auto* base = reinterpret_cast<std::byte*>(plan.blob_.get());
  // The padding after each array is zeroed too: a plan's bytes depend on nothing but the call.
  const auto zero_padding = [base](std::size_t where, std::size_t n) {
    std::memset(base + where + n, 0, (n + 7) / 8 * 8 - n);
  };
  zero_padding(plan.kind_at_, kinds.size());
  zero_padding(plan.slot_at_, at(cells) * sizeof(std::int32_t));
  zero_padding(plan.q_begin_at_, q_count.size() * sizeof(std::int32_t));
  zero_padding(plan.q_list_at_, at(plan.nonempty_) * sizeof(std::int32_t));
  zero_padding(plan.k_begin_at_, k_count.size() * sizeof(std::int32_t));
  zero_padding(plan.k_list_at_, at(plan.nonempty_) * sizeof(std::int32_t));
  if (bytes == 0) base[0] = base[1] = base[2] = base[3] = base[4] = base[5] = base[6] = base[7] = std::byte{0};
  std::memset(base + plan.bits_at_, 0, bit_words * sizeof(std::uint64_t));
  // (An empty grid has no kinds: memcpy must not be given its null pointer.)
  if (!kinds.empty()) std::memcpy(base + plan.kind_at_, kinds.data(), kinds.size());
  std::memcpy(base + plan.q_begin_at_, q_count.data(), q_count.size() * sizeof(std::int32_t));
  std::memcpy(base + plan.k_begin_at_, k_count.data(), k_count.size() * sizeof(std::int32_t));
  auto* bits = reinterpret_cast<std::uint64_t*>(base + plan.bits_at_);
  auto* slots = reinterpret_cast<std::int32_t*>(base + plan.slot_at_);
  auto* q_list = reinterpret_cast<std::int32_t*>(base + plan.q_list_at_);
  auto* k_list = reinterpret_cast<std::int32_t*>(base + plan.k_list_at_);

  // Pass 2, row-major (so both CSR lists come out ascending): slots, lists, and the bits of
  // the partial tiles.
  std::vector<std::int32_t> k_fill(k_count.begin(), k_count.end() - 1);
  std::int32_t slot = 0;
  std::int64_t q_fill = 0;
  for (std::int32_t i = 0; i < h.q_tiles; ++i) {
    const std::int64_t q0 = std::int64_t{i} * tile_q, qc = std::min<std::int64_t>(tile_q, seq_q - q0);
    for (std::int32_t j = 0; j < h.k_tiles; ++j) {
      const std::int64_t cell = std::int64_t{i} * h.k_tiles + j;
      const auto kind = static_cast<block_kind>(kinds[at(cell)]);
      slots[cell] = -1;
      if (kind == block_kind::empty) continue;
      q_list[q_fill++] = j;
      k_list[k_fill[at(j)]++] = i;
      if (kind != block_kind::partial) continue;
      slots[cell] = slot;
      std::uint64_t* tile_bits = bits + std::int64_t{slot++} * words_per_tile;
      const position_block& kb = k_blocks[at(j)];
      const std::int64_t kc = kb.size();
      for (std::int64_t r = 0; r < qc; ++r) {
        std::uint64_t* row = tile_bits + r * h.words_per_row;
        const std::int64_t qp = q_pos[q0 + r];
        bool by_interval = false;
        if constexpr (mask_with_key_intervals<Mask>) {
          if (kb.is_contiguous()) {
            by_interval = true;
            const key_interval keys = mask.allowed_keys(qp, kb.min(), kb.min() + kc);
            plan_detail::set_bit_range(row, keys.begin - kb.min(), keys.end - kb.min());
          }
        }
        if (!by_interval)
          for (std::int64_t c = 0; c < kc; ++c)
            if (mask.allowed(qp, kb[c])) row[c / 64] |= std::uint64_t{1} << (c % 64);
      }
    }
  }
  return plan;
}

// ---- launch configuration ----------------------------------------------------------------

/// The head dims the kernels are instantiated for.
inline constexpr std::array<int, 3> supported_head_dims{64, 128, 256};
[[nodiscard]] constexpr bool is_supported_head_dim(std::int64_t dim) noexcept {
  return dim == 64 || dim == 128 || dim == 256;
}

/// Calls f(std::integral_constant<int, D>{}) for the supported head dim `dim`: the one
/// switch from a call's head dim to the kernel instantiated for it.
template <class Fn>
inline void dispatch_head_dim(int dim, Fn&& f) {
  switch (dim) {
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    case 256: f(std::integral_constant<int, 256>{}); break;
    default:
      throw attention_error("baton::cuda_attention: head dim " + std::to_string(dim) +
                            " is not supported; the kernels are built for head dims 64, 128 and 256 (pad the "
                            "head dim with zeros to the next of these)");
  }
}

/// Shared memory a block may use (opt-in maximum per block): sm_80 163 KiB, sm_90 227 KiB.
inline constexpr std::size_t max_shared_bytes_sm80 = 163 * 1024;
inline constexpr std::size_t max_shared_bytes_sm90 = 227 * 1024;

/// Tiling of the forward kernel for one (element size, head dim). 4 warps per block; each
/// warp owns m_tiles x 16 query rows; K/V tiles of tile_k keys, double-buffered.
struct forward_config {
  int threads = 128;
  int warps = 4;
  int m_tiles = 1;  // 16-row MMA tiles per warp
  int tile_q = 64;  // warps * m_tiles * 16
  int tile_k = 64;
  int stages = 2;   // K/V buffers (cp.async double buffering)
  int column_splits = 1;  // blocks per query tile, each accumulating dim / column_splits of O
  int dim = 64;
  int element_bytes = 2;

  /// Q tile + stages x (K tile + V tile), swizzled rows of dim elements, + one 4-byte flag
  /// per query row and one per key of a tile (a word each: the host race detector tracks
  /// 4-byte words), + the running row sums where they live in shared memory, rounded to 128.
  [[nodiscard]] constexpr std::size_t shared_bytes() const noexcept {
    const std::size_t row = static_cast<std::size_t>(dim) * static_cast<std::size_t>(element_bytes);
    const std::size_t tiles = row * static_cast<std::size_t>(tile_q + 2 * stages * tile_k);
    return tiles + (4 * static_cast<std::size_t>(tile_q + tile_k) + row_sums_bytes() + 127) / 128 * 128;
  }
  /// Whether each thread keeps its running row sums (softmax denominators, one per row it
  /// holds) in shared memory between key tiles rather than in registers: where O and S alone
  /// take 192 of a thread's 255 registers (16-bit storage, D 128, 128 x 64 tiles), the
  /// compiler put them in local memory (a spill: 4 loads and 4 stores per tile through L1,
  /// whose share of the SM's memory is what two blocks' tiles leave over). In shared memory
  /// the same 8 accesses per tile have a fixed latency and no other tenant.
  [[nodiscard]] constexpr bool row_sums_shared() const noexcept {
    return element_bytes == 2 && m_tiles * dim / 2 + m_tiles * tile_k / 2 >= 192;
  }
  /// 4 bytes per lane of a row's 4 (each keeps the sum over its own columns).
  [[nodiscard]] constexpr std::size_t row_sums_bytes() const noexcept {
    return row_sums_shared() ? 16 * static_cast<std::size_t>(tile_q) : 0;
  }
  [[nodiscard]] constexpr std::size_t q_offset() const noexcept { return 0; }
  [[nodiscard]] constexpr std::size_t row_bytes() const noexcept {
    return static_cast<std::size_t>(dim) * static_cast<std::size_t>(element_bytes);
  }
  [[nodiscard]] constexpr std::size_t k_offset(int stage) const noexcept {
    return row_bytes() * static_cast<std::size_t>(tile_q + 2 * stage * tile_k);
  }
  [[nodiscard]] constexpr std::size_t v_offset(int stage) const noexcept { return k_offset(stage) + row_bytes() * static_cast<std::size_t>(tile_k); }
  [[nodiscard]] constexpr std::size_t row_flags_offset() const noexcept { return row_bytes() * static_cast<std::size_t>(tile_q + 2 * stages * tile_k); }
  /// The flags of the keys of the tile being computed (written only for a tile that holds a
  /// non-finite key).
  [[nodiscard]] constexpr std::size_t key_flags_offset() const noexcept {
    return row_flags_offset() + 4 * static_cast<std::size_t>(tile_q);
  }
  /// Row r's sum kept by lane tg of its 4 at row_sums_offset() + 4 (4 r + tg), when
  /// row_sums_shared().
  [[nodiscard]] constexpr std::size_t row_sums_offset() const noexcept {
    return key_flags_offset() + 4 * static_cast<std::size_t>(tile_k);
  }
};

/// A forward tiling: m_tiles 16-row MMA tiles per warp (tile_q = 64 m_tiles), tile_k keys.
[[nodiscard]] constexpr forward_config make_forward_config(int element_bytes, int dim, int m_tiles, int tile_k) noexcept {
  forward_config c;
  c.dim = dim;
  c.element_bytes = element_bytes;
  c.m_tiles = m_tiles;
  c.tile_k = tile_k;
  c.tile_q = c.warps * c.m_tiles * 16;
  // float at head dim 256: an O of 128 accumulators per thread beside the 3xTF32 operands
  // spilled (ptxas -v, sm_90); two blocks per query tile, each computing S in full and half
  // of O's columns, do not (at twice the S products, for the least common storage).
  c.column_splits = element_bytes == 4 && dim == 256 ? 2 : 1;
  return c;
}

/// The forward tiling used for element size (2: bfloat16/float16, 4: float) and head dim.
/// 16-bit: 128 x 64 tiles at D = 64 and 128 (2 MMA row tiles per warp, as FlashAttention-2),
/// 64 x 32 at D = 256, where the O accumulator alone is 128 registers per thread. At D = 128
/// the 64-key tile spills 116 bytes (ptxas -v, sm_90: 16 local accesses per 256 MMAs in the
/// main loop) and still ran ~5.5 % faster than the spill-free 128 x 32 on H200s (the tiled
/// launch 234.8 against 222.7 TFLOP/s, the backend 226.1 against 213.8; bench_cuda_attention,
/// 2026-12-04): half the online-softmax steps per key.
/// float (3xTF32, 4-byte rows in shared memory): 64 x 64 / 64 x 32 / 64 x 16, so that two
/// stages fit sm_80's 163 KiB. bench_cuda_attention times other tilings at D = 128 (bf16).
[[nodiscard]] constexpr forward_config forward_config_for(int element_bytes, int dim) noexcept {
  if (element_bytes == 2) return make_forward_config(2, dim, dim <= 128 ? 2 : 1, dim <= 128 ? 64 : 32);
  return make_forward_config(element_bytes, dim, 1, dim == 64 ? 64 : dim == 128 ? 32 : 16);
}

/// A kernel launch: grid, block, dynamic shared memory.
struct launch_shape {
  std::array<std::uint32_t, 3> grid{1, 1, 1};
  std::array<std::uint32_t, 3> block{1, 1, 1};
  std::size_t shared_bytes = 0;
};

/// The forward's launch: column_splits blocks per (query tile, query head, batch entry), as
/// grid (q_tiles x column_splits, heads_q, batch). Blocks run query tiles in descending order (the kernel
/// maps blockIdx.x to q_tiles - 1 - x): under a causal mask the longest rows start first.
[[nodiscard]] inline launch_shape forward_launch(const forward_config& c, std::int64_t seq_q, std::int64_t heads_q,
                                                 std::int64_t batch) {
  constexpr std::int64_t grid_yz_max = 65535;
  if (heads_q > grid_yz_max || batch > grid_yz_max)
    throw attention_error("baton::cuda_attention: " + std::to_string(heads_q) + " query heads x " +
                          std::to_string(batch) + " batch entries exceed the grid's 65535 per axis; split the batch");
  launch_shape s;
  s.grid = {static_cast<std::uint32_t>(std::max<std::int64_t>(1, (seq_q + c.tile_q - 1) / c.tile_q) * c.column_splits),
            static_cast<std::uint32_t>(std::max<std::int64_t>(1, heads_q)),
            static_cast<std::uint32_t>(std::max<std::int64_t>(1, batch))};
  s.block = {static_cast<std::uint32_t>(c.threads), 1, 1};
  s.shared_bytes = c.shared_bytes();
  return s;
}

/// The per-key non-finite flags the forward (and backward) read: one byte per
/// (batch, kv head, key), 1 where the key's k or v row holds a NaN or infinity.
[[nodiscard]] constexpr std::size_t key_flag_bytes(std::int64_t batch, std::int64_t heads_kv, std::int64_t seq_k) noexcept {
  return static_cast<std::size_t>(batch * heads_kv * seq_k);
}
inline constexpr int key_flag_threads = 128;  // keys per block of the flag pass
[[nodiscard]] inline launch_shape key_flag_launch(std::int64_t seq_k, std::int64_t heads_kv, std::int64_t batch) {
  launch_shape s;
  s.grid = {static_cast<std::uint32_t>(std::max<std::int64_t>(1, (seq_k + key_flag_threads - 1) / key_flag_threads)),
            static_cast<std::uint32_t>(std::max<std::int64_t>(1, heads_kv)),
            static_cast<std::uint32_t>(std::max<std::int64_t>(1, batch))};
  s.block = {key_flag_threads, 1, 1};
  return s;
}

/// Device workspace of a forward call: the plan blob and the key flags, each 256-byte aligned.
[[nodiscard]] inline std::size_t align256(std::size_t n) noexcept { return (n + 255) / 256 * 256; }
[[nodiscard]] inline std::size_t forward_workspace_bytes(const tile_plan& plan, std::int64_t batch,
                                                         std::int64_t heads_kv, std::int64_t seq_k) noexcept {
  return align256(plan.size_bytes()) + align256(key_flag_bytes(batch, heads_kv, seq_k));
}

}  // namespace baton::detail::attention::cuda
