// baton/attention/masks.hpp — attention masks as functions of global token positions.
//
// A mask answers two questions. `allowed(q_pos, k_pos)`: may the query at global position
// q_pos attend to the key at k_pos? And `classify(q_block, k_block)`: for a tile of queries
// and a tile of keys, is every pair masked out (empty: the kernel skips the tile), every pair
// allowed (full: the kernel computes it without testing a single element), or a mix
// (partial: the kernel calls allowed() per element)? classify must never claim empty or full
// wrongly; answering partial when unsure is always correct, only slower.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <baton/attention/error.hpp>
#include <baton/attention/positions.hpp>
#include <baton/core/hash.hpp>

namespace baton {

/// What a tile of (query, key) pairs looks like under a mask.
enum class block_kind : std::uint8_t {
  empty,    ///< every pair is masked out: skip the tile
  full,     ///< every pair is allowed: no per-element test
  partial,  ///< some of each: test each element
};

/// A mask type M models attention_mask when, for global positions q, k and position blocks
/// qb, kb:
///   1. `m.allowed(q, k)` returns whether query position q may attend to key position k;
///   2. `m.classify(qb, kb)` returns a block_kind that agrees with allowed() on every pair
///      (empty only if no pair is allowed, full only if every pair is);
///   3. both are const and thread-safe (several ranks may use one mask at once).
/// Optionally `m.validate(q_positions, k_positions)` throws attention_error when the mask
/// cannot describe those positions (a document mask shorter than the sequence); backends
/// call it before computing.
template <class M>
concept attention_mask = std::copy_constructible<M> &&
    requires(const M& m, std::int64_t q, std::int64_t k, const position_block& qb, const position_block& kb) {
      { m.allowed(q, k) } -> std::convertible_to<bool>;
      { m.classify(qb, kb) } -> std::same_as<block_kind>;
    };

/// Half-open interval [begin, end) of key positions (empty when begin >= end).
struct key_interval {
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

/// Optional mask member, for masks under which a query's allowed keys within a run of
/// consecutive positions are themselves consecutive (causal, windows, prefix-LM):
/// `m.allowed_keys(q, k_begin, k_end)` returns the sub-interval of [k_begin, k_end) holding
/// exactly the keys k with allowed(q, k). Kernels then bound a partial tile's rows from
/// this interval instead of testing each pair; masks without it are tested pair by pair.
template <class M>
concept mask_with_key_intervals = attention_mask<M> && requires(const M& m, std::int64_t q, std::int64_t k) {
  { m.allowed_keys(q, k, k) } -> std::same_as<key_interval>;
};

/// Checks that `mask` can describe the pairs of positions q x k (a document mask has a
/// segment id for every position, ...): calls `mask.validate(q, k)`, which throws
/// attention_error naming the problem, when the mask has one; a mask without it takes any
/// positions. Backends and context parallelism call it before any work.
template <class M>
void validate_mask(const M& mask, const positions& q, const positions& k) {
  if constexpr (requires { mask.validate(q, k); }) mask.validate(q, k);
}

namespace detail::attention {
/// [lo, hi) clipped to [k_begin, k_end), with begin <= end.
[[nodiscard]] constexpr key_interval clip_keys(std::int64_t lo, std::int64_t hi, std::int64_t k_begin,
                                               std::int64_t k_end) noexcept {
  const std::int64_t b = std::clamp(lo, k_begin, k_end);
  return {b, std::clamp(hi, b, k_end)};
}

/// A block's kind found by testing every pair: exact but O(|qb| |kb|).
template <class M>
block_kind classify_by_testing(const M& mask, const position_block& qb, const position_block& kb) {
  bool any = false, all = true;
  for (std::int64_t i = 0; i < qb.size(); ++i)
    for (std::int64_t j = 0; j < kb.size(); ++j) {
      const bool a = mask.allowed(qb[i], kb[j]);
      any = any || a;
      all = all && a;
    }
  return !any ? block_kind::empty : all ? block_kind::full : block_kind::partial;
}
}  // namespace detail::attention

/// Every query attends to every key.
struct no_mask {
  [[nodiscard]] constexpr bool allowed(std::int64_t, std::int64_t) const noexcept { return true; }
  [[nodiscard]] constexpr block_kind classify(const position_block&, const position_block&) const noexcept {
    return block_kind::full;
  }
  [[nodiscard]] constexpr key_interval allowed_keys(std::int64_t, std::int64_t k_begin, std::int64_t k_end) const noexcept {
    return {k_begin, std::max(k_begin, k_end)};
  }
  /// Equal fingerprints, equal answers (with the type): what the CUDA plan cache and the CP
  /// agreement hash. Every built-in leaf mask has one; a user mask may add its own.
  [[nodiscard]] constexpr std::uint64_t fingerprint() const noexcept { return 0; }
};

/// A query attends to keys at the same or earlier global positions (k_pos <= q_pos).
/// With Sq != Sk, say where the queries sit through attention_params::q_pos: for queries that
/// continue a key sequence of length Sk, q_pos = positions(Sk - Sq, Sq).
struct causal_mask {
  [[nodiscard]] constexpr bool allowed(std::int64_t q, std::int64_t k) const noexcept { return k <= q; }
  [[nodiscard]] constexpr block_kind classify(const position_block& qb, const position_block& kb) const noexcept {
    if (kb.max() <= qb.min()) return block_kind::full;
    if (kb.min() > qb.max()) return block_kind::empty;
    return block_kind::partial;
  }
  /// Keys up to q: a prefix of any run of keys.
  [[nodiscard]] constexpr key_interval allowed_keys(std::int64_t q, std::int64_t k_begin, std::int64_t k_end) const noexcept {
    return detail::attention::clip_keys(k_begin, q < k_end ? q + 1 : k_end, k_begin, k_end);
  }
  [[nodiscard]] constexpr std::uint64_t fingerprint() const noexcept { return 0; }
};

/// A query at q attends to keys in [q - left, q + right]. {left, 0} is causal local
/// attention with a window of left+1 tokens; {w, w} is symmetric.
struct sliding_window_mask {
  std::int64_t left = 0;
  std::int64_t right = 0;

  [[nodiscard]] constexpr bool allowed(std::int64_t q, std::int64_t k) const noexcept {
    return k >= q - left && k <= q + right;
  }
  [[nodiscard]] constexpr block_kind classify(const position_block& qb, const position_block& kb) const noexcept {
    if (kb.min() > qb.max() + right || kb.max() < qb.min() - left) return block_kind::empty;
    if (kb.min() >= qb.max() - left && kb.max() <= qb.min() + right) return block_kind::full;
    return block_kind::partial;
  }
  [[nodiscard]] constexpr key_interval allowed_keys(std::int64_t q, std::int64_t k_begin, std::int64_t k_end) const noexcept {
    // Written so that no sum overflows for extents up to INT64_MAX ("unbounded").
    const std::int64_t lo = q - k_begin <= left ? k_begin : q - left;
    const std::int64_t hi = k_end - q <= right ? k_end : q + right + 1;
    return detail::attention::clip_keys(lo, hi, k_begin, k_end);
  }
  [[nodiscard]] constexpr std::uint64_t fingerprint() const noexcept {
    return static_cast<std::uint64_t>(
        detail::core::hasher().add(static_cast<std::uint64_t>(left)).add(static_cast<std::uint64_t>(right)).value());
  }
  void validate(const positions&, const positions&) const {
    if (left < 0 || right < 0)
      throw attention_error("baton::sliding_window_mask: left (" + std::to_string(left) + ") and right (" +
                            std::to_string(right) + ") extents must be >= 0");
  }
};

/// Packed sequences: a query attends only to keys of the same document. segment_ids[p] is
/// the document of global position p (any integer labels; packed data has them ascending).
/// Combine with causal_mask through intersect() for causal document attention.
class document_mask {
 public:
  explicit document_mask(std::vector<std::int64_t> segment_ids)
      : ascending_(std::is_sorted(segment_ids.begin(), segment_ids.end())),
        fingerprint_(hash(segment_ids)),
        ids_(std::make_shared<const std::vector<std::int64_t>>(std::move(segment_ids))) {}
  template <class I>
    requires std::integral<I>
  explicit document_mask(std::span<const I> segment_ids)
      : document_mask(std::vector<std::int64_t>(segment_ids.begin(), segment_ids.end())) {}

  [[nodiscard]] bool allowed(std::int64_t q, std::int64_t k) const noexcept { return (*ids_)[q] == (*ids_)[k]; }

  [[nodiscard]] block_kind classify(const position_block& qb, const position_block& kb) const noexcept {
    const auto [qlo, qhi] = segment_range(qb);
    const auto [klo, khi] = segment_range(kb);
    if (qhi < klo || khi < qlo) return block_kind::empty;
    if (qlo == qhi && klo == khi && qlo == klo) return block_kind::full;
    return block_kind::partial;
  }

  void validate(const positions& q, const positions& k) const {
    const auto n = static_cast<std::int64_t>(ids_->size());
    for (const positions* p : {&q, &k})
      for (std::int64_t i = 0; i < p->size(); ++i)
        if ((*p)[i] >= n)
          throw attention_error("baton::document_mask: " + std::string(p == &q ? "query" : "key") +
                                " position " + std::to_string((*p)[i]) + " has no segment id (the mask holds " +
                                std::to_string(n) + "); give one segment id per global position");
  }

  [[nodiscard]] std::span<const std::int64_t> segment_ids() const noexcept { return *ids_; }
  /// Every segment id, hashed once at construction (a lookup per call would cost O(length)).
  [[nodiscard]] std::uint64_t fingerprint() const noexcept { return fingerprint_; }

 private:
  static std::uint64_t hash(const std::vector<std::int64_t>& ids) noexcept {
    detail::core::hasher h;
    for (std::int64_t id : ids) h.add(static_cast<std::uint64_t>(id));
    return static_cast<std::uint64_t>(h.add(ids.size()).value());
  }

  std::pair<std::int64_t, std::int64_t> segment_range(const position_block& b) const noexcept {
    const auto& ids = *ids_;
    // Packed documents have ascending ids: a run of positions then spans exactly the ids of
    // its ends. The flash kernels classify every tile of every head, so this O(1) answer is
    // what keeps a document mask's empty tiles free (a scan of both blocks cost about 60 ns a
    // tile: 5-7 % of a document-masked forward at S = 2048, 4 heads).
    if (b.is_contiguous() && ascending_) return {ids[b.min()], ids[b.max()]};
    if (b.is_contiguous() && ids[b.min()] == ids[b.max()]) {
      // Not ascending: equal ends may still hide another label inside; check the interior.
      bool same = true;
      for (std::int64_t p = b.min() + 1; p < b.max() && same; ++p) same = ids[p] == ids[b.min()];
      if (same) return {ids[b.min()], ids[b.min()]};
    }
    std::int64_t lo = ids[b[0]], hi = lo;
    for (std::int64_t i = 1; i < b.size(); ++i) {
      lo = std::min(lo, ids[b[i]]);
      hi = std::max(hi, ids[b[i]]);
    }
    return {lo, hi};
  }

  bool ascending_ = true;
  std::uint64_t fingerprint_ = 0;
  std::shared_ptr<const std::vector<std::int64_t>> ids_;
};

/// Prefix-LM: every query sees the whole prefix [0, prefix_length) bidirectionally, and the
/// rest causally (k < prefix_length or k <= q).
struct prefix_lm_mask {
  std::int64_t prefix_length = 0;

  [[nodiscard]] constexpr bool allowed(std::int64_t q, std::int64_t k) const noexcept {
    return k < prefix_length || k <= q;
  }
  [[nodiscard]] constexpr block_kind classify(const position_block& qb, const position_block& kb) const noexcept {
    if (kb.max() < prefix_length || kb.max() <= qb.min()) return block_kind::full;
    if (kb.min() >= prefix_length && kb.min() > qb.max()) return block_kind::empty;
    return block_kind::partial;
  }
  /// k < prefix_length or k <= q is k < max(prefix_length, q + 1): a prefix of any run.
  [[nodiscard]] constexpr key_interval allowed_keys(std::int64_t q, std::int64_t k_begin, std::int64_t k_end) const noexcept {
    const std::int64_t limit = q < k_end ? std::max(prefix_length, q + 1) : k_end;
    return detail::attention::clip_keys(k_begin, limit, k_begin, k_end);
  }
  [[nodiscard]] constexpr std::uint64_t fingerprint() const noexcept {
    return static_cast<std::uint64_t>(detail::core::hasher().add(static_cast<std::uint64_t>(prefix_length)).value());
  }
};

/// The pairs allowed by both masks (for example document_mask and causal_mask).
template <attention_mask A, attention_mask B>
struct mask_intersection {
  A first;
  B second;

  [[nodiscard]] constexpr bool allowed(std::int64_t q, std::int64_t k) const {
    return first.allowed(q, k) && second.allowed(q, k);
  }
  [[nodiscard]] constexpr block_kind classify(const position_block& qb, const position_block& kb) const {
    const block_kind a = first.classify(qb, kb);
    if (a == block_kind::empty) return block_kind::empty;
    const block_kind b = second.classify(qb, kb);
    if (b == block_kind::empty) return block_kind::empty;
    return a == block_kind::full && b == block_kind::full ? block_kind::full : block_kind::partial;
  }
  /// Offered when both masks offer it: the intersection of two intervals is one.
  [[nodiscard]] constexpr key_interval allowed_keys(std::int64_t q, std::int64_t k_begin, std::int64_t k_end) const
    requires mask_with_key_intervals<A> && mask_with_key_intervals<B>
  {
    const key_interval a = first.allowed_keys(q, k_begin, k_end);
    const key_interval b = second.allowed_keys(q, k_begin, k_end);
    return detail::attention::clip_keys(std::max(a.begin, b.begin), std::min(a.end, b.end), k_begin, k_end);
  }
  void validate(const positions& q, const positions& k) const {
    baton::validate_mask(first, q, k);
    baton::validate_mask(second, q, k);
  }
};

/// Both masks at once: `intersect(document_mask(ids), causal_mask{})`.
template <attention_mask A, attention_mask B>
[[nodiscard]] constexpr mask_intersection<A, B> intersect(A a, B b) {
  return {std::move(a), std::move(b)};
}

/// `inner` over the first `length` positions of a padded sequence, and nothing else: a pair
/// is allowed when both positions are below `length` and `inner` allows it. Padding keys are
/// never attended, and padding queries attend to nothing (out 0, lse -inf, no gradient), so
/// the results on the real tokens equal those of the unpadded sequence. `inner` is never
/// asked about a padding position (a document_mask needs ids for the real tokens only).
/// Pair it with pad_sequence (baton/cp/sharding.hpp) when a sharding refuses the length:
///
/// Example:
/// ```cpp
///   const std::int64_t padded = baton::sequence_sharding::padded_length(baton::shard_layout::zigzag, 33, 2, 2);
///   baton::sequence_sharding sharding(baton::shard_layout::zigzag, padded, 2, 2);  // 36 tokens
///   baton::padding_mask mask(baton::causal_mask{}, /*length=*/33);               // hides 33..35
/// ```
template <attention_mask Mask>
class padding_mask {
 public:
  padding_mask(Mask inner, std::int64_t length) : padding_mask(std::move(inner), length, length) {}
  /// Cross-attention (queries and keys from different sequences): queries at positions >=
  /// q_length and keys at positions >= k_length are padding, e.g. an encoder's keys padded
  /// past their valid length: `padding_mask(no_mask{}, seq_q, valid_keys)`.
  padding_mask(Mask inner, std::int64_t q_length, std::int64_t k_length)
      : inner_(std::move(inner)), q_length_(q_length), k_length_(k_length) {
    if (q_length < 0 || k_length < 0)
      throw attention_error("baton::padding_mask: the real lengths (queries " + std::to_string(q_length) +
                            ", keys " + std::to_string(k_length) + ") must be >= 0");
  }

  [[nodiscard]] bool allowed(std::int64_t q, std::int64_t k) const {
    return q < q_length_ && k < k_length_ && static_cast<bool>(inner_.allowed(q, k));
  }
  [[nodiscard]] block_kind classify(const position_block& qb, const position_block& kb) const {
    if (qb.empty() || kb.empty() || qb.min() >= q_length_ || kb.min() >= k_length_) return block_kind::empty;
    // A block straddling the end holds positions the inner mask must not see: test pairs.
    if (qb.max() >= q_length_ || kb.max() >= k_length_) return block_kind::partial;
    return inner_.classify(qb, kb);
  }
  void validate(const positions& q, const positions& k) const {
    std::vector<std::int64_t> q_real, k_real;
    baton::validate_mask(inner_, real_positions(q, q_length_, q_real), real_positions(k, k_length_, k_real));
  }

  [[nodiscard]] const Mask& inner() const noexcept { return inner_; }
  /// The queries' real length (the one length of a self-attention padding mask).
  [[nodiscard]] std::int64_t length() const noexcept { return q_length_; }
  [[nodiscard]] std::int64_t k_length() const noexcept { return k_length_; }

 private:
  static positions real_positions(const positions& p, std::int64_t length, std::vector<std::int64_t>& storage) {
    if (p.is_unsized()) return p;
    if (p.is_range()) {
      const std::int64_t begin = std::min(p.range_begin(), length);
      return positions(begin, std::max<std::int64_t>(0, std::min(p.range_begin() + p.size(), length) - begin));
    }
    for (std::int64_t i = 0; i < p.size(); ++i)
      if (p[i] < length) storage.push_back(p[i]);
    return positions(std::span<const std::int64_t>(storage));
  }

  Mask inner_;
  std::int64_t q_length_, k_length_;
};

/// A mask from any predicate `mask_mod(q_pos, k_pos) -> bool` (FlexAttention's BlockMask):
/// built once over the global grid [0, q_length) x [0, k_length) by evaluating mask_mod on
/// every pair and recording, per block_size x block_size cell, whether it is empty, full or
/// partial. Kernels then skip empty tiles and compute full ones without calling mask_mod;
/// only partial tiles call it per element. Building costs q_length * k_length calls.
///
/// `basic_block_mask<F>` keeps the predicate's type (inlined in the kernel); `block_mask`
/// erases it into a std::function, one type for every predicate.
///
/// Example:
/// ```cpp
///   // every query sees the first 4 "sink" tokens and a causal window of 256
///   baton::block_mask mask([](std::int64_t q, std::int64_t k) {
///     return k <= q && (k < 4 || q - k < 256);
///   }, 4096, 4096);
/// ```
template <class MaskMod>
class basic_block_mask {
 public:
  static constexpr std::int64_t default_block_size = 64;

  template <class F>
    requires std::constructible_from<MaskMod, F&&>
  basic_block_mask(F&& mask_mod, std::int64_t q_length, std::int64_t k_length,
                   std::int64_t block_size = default_block_size)
      : mod_(std::forward<F>(mask_mod)), q_length_(q_length), k_length_(k_length), block_(block_size) {
    static_assert(std::is_invocable_r_v<bool, const MaskMod&, std::int64_t, std::int64_t>,
                  "baton::block_mask: mask_mod must be callable as mask_mod(std::int64_t q_pos, std::int64_t "
                  "k_pos) -> bool (const-callable)");
    if (q_length < 0 || k_length < 0 || block_size <= 0)
      throw attention_error("baton::block_mask: lengths must be >= 0 and block_size > 0 (got q_length " +
                            std::to_string(q_length) + ", k_length " + std::to_string(k_length) +
                            ", block_size " + std::to_string(block_size) + ")");
    q_blocks_ = (q_length + block_ - 1) / block_;
    k_blocks_ = (k_length + block_ - 1) / block_;
    auto kinds = std::make_shared<std::vector<block_kind>>(static_cast<std::size_t>(q_blocks_ * k_blocks_));
    const positions q_all(0, q_length), k_all(0, k_length);
    for (std::int64_t qb = 0; qb < q_blocks_; ++qb) {
      const position_block q_cell(q_all, qb * block_, std::min(block_, q_length - qb * block_));
      for (std::int64_t kb = 0; kb < k_blocks_; ++kb) {
        const position_block k_cell(k_all, kb * block_, std::min(block_, k_length - kb * block_));
        (*kinds)[static_cast<std::size_t>(qb * k_blocks_ + kb)] = detail::attention::classify_by_testing(*this, q_cell, k_cell);
      }
    }
    kinds_ = std::move(kinds);
  }

  [[nodiscard]] bool allowed(std::int64_t q, std::int64_t k) const { return static_cast<bool>(std::invoke(mod_, q, k)); }

  /// Combines the cells covering the blocks' position ranges (conservative for index lists
  /// whose range spans cells they do not touch).
  [[nodiscard]] block_kind classify(const position_block& qb, const position_block& kb) const noexcept {
    if (qb.empty() || kb.empty()) return block_kind::empty;
    if (qb.max() >= q_length_ || kb.max() >= k_length_) return block_kind::partial;
    const std::int64_t q0 = qb.min() / block_, q1 = qb.max() / block_;
    const std::int64_t k0 = kb.min() / block_, k1 = kb.max() / block_;
    bool all_empty = true, all_full = true;
    for (std::int64_t i = q0; i <= q1; ++i)
      for (std::int64_t j = k0; j <= k1; ++j) {
        const block_kind c = (*kinds_)[static_cast<std::size_t>(i * k_blocks_ + j)];
        all_empty = all_empty && c == block_kind::empty;
        all_full = all_full && c == block_kind::full;
      }
    return all_empty ? block_kind::empty : all_full ? block_kind::full : block_kind::partial;
  }

  void validate(const positions& q, const positions& k) const {
    const auto check = [](const positions& p, std::int64_t length, const char* what) {
      for (std::int64_t i = 0; i < p.size(); ++i)
        if (p[i] >= length)
          throw attention_error(std::string("baton::block_mask: ") + what + " position " + std::to_string(p[i]) +
                                " is outside the grid the mask was built for (" + what + " length " +
                                std::to_string(length) + "); build it over the full global sequence");
    };
    check(q, q_length_, "query");
    check(k, k_length_, "key");
  }

  /// The recorded kind of grid cell (q_block, k_block).
  [[nodiscard]] block_kind cell(std::int64_t q_block, std::int64_t k_block) const {
    return (*kinds_)[static_cast<std::size_t>(q_block * k_blocks_ + k_block)];
  }
  [[nodiscard]] std::int64_t count(block_kind kind) const {
    return std::count(kinds_->begin(), kinds_->end(), kind);
  }
  [[nodiscard]] std::int64_t q_blocks() const noexcept { return q_blocks_; }
  [[nodiscard]] std::int64_t k_blocks() const noexcept { return k_blocks_; }
  [[nodiscard]] std::int64_t block_size() const noexcept { return block_; }
  [[nodiscard]] std::int64_t q_length() const noexcept { return q_length_; }
  [[nodiscard]] std::int64_t k_length() const noexcept { return k_length_; }
  [[nodiscard]] const MaskMod& mask_mod() const noexcept { return mod_; }

 private:
  MaskMod mod_;
  std::int64_t q_length_, k_length_, block_;
  std::int64_t q_blocks_ = 0, k_blocks_ = 0;
  std::shared_ptr<const std::vector<block_kind>> kinds_;
};

template <class F>
basic_block_mask(F, std::int64_t, std::int64_t) -> basic_block_mask<std::decay_t<F>>;
template <class F>
basic_block_mask(F, std::int64_t, std::int64_t, std::int64_t) -> basic_block_mask<std::decay_t<F>>;

/// A block mask over any predicate, type-erased: one type to store, pass and send as a side
/// input. Use basic_block_mask<F> when the per-element call in partial tiles must inline.
using block_mask = basic_block_mask<std::function<bool(std::int64_t, std::int64_t)>>;

}  // namespace baton
