// baton/cp/balance.hpp — which blocks of a sequence each context-parallel rank should hold so
// that every rank does the same attention work under any mask: packed documents of uneven
// lengths, sliding windows, prefix-LM, several masks per model — with a stated bound.
//
// Zigzag balances a causal mask over a sequence 2R divides; it does not balance a packed
// sequence's causal documents, a window, or a model whose layers use different masks. Here
// the work is measured the way the kernels spend it (per tile, from the mask's classify),
// and the blocks are dealt to ranks by a cardinality-constrained LPT with local improvement.
// See docs/context-parallel.md, "Balancing any mask", for the guarantee.
//
// The pieces: the cost model (balance/cost.hpp: block_costs, sharding_costs, attention_cost),
// the layouts compared with (balance/layouts.hpp: zigzag_positions, contiguous_positions,
// per_document_zigzag_positions), the search (detail/balance_search.hpp), and the pass that
// also balances the ring's walks of each row (detail/balance_ring.hpp, ring_row_step).
#pragma once

#include <baton/cp/balance/cost.hpp>
#include <baton/cp/balance/layouts.hpp>
#include <baton/cp/detail/balance_ring.hpp>
#include <baton/cp/detail/balance_search.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/sharding.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace baton {

/// Options of balanced_sharding.
struct balance_options {
  block_cost_weights weights{};
  /// Run the local-improvement pass (swaps and moves between the most loaded rank and the
  /// others) after the greedy assignment. It never makes the most loaded rank heavier.
  bool improve = true;
  /// Then swap blocks of exactly equal cost between ranks while that joins runs of
  /// consecutive blocks on one rank: every rank's cost stays the same, and fewer, longer runs
  /// mean fewer copies when shards are gathered and longer tiles for the kernels.
  bool contiguous_ties = true;
  /// What one query row costs each ring step that computes it, in units of one allowed
  /// (query, key) pair of a full tile (`weights.full`); 0 (the default) balances the tiles
  /// alone. A ring (or hybrid) walks a query block once in every step whose K/V block holds
  /// keys it needs, and that walk costs the same whatever its tiles hold: the call's row
  /// panels, the packing of the keys they meet, the merge of its result. With a value > 0 a
  /// last pass swaps blocks between ranks while that lowers the most loaded rank's
  /// `ring_cost_per_rank`; it may trade tile balance for it, so `ratio` (the tiles alone) may
  /// then exceed `guaranteed_ratio`, which bounds the assignment before that pass. 128 suits
  /// the CPU flash backend (bench_cp, packed documents on 2 ranks: the ring's time about 5 %
  /// lower than with 0; docs/context-parallel.md). With several masks a block's walks are
  /// those of the union of their needs, times the summed layer count. Needs the masks:
  /// refused by balanced_sharding_from_costs.
  double ring_row_step = 0.0;
};

/// What balanced_sharding returns. `positions[r]` holds rank r's global token positions in
/// ascending order, whole blocks of `block` tokens (the last block of the sequence may be
/// shorter); over all ranks they are every position of [0, seq_len) exactly once, and the
/// ranks' block counts differ by at most one (a rank may hold none when ranks exceed blocks).
struct balanced_sharding_result {
  std::int64_t seq_len = 0;
  std::int64_t block = 0;
  std::vector<std::vector<std::int64_t>> positions;
  /// The block indices (block b = positions [b*block, min((b+1)*block, seq_len))) per rank, ascending.
  std::vector<std::vector<std::int64_t>> blocks;
  std::vector<double> cost_per_rank;
  double total_cost = 0;
  /// max(cost_per_rank) / (total_cost / ranks); 1 is a perfect split (and the value when the
  /// mask allows nothing at all). Tiles only: see ring_ratio for balance_options::ring_row_step.
  double ratio = 1;
  /// What the guarantee promises for this instance: ratio <= guaranteed_ratio
  /// = 1 + (1 - 1/R) * spread / (total_cost / R), where spread is computed from the sorted
  /// block costs before any assignment (see docs/context-parallel.md, "Balancing any mask").
  double guaranteed_ratio = 1;
  /// The same ratio for zigzag (2R chunks cut as evenly as possible at token granularity, rank
  /// r holding chunks r and 2R-1-r) and for contiguous (R even chunks), costed by the same
  /// tile model. From a bare cost vector (no mask) their chunk edges are rounded to blocks.
  double zigzag_ratio = 1;
  double contiguous_ratio = 1;
  /// Per rank: cost_per_rank plus, for each of its blocks, ring_row_step x its rows (in
  /// block x block units, times the masks' summed layer count) x the number of ranks holding
  /// keys it needs — the ring steps that walk it. Equal to cost_per_rank when ring_row_step
  /// is 0.
  std::vector<double> ring_cost_per_rank;
  /// max(ring_cost_per_rank) / their mean.
  double ring_ratio = 1;

  /// The sharding the CP attention classes take: group g holds positions[g], split over
  /// `inner_degree` Ulysses ranks in hybrid attention.
  [[nodiscard]] sequence_sharding sharding(int inner_degree = 1) const { return sequence_sharding(positions, inner_degree); }
};

namespace detail::cp::balance {

// out.positions from out.blocks (each rank's blocks sorted first).
inline void positions_from_blocks(balanced_sharding_result& out) {
  out.positions.assign(out.blocks.size(), {});
  for (std::size_t r = 0; r < out.blocks.size(); ++r) {
    std::sort(out.blocks[r].begin(), out.blocks[r].end());
    for (const std::int64_t b : out.blocks[r])
      append_range(out.positions[r], b * out.block, std::min(out.seq_len, (b + 1) * out.block));
  }
}

[[nodiscard]] inline balanced_sharding_result balance_from_costs(std::span<const double> costs, std::int64_t seq_len,
                                                                 int ranks, std::int64_t block, bool improve_pass,
                                                                 bool contiguous_ties) {
  balanced_sharding_result out;
  out.seq_len = seq_len;
  out.block = block;
  assignment best = layered_lpt(costs, ranks);
  if (improve_pass) improve(best, costs);
  assignment other = capped_lpt(costs, ranks);
  if (improve_pass) improve(other, costs);
  if (max_load(other) < max_load(best)) best = std::move(other);
  if (contiguous_ties) join_equal_cost_runs(best, costs);
  out.blocks = std::move(best.blocks);
  positions_from_blocks(out);
  // Summed afresh in ascending block order: the reported costs do not depend on the order of
  // the incremental updates above.
  out.cost_per_rank = costs_of_blocks(out.positions, costs, block);
  out.total_cost = std::accumulate(costs.begin(), costs.end(), 0.0);
  out.ratio = ratio_of(out.cost_per_rank);
  const double average = out.total_cost / static_cast<double>(ranks);
  out.guaranteed_ratio = average > 0.0 ? 1.0 + (1.0 - 1.0 / static_cast<double>(ranks)) * layered_spread(costs, ranks) / average
                                       : 1.0;
  return out;
}

// Which query blocks need each key block (a tile under some mask with layers > 0 that is not
// classified empty), and what one ring step's walk of each block costs in block x block
// units: ring_row_step x its rows / block^2.
[[nodiscard]] inline block_needs needs_of(std::span<const attention_cost> masks, std::int64_t seq_len,
                                          std::int64_t block) {
  const std::int64_t n = block_count(seq_len, block);
  const positions all(0, seq_len);
  std::vector<position_block> tiles;
  for (std::int64_t b = 0; b < n; ++b) tiles.emplace_back(all, b * block, std::min(block, seq_len - b * block));
  block_needs needs;
  needs.needers.resize(static_cast<std::size_t>(n));
  for (std::int64_t k = 0; k < n; ++k)
    for (std::int64_t q = 0; q < n; ++q)
      for (const attention_cost& m : masks)
        if (m.layers() > 0.0 &&
            m.classify(tiles[static_cast<std::size_t>(q)], tiles[static_cast<std::size_t>(k)]) != block_kind::empty) {
          needs.needers[static_cast<std::size_t>(k)].push_back(q);
          break;
        }
  return needs;
}

[[nodiscard]] inline std::vector<double> step_costs_of(std::int64_t seq_len, std::int64_t block, double ring_row_step) {
  std::vector<double> out(static_cast<std::size_t>(block_count(seq_len, block)));
  const double whole = static_cast<double>(block) * static_cast<double>(block);
  for (std::size_t b = 0; b < out.size(); ++b) {
    const std::int64_t rows = std::min(block, seq_len - static_cast<std::int64_t>(b) * block);
    out[b] = ring_row_step * static_cast<double>(rows) / whole;
  }
  return out;
}

// The ring refinement (balance_options::ring_row_step > 0) and the ring costs of the result.
inline void account_for_ring(balanced_sharding_result& out, std::span<const attention_cost> masks,
                             std::span<const double> costs, int ranks, double ring_row_step) {
  const std::int64_t n = static_cast<std::int64_t>(costs.size());
  if (ring_row_step <= 0.0 || ranks == 1) {
    out.ring_cost_per_rank = out.cost_per_rank;
    out.ring_ratio = out.ratio;
    return;
  }
  const block_needs needs = needs_of(masks, out.seq_len, out.block);
  const std::vector<double> steps = step_costs_of(out.seq_len, out.block, ring_row_step);
  const std::vector<int> owner = refine_for_ring(costs, steps, needs, owners_of(out.blocks, n), ranks);
  blocks_from_owners(owner, out.blocks);
  positions_from_blocks(out);
  out.cost_per_rank = costs_of_blocks(out.positions, costs, out.block);
  out.ratio = ratio_of(out.cost_per_rank);
  out.ring_cost_per_rank = ring_loads(costs, steps, needs, owner, ranks);
  out.ring_ratio = ratio_of(out.ring_cost_per_rank);
}

}  // namespace detail::cp::balance

/// Balances given block costs (costs[i] for block i; any sum of masks or a measured profile):
/// the same algorithm as the mask overloads (options.weights is unused: the costs are given).
/// The zigzag and contiguous ratios are computed from the block costs with their chunk edges
/// rounded to blocks.
[[nodiscard]] inline balanced_sharding_result balanced_sharding_from_costs(std::span<const double> costs,
                                                                           std::int64_t seq_len, int ranks,
                                                                           std::int64_t block,
                                                                           const balance_options& options = {}) {
  detail::cp::balance::check_balance_args("baton::balanced_sharding_from_costs", seq_len, ranks, block);
  const std::int64_t n = detail::cp::balance::block_count(seq_len, block);
  if (static_cast<std::int64_t>(costs.size()) != n)
    throw cp_error("baton::balanced_sharding_from_costs: " + std::to_string(costs.size()) + " block costs for " +
                   std::to_string(seq_len) + " tokens in blocks of " + std::to_string(block) + ", which make " +
                   std::to_string(n) + " blocks; pass one cost per block (block_costs computes them)");
  for (std::size_t i = 0; i < costs.size(); ++i)
    if (!(costs[i] >= 0.0) || !std::isfinite(costs[i]))
      throw cp_error("baton::balanced_sharding_from_costs: the cost of block " + std::to_string(i) + " is " +
                     std::to_string(costs[i]) + "; costs must be finite and >= 0");
  if (options.ring_row_step != 0.0)
    throw cp_error("baton::balanced_sharding_from_costs: ring_row_step needs to know which blocks need which keys, "
                   "which bare costs do not say; pass the masks to baton::balanced_sharding, or set ring_row_step to 0");
  auto out = detail::cp::balance::balance_from_costs(costs, seq_len, ranks, block, options.improve, options.contiguous_ties);
  out.ring_cost_per_rank = out.cost_per_rank;
  out.ring_ratio = out.ratio;
  out.zigzag_ratio = detail::cp::balance::ratio_of(detail::cp::balance::costs_of_blocks(detail::cp::balance::zigzag_cut(seq_len, ranks, block), costs, block));
  out.contiguous_ratio =
      detail::cp::balance::ratio_of(detail::cp::balance::costs_of_blocks(detail::cp::balance::contiguous_cut(seq_len, ranks, block), costs, block));
  return out;
}

/// Balances the layer-weighted sum of several masks' costs (a model whose layers use
/// different masks) over `ranks`, in whole blocks of `block` tokens. See the single-mask
/// overload.
[[nodiscard]] inline balanced_sharding_result balanced_sharding(std::span<const attention_cost> masks,
                                                                std::int64_t seq_len, int ranks, std::int64_t block,
                                                                const balance_options& options = {}) {
  detail::cp::balance::check_balance_args("baton::balanced_sharding", seq_len, ranks, block);
  if (!(options.ring_row_step >= 0.0) || !std::isfinite(options.ring_row_step))
    throw cp_error("baton::balanced_sharding: ring_row_step " + std::to_string(options.ring_row_step) +
                   " must be finite and >= 0 (the cost of one query row per ring step, in allowed pairs; 0 ignores it)");
  const auto costs = block_costs(masks, seq_len, block, options.weights);
  auto out = detail::cp::balance::balance_from_costs(costs, seq_len, ranks, block, options.improve, options.contiguous_ties);
  double layers = 0;
  for (const attention_cost& m : masks) layers += m.layers();
  detail::cp::balance::account_for_ring(out, masks, costs, ranks, options.ring_row_step * options.weights.full * layers);
  std::vector<double> zigzag, contiguous;
  for (const auto& mine : detail::cp::balance::zigzag_cut(seq_len, ranks, 1))
    zigzag.push_back(detail::cp::balance::masks_positions_cost(masks, mine, seq_len, block, options.weights));
  for (const auto& mine : detail::cp::balance::contiguous_cut(seq_len, ranks, 1))
    contiguous.push_back(detail::cp::balance::masks_positions_cost(masks, mine, seq_len, block, options.weights));
  out.zigzag_ratio = detail::cp::balance::ratio_of(zigzag);
  out.contiguous_ratio = detail::cp::balance::ratio_of(contiguous);
  return out;
}

/// Deals the sequence's blocks of `block` tokens to `ranks` so that the most loaded rank's
/// attention cost under `mask` is as close to the average as the algorithm finds: layered
/// LPT and cardinality-capped LPT (heaviest block first), each followed by local
/// improvement, the better kept, then equal-cost blocks swapped to join runs. Every rank
/// holds the same number of blocks, give or take one; with more ranks than blocks some ranks
/// hold none (empty shards are valid).
/// Deterministic. Throws cp_error for seq_len, ranks or block below 1, negative weights, or a
/// mask that cannot describe [0, seq_len).
template <class Mask>
  requires(!std::convertible_to<const Mask&, std::span<const attention_cost>>)
[[nodiscard]] balanced_sharding_result balanced_sharding(const Mask& mask, std::int64_t seq_len, int ranks,
                                                         std::int64_t block, const balance_options& options = {}) {
  static_assert(attention_mask<Mask>,
                "baton::balanced_sharding: the mask must model baton::attention_mask: allowed(q_pos, k_pos) -> bool "
                "and classify(position_block, position_block) -> block_kind, both const");
  const attention_cost one[] = {attention_cost(mask)};
  return balanced_sharding(std::span<const attention_cost>(one), seq_len, ranks, block, options);
}

}  // namespace baton
