// baton/cp/balance.hpp — which blocks of a sequence each context-parallel rank should hold so
// that every rank does the same attention work under any mask: packed documents of uneven
// lengths, sliding windows, prefix-LM, several masks per model — with a stated bound.
//
// Zigzag balances a causal mask over a sequence 2R divides; it does not balance a packed
// sequence's causal documents, a window, or a model whose layers use different masks. Here
// the work is measured the way the kernels spend it (per tile, from the mask's classify),
// and the blocks are dealt to ranks by a cardinality-constrained LPT with local improvement.
// See docs/context-parallel.md, "Balancing any mask", for the guarantee.
#pragma once

#include <baton/attention/error.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/sharding.hpp>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
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
  /// mask allows nothing at all).
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

  /// The sharding the CP attention classes take: group g holds positions[g], split over
  /// `inner_degree` Ulysses ranks in hybrid attention.
  [[nodiscard]] sequence_sharding sharding(int inner_degree = 1) const { return sequence_sharding(positions, inner_degree); }
};

namespace detail::cp::balance {

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

// Blocks by cost, heaviest first; equal costs by block index, so the result is deterministic.
[[nodiscard]] inline std::vector<std::int64_t> heaviest_first(std::span<const double> costs) {
  std::vector<std::int64_t> order(costs.size());
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) {
    return costs[static_cast<std::size_t>(a)] > costs[static_cast<std::size_t>(b)];
  });
  return order;
}

// The spread the layered greedy's proof bounds the final loads' spread by: over the layers of
// R consecutive blocks in heaviest-first order, the largest (first - last) of a full layer,
// and the first block of a partial last layer.
[[nodiscard]] inline double layered_spread(std::span<const double> costs, int ranks) {
  const auto order = heaviest_first(costs);
  const auto n = order.size();
  const auto r = static_cast<std::size_t>(ranks);
  double spread = 0;
  for (std::size_t s = 0; s < n; s += r) {
    const double first = costs[static_cast<std::size_t>(order[s])];
    if (s + r <= n) spread = std::max(spread, first - costs[static_cast<std::size_t>(order[s + r - 1])]);
    else spread = std::max(spread, first);
  }
  return spread;
}

struct assignment {
  std::vector<std::vector<std::int64_t>> blocks;
  std::vector<double> load;
};

[[nodiscard]] inline double max_load(const assignment& a) {
  return a.load.empty() ? 0.0 : *std::max_element(a.load.begin(), a.load.end());
}

// Ranks by load, lightest first; equal loads by rank index.
[[nodiscard]] inline std::vector<int> lightest_first(const std::vector<double>& load) {
  std::vector<int> order(load.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return load[static_cast<std::size_t>(a)] < load[static_cast<std::size_t>(b)];
  });
  return order;
}

// Layered LPT: heaviest first, R blocks at a time, the heaviest of each layer to the lightest
// rank. Every rank gets one block per full layer, so the counts differ by at most one, and
// the loads' spread never exceeds layered_spread (the proof is in the docs).
[[nodiscard]] inline assignment layered_lpt(std::span<const double> costs, int ranks) {
  assignment a{std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(ranks)),
               std::vector<double>(static_cast<std::size_t>(ranks), 0.0)};
  const auto order = heaviest_first(costs);
  const auto r = static_cast<std::size_t>(ranks);
  for (std::size_t s = 0; s < order.size(); s += r) {
    const auto ranks_now = lightest_first(a.load);
    for (std::size_t i = 0; i < r && s + i < order.size(); ++i) {
      const auto rank = static_cast<std::size_t>(ranks_now[i]);
      const std::int64_t b = order[s + i];
      a.blocks[rank].push_back(b);
      a.load[rank] += costs[static_cast<std::size_t>(b)];
    }
  }
  return a;
}

// Cardinality-capped LPT: heaviest first, each block to the lightest rank that may still take
// one. A rank may hold ceil(n/R) blocks, and only n mod R ranks may reach it (when R does not
// divide n): the caps then sum to n, so every block finds a place and the counts differ by
// at most one. Often better than the layered order when a few blocks dominate.
[[nodiscard]] inline assignment capped_lpt(std::span<const double> costs, int ranks) {
  const auto n = static_cast<std::int64_t>(costs.size());
  const std::int64_t most = (n + ranks - 1) / ranks;
  const std::int64_t may_reach_most = n % ranks == 0 ? ranks : n % ranks;
  assignment a{std::vector<std::vector<std::int64_t>>(static_cast<std::size_t>(ranks)),
               std::vector<double>(static_cast<std::size_t>(ranks), 0.0)};
  std::int64_t at_most = 0;
  for (const std::int64_t b : heaviest_first(costs)) {
    int chosen = -1;
    for (int r = 0; r < ranks; ++r) {
      const auto held = static_cast<std::int64_t>(a.blocks[static_cast<std::size_t>(r)].size());
      const bool room = held < most - 1 || (held == most - 1 && at_most < may_reach_most);
      if (room && (chosen < 0 || a.load[static_cast<std::size_t>(r)] < a.load[static_cast<std::size_t>(chosen)]))
        chosen = r;
    }
    auto& mine = a.blocks[static_cast<std::size_t>(chosen)];
    mine.push_back(b);
    a.load[static_cast<std::size_t>(chosen)] += costs[static_cast<std::size_t>(b)];
    if (static_cast<std::int64_t>(mine.size()) == most) ++at_most;
  }
  return a;
}

// Local improvement: while some exchange lowers the most loaded rank without lifting another
// to its load, apply the best one — a swap of two blocks with any other rank, or a move of one
// block to a rank holding one block fewer (the counts trade places, so they still differ by at
// most one). The most loaded rank's load only decreases; the sum of squared loads strictly
// decreases, so it ends. Ties go to the lowest rank and block positions: deterministic.
inline void improve(assignment& a, std::span<const double> costs) {
  const auto ranks = static_cast<int>(a.load.size());
  const auto cost = [&](std::int64_t b) { return costs[static_cast<std::size_t>(b)]; };
  const std::size_t limit = 64 * costs.size() + 64;
  for (std::size_t step = 0; step < limit; ++step) {
    const auto top = static_cast<std::size_t>(std::max_element(a.load.begin(), a.load.end()) - a.load.begin());
    const double top_load = a.load[top];
    // Rounding in the incremental loads must not let two exchanges undo each other forever.
    const double tol = 1e-12 * std::max(1.0, top_load);
    double best = top_load - tol;
    int best_rank = -1;
    std::size_t best_x = 0, best_y = 0;
    bool best_is_move = false;
    auto& mine = a.blocks[top];
    for (int r = 0; r < ranks; ++r) {
      const auto other = static_cast<std::size_t>(r);
      if (other == top) continue;
      const double gap = top_load - a.load[other];
      if (gap <= tol) continue;
      const auto& theirs = a.blocks[other];
      const auto consider = [&](double d, std::size_t x, std::size_t y, bool move) {
        if (!(d > tol && d < gap - tol)) return;
        const double new_max = std::max(top_load - d, a.load[other] + d);
        if (new_max < best) {
          best = new_max;
          best_rank = r;
          best_x = x;
          best_y = y;
          best_is_move = move;
        }
      };
      if (mine.size() > theirs.size())
        for (std::size_t x = 0; x < mine.size(); ++x) consider(cost(mine[x]), x, 0, true);
      for (std::size_t x = 0; x < mine.size(); ++x)
        for (std::size_t y = 0; y < theirs.size(); ++y) consider(cost(mine[x]) - cost(theirs[y]), x, y, false);
    }
    if (best_rank < 0) return;
    auto& theirs = a.blocks[static_cast<std::size_t>(best_rank)];
    const std::int64_t given = mine[best_x];
    if (best_is_move) {
      mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(best_x));
      theirs.push_back(given);
      a.load[top] -= cost(given);
      a.load[static_cast<std::size_t>(best_rank)] += cost(given);
    } else {
      const std::int64_t taken = theirs[best_y];
      mine[best_x] = taken;
      theirs[best_y] = given;
      a.load[top] += cost(taken) - cost(given);
      a.load[static_cast<std::size_t>(best_rank)] += cost(given) - cost(taken);
    }
  }
}

// Swaps of equal-cost blocks between ranks while one lowers the number of runs (maximal
// stretches of consecutive blocks on one rank). Costs are compared exactly: a swap moves no
// work at all, so every rank's load, the ratio and the bound are untouched.
inline void join_equal_cost_runs(assignment& a, std::span<const double> costs) {
  const auto n = static_cast<std::int64_t>(costs.size());
  std::vector<int> owner(static_cast<std::size_t>(n), 0);
  for (std::size_t r = 0; r < a.blocks.size(); ++r)
    for (const std::int64_t b : a.blocks[r]) owner[static_cast<std::size_t>(b)] = static_cast<int>(r);
  const auto at = [&](std::int64_t b) { return owner[static_cast<std::size_t>(b)]; };
  // Run starts among blocks b and b+1 (the only ones a change of b's owner can affect).
  const auto starts_near = [&](std::int64_t b) {
    int count = b == 0 || at(b) != at(b - 1) ? 1 : 0;
    if (b + 1 < n && at(b + 1) != at(b)) ++count;
    return count;
  };
  std::vector<std::int64_t> order = heaviest_first(costs);  // equal costs sit together
  bool changed = true;
  for (int sweep = 0; changed && sweep < 64; ++sweep) {
    changed = false;
    for (std::size_t i = 0; i < order.size(); ++i)
      for (std::size_t j = i + 1; j < order.size() && costs[static_cast<std::size_t>(order[j])] ==
                                                          costs[static_cast<std::size_t>(order[i])]; ++j) {
        const std::int64_t x = std::min(order[i], order[j]), y = std::max(order[i], order[j]);
        if (at(x) == at(y)) continue;
        // Adjacent blocks share a boundary term; count the union of the affected terms once.
        const auto affected = [&] { return y == x + 1 ? starts_near(x) + (y + 1 < n && at(y + 1) != at(y) ? 1 : 0)
                                                      : starts_near(x) + starts_near(y); };
        const int before = affected();
        std::swap(owner[static_cast<std::size_t>(x)], owner[static_cast<std::size_t>(y)]);
        if (affected() < before) {
          changed = true;
        } else {
          std::swap(owner[static_cast<std::size_t>(x)], owner[static_cast<std::size_t>(y)]);
        }
      }
  }
  for (auto& mine : a.blocks) mine.clear();
  for (std::int64_t b = 0; b < n; ++b) a.blocks[static_cast<std::size_t>(at(b))].push_back(b);
}

// Positions [round(b), round(e)) for an even cut whose edges are rounded to `granule`:
// nearest multiple, except the sequence's end, which stays (so the chunks still cover it).
[[nodiscard]] constexpr std::int64_t round_edge(std::int64_t x, std::int64_t granule, std::int64_t seq_len) noexcept {
  if (x >= seq_len) return seq_len;
  return std::min(seq_len, (x + granule / 2) / granule * granule);
}

inline void append_range(std::vector<std::int64_t>& out, std::int64_t begin, std::int64_t end) {
  for (std::int64_t p = begin; p < end; ++p) out.push_back(p);
}


// Zigzag over [0, seq_len) with chunk edges rounded to `granule` (1: token granularity, the
// positions of sequence_sharding(shard_layout::zigzag, seq_len, ranks): the same run rule).
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> zigzag_cut(std::int64_t seq_len, int ranks,
                                                                       std::int64_t granule) {
  const std::int64_t chunks = 2 * std::int64_t{ranks};
  const auto edge = [&](std::int64_t c) { return round_edge(even_run_start(seq_len, chunks, c), granule, seq_len); };
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& mine = out[static_cast<std::size_t>(r)];
    append_range(mine, edge(r), edge(r + 1));
    append_range(mine, edge(chunks - 1 - r), edge(chunks - r));
  }
  return out;
}

[[nodiscard]] inline std::vector<std::vector<std::int64_t>> contiguous_cut(std::int64_t seq_len, int ranks,
                                                                           std::int64_t granule) {
  const auto edge = [&](std::int64_t r) { return round_edge(even_run_start(seq_len, ranks, r), granule, seq_len); };
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) append_range(out[static_cast<std::size_t>(r)], edge(r), edge(r + 1));
  return out;
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
  out.positions.resize(out.blocks.size());
  for (std::size_t r = 0; r < out.blocks.size(); ++r) {
    std::sort(out.blocks[r].begin(), out.blocks[r].end());
    for (const std::int64_t b : out.blocks[r]) append_range(out.positions[r], b * block, std::min(seq_len, (b + 1) * block));
  }
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

}  // namespace detail::cp::balance

/// Rank r's share of zigzag over any sequence length: 2R chunks cut as evenly as possible (the
/// first S mod 2R one token longer), rank r holding chunks r and 2R-1-r, ascending — the
/// positions of sequence_sharding(shard_layout::zigzag, S, R).
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> zigzag_positions(std::int64_t seq_len, int ranks) {
  detail::cp::balance::check_balance_args("baton::zigzag_positions", seq_len, ranks, 1);
  return detail::cp::balance::zigzag_cut(seq_len, ranks, 1);
}

/// R contiguous chunks cut as evenly as possible (the first S mod R one token longer), the
/// positions of sequence_sharding(shard_layout::contiguous, S, R).
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> contiguous_positions(std::int64_t seq_len, int ranks) {
  detail::cp::balance::check_balance_args("baton::contiguous_positions", seq_len, ranks, 1);
  return detail::cp::balance::contiguous_cut(seq_len, ranks, 1);
}

/// Per-document zigzag for a packed sequence (segment_ids[p] = document of position p; a
/// document is a maximal run of equal ids): each document is cut into 2R chunks as evenly as
/// possible and rank r holds chunks r and 2R-1-r of every document. With block > 1 every
/// chunk edge is rounded to the nearest multiple of `block` (kernels tile whole blocks), so a
/// document shorter than 2R blocks leaves some ranks without a share of it.
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> per_document_zigzag_positions(
    std::span<const std::int64_t> segment_ids, int ranks, std::int64_t block = 1) {
  const auto seq_len = static_cast<std::int64_t>(segment_ids.size());
  detail::cp::balance::check_balance_args("baton::per_document_zigzag_positions", seq_len, ranks, block);
  const std::int64_t chunks = 2 * std::int64_t{ranks};
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(ranks));
  std::int64_t begin = 0;
  while (begin < seq_len) {
    std::int64_t end = begin + 1;
    while (end < seq_len && segment_ids[static_cast<std::size_t>(end)] == segment_ids[static_cast<std::size_t>(begin)]) ++end;
    const std::int64_t length = end - begin;
    const auto edge = [&](std::int64_t c) {
      return detail::cp::balance::round_edge(begin + detail::cp::even_run_start(length, chunks, c), block, seq_len);
    };
    for (int r = 0; r < ranks; ++r) {
      auto& mine = out[static_cast<std::size_t>(r)];
      detail::cp::balance::append_range(mine, edge(r), edge(r + 1));
      detail::cp::balance::append_range(mine, edge(chunks - 1 - r), edge(chunks - r));
    }
    begin = end;
  }
  // Rounded edges are monotone, so each rank's runs are ascending already; sort anyway for
  // labellings that revisit a document id later (two runs, two documents).
  for (auto& mine : out) std::sort(mine.begin(), mine.end());
  return out;
}

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
  auto out = detail::cp::balance::balance_from_costs(costs, seq_len, ranks, block, options.improve, options.contiguous_ties);
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
  const auto costs = block_costs(masks, seq_len, block, options.weights);
  auto out = detail::cp::balance::balance_from_costs(costs, seq_len, ranks, block, options.improve, options.contiguous_ties);
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
