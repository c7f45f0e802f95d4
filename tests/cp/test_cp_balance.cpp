// Mask-aware load balancing (baton/cp/balance.hpp, issue 17): the block costs against closed
// forms, the result as a partition with block counts differing by at most one, the ratios
// recomputed here, the stated bound against the brute-force optimum under the same
// cardinality constraint, the several-mask overload against the summed cost vector, and the
// comparisons with zigzag and per-document zigzag.
#include "catch.hpp"

#include <baton/attention/masks.hpp>
#include <baton/cp/balance.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

namespace {

using positions_per_rank = std::vector<std::vector<std::int64_t>>;

// Packed documents of random lengths in [lo, hi] tokens, the last one cut at seq_len.
std::vector<std::int64_t> random_documents(std::int64_t seq_len, std::int64_t lo, std::int64_t hi, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> length(lo, hi);
  std::vector<std::int64_t> ids;
  std::int64_t doc = 0;
  while (static_cast<std::int64_t>(ids.size()) < seq_len) {
    const std::int64_t n = std::min(length(gen), seq_len - static_cast<std::int64_t>(ids.size()));
    ids.insert(ids.end(), static_cast<std::size_t>(n), doc++);
  }
  return ids;
}

// Every position of [0, seq_len) exactly once, each rank ascending, whole blocks, and the
// ranks' block counts within one of each other.
void require_balanced_partition(const baton::balanced_sharding_result& r, std::int64_t seq_len, int ranks,
                                std::int64_t block) {
  REQUIRE(static_cast<int>(r.positions.size()) == ranks);
  std::vector<int> seen(static_cast<std::size_t>(seq_len), 0);
  std::int64_t fewest = std::numeric_limits<std::int64_t>::max(), most = 0;
  for (const auto& mine : r.positions) {
    REQUIRE(std::is_sorted(mine.begin(), mine.end()));
    std::int64_t blocks = 0;
    for (std::size_t i = 0; i < mine.size(); ++i) {
      REQUIRE(mine[i] >= 0);
      REQUIRE(mine[i] < seq_len);
      ++seen[static_cast<std::size_t>(mine[i])];
      if (i == 0 || mine[i] / block != mine[i - 1] / block) ++blocks;
    }
    // whole blocks: a block's positions count equals its extent
    for (std::size_t i = 0; i < mine.size();) {
      const std::int64_t b = mine[i] / block;
      const std::int64_t extent = std::min(seq_len, (b + 1) * block) - b * block;
      std::size_t j = i;
      while (j < mine.size() && mine[j] / block == b) ++j;
      REQUIRE(static_cast<std::int64_t>(j - i) == extent);
      i = j;
    }
    fewest = std::min(fewest, blocks);
    most = std::max(most, blocks);
  }
  for (const int s : seen) REQUIRE(s == 1);
  REQUIRE(most - fewest <= 1);
}

// The ratio recomputed from the block costs and the positions, not from the result's fields.
double ratio_from_blocks(const positions_per_rank& held, const std::vector<double>& costs, std::int64_t block) {
  std::vector<double> per_rank;
  for (const auto& mine : held) {
    std::vector<std::int64_t> blocks;
    for (const std::int64_t p : mine) blocks.push_back(p / block);
    blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
    double c = 0;
    for (const std::int64_t b : blocks) c += costs[static_cast<std::size_t>(b)];
    per_rank.push_back(c);
  }
  const double total = std::accumulate(per_rank.begin(), per_rank.end(), 0.0);
  if (total <= 0) return 1.0;
  return *std::max_element(per_rank.begin(), per_rank.end()) / (total / static_cast<double>(held.size()));
}

// The optimum under the same constraint: every assignment of the blocks to the ranks with
// floor(n/R) or ceil(n/R) blocks each (and at most n mod R ranks at the ceiling), enumerated.
double brute_force_optimum(const std::vector<double>& costs, int ranks) {
  const auto n = static_cast<int>(costs.size());
  const int most = (n + ranks - 1) / ranks;
  const int at_ceiling_allowed = n % ranks == 0 ? ranks : n % ranks;
  std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
  std::vector<int> count(static_cast<std::size_t>(ranks), 0);
  double best = std::numeric_limits<double>::infinity();
  std::function<void(int, double)> place = [&](int i, double current_max) {
    if (current_max >= best) return;
    if (i == n) {
      int at_ceiling = 0;
      for (const int c : count) at_ceiling += c == most ? 1 : 0;
      for (const int c : count)
        if (c < most - 1 || (n % ranks == 0 && c != most)) return;
      if (at_ceiling > at_ceiling_allowed) return;
      best = current_max;
      return;
    }
    for (int r = 0; r < ranks; ++r) {
      const auto u = static_cast<std::size_t>(r);
      if (count[u] == most) continue;
      load[u] += costs[static_cast<std::size_t>(i)];
      ++count[u];
      place(i + 1, std::max(current_max, load[u]));
      --count[u];
      load[u] -= costs[static_cast<std::size_t>(i)];
    }
  };
  place(0, 0.0);
  return best;
}

// The spread the proof bounds the loads' spread by, recomputed: over layers of R blocks in
// descending cost order, max(first - last) of a full layer, and the first of a partial one.
double layered_spread(std::vector<double> costs, int ranks) {
  std::sort(costs.begin(), costs.end(), std::greater<>());
  double spread = 0;
  for (std::size_t s = 0; s < costs.size(); s += static_cast<std::size_t>(ranks)) {
    const std::size_t last = s + static_cast<std::size_t>(ranks) - 1;
    spread = std::max(spread, last < costs.size() ? costs[s] - costs[last] : costs[s]);
  }
  return spread;
}

}  // namespace

TEST_CASE("balance: block costs count each tile by its kind and area", "[cp][balance]") {
  // Causal, 8 blocks of 4: block i sees i full tiles and its diagonal, a partial tile.
  const auto causal = baton::block_costs(baton::causal_mask{}, 32, 4, {.full = 1.0, .partial = 2.5});
  REQUIRE(causal.size() == 8);
  for (std::size_t i = 0; i < causal.size(); ++i) CHECK(causal[i] == Approx(static_cast<double>(i) + 2.5));
  // 30 tokens: the last block holds 2 tokens, so each of its tiles is 2 x 4 / 16 of a tile,
  // its diagonal 2 x 2 / 16; and the tiles of the other blocks against it are 4 x 2 / 16.
  const auto short_end = baton::block_costs(baton::causal_mask{}, 30, 4);
  REQUIRE(short_end.size() == 8);
  CHECK(short_end[7] == Approx(7 * 0.5 + 0.25));
  CHECK(short_end[6] == Approx(7.0));
  // A window of 4 to the left in blocks of 4: block i > 0 touches blocks i-1 (partial) and
  // i (partial); block 0 only itself.
  const auto window = baton::block_costs(baton::sliding_window_mask{4, 0}, 32, 4);
  CHECK(window[0] == Approx(1.0));
  for (std::size_t i = 1; i < window.size(); ++i) CHECK(window[i] == Approx(2.0));
  // Several masks: the layer-weighted sum.
  const std::vector<baton::attention_cost> model{{baton::sliding_window_mask{4, 0}, 3.0}, {baton::causal_mask{}, 1.0}};
  const auto both = baton::block_costs(model, 32, 4);
  const auto causal_plain = baton::block_costs(baton::causal_mask{}, 32, 4);
  for (std::size_t i = 0; i < both.size(); ++i) CHECK(both[i] == Approx(3 * window[i] + causal_plain[i]));
}

TEST_CASE("balance: zigzag, contiguous and per-document zigzag positions over any length", "[cp][balance]") {
  // 10 tokens, 4 chunks: edges floor(c * 10 / 4) = 0, 2, 5, 7, 10.
  // chunks of 3 3 2 2 and 4 3 3 tokens: sequence_sharding's layouts, token for token
  CHECK(baton::zigzag_positions(10, 2) == positions_per_rank{{0, 1, 2, 8, 9}, {3, 4, 5, 6, 7}});
  CHECK(baton::contiguous_positions(10, 3) == positions_per_rank{{0, 1, 2, 3}, {4, 5, 6}, {7, 8, 9}});
  for (std::int64_t n : {1, 7, 10, 33})
    for (int ranks : {1, 2, 3, 5})
      for (int r = 0; r < ranks; ++r) {
        CHECK(baton::zigzag_positions(n, ranks)[static_cast<std::size_t>(r)] ==
              baton::sequence_sharding(baton::shard_layout::zigzag, n, ranks).global_positions(r));
        CHECK(baton::contiguous_positions(n, ranks)[static_cast<std::size_t>(r)] ==
              baton::sequence_sharding(baton::shard_layout::contiguous, n, ranks).global_positions(r));
      }
  // Two documents of 8 and 4 tokens over 2 ranks (4 chunks each): 2,2,2,2 and 1,1,1,1.
  const std::vector<std::int64_t> ids{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1};
  CHECK(baton::per_document_zigzag_positions(ids, 2) ==
        positions_per_rank{{0, 1, 6, 7, 8, 11}, {2, 3, 4, 5, 9, 10}});
  // Rounded to blocks of 4: document 0's edges 0, 2->4, 4, 6->8, 8 give rank 0 [0, 4) and
  // rank 1 [4, 8); document 1's edges 8, 9->8, 10->12, 11->12, 12 leave only chunk 1, rank 1's.
  const auto rounded = baton::per_document_zigzag_positions(ids, 2, 4);
  CHECK(rounded == positions_per_rank{{0, 1, 2, 3}, {4, 5, 6, 7, 8, 9, 10, 11}});
}

TEST_CASE("balance: the result is a partition in whole blocks, counts within one, ratios as defined",
          "[cp][balance]") {
  const std::int64_t block = GENERATE(4, 16);
  const std::int64_t seq_len = GENERATE(64, 100, 257, 1000);
  const int ranks = GENERATE(1, 2, 3, 4, 7);
  const auto ids = random_documents(seq_len, 5, 90, static_cast<unsigned>(seq_len + ranks));
  const std::vector<baton::attention_cost> masks{
      baton::causal_mask{}, baton::sliding_window_mask{24, 0}, baton::prefix_lm_mask{seq_len / 3},
      baton::intersect(baton::document_mask(ids), baton::causal_mask{}), baton::document_mask(ids)};
  for (std::size_t m = 0; m < masks.size(); ++m) {
    CAPTURE(block, seq_len, ranks, m);
    const std::span<const baton::attention_cost> one(&masks[m], 1);
    const auto r = baton::balanced_sharding(one, seq_len, ranks, block);
    require_balanced_partition(r, seq_len, ranks, block);
    const auto costs = baton::block_costs(one, seq_len, block);
    CHECK(r.ratio == Approx(ratio_from_blocks(r.positions, costs, block)).epsilon(1e-12));
    CHECK(r.total_cost == Approx(std::accumulate(costs.begin(), costs.end(), 0.0)));
    // the guarantee holds on every instance
    CHECK(r.ratio <= r.guaranteed_ratio + 1e-12);
    // zigzag's ratio: the same tile model over zigzag's positions, recomputed through sharding_costs
    CHECK(r.zigzag_ratio ==
          Approx(baton::balance_ratio(baton::sharding_costs(one, baton::zigzag_positions(seq_len, ranks), seq_len, block))));
    CHECK(r.contiguous_ratio == Approx(baton::balance_ratio(
                                    baton::sharding_costs(one, baton::contiguous_positions(seq_len, ranks), seq_len, block))));
    // cost_per_rank is the tile model over the returned positions
    const auto recomputed = baton::sharding_costs(one, r.positions, seq_len, block);
    for (int k = 0; k < ranks; ++k)
      CHECK(r.cost_per_rank[static_cast<std::size_t>(k)] == Approx(recomputed[static_cast<std::size_t>(k)]));
    // the improvement pass never makes it worse
    const auto greedy = baton::balanced_sharding(one, seq_len, ranks, block, {.improve = false});
    CHECK(r.ratio <= greedy.ratio + 1e-12);
  }
}

TEST_CASE("balance: more ranks than blocks leaves ranks empty, every block still on one rank", "[cp][balance]") {
  const auto r = baton::balanced_sharding(baton::causal_mask{}, 10, 5, 4);  // 3 blocks: 4, 4, 2 tokens
  require_balanced_partition(r, 10, 5, 4);
  std::size_t empty = 0;
  for (const auto& mine : r.positions) empty += mine.empty() ? 1 : 0;
  CHECK(empty == 2);
  // one block per rank: the most loaded rank holds the heaviest block
  const auto costs = baton::block_costs(baton::causal_mask{}, 10, 4);
  CHECK(*std::max_element(r.cost_per_rank.begin(), r.cost_per_rank.end()) ==
        Approx(*std::max_element(costs.begin(), costs.end())));
}

TEST_CASE("balance: within the proven bound of the brute-force optimum on small instances", "[cp][balance]") {
  int instances = 0, optimal = 0;
  double worst = 1.0;
  const auto check_instance = [&](const std::vector<double>& costs, std::int64_t seq_len, std::int64_t block,
                                  int ranks) {
    const auto r = baton::balanced_sharding_from_costs(costs, seq_len, ranks, block);
    const double alg = *std::max_element(r.cost_per_rank.begin(), r.cost_per_rank.end());
    const double opt = brute_force_optimum(costs, ranks);
    const double total = std::accumulate(costs.begin(), costs.end(), 0.0);
    const double average = total / ranks;
    const double slack = 1e-9 * std::max(1.0, opt);
    CAPTURE(costs, ranks, alg, opt);
    REQUIRE(alg >= opt - slack);  // the oracle's optimum is a true lower bound of any feasible result
    // The bound, as stated in docs/context-parallel.md: max <= average + (1 - 1/R) * spread,
    // hence max <= (2 - 1/R) * OPT.
    REQUIRE(alg <= average + (1.0 - 1.0 / ranks) * layered_spread(costs, ranks) + slack);
    REQUIRE(alg <= (2.0 - 1.0 / ranks) * opt + slack);
    ++instances;
    if (alg <= opt + slack) ++optimal;
    if (opt > 0) worst = std::max(worst, alg / opt);
  };
  std::mt19937 gen(17);
  const std::int64_t block = 4;
  for (int n = 6; n <= 10; ++n) {
    const std::int64_t seq_len = n * block - (n % 2);  // odd n: a short last block
    for (int ranks = 2; ranks <= 3; ++ranks) {
      const std::vector<baton::attention_cost> fixed{
          baton::causal_mask{}, baton::sliding_window_mask{6, 0}, baton::prefix_lm_mask{seq_len / 2},
          baton::sliding_window_mask{3, 3}};
      for (const auto& m : fixed) check_instance(baton::block_costs(std::span(&m, 1), seq_len, block), seq_len, block, ranks);
      for (unsigned seed = 0; seed < 12; ++seed) {
        const auto ids = random_documents(seq_len, 1, 3 * block, seed * 31 + static_cast<unsigned>(n * 7 + ranks));
        check_instance(baton::block_costs(baton::intersect(baton::document_mask(ids), baton::causal_mask{}), seq_len,
                                          block, {.full = 1.0, .partial = 1.5}),
                       seq_len, block, ranks);
        check_instance(baton::block_costs(baton::document_mask(ids), seq_len, block), seq_len, block, ranks);
      }
      // Arbitrary costs, including a few dominant blocks: what the masks above cannot produce.
      std::uniform_real_distribution<double> uniform(0.0, 1.0);
      for (int t = 0; t < 12; ++t) {
        std::vector<double> costs(static_cast<std::size_t>(n));
        for (auto& c : costs) c = t % 3 == 0 ? std::floor(10 * uniform(gen)) : std::pow(uniform(gen), 4.0) * 100;
        check_instance(costs, seq_len, block, ranks);
      }
    }
  }
  std::printf("balance vs brute force: %d instances, optimal on %d (%.0f%%), worst max/OPT %.4f\n", instances, optimal,
              100.0 * optimal / instances, worst);
  REQUIRE(instances == 5 * 2 * (4 + 24 + 12));
  // Not a guarantee, a regression guard: the improvement pass finds the optimum on 96% of
  // these (384 of 400); a broken pass would fall far below.
  CHECK(optimal * 100 >= instances * 85);
}

TEST_CASE("balance: several masks balance exactly as their summed cost vector does", "[cp][balance]") {
  const std::int64_t seq_len = 2000, block = 32;
  const int ranks = 4;
  const std::vector<baton::attention_cost> model{{baton::sliding_window_mask{256, 0}, 3.0}, {baton::causal_mask{}, 1.0}};
  const auto together = baton::balanced_sharding(model, seq_len, ranks, block);
  const auto window = baton::block_costs(baton::sliding_window_mask{256, 0}, seq_len, block);
  const auto causal = baton::block_costs(baton::causal_mask{}, seq_len, block);
  std::vector<double> summed(window.size());
  for (std::size_t i = 0; i < summed.size(); ++i) summed[i] = 3 * window[i] + causal[i];
  const auto from_costs = baton::balanced_sharding_from_costs(summed, seq_len, ranks, block);
  CHECK(together.positions == from_costs.positions);
  CHECK(together.ratio == Approx(from_costs.ratio));
  CHECK(together.ratio == Approx(ratio_from_blocks(together.positions, summed, block)));
  // and it is not the balance of either mask alone
  const auto causal_only = baton::balanced_sharding(baton::causal_mask{}, seq_len, ranks, block);
  CHECK(together.positions != causal_only.positions);
  // deterministic
  CHECK(baton::balanced_sharding(model, seq_len, ranks, block).positions == together.positions);
}

TEST_CASE("balance: causal is balanced at least as well as zigzag", "[cp][balance]") {
  const std::int64_t seq_len = GENERATE(8192, 8000);
  const int ranks = GENERATE(2, 4, 8);
  const auto r = baton::balanced_sharding(baton::causal_mask{}, seq_len, ranks, 64);
  CAPTURE(seq_len, ranks, r.ratio, r.zigzag_ratio, r.contiguous_ratio);
  CHECK(r.ratio <= 1.01);
  CHECK(r.ratio <= r.guaranteed_ratio);
  // Where 2R whole blocks divide the sequence zigzag is itself a whole-block sharding, and
  // the balance is at least as good. Elsewhere zigzag cuts its chunks at token granularity,
  // which whole blocks cannot match exactly (8000 tokens, R = 8: 1.0017 against 1.0000).
  if (seq_len % (2 * ranks * 64) == 0) CHECK(r.ratio <= r.zigzag_ratio + 1e-9);
  else CHECK(r.ratio <= r.zigzag_ratio + 0.002);
  CHECK(r.contiguous_ratio > 1.4);  // the comparison is computed, not defaulted
}

TEST_CASE("balance: packed documents beat per-document zigzag", "[cp][balance]") {
  const std::int64_t seq_len = 8192, block = 64;
  const int ranks = 8;
  for (unsigned seed = 1; seed <= 5; ++seed) {
    const auto ids = random_documents(seq_len, 64, 1024, seed);
    const auto mask = baton::intersect(baton::document_mask(ids), baton::causal_mask{});
    const auto r = baton::balanced_sharding(mask, seq_len, ranks, block);
    const double per_doc = baton::balance_ratio(
        baton::sharding_costs(mask, baton::per_document_zigzag_positions(ids, ranks, block), seq_len, block));
    CAPTURE(seed, r.ratio, per_doc, r.zigzag_ratio);
    CHECK(r.ratio < per_doc);
    CHECK(r.ratio <= r.zigzag_ratio);
    CHECK(r.ratio <= 1.05);
  }
}

namespace {
// Maximal stretches of consecutive blocks on one rank, summed over ranks.
std::int64_t runs(const baton::balanced_sharding_result& r) {
  std::int64_t count = 0;
  for (const auto& mine : r.blocks)
    for (std::size_t i = 0; i < mine.size(); ++i) count += i == 0 || mine[i] != mine[i - 1] + 1 ? 1 : 0;
  return count;
}
}  // namespace

TEST_CASE("balance: equal-cost blocks are swapped to join runs, moving no work", "[cp][balance]") {
  // Four equal blocks over 2 ranks: layered LPT deals 0, 1 then 2, 3 alternately (4 runs);
  // swapping blocks 1 and 2 gives {0, 1} and {2, 3}.
  const std::vector<double> flat{1, 1, 1, 1};
  const auto joined = baton::balanced_sharding_from_costs(flat, 16, 2, 4);
  CHECK(joined.blocks == positions_per_rank{{0, 1}, {2, 3}});
  baton::balance_options no_ties;
  no_ties.contiguous_ties = false;
  CHECK(baton::balanced_sharding_from_costs(flat, 16, 2, 4, no_ties).blocks == positions_per_rank{{0, 2}, {1, 3}});
  // On packed documents: the same cost on every rank, no more runs than without the pass.
  for (unsigned seed = 1; seed <= 3; ++seed) {
    const auto ids = random_documents(8192, 64, 1024, seed);
    const auto mask = baton::intersect(baton::document_mask(ids), baton::causal_mask{});
    const auto with = baton::balanced_sharding(mask, 8192, 8, 64);
    const auto without = baton::balanced_sharding(mask, 8192, 8, 64, no_ties);
    require_balanced_partition(with, 8192, 8, 64);
    for (std::size_t r = 0; r < 8; ++r) CHECK(with.cost_per_rank[r] == Approx(without.cost_per_rank[r]));
    CAPTURE(seed, runs(with), runs(without));
    CHECK(runs(with) < runs(without));
  }
}

namespace {
// The ring cost model of balance_options::ring_row_step, computed here from its definition:
// per rank, its blocks' tile costs plus, per block, ring_row_step x rows / block^2 x the number
// of ranks holding a key block that the mask does not classify empty against it.
std::vector<double> ring_costs_by_definition(const baton::balanced_sharding_result& r, const auto& mask,
                                             std::int64_t seq_len, std::int64_t block, double ring_row_step) {
  const std::int64_t n = (seq_len + block - 1) / block;
  const auto tiles = baton::block_costs(mask, seq_len, block);
  std::vector<int> owner(static_cast<std::size_t>(n), -1);
  for (std::size_t k = 0; k < r.positions.size(); ++k)
    for (const std::int64_t p : r.positions[k]) owner[static_cast<std::size_t>(p / block)] = static_cast<int>(k);
  const baton::positions all(0, seq_len);
  std::vector<double> out(r.positions.size(), 0.0);
  for (std::int64_t q = 0; q < n; ++q) {
    const std::int64_t rows = std::min(block, seq_len - q * block);
    std::vector<bool> from(r.positions.size(), false);
    for (std::int64_t k = 0; k < n; ++k)
      if (mask.classify(baton::position_block(all, q * block, rows),
                        baton::position_block(all, k * block, std::min(block, seq_len - k * block))) !=
          baton::block_kind::empty)
        from[static_cast<std::size_t>(owner[static_cast<std::size_t>(k)])] = true;
    const auto ranks_needed = static_cast<double>(std::count(from.begin(), from.end(), true));
    out[static_cast<std::size_t>(owner[static_cast<std::size_t>(q)])] +=
        tiles[static_cast<std::size_t>(q)] +
        ring_row_step * static_cast<double>(rows) / static_cast<double>(block * block) * ranks_needed;
  }
  return out;
}
double most(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
}  // namespace

TEST_CASE("balance: ring_row_step balances the ring's walks of each row as well as the tiles", "[cp][balance]") {
  const std::int64_t seq_len = GENERATE(1000, 4096);
  const int ranks = GENERATE(2, 3, 4);
  const std::int64_t block = 64;
  const double step = 128;
  const auto ids = random_documents(seq_len, 64, seq_len / 4, static_cast<unsigned>(seq_len + ranks));
  const auto documents = baton::intersect(baton::document_mask(ids), baton::causal_mask{});
  const auto check = [&](const auto& mask, const char* name) {
    CAPTURE(seq_len, ranks, name);
    baton::balance_options options;
    options.ring_row_step = step;
    const auto tiles_only = baton::balanced_sharding(mask, seq_len, ranks, block);
    const auto for_ring = baton::balanced_sharding(mask, seq_len, ranks, block, options);
    require_balanced_partition(for_ring, seq_len, ranks, block);
    // ring_row_step 0: the ring costs are the tile costs
    CHECK(tiles_only.ring_cost_per_rank == tiles_only.cost_per_rank);
    CHECK(tiles_only.ring_ratio == tiles_only.ratio);
    // the reported ring costs are the model's, recomputed here from its definition
    const auto by_definition = ring_costs_by_definition(for_ring, mask, seq_len, block, step);
    for (int r = 0; r < ranks; ++r)
      CHECK(for_ring.ring_cost_per_rank[static_cast<std::size_t>(r)] ==
            Approx(by_definition[static_cast<std::size_t>(r)]).epsilon(1e-12));
    CHECK(for_ring.ring_ratio == Approx(most(by_definition) /
                                        (std::accumulate(by_definition.begin(), by_definition.end(), 0.0) / ranks)));
    // cost_per_rank and ratio stay the tile model over the returned positions
    const auto tiles = baton::sharding_costs(mask, for_ring.positions, seq_len, block);
    for (int r = 0; r < ranks; ++r)
      CHECK(for_ring.cost_per_rank[static_cast<std::size_t>(r)] == Approx(tiles[static_cast<std::size_t>(r)]));
    // the pass starts from the tile balance and only lowers the most loaded rank's ring cost
    const double before = most(ring_costs_by_definition(tiles_only, mask, seq_len, block, step));
    CAPTURE(before, most(by_definition), for_ring.ratio, for_ring.ring_ratio);
    CHECK(most(by_definition) <= before + 1e-9);
    // deterministic
    CHECK(baton::balanced_sharding(mask, seq_len, ranks, block, options).positions == for_ring.positions);
    return before - most(by_definition);
  };
  const double documents_gain = check(documents, "documents (causal)");
  check(baton::causal_mask{}, "causal");
  check(baton::sliding_window_mask{200, 0}, "sliding window {200, 0}");
  // On packed documents the tile balance leaves walks to gain: it is strictly lower there.
  CHECK(documents_gain > 0.0);
}

TEST_CASE("balance: ring_row_step on bench_cp's documents lowers the ring's most loaded rank", "[cp][balance]") {
  // bench_cp's instance: 8192 tokens, causal documents of 64..2048 tokens, 2 ranks, blocks of 128.
  std::mt19937 gen(1);
  std::uniform_int_distribution<std::int64_t> length(64, 2048);
  std::vector<std::int64_t> ids;
  for (std::int64_t doc = 0; static_cast<std::int64_t>(ids.size()) < 8192; ++doc)
    ids.insert(ids.end(), static_cast<std::size_t>(std::min(length(gen), 8192 - static_cast<std::int64_t>(ids.size()))), doc);
  const auto mask = baton::intersect(baton::document_mask(ids), baton::causal_mask{});
  baton::balance_options options;
  options.ring_row_step = 128;
  const auto tiles_only = baton::balanced_sharding(mask, 8192, 2, 128);
  const auto for_ring = baton::balanced_sharding(mask, 8192, 2, 128, options);
  const double before = most(ring_costs_by_definition(tiles_only, mask, 8192, 128, 128));
  const double after = most(for_ring.ring_cost_per_rank);
  CAPTURE(before, after, tiles_only.ratio, for_ring.ratio, for_ring.ring_ratio);
  // 288 -> 273 block units when this was written (the ring's CPU time: 4-8 % apart between
  // the ranks before, docs/context-parallel.md); a pass that did nothing would leave 288.
  CHECK(after <= 0.97 * before);
  CHECK(for_ring.ring_ratio <= 1.01);
}

TEST_CASE("balance: bad input is a cp_error naming the fix", "[cp][balance]") {
  const baton::causal_mask causal;
  REQUIRE_THROWS_AS(baton::balanced_sharding(causal, 64, 0, 4), baton::cp_error);
  REQUIRE_THROWS_WITH(baton::balanced_sharding(causal, 64, 0, 4), Catch::Contains("ranks 0 must be >= 1"));
  REQUIRE_THROWS_WITH(baton::balanced_sharding(causal, 64, 2, 0), Catch::Contains("kernel's tile size"));
  REQUIRE_THROWS_WITH(baton::balanced_sharding(causal, 0, 2, 4), Catch::Contains("sequence length 0 must be >= 1"));
  REQUIRE_THROWS_WITH(baton::block_costs(causal, 64, 4, {.full = -1.0, .partial = 1.0}), Catch::Contains(">= 0"));
  REQUIRE_THROWS_WITH(baton::attention_cost(causal, -2.0), Catch::Contains("layer count"));
  REQUIRE_THROWS_WITH(baton::balanced_sharding(std::vector<baton::attention_cost>{}, 64, 2, 4),
                      Catch::Contains("pass at least one"));
  // a document mask shorter than the sequence: the mask's own problem, as a cp_error
  const baton::document_mask short_mask(std::vector<std::int64_t>(10, 0));
  REQUIRE_THROWS_AS(baton::balanced_sharding(short_mask, 64, 2, 4), baton::cp_error);
  REQUIRE_THROWS_WITH(baton::balanced_sharding(short_mask, 64, 2, 4), Catch::Contains("give one segment id per global position"));
  const std::vector<double> three{1, 2, 3};
  REQUIRE_THROWS_WITH(baton::balanced_sharding_from_costs(three, 64, 2, 4), Catch::Contains("pass one cost per block"));
  const std::vector<double> nan_cost{1, std::nan(""), 3};
  REQUIRE_THROWS_WITH(baton::balanced_sharding_from_costs(nan_cost, 12, 2, 4), Catch::Contains("finite and >= 0"));
  REQUIRE_THROWS_WITH(baton::sharding_costs(causal, positions_per_rank{{0, 70}}, 64, 4), Catch::Contains("outside the sequence"));
  for (const double bad : {-1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    baton::balance_options options;
    options.ring_row_step = bad;
    REQUIRE_THROWS_AS(baton::balanced_sharding(causal, 64, 2, 4, options), baton::cp_error);
    REQUIRE_THROWS_WITH(baton::balanced_sharding(causal, 64, 2, 4, options), Catch::Contains("ring_row_step"));
  }
  baton::balance_options for_ring;
  for_ring.ring_row_step = 128;
  const std::vector<double> four{1, 2, 3, 4};
  REQUIRE_THROWS_WITH(baton::balanced_sharding_from_costs(four, 16, 2, 4, for_ring), Catch::Contains("pass the masks"));
}

TEST_CASE("docs: balancing any mask", "[cp][balance][docs]") {
  const auto segment_ids = random_documents(4096, 64, 1024, 3);
  // [doc:balance]
  // Packed documents, causal within each: deal blocks of 64 tokens to 4 ranks.
  const auto mask = baton::intersect(baton::document_mask(segment_ids), baton::causal_mask{});
  const baton::balanced_sharding_result balanced = baton::balanced_sharding(mask, /*seq_len=*/4096, /*ranks=*/4, /*block=*/64);
  // balanced.positions[r]: rank r's global positions, ascending, whole blocks
  // balanced.ratio: most loaded rank / average (1 = perfect); balanced.zigzag_ratio: zigzag's

  // A model with 3 sliding-window layers for each global causal layer balances their sum.
  const std::vector<baton::attention_cost> model{{baton::sliding_window_mask{1024, 0}, 3}, {baton::causal_mask{}, 1}};
  const baton::balanced_sharding_result mixed = baton::balanced_sharding(model, 4096, 4, 64);

  // For ring or hybrid attention, price each ring step's walk of a query row too (128 suits the
  // CPU flash backend): ring_balanced.ring_ratio is the balance under that model.
  baton::balance_options for_ring;
  for_ring.ring_row_step = 128;
  const baton::balanced_sharding_result ring_balanced = baton::balanced_sharding(mask, 4096, 4, 64, for_ring);
  // [/doc:balance]
  require_balanced_partition(balanced, 4096, 4, 64);
  require_balanced_partition(mixed, 4096, 4, 64);
  CHECK(balanced.ratio <= balanced.guaranteed_ratio);
  CHECK(balanced.ratio < balanced.zigzag_ratio);
  CHECK(mixed.ratio <= 1.05);
  require_balanced_partition(ring_balanced, 4096, 4, 64);
  CHECK(ring_balanced.ring_ratio <= 1.05);
  CHECK(ring_balanced.ring_cost_per_rank != ring_balanced.cost_per_rank);  // the walks are counted
}
