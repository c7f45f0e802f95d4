// baton/cp/detail/ring_plan.hpp — the ring's bookkeeping: which rank's K/V block a rank holds
// at each step, how far what it holds is from its owner, and which (query piece, key piece)
// rectangles of a step are worth computing under a mask, and how far each can be trimmed.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/cp/sharding.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace baton::detail::cp {

// K/V blocks travel forward around the ring: rank r sends what it holds towards r+1 and
// receives from r-1, so at step s rank r holds the block rank (r - s) mod R owns. Steps no
// rank needs are skipped (active_ring_steps, ring_core.hpp): the block then jumps from one
// active step to the next in one shift of their difference.
struct ring_schedule {
  int ranks = 1;

  constexpr int steps() const noexcept { return ranks; }
  constexpr int kv_owner(int rank, int step) const noexcept { return ((rank - step) % ranks + ranks) % ranks; }
  // The hops forward that take what a rank holds at `step` back to its owner: the backward's
  // dK/dV accumulator travels with its block and makes this shift after the last active step
  // (none when that block is the rank's own).
  constexpr int hops_to_owner(int step) const noexcept { return (ranks - step) % ranks; }
};

// Whether the backward's dK/dV accumulators start travelling only at the second of the
// active steps: when a rank's own block is held first and others follow, the owner keeps its
// own part at home (ring_backward; cp::choose counts the same hops).
inline bool own_grad_stays_home(std::span<const int> active_steps) noexcept {
  return active_steps.size() > 1 && active_steps.front() == 0;
}

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

// True when pieces [begin, end) hold one contiguous run of global positions.
inline bool is_contiguous_range(std::span<const shard_piece> pieces, std::size_t begin, std::size_t end) {
  std::int64_t next = pieces[begin].first;
  for (std::size_t p = begin; p < end; ++p) {
    if (pieces[p].first != next || (pieces[p].count > 1 && pieces[p].stride != 1)) return false;
    next = pieces[p].first + pieces[p].count;
  }
  return true;
}

// Calls are trimmed in whole tiles of this many rows and keys, counted from the call's first
// row and key: the CPU flash backends' tiles (64 x 64). A trimmed call's tiles then hold the
// rows and keys the untrimmed call's tiles held, so the backend does the same arithmetic on
// them and the results keep their bits.
inline constexpr std::int64_t trim_tile = 64;

// Positions [offset, offset + count) of `p` (a sized range or list).
inline positions sub_positions(const positions& p, std::int64_t offset, std::int64_t count) {
  return p.is_range() ? positions(p.range_begin() + offset, count)
                      : positions(p.indices().subspan(static_cast<std::size_t>(offset), static_cast<std::size_t>(count)));
}

// Narrows call c (and its positions in params) to the tiles of `tile` rows x `tile` keys from
// its corner that bound every tile the mask leaves non-empty; false when there is none. The
// piece planner decides per (query piece, key piece); under a document mask a call's
// rectangle then still holds whole row and key panels that meet only empty tiles — the
// backend skips their compute but would pack those keys (and, in the backward, those
// queries) and walk those rows. A row cut off gets nothing from this block, exactly as the
// backend would have given it (forward: out 0, lse -inf, which merges as a no-op; backward:
// zero dq), and a key cut off gets zero dK/dV. tile <= 0: no trimming.
template <class Mask>
bool trim_call(const Mask& mask, block_call& c, attention_params& params, std::int64_t tile) {
  if (tile <= 0 || (c.q_count <= tile && c.k_count <= tile)) return true;
  const positions qpos = params.q_pos, kpos = params.k_pos;
  const std::int64_t nq = (c.q_count + tile - 1) / tile, nk = (c.k_count + tile - 1) / tile;
  std::vector<position_block> kb(static_cast<std::size_t>(nk));
  for (std::int64_t j = 0; j < nk; ++j)
    kb[static_cast<std::size_t>(j)] = position_block(kpos, j * tile, std::min(tile, c.k_count - j * tile));
  std::int64_t q_lo = nq, q_hi = 0, k_lo = nk, k_hi = 0;  // tiles [lo, hi)
  for (std::int64_t i = 0; i < nq; ++i) {
    const position_block qb(qpos, i * tile, std::min(tile, c.q_count - i * tile));
    for (std::int64_t j = 0; j < nk; ++j) {
      if (mask.classify(qb, kb[static_cast<std::size_t>(j)]) == block_kind::empty) continue;
      q_lo = std::min(q_lo, i);
      q_hi = i + 1;
      k_lo = std::min(k_lo, j);
      k_hi = std::max(k_hi, j + 1);
    }
  }
  if (q_hi == 0) return false;
  const std::int64_t q0 = q_lo * tile, q1 = std::min(q_hi * tile, c.q_count);
  const std::int64_t k0 = k_lo * tile, k1 = std::min(k_hi * tile, c.k_count);
  params.q_pos = sub_positions(qpos, q0, q1 - q0);
  params.k_pos = sub_positions(kpos, k0, k1 - k0);
  c.q_offset += q0;
  c.q_count = q1 - q0;
  c.k_offset += k0;
  c.k_count = k1 - k0;
  return true;
}

}  // namespace baton::detail::cp
