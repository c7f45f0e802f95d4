// baton/cp/sharding.hpp — which global token positions each rank holds, and copying any
// tensor's sequence axis between the full order and a rank's shard.
//
// Attention masks in baton are functions of global positions, so sharding a sequence only
// changes which positions a rank holds; nothing about the mask is re-sharded. Everything the
// ring / Ulysses / hybrid code needs to know about the layout is in `sequence_sharding`.
#pragma once

#include <baton/core/hash.hpp>
#include <baton/core/sizes.hpp>
#include <baton/cp/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

namespace detail::cp {

// n items cut into `parts` runs as evenly as possible, the first n % parts one longer: the
// rule of every layout where the length does not divide (and of the layouts in
// balance/layouts.hpp).
constexpr std::int64_t even_run_count(std::int64_t n, std::int64_t parts, std::int64_t i) noexcept {
  return n / parts + (i < n % parts ? 1 : 0);
}
constexpr std::int64_t even_run_start(std::int64_t n, std::int64_t parts, std::int64_t i) noexcept {
  return i * (n / parts) + (i < n % parts ? i : n % parts);
}

}  // namespace detail::cp

/// How a sequence of S tokens is cut over R ranks. Any S >= 1 works with every layout: where
/// R (or 2R) does not divide S, the first shards hold one token more than the last, and a
/// shard may be empty (S < R). Nothing is padded; results equal the unsharded computation.
///  - contiguous: rank r holds one run of about S / R tokens, in order. Simple; unbalanced
///    under a causal mask (the last rank does R times the work of the first).
///  - zigzag: the sequence is cut into 2R chunks of about S / 2R; rank r holds chunks r and
///    2R-1-r, so under a causal mask every rank does the same work, and in a ring every step
///    after the first is about half a block.
///  - striped: rank r holds r, r+R, r+2R, ... (round robin). Balanced under a causal mask at
///    token granularity; the per-step work is close to (not exactly) half a block.
///  - custom: any partition of the positions, given as a list per rank (what
///    balanced_sharding in baton/cp/balance.hpp computes from a mask's cost).
enum class shard_layout { contiguous, zigzag, striped, custom };

constexpr std::string_view to_string(shard_layout layout) noexcept {
  switch (layout) {
    case shard_layout::contiguous: return "contiguous";
    case shard_layout::zigzag: return "zigzag";
    case shard_layout::striped: return "striped";
    case shard_layout::custom: return "custom";
  }
  return "unknown";
}

/// A run of a shard: local indices [local_offset, local_offset + count) hold the global
/// positions first, first + stride, ..., first + (count-1) stride.
struct shard_piece {
  std::int64_t local_offset = 0;
  std::int64_t first = 0;
  std::int64_t count = 0;
  std::int64_t stride = 1;

  constexpr std::int64_t position(std::int64_t i) const noexcept { return first + i * stride; }
  constexpr std::int64_t last() const noexcept { return first + (count - 1) * stride; }
  friend constexpr bool operator==(const shard_piece&, const shard_piece&) = default;
};

namespace detail::cp {

// The global positions of `pieces`, in local order.
inline std::vector<std::int64_t> positions_of(std::span<const shard_piece> pieces) {
  std::int64_t n = 0;
  for (const shard_piece& p : pieces) n += p.count;
  std::vector<std::int64_t> out;
  out.reserve(static_cast<std::size_t>(n));
  for (const shard_piece& p : pieces)
    for (std::int64_t i = 0; i < p.count; ++i) out.push_back(p.position(i));
  return out;
}

}  // namespace detail::cp

/// The layout of one sequence over `degree x inner_degree` ranks.
///
/// The layout (contiguous / zigzag / striped / custom) cuts the sequence over `degree`
/// groups; each group's shard, in its local order, is then split contiguously over
/// `inner_degree` consecutive ranks (the first ones taking one token more where the count does
/// not divide). Rank = group * inner_degree + inner_rank. For a pure ring or pure Ulysses,
/// inner_degree is 1 and degree is the world size. For hybrid attention (Ulysses inside, ring
/// outside), degree is the ring degree and inner_degree the Ulysses degree: the Ulysses
/// all-to-all re-assembles exactly the group's shard, which the ring then balances.
///
/// Shards may differ in length (by one token for contiguous and striped, by at most one chunk
/// token for zigzag; anything for custom): each rank passes tensors of local_len(rank)
/// tokens. The CP algorithms size their transfers by max_local_len() internally.
class sequence_sharding {
 public:
  /// Throws cp_error for a degree below 1, a length below 1, or layout == custom (which is
  /// built from its positions, by the constructor below).
  sequence_sharding(shard_layout layout, std::int64_t seq_len, int degree, int inner_degree = 1)
      : layout_(layout), seq_len_(seq_len), degree_(degree), inner_(inner_degree) {
    check_degrees(degree, inner_degree);
    if (seq_len < 1) {
      throw cp_error("sequence_sharding: sequence length " + std::to_string(seq_len) + " must be positive");
    }
    const std::int64_t r = degree;
    groups_.resize(static_cast<std::size_t>(degree));
    for (int g = 0; g < degree; ++g) {
      auto& pieces = groups_[static_cast<std::size_t>(g)];
      const auto add = [&](std::int64_t first, std::int64_t count, std::int64_t stride) {
        if (count <= 0) return;
        const std::int64_t offset = pieces.empty() ? 0 : pieces.back().local_offset + pieces.back().count;
        pieces.push_back(shard_piece{offset, first, count, stride});
      };
      switch (layout) {
        case shard_layout::contiguous: add(even_start(seq_len, r, g), even_count(seq_len, r, g), 1); break;
        case shard_layout::zigzag:
          add(even_start(seq_len, 2 * r, g), even_count(seq_len, 2 * r, g), 1);
          add(even_start(seq_len, 2 * r, 2 * r - 1 - g), even_count(seq_len, 2 * r, 2 * r - 1 - g), 1);
          break;
        case shard_layout::striped: add(g, g < seq_len ? (seq_len - g + r - 1) / r : 0, r); break;
        case shard_layout::custom:
          throw cp_error("sequence_sharding: a custom sharding is built from its positions: "
                         "sequence_sharding(std::vector<std::vector<std::int64_t>> positions_per_group, inner_degree), "
                         "or balanced_sharding(...).sharding()");
      }
    }
    finish();
  }

  /// A custom sharding: `positions_per_group[g]` lists the global positions group g holds,
  /// in its local order (any order; runs of consecutive positions make cheaper copies and
  /// fewer attention calls). Together they must hold every position of [0, S) exactly once,
  /// S being the total count. Each group's list is split over `inner_degree` ranks as for the
  /// other layouts. Throws cp_error naming a missing, repeated or negative position.
  explicit sequence_sharding(const std::vector<std::vector<std::int64_t>>& positions_per_group, int inner_degree = 1)
      : layout_(shard_layout::custom),
        seq_len_(0),
        degree_(static_cast<int>(positions_per_group.size())),
        inner_(inner_degree) {
    check_degrees(degree_, inner_degree);
    for (const auto& list : positions_per_group) seq_len_ += static_cast<std::int64_t>(list.size());
    if (seq_len_ < 1) throw cp_error("sequence_sharding: a custom sharding must hold at least one position");
    std::vector<int> owner(static_cast<std::size_t>(seq_len_), -1);
    groups_.resize(positions_per_group.size());
    for (int g = 0; g < degree_; ++g) {
      auto& pieces = groups_[static_cast<std::size_t>(g)];
      std::int64_t offset = 0;
      for (const std::int64_t pos : positions_per_group[static_cast<std::size_t>(g)]) {
        if (pos < 0 || pos >= seq_len_) {
          throw cp_error("sequence_sharding: group " + std::to_string(g) + " lists position " + std::to_string(pos) +
                         ", outside [0, " + std::to_string(seq_len_) +
                         ") (the groups hold that many positions in all); list every position of the sequence once");
        }
        int& who = owner[static_cast<std::size_t>(pos)];
        if (who >= 0) {
          throw cp_error("sequence_sharding: position " + std::to_string(pos) + " is listed by group " +
                         std::to_string(who) + " and again by group " + std::to_string(g) +
                         "; list every position of the sequence exactly once");
        }
        who = g;
        if (!pieces.empty() && pieces.back().first + pieces.back().count == pos)
          ++pieces.back().count;
        else
          pieces.push_back(shard_piece{offset, pos, 1, 1});
        ++offset;
      }
    }
    finish();
  }

  /// The smallest sequence length >= seq_len (and >= 1) that divides evenly for the layout:
  /// a multiple of degree x lcm(inner_degree, 2) for zigzag and of degree x inner_degree
  /// otherwise. No layout needs it any more (any length works); it remains for code that
  /// wants shards of equal length, e.g. for a fixed tensor shape on every rank.
  [[nodiscard]] static std::int64_t padded_length(shard_layout layout, std::int64_t seq_len, int degree,
                                                  int inner_degree = 1) {
    check_degrees(degree, inner_degree);
    const std::int64_t multiple =
        std::int64_t{degree} * std::lcm(std::int64_t{inner_degree}, std::int64_t{layout == shard_layout::zigzag ? 2 : 1});
    const std::int64_t n = std::max<std::int64_t>(seq_len, 1);
    return (n + multiple - 1) / multiple * multiple;
  }

  shard_layout layout() const noexcept { return layout_; }
  std::int64_t seq_len() const noexcept { return seq_len_; }
  int degree() const noexcept { return degree_; }
  int inner_degree() const noexcept { return inner_; }
  /// Number of ranks the sequence is spread over (degree x inner_degree).
  int ranks() const noexcept { return degree_ * inner_; }
  /// True when every rank holds the same number of tokens.
  bool is_even() const noexcept { return max_local_len() * ranks() == seq_len_; }

  /// Tokens rank holds.
  std::int64_t local_len(int rank) const {
    check_index(rank, ranks(), "rank");
    return inner_count(group_len(rank / inner_), rank % inner_);
  }
  /// The largest shard: what a transfer between ranks is sized by.
  std::int64_t max_local_len() const noexcept {
    std::int64_t m = 0;
    for (int g = 0; g < degree_; ++g) m = std::max(m, inner_count(group_len_unchecked(g), 0));
    return m;
  }
  /// Tokens per rank of an even sharding; throws cp_error when shards differ (use
  /// local_len(rank) then).
  std::int64_t local_len() const {
    if (!is_even()) {
      throw cp_error("sequence_sharding::local_len(): the " + std::string(to_string(layout_)) + " sharding of " +
                     std::to_string(seq_len_) + " tokens over " + std::to_string(ranks()) +
                     " ranks gives shards of different lengths; ask for one rank's, local_len(rank)");
    }
    return seq_len_ / ranks();
  }

  /// Tokens group holds (the shard a ring step moves in hybrid attention).
  std::int64_t group_len(int group) const {
    check_index(group, degree_, "group");
    return group_len_unchecked(group);
  }
  std::int64_t max_group_len() const noexcept {
    std::int64_t m = 0;
    for (int g = 0; g < degree_; ++g) m = std::max(m, group_len_unchecked(g));
    return m;
  }
  /// Tokens per group of a sharding whose groups are equal; throws cp_error otherwise.
  std::int64_t group_len() const {
    if (max_group_len() * degree_ != seq_len_) {
      throw cp_error("sequence_sharding::group_len(): the groups hold different numbers of tokens; ask for one "
                     "group's, group_len(group)");
    }
    return seq_len_ / degree_;
  }
  /// Where rank's tokens start within its group's shard (the inner ranks split it in order).
  std::int64_t offset_in_group(int rank) const {
    check_index(rank, ranks(), "rank");
    const std::int64_t len = group_len_unchecked(rank / inner_);
    std::int64_t offset = 0;
    for (int i = 0; i < rank % inner_; ++i) offset += inner_count(len, i);
    return offset;
  }

  /// The pieces of group g's shard (before the inner split), in local order.
  std::vector<shard_piece> group_pieces(int group) const {
    check_index(group, degree_, "group");
    return groups_[static_cast<std::size_t>(group)];
  }

  /// The pieces of rank's shard, in local order.
  std::vector<shard_piece> pieces(int rank) const {
    check_index(rank, ranks(), "rank");
    const std::int64_t begin = offset_in_group(rank);
    const std::int64_t end = begin + local_len(rank);
    std::vector<shard_piece> out;
    for (const shard_piece& p : groups_[static_cast<std::size_t>(rank / inner_)]) {
      const std::int64_t lo = std::max(begin, p.local_offset);
      const std::int64_t hi = std::min(end, p.local_offset + p.count);
      if (lo < hi) {
        out.push_back(shard_piece{lo - begin, p.position(lo - p.local_offset), hi - lo, p.stride});
      }
    }
    return out;
  }

  /// The global positions rank holds, in local order.
  std::vector<std::int64_t> global_positions(int rank) const { return detail::cp::positions_of(pieces(rank)); }

  /// The global positions group holds (the concatenation of its inner ranks' positions).
  std::vector<std::int64_t> group_positions(int group) const { return detail::cp::positions_of(group_pieces(group)); }

  /// A hash of the whole layout (every piece), for ranks to check they agree.
  std::int64_t fingerprint() const noexcept {
    detail::core::hasher h;
    h.add(static_cast<std::uint64_t>(layout_));
    h.add(static_cast<std::uint64_t>(seq_len_));
    h.add(static_cast<std::uint64_t>(degree_));
    h.add(static_cast<std::uint64_t>(inner_));
    for (const auto& g : groups_) {
      h.add(g.size());
      for (const shard_piece& p : g) {
        h.add(static_cast<std::uint64_t>(p.first));
        h.add(static_cast<std::uint64_t>(p.count));
        h.add(static_cast<std::uint64_t>(p.stride));
      }
    }
    return h.value();
  }

  friend bool operator==(const sequence_sharding&, const sequence_sharding&) = default;

 private:
  static void check_degrees(int degree, int inner_degree) {
    if (degree < 1 || inner_degree < 1) {
      throw cp_error("sequence_sharding: degree (" + std::to_string(degree) + ") and inner degree (" +
                     std::to_string(inner_degree) + ") must be at least 1");
    }
  }
  static void check_index(int i, int n, const char* what) {
    if (i < 0 || i >= n) {
      throw cp_error(std::string("sequence_sharding: ") + what + " " + std::to_string(i) + " is out of range [0, " +
                     std::to_string(n) + ")");
    }
  }
  static constexpr std::int64_t even_count(std::int64_t n, std::int64_t parts, std::int64_t i) noexcept {
    return detail::cp::even_run_count(n, parts, i);
  }
  static constexpr std::int64_t even_start(std::int64_t n, std::int64_t parts, std::int64_t i) noexcept {
    return detail::cp::even_run_start(n, parts, i);
  }
  std::int64_t inner_count(std::int64_t group_len, int inner_rank) const noexcept {
    return even_count(group_len, inner_, inner_rank);
  }
  std::int64_t group_len_unchecked(int group) const noexcept { return group_lens_[static_cast<std::size_t>(group)]; }
  void finish() {
    group_lens_.clear();
    for (const auto& g : groups_) {
      std::int64_t n = 0;
      for (const shard_piece& p : g) n += p.count;
      group_lens_.push_back(n);
    }
  }

  shard_layout layout_;
  std::int64_t seq_len_;
  int degree_;
  int inner_;
  std::vector<std::vector<shard_piece>> groups_;  // each group's pieces, in its local order
  std::vector<std::int64_t> group_lens_;
};

namespace detail::cp {

// Row-major tensor split around its sequence axis: outer x seq x inner elements.
struct seq_axis_split {
  std::int64_t outer = 1;
  std::int64_t seq = 1;
  std::int64_t inner = 1;
};

inline seq_axis_split split_at_seq_axis(std::span<const std::int64_t> shape, int seq_axis, const char* who) {
  if (seq_axis < 0 || seq_axis >= static_cast<int>(shape.size())) {
    throw cp_error(std::string(who) + ": sequence axis " + std::to_string(seq_axis) + " is out of range for a tensor of rank " +
                   std::to_string(shape.size()));
  }
  seq_axis_split s;
  for (int i = 0; i < static_cast<int>(shape.size()); ++i) {
    if (shape[static_cast<std::size_t>(i)] < 0) throw cp_error(std::string(who) + ": negative extent in shape");
    if (i < seq_axis) s.outer *= shape[static_cast<std::size_t>(i)];
    if (i > seq_axis) s.inner *= shape[static_cast<std::size_t>(i)];
  }
  s.seq = shape[static_cast<std::size_t>(seq_axis)];
  return s;
}

// Copies between a full tensor and one rank's shard. to_local: full -> local; else local -> full.
template <class T>
void copy_shard(const sequence_sharding& sharding, int rank, const seq_axis_split& full, T* full_data, T* local_data,
                bool to_local) {
  const std::int64_t local_len = sharding.local_len(rank);
  const auto pieces = sharding.pieces(rank);
  for (std::int64_t o = 0; o < full.outer; ++o) {
    T* f = full_data + o * full.seq * full.inner;
    T* l = local_data + o * local_len * full.inner;
    for (const shard_piece& p : pieces) {
      if (p.stride == 1) {  // a contiguous run is one block copy
        T* fp = f + p.first * full.inner;
        T* lp = l + p.local_offset * full.inner;
        const auto n = static_cast<std::size_t>(p.count * full.inner);
        if (to_local) std::copy_n(fp, n, lp); else std::copy_n(lp, n, fp);
        continue;
      }
      for (std::int64_t i = 0; i < p.count; ++i) {
        T* fp = f + p.position(i) * full.inner;
        T* lp = l + (p.local_offset + i) * full.inner;
        const auto n = static_cast<std::size_t>(full.inner);
        if (to_local) std::copy_n(fp, n, lp); else std::copy_n(lp, n, fp);
      }
    }
  }
}

template <class T>
seq_axis_split check_shard_args(const sequence_sharding& sharding, int rank, std::size_t full_size, std::size_t local_size,
                                std::span<const std::int64_t> full_shape, int seq_axis, const char* who) {
  const seq_axis_split s = split_at_seq_axis(full_shape, seq_axis, who);
  if (s.seq != sharding.seq_len()) {
    throw cp_error(std::string(who) + ": the full tensor's sequence axis " + std::to_string(seq_axis) + " of shape " +
                   core::shape_text(full_shape) + " has " + std::to_string(s.seq) + " tokens, but the sharding is of " +
                   std::to_string(sharding.seq_len()) + " tokens");
  }
  const std::int64_t full_elems = s.outer * s.seq * s.inner;
  const std::int64_t local_elems = s.outer * sharding.local_len(rank) * s.inner;
  if (static_cast<std::int64_t>(full_size) != full_elems) {
    throw cp_error(std::string(who) + ": the full tensor holds " + std::to_string(full_size) +
                   " elements but its shape " + core::shape_text(full_shape) + " needs " + std::to_string(full_elems));
  }
  if (static_cast<std::int64_t>(local_size) != local_elems) {
    throw cp_error(std::string(who) + ": the shard holds " + std::to_string(local_size) + " elements but needs " +
                   std::to_string(local_elems) + " (the full shape with " + std::to_string(sharding.local_len(rank)) +
                   " tokens on axis " + std::to_string(seq_axis) + ")");
  }
  return s;
}

}  // namespace detail::cp

/// Copies rank's shard of a full row-major tensor (any rank, sequence on `seq_axis`) into
/// `local` (the same shape with local_len(rank) tokens on that axis), in the shard's local order.
template <class T>
void shard_sequence(const sequence_sharding& sharding, int rank, std::span<const T> full,
                    std::span<const std::int64_t> full_shape, int seq_axis, std::span<T> local) {
  const auto s = detail::cp::check_shard_args<T>(sharding, rank, full.size(), local.size(), full_shape, seq_axis,
                                                 "shard_sequence");
  detail::cp::copy_shard(sharding, rank, s, const_cast<T*>(full.data()), local.data(), true);
}

/// As above, returning the shard.
template <class T>
std::vector<T> shard_sequence(const sequence_sharding& sharding, int rank, std::span<const T> full,
                              std::span<const std::int64_t> full_shape, int seq_axis) {
  const auto s = detail::cp::split_at_seq_axis(full_shape, seq_axis, "shard_sequence");
  std::vector<T> local(static_cast<std::size_t>(s.outer * sharding.local_len(rank) * s.inner));
  shard_sequence<T>(sharding, rank, full, full_shape, seq_axis, std::span<T>(local));
  return local;
}

/// Writes rank's shard `local` back into its global positions of the full tensor `full`
/// (positions other ranks hold are left untouched, so calling it for every rank re-assembles
/// the full tensor).
template <class T>
void unshard_sequence(const sequence_sharding& sharding, int rank, std::span<const T> local,
                      std::span<const std::int64_t> full_shape, int seq_axis, std::span<T> full) {
  const auto s = detail::cp::check_shard_args<T>(sharding, rank, full.size(), local.size(), full_shape, seq_axis,
                                                 "unshard_sequence");
  detail::cp::copy_shard(sharding, rank, s, full.data(), const_cast<T*>(local.data()), false);
}

/// A copy of the row-major tensor `full` (shape `full_shape`, sequence on `seq_axis`) with its
/// sequence axis extended to `padded_len` tokens, the new positions filled with `fill`:
/// padding for a length a sharding refuses (sequence_sharding::padded_length says how long).
/// Attend the padded sequence with padding_mask(mask, real length), which hides the padding,
/// and the results on the real tokens equal those of the unpadded sequence; unpad_sequence
/// drops the padding again.
template <class T>
std::vector<T> pad_sequence(std::span<const T> full, std::span<const std::int64_t> full_shape, int seq_axis,
                            std::int64_t padded_len, T fill = T{}) {
  const auto s = detail::cp::split_at_seq_axis(full_shape, seq_axis, "pad_sequence");
  if (static_cast<std::int64_t>(full.size()) != s.outer * s.seq * s.inner) {
    throw cp_error("pad_sequence: the tensor holds " + std::to_string(full.size()) + " elements but its shape " +
                   detail::core::shape_text(full_shape) + " needs " + std::to_string(s.outer * s.seq * s.inner));
  }
  if (padded_len < s.seq) {
    throw cp_error("pad_sequence: padded length " + std::to_string(padded_len) + " is shorter than the sequence (" +
                   std::to_string(s.seq) + " tokens on axis " + std::to_string(seq_axis) +
                   "); pass a length >= the sequence length, e.g. sequence_sharding::padded_length(...)");
  }
  std::vector<T> out(static_cast<std::size_t>(s.outer * padded_len * s.inner), fill);
  for (std::int64_t o = 0; o < s.outer; ++o)
    std::copy_n(full.data() + o * s.seq * s.inner, static_cast<std::size_t>(s.seq * s.inner),
                out.data() + o * padded_len * s.inner);
  return out;
}

/// The first `real_len` tokens of the padded row-major tensor `padded` (shape `padded_shape`,
/// sequence on `seq_axis`): undoes pad_sequence.
template <class T>
std::vector<T> unpad_sequence(std::span<const T> padded, std::span<const std::int64_t> padded_shape, int seq_axis,
                              std::int64_t real_len) {
  const auto s = detail::cp::split_at_seq_axis(padded_shape, seq_axis, "unpad_sequence");
  if (static_cast<std::int64_t>(padded.size()) != s.outer * s.seq * s.inner) {
    throw cp_error("unpad_sequence: the tensor holds " + std::to_string(padded.size()) + " elements but its shape " +
                   detail::core::shape_text(padded_shape) + " needs " + std::to_string(s.outer * s.seq * s.inner));
  }
  if (real_len < 0 || real_len > s.seq) {
    throw cp_error("unpad_sequence: real length " + std::to_string(real_len) + " is outside [0, " +
                   std::to_string(s.seq) + "], the padded sequence axis " + std::to_string(seq_axis) + " of shape " +
                   detail::core::shape_text(padded_shape));
  }
  std::vector<T> out(static_cast<std::size_t>(s.outer * real_len * s.inner));
  for (std::int64_t o = 0; o < s.outer; ++o)
    std::copy_n(padded.data() + o * s.seq * s.inner, static_cast<std::size_t>(real_len * s.inner),
                out.data() + o * real_len * s.inner);
  return out;
}

}  // namespace baton
