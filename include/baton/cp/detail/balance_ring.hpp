// baton/cp/detail/balance_ring.hpp — balanced_sharding's refinement for the ring's per-step
// costs (balance_options::ring_row_step): a ring walks a query block once in every step
// whose held K/V block holds a key block it needs, and each such walk costs the same
// whatever its tiles (the call's row panels, its packing of the keys they meet, the merge
// of its result). A rank's ring cost is therefore its tile cost plus ring_row_step x rows x
// the number of ranks its query blocks need keys from; the tile model alone ignores the
// second term, which differs between ranks with equal tile costs (measured on 2 ranks of
// the bench's packed documents: 4-8 % more CPU time on one rank than the other).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace baton::detail::cp::balance {

// needers[j]: the query blocks that need key block j (a tile of theirs against it that some
// mask with layers > 0 does not classify empty).
struct block_needs {
  std::vector<std::vector<std::int64_t>> needers;
};

// The ring cost model over an assignment (owner of every block), kept up to date as blocks
// change hands: per block the number of ranks it needs keys from (steps), per rank the ring
// load = its blocks' tile costs + the sum over its blocks of step_cost[b] x steps[b]
// (step_cost[b]: what one walk of block b's rows costs, in tile-cost units).
class ring_load_model {
 public:
  ring_load_model(std::span<const double> tile_costs, std::span<const double> step_costs, const block_needs& needs,
                  std::vector<int> owner, int ranks)
      : tile_(tile_costs), step_cost_(step_costs), needs_(&needs), owner_(std::move(owner)), ranks_(ranks) {
    const std::size_t n = owner_.size();
    count_.assign(n * static_cast<std::size_t>(ranks_), 0);
    steps_.assign(n, 0);
    ring_load_.assign(static_cast<std::size_t>(ranks_), 0.0);
    for (std::size_t key = 0; key < n; ++key)
      for (const std::int64_t q : needs.needers[key]) {
        int& c = count_at(static_cast<std::size_t>(q), owner_[key]);
        if (c++ == 0) ++steps_[static_cast<std::size_t>(q)];
      }
    for (std::size_t b = 0; b < n; ++b) {
      ring_load_[static_cast<std::size_t>(owner_[b])] += tile_[b] + step_cost_[b] * steps_[b];
    }
  }

  // Exchanges the owners of blocks i and j; the same call again undoes it. Returns the
  // number of needers visited (the work, for the caller's budget).
  std::size_t swap_owners(std::int64_t i, std::int64_t j) {
    const int a = owner_[static_cast<std::size_t>(i)], c = owner_[static_cast<std::size_t>(j)];
    return move(i, a, c) + move(j, c, a);
  }

  [[nodiscard]] int owner(std::int64_t b) const noexcept { return owner_[static_cast<std::size_t>(b)]; }
  [[nodiscard]] const std::vector<int>& owners() const noexcept { return owner_; }
  [[nodiscard]] const std::vector<double>& ring_load() const noexcept { return ring_load_; }
  [[nodiscard]] double max_ring_load() const { return *std::max_element(ring_load_.begin(), ring_load_.end()); }

 private:
  int& count_at(std::size_t block, int rank) {
    return count_[block * static_cast<std::size_t>(ranks_) + static_cast<std::size_t>(rank)];
  }

  std::size_t move(std::int64_t b, int from, int to) {
    const auto ub = static_cast<std::size_t>(b);
    const double own = tile_[ub] + step_cost_[ub] * steps_[ub];
    ring_load_[static_cast<std::size_t>(from)] -= own;
    ring_load_[static_cast<std::size_t>(to)] += own;
    owner_[ub] = to;
    // Every block that needs b now needs a key block on `to` instead of one on `from`.
    const auto& needers = needs_->needers[ub];
    for (const std::int64_t q : needers) {
      const auto uq = static_cast<std::size_t>(q);
      const int before = steps_[uq];
      if (--count_at(uq, from) == 0) --steps_[uq];
      if (count_at(uq, to)++ == 0) ++steps_[uq];
      ring_load_[static_cast<std::size_t>(owner_[uq])] += step_cost_[uq] * (steps_[uq] - before);
    }
    return needers.size();
  }

  std::span<const double> tile_, step_cost_;
  const block_needs* needs_;
  std::vector<int> owner_;
  int ranks_;
  std::vector<int> count_;  // [block][rank]: key blocks on rank that the block needs
  std::vector<int> steps_;  // per block: ranks holding a key block it needs
  std::vector<double> ring_load_;
};

// The ring load of every rank of an assignment, summed afresh (not incrementally).
[[nodiscard]] inline std::vector<double> ring_loads(std::span<const double> tile_costs, std::span<const double> step_costs,
                                                    const block_needs& needs, const std::vector<int>& owner, int ranks) {
  return ring_load_model(tile_costs, step_costs, needs, owner, ranks).ring_load();
}

// How many needer visits the refinement may spend (about a tenth of a second): it stops
// there, keeping what it has improved so far.
inline constexpr std::size_t ring_refine_budget = std::size_t{50'000'000};

// Best-improvement swaps: while exchanging a block of the rank with the highest ring load
// for a block of another rank lowers the highest ring load, or keeps it and lowers the sum of
// all ranks' ring loads (fewer walks in all: that frees the ranks that are tied at the top),
// apply the best such swap. Swaps keep every rank's block count. Ties go to the lowest block
// indices: deterministic.
inline std::vector<int> refine_for_ring(std::span<const double> tile_costs, std::span<const double> step_costs,
                                        const block_needs& needs, std::vector<int> owner, int ranks) {
  ring_load_model model(tile_costs, step_costs, needs, std::move(owner), ranks);
  const auto n = static_cast<std::int64_t>(tile_costs.size());
  const auto sum = [&] {
    double total = 0;
    for (const double l : model.ring_load()) total += l;
    return total;
  };
  std::size_t work = 0;
  for (std::int64_t iteration = 0; iteration < 4 * n && work < ring_refine_budget; ++iteration) {
    const auto& load = model.ring_load();
    const int top = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    const double tol = 1e-9 * std::max(1.0, load[static_cast<std::size_t>(top)]);
    double best_max = load[static_cast<std::size_t>(top)], best_sum = sum();
    std::int64_t best_i = -1, best_j = -1;
    for (std::int64_t i = 0; i < n && work < ring_refine_budget; ++i) {
      if (model.owner(i) != top) continue;
      for (std::int64_t j = 0; j < n; ++j) {
        if (model.owner(j) == top) continue;
        work += model.swap_owners(i, j);
        const double now_max = model.max_ring_load(), now_sum = sum();
        if (now_max < best_max - tol || (now_max <= best_max + tol && now_sum < best_sum - tol)) {
          best_max = now_max;
          best_sum = now_sum;
          best_i = i;
          best_j = j;
        }
        work += model.swap_owners(i, j);
      }
    }
    if (best_i < 0) break;
    model.swap_owners(best_i, best_j);
  }
  return model.owners();
}

}  // namespace baton::detail::cp::balance
