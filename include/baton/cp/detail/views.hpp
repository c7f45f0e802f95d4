// baton/cp/detail/views.hpp — small tensor_view helpers the CP layer shares: the shape
// checks every entry point runs
// (as messages, not throws: see agree.hpp), and positions of shard pieces.
#pragma once

#include <baton/attention/positions.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/cp/detail/ring_plan.hpp>
#include <baton/cp/detail/ulysses_layout.hpp>
#include <baton/cp/sharding.hpp>

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace baton::detail::cp {

// The shape of one rank's attention problem, read from q and k.
// seq: the query shard's tokens; seq_kv: the key/value shard's (equal in self-attention).
struct local_shape {
  std::int64_t batch = 0, seq = 0, heads_q = 0, heads_kv = 0, dim = 0, seq_kv = 0;
};

template <class TQ, class TK>
local_shape shape_of(const tensor_view<TQ, 4>& q, const tensor_view<TK, 4>& k) noexcept {
  return {q.extent(0), q.extent(1), q.extent(2), k.extent(2), q.extent(3), k.extent(1)};
}

// Empty when q, k, v (and the other tensors, when given) describe one problem; else a
// message naming the tensor and the shape it should have.
template <class TA, std::size_t N>
std::string expect(const tensor_view<TA, N>& t, const char* name, const std::array<std::int64_t, N>& want) {
  if (t.extents() != want) {
    return std::string("tensor '") + name + "' has shape " + core::shape_text(t.extents()) + " but expected " + core::shape_text(want);
  }
  if (t.data == nullptr && t.size() > 0) return std::string("tensor '") + name + "' has a null data pointer";
  return {};
}

inline std::string check_local(const local_shape& s, std::int64_t expected_seq, std::int64_t expected_seq_kv,
                               bool cross) {
  if (s.batch < 1 || s.seq < 0 || s.heads_q < 1 || s.heads_kv < 1 || s.dim < 1) {
    return "q must be [batch, seq, heads_q, dim] and k [batch, seq, heads_kv, dim] with batch, heads and dim >= 1";
  }
  if (s.heads_q % s.heads_kv != 0) {
    return "q has " + std::to_string(s.heads_q) + " heads and k/v " + std::to_string(s.heads_kv) +
           "; the query heads must be a multiple of the key/value heads (GQA/MQA)";
  }
  if (s.seq != expected_seq) {
    return std::string(cross ? "the local query shard" : "the local shard") + " holds " + std::to_string(s.seq) +
           " tokens but the " + (cross ? "query " : "") + "sequence_sharding gives this rank " +
           std::to_string(expected_seq) + " (sequence_sharding::local_len(rank) for this rank)";
  }
  if (cross && s.seq_kv != expected_seq_kv) {
    return "the local key/value shard holds " + std::to_string(s.seq_kv) +
           " tokens but the key/value sharding gives this rank " + std::to_string(expected_seq_kv) +
           " (kv_sharding::sharding.local_len(rank) for this rank)";
  }
  return {};
}

// `pieces` with `offset` added to their global positions (a cross-attention's keys, as the
// mask sees them).
inline std::vector<shard_piece> offset_pieces(std::vector<shard_piece> pieces, std::int64_t offset) {
  for (shard_piece& p : pieces) p.first += offset;
  return pieces;
}

// Positions of the pieces [begin, end) as a baton::positions: a range when they are one
// contiguous run, else a list backed by `storage` (which must outlive the positions).
inline positions positions_for(std::span<const shard_piece> pieces, std::size_t begin, std::size_t end,
                               std::vector<std::int64_t>& storage) {
  if (is_contiguous_range(pieces, begin, end)) {
    std::int64_t n = 0;
    for (std::size_t p = begin; p < end; ++p) n += pieces[p].count;
    return positions(pieces[begin].first, n);
  }
  storage = positions_of(pieces.subspan(begin, end - begin));
  return positions(std::span<const std::int64_t>(storage));
}

// Validates the mask against every global position once, up front, so that a mask that
// cannot describe the sequence fails on every rank before any data moves.
// Cross-attention: the queries' positions [0, seq_len), the keys' [k_begin, k_begin + k_len).
template <class Mask>
std::string check_mask(const Mask& mask, std::int64_t seq_len, std::int64_t k_begin, std::int64_t k_len) {
  const positions qs(0, seq_len), ks(k_begin, k_len);
  if constexpr (requires { mask.validate(qs, ks); }) {
    try {
      mask.validate(qs, ks);
    } catch (const std::exception& e) {
      return std::string("the mask does not cover the sequence: ") + e.what();
    }
  }
  return {};
}
template <class Mask>
std::string check_mask(const Mask& mask, std::int64_t seq_len) {
  return check_mask(mask, seq_len, 0, seq_len);
}

}  // namespace baton::detail::cp
