// partition: the least bottleneck against a brute force over every cut of small chains; the
// memory cap; non-uniform models (embedding and head) where partition + synthesize beat 1F1B
// and ZB1P on an even cut; bad input.
#include <baton/schedule.hpp>

#include "catch.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <vector>

namespace {

// Every way to cut n layers into k non-empty contiguous stages, as first_layer vectors.
void every_cut(int n, int k, std::vector<int>& first, const std::function<void(const std::vector<int>&)>& visit) {
  const int made = static_cast<int>(first.size()) - 1;  // stages whose start is fixed
  if (made == k - 1) {
    first.push_back(n);
    visit(first);
    first.pop_back();
    return;
  }
  for (int next = first.back() + 1; next <= n - (k - 1 - made); ++next) {
    first.push_back(next);
    every_cut(n, k, first, visit);
    first.pop_back();
  }
}

double deterministic(int seed, int i) {
  return 0.1 + static_cast<double>((seed * 7919 + i * 104729) % 97) / 40.0;
}

}  // namespace

TEST_CASE("partition: the least bottleneck of a brute force over every cut, with and without a memory cap",
          "[planner][partition]") {
  int checked = 0;
  for (int seed = 1; seed <= 6; ++seed)
    for (int n : {4, 7, 10})
      for (int k : {2, 3, 4}) {
        if (k > n) continue;
        std::vector<baton::layer_cost> layers;
        std::vector<double> memory;
        for (int i = 0; i < n; ++i) {
          layers.push_back({deterministic(seed, i), deterministic(seed + 1, i), deterministic(seed + 2, i)});
          memory.push_back(deterministic(seed + 3, i));
        }
        double total_memory = 0;
        for (double m : memory) total_memory += m;
        for (double cap : {std::numeric_limits<double>::infinity(), total_memory / k * 1.3}) {
          double best = std::numeric_limits<double>::infinity();
          std::vector<int> first{0};
          every_cut(n, k, first, [&](const std::vector<int>& cut) {
            double bottleneck = 0;
            for (int s = 0; s < k; ++s) {
              double time = 0, mem = 0;
              for (int l = cut[static_cast<std::size_t>(s)]; l < cut[static_cast<std::size_t>(s) + 1]; ++l) {
                time += layers[static_cast<std::size_t>(l)].forward + layers[static_cast<std::size_t>(l)].backward_input +
                        layers[static_cast<std::size_t>(l)].backward_weight;
                mem += memory[static_cast<std::size_t>(l)];
              }
              if (mem > cap) return;
              bottleneck = std::max(bottleneck, time);
            }
            best = std::min(best, bottleneck);
          });
          INFO("seed " << seed << ", " << n << " layers, " << k << " stages, cap " << cap);
          if (best == std::numeric_limits<double>::infinity()) {
            CHECK_THROWS_AS(baton::partition(layers, memory, k, 1, cap), baton::schedule_error);
            continue;
          }
          const auto result = baton::partition(layers, memory, k, 1, cap);
          CHECK(result.bottleneck == Approx(best).epsilon(1e-12));
          REQUIRE(result.stages() == k);
          CHECK(result.first_layer.front() == 0);
          CHECK(result.first_layer.back() == n);
          // The cost model holds the stage sums, and every stage fits the cap.
          double slowest = 0;
          for (int s = 0; s < k; ++s) {
            const auto u = static_cast<std::size_t>(s);
            CHECK(result.first_layer[u] < result.first_layer[u + 1]);
            slowest = std::max(slowest, result.costs.forward[u] + result.costs.backward_input[u] + result.costs.backward_weight[u]);
            CHECK(result.costs.activation[u] <= cap * (1 + 1e-12));
          }
          CHECK(slowest == Approx(best).epsilon(1e-12));
          ++checked;
        }
      }
  CHECK(checked >= 60);
}

TEST_CASE("synthesize beats 1F1B and matches ZB1P, both optimal, when the embedding's stage costs half and the head's 1.5 times a block's",
          "[planner][synthesize][uneven]") {
  baton::cost_model costs;
  costs.forward = costs.backward_input = costs.backward_weight = {0.5, 1.0, 1.0, 1.5};
  costs.backward = {1.0, 2.0, 2.0, 3.0};
  const baton::schedule_shape shape{4, 1, 16};
  const auto one_f_one_b = baton::simulate(baton::one_f_one_b::generate(shape), costs);
  const double zb1p = baton::simulate(baton::zb1p::generate(shape), costs).makespan;
  const double cap = one_f_one_b.peak_activation();
  const auto plan = baton::synthesize(shape, costs, cap);
  INFO("1F1B " << one_f_one_b.makespan << ", ZB1P " << zb1p << ", planned " << plan.makespan << ", bound "
               << plan.lower_bound);
  CHECK(plan.makespan < one_f_one_b.makespan - 1e-9);
  CHECK(plan.makespan <= zb1p + 1e-9);
  // The head's rank has 16 x 4.5 = 72 of work and waits 0.5 + 1 + 1 for its first input: 74.5
  // is the bound, and the plan (like ZB1P, whose deferred W fill exactly the head's waits)
  // reaches it. With the stages as given nothing beats ZB1P; moving layers (next case) does.
  CHECK(plan.lower_bound == Approx(74.5));
  CHECK(plan.makespan == Approx(plan.lower_bound));
  CHECK(plan.proven_optimal);
}

TEST_CASE("partition + synthesize beat 1F1B and ZB1P on an even cut of a model with a light embedding and a heavy head",
          "[planner][partition][synthesize][uneven]") {
  // 32 layers on 4 ranks: the embedding (a lookup: 0.2 of a block), 30 blocks and the head
  // (norm and vocabulary projection: 4.8 blocks). Cut by count (8 layers each), the head's rank
  // carries 11.8 blocks against 7.2 on the embedding's: the "last stage 1.5x slower" of many
  // real pipelines.
  std::vector<baton::layer_cost> layers{{0.2, 0.2, 0.2}};
  std::vector<double> memory{0.2};
  for (int i = 0; i < 30; ++i) {
    layers.push_back({1, 1, 1});
    memory.push_back(1);
  }
  layers.push_back({4.8, 4.8, 4.8});
  memory.push_back(2);
  const int p = 4, m = 16;
  const auto even = baton::stage_costs(layers, memory, {0, 8, 16, 24, 32});
  const baton::schedule_shape shape{p, 1, m};
  const auto one_f_one_b = baton::simulate(baton::one_f_one_b::generate(shape), even);
  const double zb1p = baton::simulate(baton::zb1p::generate(shape), even).makespan;
  const double cap = one_f_one_b.peak_activation();

  // Without microbatches: the least bottleneck, 9 blocks' F + I + W (embedding + 8, 9, 9,
  // 4 + head = 8.2, 9, 9, 8.8 blocks).
  CHECK(baton::partition(layers, memory, p, 1, cap).bottleneck == Approx(27.0));
  // With them, the cut that simulates fastest: the embedding's stage lighter in activations
  // (7.2 blocks), so that its rank holds 4 microbatches under the cap, at a bottleneck of 9.8.
  const auto cut = baton::partition(layers, memory, p, 1, cap, m);
  CHECK(cut.first_layer == std::vector<int>{0, 8, 17, 26, 32});
  CHECK(cut.bottleneck == Approx(29.4));
  const auto plan = baton::synthesize(shape, cut.costs, cap);
  INFO("1F1B " << one_f_one_b.makespan << ", ZB1P " << zb1p << ", planned " << plan.makespan);
  // Per microbatch the slowest stage goes from 11.8 blocks to 9.8: 17 % less. Measured: the
  // plan takes 0.84 of ZB1P's makespan, 0.78 of 1F1B's, and reaches its bound (gap 1).
  // 0.88 and 0.82 leave room for a change of rule, none for losing the cut's gain.
  CHECK(plan.makespan < 0.82 * one_f_one_b.makespan);
  CHECK(plan.makespan < 0.88 * zb1p);
  CHECK(plan.gap <= 1.01);
  for (double peak : plan.peak_memory) CHECK(peak <= cap + 1e-9);
}

TEST_CASE("partition: bad input throws schedule_error naming the fix", "[planner][partition][errors]") {
  const std::vector<baton::layer_cost> layers(3, baton::layer_cost{1, 1, 1});
  const std::vector<double> memory(3, 1.0);
  const double no_cap = std::numeric_limits<double>::infinity();
  CHECK_THROWS_WITH(baton::partition(layers, memory, 4, 1, no_cap),
                    Catch::Matchers::Contains("4 stages (ranks x stages_per_rank) but only 3 layers") &&
                        Catch::Matchers::Contains("use fewer ranks"));
  CHECK_THROWS_WITH(baton::partition(layers, memory, 2, 1, 0.5),
                    Catch::Matchers::Contains("no cut into 2 stages") && Catch::Matchers::Contains("raise memory_cap"));
  std::vector<baton::layer_cost> negative = layers;
  negative[1].backward_weight = -1;
  CHECK_THROWS_WITH(baton::partition(negative, memory, 2, 1, no_cap),
                    Catch::Matchers::Contains("layer 1 has a negative") && Catch::Matchers::Contains("must be finite and >= 0"));
  CHECK_THROWS_WITH(baton::partition(layers, std::vector<double>(2, 1.0), 2, 1, no_cap),
                    Catch::Matchers::Contains("give one per layer"));
  CHECK_THROWS_WITH(baton::partition(layers, memory, 0, 1, no_cap), Catch::Matchers::Contains("must be at least 1"));
}
