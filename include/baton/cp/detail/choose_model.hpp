// baton/cp/detail/choose_model.hpp — the work and the bytes of one CP split, counted the way
// the ring and Ulysses code spends them: the ring's block calls per (rank, step), planned and
// trimmed by the same functions the ring runs (plan_step, trim_call), then cut into the CPU
// flash backend's 64 x 64 tiles from each call's corner and classified by the mask.
#pragma once

#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/attention/tiles.hpp>
#include <baton/cp/detail/ring_core.hpp>
#include <baton/cp/detail/ring_plan.hpp>
#include <baton/cp/detail/ulysses_layout.hpp>
#include <baton/cp/detail/views.hpp>
#include <baton/cp/sharding.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace baton::detail::cp {

// Tiles of one (rank, step) or one call by class, weighted by their area (an edge tile of
// 32 x 64 counts 0.5, so a shard that 64 does not divide costs what its elements cost), the
// call's 64-row panels (per query head: each is set up, walked and finished whatever its
// tiles, while empty tiles are skipped) and its 64-key column panels (per kv head: the key
// block's packing and its dK/dV rows, shared by the query heads of a GQA group). A call costs
// its non-empty tiles plus its panels. A partial tile costs a fixed part (its pairs are tested)
// plus the part of it the kernel computes — each 4-row group's span of key columns from its
// first allowed key to its last, rounded out to whole vectors (flash_tile_coverage) — counted in
// `partial_area` in full tiles: the diagonal tile of a causal mask computes 0.625 of a tile with
// 16-float vectors, a document mask's partial tiles anywhere from one vector's width to all of it.
struct tile_count {
  double full = 0, partial = 0, partial_area = 0, panels = 0, columns = 0;
  std::int64_t calls = 0;
  tile_count& operator+=(const tile_count& o) {
    full += o.full;
    partial += o.partial;
    partial_area += o.partial_area;
    panels += o.panels;
    columns += o.columns;
    calls += o.calls;
    return *this;
  }
};

template <class Mask>
tile_count count_call_tiles(const Mask& mask, const positions& qpos, const positions& kpos, std::int64_t nq,
                            std::int64_t nk) {
  tile_count t;
  t.calls = 1;
  const std::int64_t tile = trim_tile;
  static_assert(trim_tile == flash_tile_size, "the model cuts calls into the flash kernels' tiles");
  flash_tile_coverage coverage;
  std::vector<position_block> kb;
  for (std::int64_t j = 0; j < nk; j += tile) {
    kb.emplace_back(kpos, j, std::min(tile, nk - j));
    t.columns += static_cast<double>(std::min(tile, nk - j)) / static_cast<double>(tile);
  }
  for (std::int64_t i = 0; i < nq; i += tile) {
    const std::int64_t rows = std::min(tile, nq - i);
    const position_block qb(qpos, i, rows);
    t.panels += static_cast<double>(rows) / static_cast<double>(tile);
    for (const position_block& k : kb) {
      const double area = static_cast<double>(rows * k.size()) / static_cast<double>(tile * tile);
      switch (mask.classify(qb, k)) {
        case block_kind::full: t.full += area; break;
        case block_kind::partial:
          t.partial += area;
          t.partial_area += coverage.of(mask, qb, k);
          break;
        case block_kind::empty: break;
      }
    }
  }
  return t;
}

// Calls f(call, params, q_store, k_store) for each backend call rank `me` of a ring over
// `groups` makes at ring step `step`: the step's planned calls, each trimmed as the ring trims
// it. params' positions may point into the stores (a moved vector keeps its elements).
template <class Mask, class F>
void for_each_ring_call(const Mask& mask, const std::vector<std::vector<shard_piece>>& groups, int me, int step, F&& f) {
  const ring_schedule schedule{static_cast<int>(groups.size())};
  const auto& q = groups[static_cast<std::size_t>(me)];
  const auto& k = groups[static_cast<std::size_t>(schedule.kv_owner(me, step))];
  for (block_call c : plan_step(mask, std::span<const shard_piece>(q), std::span<const shard_piece>(k))) {
    std::vector<std::int64_t> q_store, k_store;
    attention_params params = call_params(q, k, c, 0.0, q_store, k_store);
    if (!trim_call(mask, c, params, trim_tile)) continue;
    f(c, params, q_store, k_store);
  }
}

// The tiles rank `me` of a ring over `groups` computes at ring step `step` (one head, one batch
// entry).
template <class Mask>
tile_count ring_step_tiles(const Mask& mask, const std::vector<std::vector<shard_piece>>& groups, int me, int step) {
  tile_count total;
  for_each_ring_call(mask, groups, me, step, [&](const block_call& c, const attention_params& params, auto&, auto&) {
    total += count_call_tiles(mask, params.q_pos, params.k_pos, c.q_count, c.k_count);
  });
  return total;
}

// The positions of Ulysses' one call over the whole sequence: every rank's, in rank order.
inline std::vector<std::int64_t> ulysses_call_positions(shard_layout layout, std::int64_t seq_len, int ranks) {
  const sequence_sharding sh(layout, seq_len, ranks);
  std::vector<std::int64_t> all;
  for (int r = 0; r < ranks; ++r) {
    const auto mine = sh.global_positions(r);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  return all;
}

// The ring steps some group needs (as active_ring_steps decides for the ring itself).
template <class Mask>
std::vector<int> needed_steps(const Mask& mask, const std::vector<std::vector<shard_piece>>& groups) {
  ring_geometry g;
  g.pieces = groups;
  return active_ring_steps(mask, g);
}

}  // namespace baton::detail::cp
