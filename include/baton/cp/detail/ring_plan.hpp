// baton/cp/detail/ring_plan.hpp — the ring's bookkeeping: which rank's K/V block a rank holds
// at each step, how many hops each tensor makes, and which (query piece, key piece)
// rectangles of a step are worth computing under a mask.
#pragma once

#include <baton/cp/sharding.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace baton::detail::cp {

// K/V blocks travel forward around the ring: at each step rank r sends what it holds to r+1
// and receives from r-1. So at step s rank r holds the block rank (r - s) mod R owns.
struct ring_schedule {
  int ranks = 1;

  constexpr int steps() const noexcept { return ranks; }
  constexpr int kv_owner(int rank, int step) const noexcept { return ((rank - step) % ranks + ranks) % ranks; }
  // Forward and backward each move K/V R-1 times: the block held at the last step is not sent on.
  constexpr int kv_hops() const noexcept { return ranks - 1; }
  // The dK/dV accumulator of a block travels with it (R-1 hops) and then makes one more hop:
  // after the last step rank r holds the block of (r + 1) mod R, its next neighbour, so one
  // shift by +1 returns every accumulator to its owner.
  constexpr int grad_hops() const noexcept { return ranks; }
  constexpr int holder_after_last_step(int owner) const noexcept { return (owner + ranks - 1) % ranks; }
};

// One backend call of a ring step: local query rows [q_offset, q_offset + q_count) against
// local key rows [k_offset, k_offset + k_count) of the block held; the pieces they cover.
struct block_call {
  std::int64_t q_offset = 0;
  std::int64_t q_count = 0;
  std::int64_t k_offset = 0;
  std::int64_t k_count = 0;
  std::size_t q_piece_begin = 0, q_piece_end = 0;
  std::size_t k_piece_begin = 0, k_piece_end = 0;
};

// Splits a step's (queries x keys) rectangle into the backend calls that cover every
// non-empty (query piece, key piece) pair and nothing else that can be avoided. Consecutive
// query pieces needing the same key pieces share a call; each run of consecutive needed key
// pieces is one call. `non_empty(q_piece, k_piece)` is the mask's block classifier on
// global positions. For zigzag under a causal mask this turns every step after the first
// into exactly half a block: queries (2 chunks) x one key chunk, or one query chunk x keys.
template <class NonEmpty>
std::vector<block_call> plan_block_calls(std::span<const shard_piece> q, std::span<const shard_piece> k,
                                         NonEmpty&& non_empty) {
  std::vector<std::vector<bool>> need(q.size(), std::vector<bool>(k.size(), false));
  for (std::size_t i = 0; i < q.size(); ++i) {
    for (std::size_t j = 0; j < k.size(); ++j) need[i][j] = non_empty(q[i], k[j]);
  }
  std::vector<block_call> calls;
  std::size_t i = 0;
  while (i < q.size()) {
    std::size_t i_end = i + 1;
    while (i_end < q.size() && need[i_end] == need[i] &&
           q[i_end].local_offset == q[i_end - 1].local_offset + q[i_end - 1].count) {
      ++i_end;
    }
    std::size_t j = 0;
    while (j < k.size()) {
      if (!need[i][j]) { ++j; continue; }
      std::size_t j_end = j + 1;
      while (j_end < k.size() && need[i][j_end] &&
             k[j_end].local_offset == k[j_end - 1].local_offset + k[j_end - 1].count) {
        ++j_end;
      }
      block_call c;
      c.q_offset = q[i].local_offset;
      c.q_count = q[i_end - 1].local_offset + q[i_end - 1].count - c.q_offset;
      c.k_offset = k[j].local_offset;
      c.k_count = k[j_end - 1].local_offset + k[j_end - 1].count - c.k_offset;
      c.q_piece_begin = i;
      c.q_piece_end = i_end;
      c.k_piece_begin = j;
      c.k_piece_end = j_end;
      calls.push_back(c);
      j = j_end;
    }
    i = i_end;
  }
  return calls;
}

// Global positions of the pieces [begin, end), in local order.
inline std::vector<std::int64_t> positions_of(std::span<const shard_piece> pieces, std::size_t begin, std::size_t end) {
  std::vector<std::int64_t> out;
  for (std::size_t p = begin; p < end; ++p) {
    for (std::int64_t i = 0; i < pieces[p].count; ++i) out.push_back(pieces[p].position(i));
  }
  return out;
}

// True when pieces [begin, end) hold one contiguous run of global positions.
inline bool is_contiguous_range(std::span<const shard_piece> pieces, std::size_t begin, std::size_t end) {
  std::int64_t next = pieces[begin].first;
  for (std::size_t p = begin; p < end; ++p) {
    if (pieces[p].first != next || (pieces[p].count > 1 && pieces[p].stride != 1)) return false;
    next = pieces[p].first + pieces[p].count;
  }
  return true;
}

}  // namespace baton::detail::cp
