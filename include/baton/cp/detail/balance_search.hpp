// baton/cp/detail/balance_search.hpp — how balanced_sharding deals blocks of given costs to
// ranks: layered LPT and cardinality-capped LPT, the local improvement pass after each, the
// swaps of equal-cost blocks that join runs, and the spread that bounds layered LPT's most
// loaded rank (the guarantee of docs/context-parallel.md, "Balancing any mask").
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

namespace baton::detail::cp::balance {

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

// Which rank holds each of n blocks, from the blocks each rank holds.
[[nodiscard]] inline std::vector<int> owners_of(const std::vector<std::vector<std::int64_t>>& blocks, std::int64_t n) {
  std::vector<int> owner(static_cast<std::size_t>(n), 0);
  for (std::size_t r = 0; r < blocks.size(); ++r)
    for (const std::int64_t b : blocks[r]) owner[static_cast<std::size_t>(b)] = static_cast<int>(r);
  return owner;
}

// The blocks each rank holds, ascending, from the owner of every block (into `blocks`, whose
// size is the rank count).
inline void blocks_from_owners(const std::vector<int>& owner, std::vector<std::vector<std::int64_t>>& blocks) {
  for (auto& mine : blocks) mine.clear();
  for (std::size_t b = 0; b < owner.size(); ++b)
    blocks[static_cast<std::size_t>(owner[b])].push_back(static_cast<std::int64_t>(b));
}

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
  std::vector<int> owner = owners_of(a.blocks, n);
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
  blocks_from_owners(owner, a.blocks);
}


}  // namespace baton::detail::cp::balance
