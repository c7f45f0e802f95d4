// baton/attention/cuda/plan_cache.hpp — the CUDA backend's workspace: tile plans cached by
// (shape, mask fingerprint, positions, tiles) and kept in device memory, and the per-call
// scratch (key flags, the backward's row state), both sized up front by reserve().
// Plain C++ (g++-compilable): the device operations are a policy (Ops), so the same logic
// runs under cuda_attention (cudaMalloc / cudaMemcpyAsync) and cuda_attention_emulated (host
// memory), where the CPU tests count what it builds, uploads and allocates.
//
// Why: planning a causal S = 8192 call on the host costs milliseconds, and uploading a plan
// from pageable memory makes the host wait for the stream (cudaMemcpyAsync from pageable
// memory synchronises with the stream before it copies). A training loop, and a ring's
// steps from one training step to the next, repeat the same calls; a repeated call must
// neither rebuild nor re-upload its plan.
//
// The key is exactly what make_tile_plan reads: the mask, the query and key positions, the
// sequence lengths and the tile sizes. A mask's part of it is exact for the built-in masks
// (their type and every parameter; a document_mask all its segment ids), for intersections
// and paddings of those, and for any mask with a `std::uint64_t fingerprint() const` member
// (the mask's author promises that equal fingerprints mean equal answers). Other masks (a
// block_mask: its predicate is opaque) have no key: their plan is built at every call and
// uploaded only when its bytes differ from a plan already held. The hash is 64 bits and not
// cryptographic (core/hash.hpp): it tells honest differences apart.
//
// Device memory: two allocations. The plan arena holds cached plans one after another;
// when a plan does not fit, the arena is emptied (every cached plan dropped) and the plan
// placed at its start. That is safe without a host wait because every kernel that reads a
// plan and every upload that overwrites one are on the object's one stream, in call order.
// The scratch holds the one running call's flags and row state (stream-ordered the same
// way). Without reserve() both grow on demand: a full arena is emptied, unless plans it
// evicted before were needed again (the keys of evicted plans are remembered), in which
// case it at least doubles and takes its plans along (a device-to-device copy). So a
// repeating working set (a ring's steps) is soon planned and uploaded once, and plans that
// never repeat do not grow it. Growing frees the old block, which waits for the stream. After reserve() the arena keeps its size (emptied when
// full) unless one plan alone exceeds it; a later reserve() grows it to the distinct plans
// built in the last two intervals between reserves, so calls that evicted one another fit
// from then on (a ring calls reserve before its first step, forward and backward: the arena
// grows there, never between steps).
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <new>
#include <optional>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/attention/cuda/plan.hpp>
#include <baton/core/hash.hpp>

namespace baton::detail::attention::cuda {

// ---- the key ------------------------------------------------------------------------------

namespace plan_cache_detail {
template <class T>
inline constexpr bool is_intersection = false;
template <class A, class B>
inline constexpr bool is_intersection<mask_intersection<A, B>> = true;
template <class T>
inline constexpr bool is_padding = false;
template <class M>
inline constexpr bool is_padding<padding_mask<M>> = true;
}  // namespace plan_cache_detail

/// Adds the mask's identity and every parameter to `h`; false when the mask's answers are not
/// determined by anything hashable (then no plan of it is cached).
template <class Mask>
[[nodiscard]] bool add_mask_fingerprint(core::hasher& h, const Mask& mask) {
  h.add(std::string_view(typeid(Mask).name()));
  if constexpr (requires { { mask.fingerprint() } -> std::convertible_to<std::uint64_t>; }) {
    h.add(static_cast<std::uint64_t>(mask.fingerprint()));
    return true;
  } else if constexpr (plan_cache_detail::is_intersection<Mask>) {
    return add_mask_fingerprint(h, mask.first) && add_mask_fingerprint(h, mask.second);
  } else if constexpr (plan_cache_detail::is_padding<Mask>) {
    h.add(static_cast<std::uint64_t>(mask.length())).add(static_cast<std::uint64_t>(mask.k_length()));
    return add_mask_fingerprint(h, mask.inner());
  } else {
    return false;  // a block_mask or a user mask without fingerprint(): opaque
  }
}

/// Positions as the plan sees them (resolved ones): a range by its start and length, a
/// list by every entry.
inline void add_positions_fingerprint(core::hasher& h, const positions& p) {
  h.add(static_cast<std::uint64_t>(p.size()));
  if (p.is_range()) {
    h.add(std::uint64_t{0}).add(static_cast<std::uint64_t>(p.range_begin()));
    return;
  }
  h.add(std::uint64_t{1});
  for (std::int64_t i = 0; i < p.size(); ++i) h.add(static_cast<std::uint64_t>(p[i]));
}

/// Everything make_tile_plan reads: equal keys, equal plans.
struct plan_key {
  std::uint64_t fingerprint = 0;  // mask and positions
  std::int64_t seq_q = 0, seq_k = 0;
  std::int32_t tile_q = 0, tile_k = 0;
  friend bool operator==(const plan_key&, const plan_key&) = default;
};

/// The key of make_tile_plan(mask, q_pos, k_pos, seq_q, seq_k, tile_q, tile_k), or none when
/// the mask is opaque (add_mask_fingerprint).
template <class Mask>
[[nodiscard]] std::optional<plan_key> plan_key_for(const Mask& mask, const positions& q_pos, const positions& k_pos,
                                                   std::int64_t seq_q, std::int64_t seq_k, std::int32_t tile_q,
                                                   std::int32_t tile_k) {
  core::hasher h;
  if (!add_mask_fingerprint(h, mask)) return std::nullopt;
  add_positions_fingerprint(h, q_pos);
  add_positions_fingerprint(h, k_pos);
  return plan_key{.fingerprint = static_cast<std::uint64_t>(h.value()), .seq_q = seq_q, .seq_k = seq_k,
                  .tile_q = tile_q, .tile_k = tile_k};
}

/// The most bytes make_tile_plan can need for a seq_q x seq_k call at tile_q x tile_k tiles:
/// every tile partial (what reserve() sets aside per plan when not told otherwise).
[[nodiscard]] constexpr std::size_t tile_plan_bytes_bound(std::int64_t seq_q, std::int64_t seq_k, std::int32_t tile_q,
                                                          std::int32_t tile_k) noexcept {
  const auto up8 = [](std::size_t n) { return (n + 7) / 8 * 8; };
  const auto q_tiles = static_cast<std::size_t>(std::max<std::int64_t>(0, (seq_q + tile_q - 1) / tile_q));
  const auto k_tiles = static_cast<std::size_t>(std::max<std::int64_t>(0, (seq_k + tile_k - 1) / tile_k));
  const std::size_t cells = q_tiles * k_tiles;
  const std::size_t bits = cells * static_cast<std::size_t>(tile_q) * static_cast<std::size_t>((tile_k + 63) / 64) * 8;
  return std::max<std::size_t>(8, bits + up8(cells) + up8(cells * 4) + up8((q_tiles + 1) * 4) + up8(cells * 4) +
                                      up8((k_tiles + 1) * 4) + up8(cells * 4));
}

// ---- the workspace ------------------------------------------------------------------------

/// What a workspace has done since it was made: the CPU tests' and benchmarks' view of it.
struct workspace_stats {
  std::int64_t allocations = 0;     ///< device allocations (arena and scratch)
  std::int64_t frees = 0;           ///< device frees (each waits for the stream first)
  std::int64_t plan_builds = 0;     ///< host planning runs (make_tile_plan)
  std::int64_t plan_uploads = 0;    ///< plan copies to the device
  std::int64_t plan_hits = 0;       ///< calls served by a cached plan, no build, no upload
  std::int64_t plan_evictions = 0;  ///< times the full arena was emptied to make room
  std::size_t plan_bytes_used = 0;  ///< arena bytes the cached plans occupy now
  std::size_t plan_capacity = 0;    ///< arena bytes allocated
  std::size_t scratch_capacity = 0;
  std::size_t cached_plans = 0;
};

inline constexpr std::size_t workspace_align = 256;  // cudaMalloc's alignment
[[nodiscard]] constexpr std::size_t align_up(std::size_t n) noexcept {
  return (n + workspace_align - 1) / workspace_align * workspace_align;
}

/// Plans and scratch in device memory through `Ops`, which provides
///   void* allocate(std::size_t bytes)                  workspace_align-aligned, bytes > 0
///   void free(void* p)                                 once the stream is past its users
///   void free_at_exit(void* p) noexcept                the same, from a destructor
///   void upload(void* dst, const void* src, std::size_t bytes)  stream-ordered; src may die on return
///   void copy(void* dst, const void* src, std::size_t bytes)    device to device, stream-ordered
/// Not thread-safe by itself: callers hold mutex() from the lookup to the last launch.
template <class Ops>
class plan_workspace {
 public:
  explicit plan_workspace(Ops ops = {}) : ops_(std::move(ops)) {}
  plan_workspace(const plan_workspace&) = delete;
  plan_workspace& operator=(const plan_workspace&) = delete;
  ~plan_workspace() {
    if (arena_ != nullptr) ops_.free_at_exit(arena_);
    if (scratch_ != nullptr) ops_.free_at_exit(scratch_);
  }

  [[nodiscard]] std::mutex& mutex() noexcept { return mutex_; }
  [[nodiscard]] Ops& ops() noexcept { return ops_; }

  /// Sizes both parts now: the scratch to at least scratch_bytes, the plan arena to at least
  /// plan_bytes and at least the distinct plans built since the reserve before the previous
  /// one (the working set of the last two batches of calls, such as a ring's forward and
  /// backward, so that they fit together next time); from then on the arena keeps its size
  /// (evicting, not growing) unless a single plan needs more. Allocates only what is
  /// missing: a caller may call it before every batch of calls (a ring does, before its
  /// first step), and it grows only there, at a quiescent point. Plans never used twice
  /// (a document mask that changes every batch) make it grow to two batches' plans at most.
  void reserve(std::size_t scratch_bytes, std::size_t plan_bytes) {
    if (scratch_bytes > scratch_capacity_) grow_scratch(scratch_bytes);
    std::size_t demand = 0;
    for (const auto& [key, bytes] : built_now_) demand += bytes;
    for (const auto& [key, bytes] : built_before_)
      if (!built_in(built_now_, key)) demand += bytes;
    const std::size_t want = std::max(plan_bytes, demand);
    if (want > capacity_) grow_arena(want, /*keep=*/true);
    fixed_ = true;
    built_before_ = std::move(built_now_);
    built_now_.clear();
  }

  /// The scratch of one call, at least `bytes` (grown, which frees the old block, if short).
  [[nodiscard]] std::byte* scratch(std::size_t bytes) {
    if (bytes > scratch_capacity_ || scratch_ == nullptr) grow_scratch(std::max<std::size_t>(bytes, 1));
    return scratch_;
  }

  /// The device view of the plan with `key`: the cached one, or `build()`'s (a tile_plan),
  /// uploaded into the arena. With no key the plan is built, and uploaded unless a plan
  /// with the same bytes is held (what a call with an opaque mask repeated gets).
  template <class Build>
  [[nodiscard]] tile_plan_view plan(const std::optional<plan_key>& key, Build&& build) {
    if (key) {
      for (const entry& e : entries_)
        if (e.key && *e.key == *key) {
          ++stats_.plan_hits;
          return e.view;
        }
    }
    const tile_plan p = std::forward<Build>(build)();
    ++stats_.plan_builds;
    const std::size_t n = p.size_bytes();
    if (key && !built_in(built_now_, *key)) built_now_.emplace_back(*key, align_up(n));  // (misses only)
    if (key) {
      const auto ghost = std::find(ghosts_.begin(), ghosts_.end(), *key);
      if (ghost != ghosts_.end()) {  // evicted, and needed again: the working set did not fit
        ghosts_.erase(ghost);
        ++ghost_misses_;
      }
    }
    if (!key) {
      for (const entry& e : entries_)
        if (!e.key && e.bytes.size() * 8 == n && std::memcmp(e.bytes.data(), p.blob(), n) == 0) return e.view;
    }
    std::size_t at = align_up(used_);
    if (arena_ == nullptr || at + n > capacity_) {
      const bool fits_alone = arena_ != nullptr && n <= capacity_;
      if (fits_alone && (fixed_ || ghost_misses_ == 0)) {
        // Reserved, or nothing evicted has been needed again (plans that do not repeat, a
        // document mask that changes every batch): empty the arena and start over.
        evict_all();
        at = 0;
      } else if (fixed_) {  // one plan larger than the reservation: room for it alone
        grow_arena(align_up(n), /*keep=*/false);
        at = 0;
      } else {  // evicted plans came back: grow, the cached plans moving along
        grow_arena(std::max({at + align_up(n), 2 * capacity_, workspace_align}), /*keep=*/true);
        ghost_misses_ = 0;
      }
    }
    std::byte* where = arena_ + at;
    ops_.upload(where, p.blob(), n);
    ++stats_.plan_uploads;
    entry e{key, p.view(where), {}};
    if (!key) e.bytes.assign(p.blob(), p.blob() + n / 8);
    entries_.push_back(std::move(e));
    used_ = at + n;
    return entries_.back().view;
  }

  /// Frees both parts (waiting for the stream) and forgets every plan and the reservation.
  void release() {
    entries_.clear();
    built_now_.clear();
    built_before_.clear();
    ghosts_.clear();
    ghost_misses_ = 0;
    used_ = 0;
    fixed_ = false;
    free_block(arena_, capacity_);
    free_block(scratch_, scratch_capacity_);
  }

  [[nodiscard]] workspace_stats stats() const noexcept {
    workspace_stats s = stats_;
    s.plan_bytes_used = used_;
    s.plan_capacity = capacity_;
    s.scratch_capacity = scratch_capacity_;
    s.cached_plans = entries_.size();
    return s;
  }

 private:
  struct entry {
    std::optional<plan_key> key;
    tile_plan_view view;
    std::vector<std::uint64_t> bytes;  // a keyless plan's bytes, to recognise it again
  };

  static bool built_in(const std::vector<std::pair<plan_key, std::size_t>>& built, const plan_key& key) noexcept {
    return std::any_of(built.begin(), built.end(), [&](const auto& b) { return b.first == key; });
  }
  void evict_all() {
    if (!entries_.empty()) ++stats_.plan_evictions;
    for (const entry& e : entries_)
      if (e.key) ghosts_.push_back(*e.key);
    if (ghosts_.size() > max_ghosts) ghosts_.erase(ghosts_.begin(), ghosts_.end() - max_ghosts);
    entries_.clear();
    used_ = 0;
  }
  void free_block(std::byte*& p, std::size_t& capacity) {
    if (p != nullptr) {
      ops_.free(p);
      ++stats_.frees;
    }
    p = nullptr;
    capacity = 0;
  }
  // A larger arena; with `keep` the cached plans are copied into it (on the device, in stream
  // order) and their views moved, else they are dropped.
  void grow_arena(std::size_t bytes, bool keep) {
    if (!keep || arena_ == nullptr) evict_all();
    auto* grown = static_cast<std::byte*>(ops_.allocate(bytes));
    ++stats_.allocations;
    if (!entries_.empty()) {
      ops_.copy(grown, arena_, used_);
      for (entry& e : entries_) e.view = moved(e.view, arena_, grown);
    }
    std::size_t capacity = capacity_;
    free_block(arena_, capacity);
    arena_ = grown;
    capacity_ = bytes;
  }
  // The view's arrays at the same offsets from `to` as they were from `from`.
  static tile_plan_view moved(tile_plan_view v, const std::byte* from, std::byte* to) noexcept {
    const auto move = [&](auto*& p) {
      using P = std::remove_reference_t<decltype(p)>;
      p = reinterpret_cast<P>(to + (reinterpret_cast<const std::byte*>(p) - from));
    };
    move(v.kind);
    move(v.partial_slot);
    move(v.bits);
    move(v.q_list_begin);
    move(v.q_list);
    move(v.k_list_begin);
    move(v.k_list);
    return v;
  }
  void grow_scratch(std::size_t bytes) {
    bytes = align_up(bytes);
    free_block(scratch_, scratch_capacity_);
    scratch_ = static_cast<std::byte*>(ops_.allocate(bytes));
    ++stats_.allocations;
    scratch_capacity_ = bytes;
  }

  Ops ops_;
  std::mutex mutex_;
  std::byte* arena_ = nullptr;
  std::size_t capacity_ = 0, used_ = 0;
  bool fixed_ = false;
  std::byte* scratch_ = nullptr;
  std::size_t scratch_capacity_ = 0;
  std::vector<entry> entries_;
  // The distinct plans built (and the arena bytes each takes) since the last reserve, and
  // between the two before it.
  std::vector<std::pair<plan_key, std::size_t>> built_now_, built_before_;
  // Keys of evicted plans (the latest max_ghosts), and how many misses since the arena last
  // grew were on one of them: without a reservation the arena grows only on that evidence
  // that its working set does not fit.
  static constexpr std::size_t max_ghosts = 4096;
  std::vector<plan_key> ghosts_;
  std::int64_t ghost_misses_ = 0;
  workspace_stats stats_;
};

/// Host memory as the "device" (cuda_attention_emulated): aligned blocks, memcpy uploads.
struct host_workspace_ops {
  // Poisoned, as the emulation's shared memory is: a kernel that reads scratch it did not
  // write sees 0xff bytes (a NaN in float), not a lucky zero.
  void* allocate(std::size_t bytes) {
    void* p = ::operator new(bytes, std::align_val_t{workspace_align});
    std::memset(p, 0xff, bytes);
    return p;
  }
  void free(void* p) noexcept { ::operator delete(p, std::align_val_t{workspace_align}); }
  void free_at_exit(void* p) noexcept { free(p); }
  void upload(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
  void copy(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
};

}  // namespace baton::detail::attention::cuda
