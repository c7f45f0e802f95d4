// baton/cp/balance/cost.hpp — the cost model balanced_sharding balances: what a tile of
// (query block x key block) costs under a mask, read from the mask's classify the way the
// kernels spend it, summed per query block, per set of positions and per rank, and over the
// masks of a model weighted by their layer counts (attention_cost).
#pragma once

#include <baton/attention/error.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/cp/error.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace baton {

/// What one (query tile x key tile) of each kind costs, per block x block elements. An empty
/// tile is skipped by the kernels and costs 0. A partial tile evaluates the mask per element
/// (or bounds its rows), so it may cost more than a full one: set `partial` > 1 to say so.
struct block_cost_weights {
  double full = 1.0;
  double partial = 1.0;
};

/// One mask of a model, type-erased, with the number of layers that use it: a model that
/// alternates sliding-window and global layers balances the sum of both masks' costs,
/// weighted by their layer counts, e.g.
/// `std::vector<baton::attention_cost> model{{baton::sliding_window_mask{4096, 0}, 3}, {baton::causal_mask{}, 1}};`
class attention_cost {
 public:
  template <class Mask>
    requires attention_mask<Mask>
  attention_cost(Mask mask, double layers = 1.0)  // NOLINT(google-explicit-constructor): a list of masks reads naturally
      : mask_(std::make_shared<const Mask>(std::move(mask))),
        layers_(layers),
        classify_([](const void* m, const position_block& q, const position_block& k) {
          return static_cast<const Mask*>(m)->classify(q, k);
        }),
        validate_([](const void* m, const positions& q, const positions& k) {
          baton::validate_mask(*static_cast<const Mask*>(m), q, k);
        }) {
    if (!(layers >= 0.0) || !std::isfinite(layers))
      throw cp_error("baton::attention_cost: the layer count " + std::to_string(layers) +
                     " must be finite and >= 0 (it weights this mask's cost in the sum)");
  }

  [[nodiscard]] double layers() const noexcept { return layers_; }
  [[nodiscard]] block_kind classify(const position_block& q, const position_block& k) const {
    return classify_(mask_.get(), q, k);
  }
  /// Throws what the mask's validate() throws for positions [0, seq_len) (e.g. a document
  /// mask holding fewer segment ids than the sequence has tokens).
  void validate(std::int64_t seq_len) const {
    const positions all(0, seq_len);
    validate_(mask_.get(), all, all);
  }

 private:
  std::shared_ptr<const void> mask_;
  double layers_;
  block_kind (*classify_)(const void*, const position_block&, const position_block&);
  void (*validate_)(const void*, const positions&, const positions&);
};

namespace detail::cp::balance {

// The arguments every entry point of balancing checks (here, in balance/layouts.hpp and in
// balance.hpp).
inline void check_balance_args(const char* who, std::int64_t seq_len, int ranks, std::int64_t block) {
  if (seq_len < 1)
    throw cp_error(std::string(who) + ": sequence length " + std::to_string(seq_len) +
                   " must be >= 1; pass the number of tokens of the whole sequence");
  if (ranks < 1)
    throw cp_error(std::string(who) + ": ranks " + std::to_string(ranks) +
                   " must be >= 1; pass the context-parallel degree (the ring's size)");
  if (block < 1)
    throw cp_error(std::string(who) + ": block " + std::to_string(block) +
                   " must be >= 1; pass the attention kernel's tile size in tokens (64 or 128 are usual)");
}

inline void check_weights(const char* who, const block_cost_weights& w) {
  if (!(w.full >= 0.0) || !(w.partial >= 0.0) || !std::isfinite(w.full) || !std::isfinite(w.partial))
    throw cp_error(std::string(who) + ": block cost weights (full " + std::to_string(w.full) + ", partial " +
                   std::to_string(w.partial) + ") must be finite and >= 0");
}

[[nodiscard]] constexpr std::int64_t block_count(std::int64_t seq_len, std::int64_t block) noexcept {
  return (seq_len + block - 1) / block;
}

[[nodiscard]] constexpr double kind_weight(block_kind kind, const block_cost_weights& w) noexcept {
  return kind == block_kind::empty ? 0.0 : kind == block_kind::full ? w.full : w.partial;
}

// The cost of queries [q_begin, q_begin + q_count) (one tile, consecutive positions) against
// every key of the sequence, tiled in global blocks: each tile's weight scaled by its share of
// a whole block x block tile, so a short last block or a fragment costs its area.
template <class Classify>
double tile_cost(const Classify& classify, std::int64_t q_begin, std::int64_t q_count, std::int64_t seq_len,
                 std::int64_t block, const block_cost_weights& w) {
  const positions q_pos(q_begin, q_count), k_pos(0, seq_len);
  const position_block q_tile(q_pos, 0, q_count);
  const double whole = static_cast<double>(block) * static_cast<double>(block);
  double cost = 0;
  for (std::int64_t k0 = 0; k0 < seq_len; k0 += block) {
    const std::int64_t k_count = std::min(block, seq_len - k0);
    const block_kind kind = classify(q_tile, position_block(k_pos, k0, k_count));
    cost += kind_weight(kind, w) * static_cast<double>(q_count) * static_cast<double>(k_count) / whole;
  }
  return cost;
}

// The cost of any set of query positions: cut into tiles of consecutive positions that never
// cross a multiple of `block` (as a kernel tiling a shard of runs would at best), each costed
// by tile_cost. Whole blocks cost exactly block_costs' entries.
template <class Classify>
double positions_cost(const Classify& classify, std::vector<std::int64_t> held, std::int64_t seq_len,
                      std::int64_t block, const block_cost_weights& w) {
  std::sort(held.begin(), held.end());
  double cost = 0;
  std::size_t i = 0;
  while (i < held.size()) {
    const std::int64_t begin = held[i];
    const std::int64_t block_end = (begin / block + 1) * block;
    std::size_t j = i + 1;
    while (j < held.size() && held[j] == held[j - 1] + 1 && held[j] < block_end) ++j;
    cost += tile_cost(classify, begin, static_cast<std::int64_t>(j - i), seq_len, block, w);
    i = j;
  }
  return cost;
}

inline void check_positions(const char* who, const std::vector<std::vector<std::int64_t>>& held,
                            std::int64_t seq_len) {
  for (std::size_t r = 0; r < held.size(); ++r)
    for (const std::int64_t p : held[r])
      if (p < 0 || p >= seq_len)
        throw cp_error(std::string(who) + ": rank " + std::to_string(r) + " holds position " + std::to_string(p) +
                       ", outside the sequence [0, " + std::to_string(seq_len) +
                       "); pass global positions of the sequence the costs are for");
}

[[nodiscard]] inline double ratio_of(std::span<const double> cost_per_rank) {
  if (cost_per_rank.empty()) return 1.0;
  const double total = std::accumulate(cost_per_rank.begin(), cost_per_rank.end(), 0.0);
  if (!(total > 0.0)) return 1.0;
  const double most = *std::max_element(cost_per_rank.begin(), cost_per_rank.end());
  return most / (total / static_cast<double>(cost_per_rank.size()));
}

// The cost per rank of whole-block shards, from the block costs.
[[nodiscard]] inline std::vector<double> costs_of_blocks(const std::vector<std::vector<std::int64_t>>& held,
                                                         std::span<const double> costs, std::int64_t block) {
  std::vector<double> out;
  for (const auto& mine : held) {
    double c = 0;
    std::int64_t last_block = -1;
    for (const std::int64_t p : mine)
      if (p / block != last_block) {
        last_block = p / block;
        c += costs[static_cast<std::size_t>(last_block)];
      }
    out.push_back(c);
  }
  return out;
}

inline void validate_costs(const char* who, std::span<const attention_cost> masks, std::int64_t seq_len) {
  if (masks.empty())
    throw cp_error(std::string(who) + ": no masks given; pass at least one (with its layer count)");
  for (std::size_t i = 0; i < masks.size(); ++i) {
    try {
      masks[i].validate(seq_len);
    } catch (const attention_error& e) {
      throw cp_error(std::string(who) + ": mask " + std::to_string(i) + " cannot describe a sequence of " +
                     std::to_string(seq_len) + " tokens: " + e.what());
    }
  }
}

// Summed, layer-weighted cost of any positions under every mask.
[[nodiscard]] inline double masks_positions_cost(std::span<const attention_cost> masks,
                                                 const std::vector<std::int64_t>& held, std::int64_t seq_len,
                                                 std::int64_t block, const block_cost_weights& w) {
  double cost = 0;
  for (const attention_cost& m : masks)
    if (m.layers() > 0.0)
      cost += m.layers() * positions_cost([&](const position_block& q, const position_block& k) { return m.classify(q, k); },
                                          held, seq_len, block, w);
  return cost;
}

}  // namespace detail::cp::balance

/// The cost of each query block: for block i (positions [i*block, min((i+1)*block, seq_len))),
/// the sum over the key blocks j of weight(mask.classify(block i, block j)) times the tile's
/// share of a whole block x block tile (1 except at the sequence's end). O(n_blocks^2)
/// classify calls.
template <class Mask>
  requires(!std::convertible_to<const Mask&, std::span<const attention_cost>>)
[[nodiscard]] std::vector<double> block_costs(const Mask& mask, std::int64_t seq_len, std::int64_t block,
                                              block_cost_weights weights = {}) {
  static_assert(attention_mask<Mask>,
                "baton::block_costs: the mask must model baton::attention_mask: allowed(q_pos, k_pos) -> bool and "
                "classify(position_block, position_block) -> block_kind, both const");
  detail::cp::balance::check_balance_args("baton::block_costs", seq_len, 1, block);
  detail::cp::balance::check_weights("baton::block_costs", weights);
  const attention_cost one[] = {attention_cost(mask)};
  detail::cp::balance::validate_costs("baton::block_costs", one, seq_len);
  std::vector<double> out(static_cast<std::size_t>(detail::cp::balance::block_count(seq_len, block)));
  const auto classify = [&](const position_block& q, const position_block& k) { return mask.classify(q, k); };
  for (std::size_t i = 0; i < out.size(); ++i) {
    const auto q0 = static_cast<std::int64_t>(i) * block;
    out[i] = detail::cp::balance::tile_cost(classify, q0, std::min(block, seq_len - q0), seq_len, block, weights);
  }
  return out;
}

/// The layer-weighted sum of several masks' block costs: sum over m of
/// masks[m].layers() * block_costs(mask m, ...).
[[nodiscard]] inline std::vector<double> block_costs(std::span<const attention_cost> masks, std::int64_t seq_len,
                                                     std::int64_t block, block_cost_weights weights = {}) {
  detail::cp::balance::check_balance_args("baton::block_costs", seq_len, 1, block);
  detail::cp::balance::check_weights("baton::block_costs", weights);
  detail::cp::balance::validate_costs("baton::block_costs", masks, seq_len);
  std::vector<double> out(static_cast<std::size_t>(detail::cp::balance::block_count(seq_len, block)), 0.0);
  for (const attention_cost& m : masks) {
    if (m.layers() == 0.0) continue;
    const auto classify = [&](const position_block& q, const position_block& k) { return m.classify(q, k); };
    for (std::size_t i = 0; i < out.size(); ++i) {
      const auto q0 = static_cast<std::int64_t>(i) * block;
      out[i] += m.layers() * detail::cp::balance::tile_cost(classify, q0, std::min(block, seq_len - q0), seq_len, block, weights);
    }
  }
  return out;
}

/// The cost per rank of any sharding (`held[r]`: rank r's global positions, any order) under
/// the masks, by the same tile model as block_costs: a rank's positions are cut into tiles of
/// consecutive positions that do not cross a multiple of `block`, each costed against every
/// key block. For whole-block shards this is the sum of the blocks' block_costs.
[[nodiscard]] inline std::vector<double> sharding_costs(std::span<const attention_cost> masks,
                                                        const std::vector<std::vector<std::int64_t>>& held,
                                                        std::int64_t seq_len, std::int64_t block,
                                                        block_cost_weights weights = {}) {
  detail::cp::balance::check_balance_args("baton::sharding_costs", seq_len, 1, block);
  detail::cp::balance::check_weights("baton::sharding_costs", weights);
  detail::cp::balance::validate_costs("baton::sharding_costs", masks, seq_len);
  detail::cp::balance::check_positions("baton::sharding_costs", held, seq_len);
  std::vector<double> out;
  for (const auto& mine : held) out.push_back(detail::cp::balance::masks_positions_cost(masks, mine, seq_len, block, weights));
  return out;
}

template <class Mask>
  requires(!std::convertible_to<const Mask&, std::span<const attention_cost>>)
[[nodiscard]] std::vector<double> sharding_costs(const Mask& mask, const std::vector<std::vector<std::int64_t>>& held,
                                                 std::int64_t seq_len, std::int64_t block,
                                                 block_cost_weights weights = {}) {
  static_assert(attention_mask<Mask>,
                "baton::sharding_costs: the mask must model baton::attention_mask: allowed(q_pos, k_pos) -> bool and "
                "classify(position_block, position_block) -> block_kind, both const");
  const attention_cost one[] = {attention_cost(mask)};
  return sharding_costs(std::span<const attention_cost>(one), held, seq_len, block, weights);
}

/// max(cost_per_rank) / (sum / ranks): 1 for a perfect split (and for all-zero costs).
[[nodiscard]] inline double balance_ratio(std::span<const double> cost_per_rank) {
  return detail::cp::balance::ratio_of(cost_per_rank);
}

}  // namespace baton
