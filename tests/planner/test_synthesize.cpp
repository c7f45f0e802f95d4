// synthesize and makespan_lower_bound: never worse than the built-in policies under the same
// cap (documentation: the built-ins are candidates of the search, so this holds by
// construction), the gap on the uniform grid, the optimum of an independent exhaustive search
// on small shapes with and without the built-ins, valid programs, and bad input.
// [doc:planner_in_code]
#include <baton/schedule.hpp>
// [/doc:planner_in_code]

#include "catch.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

#if defined(BATON_PLANNER_SMALL_GRID)
constexpr int largest_ranks = 4;
#else
constexpr int largest_ranks = 8;
#endif

// Floating-point slack for comparing makespans: sums of a few hundred costs of order 1.
constexpr double slack = 1e-9;

struct builtin_best {
  double makespan = std::numeric_limits<double>::infinity();
  std::string name;
};

// The best built-in policy of the registry for this shape whose peak fits the cap, found
// here independently of synthesize's own bookkeeping.
builtin_best best_builtin(const baton::schedule_shape& shape, const baton::cost_model& costs, double cap) {
  builtin_best best;
  for (const auto& info : baton::builtin_policies) {
    baton::program prog;
    try {
      prog = info.generate(shape);
    } catch (const baton::schedule_error&) {
      continue;
    }
    if (baton::is_forward_only(prog)) continue;
    const auto sim = baton::simulate(prog, costs);
    if (sim.peak_activation() <= cap + slack && sim.makespan < best.makespan) best = {sim.makespan, std::string(info.name)};
  }
  return best;
}

// ---- the independent oracle: every per-rank order -------------------------------------------

// Times per-rank orders of F/I/W with the simulator's rule (start = max(rank free, input
// there)); -1 when they deadlock or run an I or W before its own F or I. Written from the
// rules in docs/schedules.md, sharing no code with the planner.
double time_orders(const baton::schedule_shape& shape, const baton::cost_model& costs,
                   const std::vector<std::vector<baton::action>>& rows) {
  const int S = shape.num_stages(), M = shape.microbatches;
  std::vector<double> done_f(static_cast<std::size_t>(S * M), -1), done_i(done_f.size(), -1);
  std::vector<std::size_t> pos(rows.size(), 0);
  std::vector<double> clock(rows.size(), 0);
  bool moved = true;
  while (moved) {
    moved = false;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      while (pos[r] < rows[r].size()) {
        const auto& a = rows[r][pos[r]];
        const auto key = static_cast<std::size_t>(a.stage * M + a.microbatch);
        double ready = clock[r];
        const auto arrive = [&](double done, int from) {
          return done + (baton::stage_rank(shape, from) == baton::stage_rank(shape, a.stage) ? 0.0 : costs.communication);
        };
        if (a.kind == baton::action_kind::forward && a.stage > 0) {
          if (done_f[key - static_cast<std::size_t>(M)] < 0) break;
          ready = std::max(ready, arrive(done_f[key - static_cast<std::size_t>(M)], a.stage - 1));
        }
        if (a.kind == baton::action_kind::backward_input) {
          if (done_f[key] < 0) return -1;
          if (a.stage + 1 < S) {
            if (done_i[key + static_cast<std::size_t>(M)] < 0) break;
            ready = std::max(ready, arrive(done_i[key + static_cast<std::size_t>(M)], a.stage + 1));
          }
        }
        if (a.kind == baton::action_kind::backward_weight && done_i[key] < 0) return -1;
        clock[r] = ready + costs.cost(a.kind, a.stage);
        if (a.kind == baton::action_kind::forward) done_f[key] = clock[r];
        if (a.kind == baton::action_kind::backward_input) done_i[key] = clock[r];
        ++pos[r];
        moved = true;
      }
    }
  }
  for (std::size_t r = 0; r < rows.size(); ++r)
    if (pos[r] < rows[r].size()) return -1;
  return *std::max_element(clock.begin(), clock.end());
}

// Every order of one rank's F, I and W (each microbatch's F before its I before its W, any
// interleaving of microbatches and stages) whose live activation stays within the cap.
void orders_of_rank(const baton::schedule_shape& shape, const baton::cost_model& costs, double cap, int rank,
                    std::vector<std::vector<baton::action>>& out) {
  const auto stages = baton::rank_stages(shape, rank);
  const int M = shape.microbatches;
  // progress[stage index][mb]: 0 nothing, 1 F, 2 I, 3 W done
  std::vector<int> progress(stages.size() * static_cast<std::size_t>(M), 0);
  std::vector<baton::action> row;
  const std::size_t total = 3 * stages.size() * static_cast<std::size_t>(M);
  std::function<void(double)> extend = [&](double live) {
    if (row.size() == total) {
      out.push_back(row);
      return;
    }
    for (std::size_t j = 0; j < stages.size(); ++j)
      for (int mb = 0; mb < M; ++mb) {
        int& p = progress[j * static_cast<std::size_t>(M) + static_cast<std::size_t>(mb)];
        if (p == 3) continue;
        const int s = stages[j];
        const double act = costs.activation_of(s);
        if (p == 0 && live + act > cap + slack) continue;
        const baton::action_kind kind = p == 0 ? baton::action_kind::forward
                                        : p == 1 ? baton::action_kind::backward_input
                                                 : baton::action_kind::backward_weight;
        row.push_back({s, kind, mb});
        ++p;
        extend(live + (kind == baton::action_kind::forward ? act : kind == baton::action_kind::backward_weight ? -act : 0.0));
        --p;
        row.pop_back();
      }
  };
  extend(0.0);
}

// The least makespan over every combination of per-rank orders (a cross product: no
// pruning, no ordering assumption).
double exhaustive_optimum(const baton::schedule_shape& shape, const baton::cost_model& costs, double cap) {
  std::vector<std::vector<std::vector<baton::action>>> per_rank(static_cast<std::size_t>(shape.ranks));
  for (int r = 0; r < shape.ranks; ++r) orders_of_rank(shape, costs, cap, r, per_rank[static_cast<std::size_t>(r)]);
  double best = std::numeric_limits<double>::infinity();
  std::vector<std::vector<baton::action>> rows(static_cast<std::size_t>(shape.ranks));
  std::function<void(int)> choose = [&](int r) {
    if (r == shape.ranks) {
      const double t = time_orders(shape, costs, rows);
      if (t >= 0) best = std::min(best, t);
      return;
    }
    for (const auto& order : per_rank[static_cast<std::size_t>(r)]) {
      rows[static_cast<std::size_t>(r)] = order;
      choose(r + 1);
    }
  };
  choose(0);
  return best;
}

}  // namespace

// "Never loses to the best built-in" documents the design (the built-in programs that fit are
// candidates of the search); the gaps are what this case can catch.
TEST_CASE("synthesize: uniform costs, p = 2..8, m = p, 2p, 4p: never loses to the best built-in under the same cap "
          "(by construction), and its gap to the lower bound",
          "[planner][synthesize]") {
  const auto costs = baton::cost_model::uniform(1, 1, 1);
  int cases = 0;
  for (int p = 2; p <= largest_ranks; ++p)
    for (int m : {p, 2 * p, 4 * p}) {
      const baton::schedule_shape shape{p, 1, m};
      const double one_f_one_b_peak = baton::simulate(baton::one_f_one_b::generate(shape), costs).peak_activation();
      // 1F1B's peak (p), and one microbatch less: below every built-in of one stage per rank
      // but zb1p-like orders with less warm-up still fit.
      for (double cap : {one_f_one_b_peak, std::max(1.0, one_f_one_b_peak - 1)}) {
        INFO("p = " << p << ", m = " << m << ", cap = " << cap);
        const auto plan = baton::synthesize(shape, costs, cap);
        const auto builtin = best_builtin(shape, costs, cap);
        CHECK(plan.makespan <= builtin.makespan + slack);
        CHECK(plan.best_builtin_makespan == Approx(builtin.makespan));
        for (double peak : plan.peak_memory) CHECK(peak <= cap + slack);
        // The bound is a bound: no built-in (whatever its memory) beats it.
        CHECK(plan.lower_bound <= plan.makespan + slack);
        if (cap >= one_f_one_b_peak) {
          // At 1F1B's memory the plan is within 5 % of the best possible schedule (measured:
          // it reaches the bound exactly on this grid; 5 % is the promise).
          CHECK(plan.gap <= 1.05);
        } else {
          // One microbatch less: measured gaps 1.0 (p = 2) to 1.14 (p = 4, m = 4), where the
          // bound ignores part of what the cap costs (at p = 3, m = 3 the search proves 14 optimal
          // against a bound of 12). 1.20 guards against a regression of either.
          CHECK(plan.gap <= 1.20);
        }
        ++cases;
      }
    }
  CHECK(cases == 3 * 2 * (largest_ranks - 1));
}

TEST_CASE("synthesize: V shapes (2 stages per rank) never lose to zbv, dual_pipe_v or any V built-in (by construction), "
          "and their gap to the lower bound",
          "[planner][synthesize]") {
  const auto costs = baton::cost_model::uniform(1, 1, 1).per_rank_share(2);
  for (int p : {2, 4, largest_ranks}) {
    for (int m : {p, 2 * p, 4 * p}) {
      const baton::schedule_shape shape{p, 2, m, baton::placement::v};
      const double zbv_peak = baton::simulate(baton::zbv::generate(shape), costs).peak_activation();
      INFO("p = " << p << ", m = " << m << ", cap = " << zbv_peak);
      const auto plan = baton::synthesize(shape, costs, zbv_peak);
      const auto builtin = best_builtin(shape, costs, zbv_peak);
      REQUIRE(std::isfinite(builtin.makespan));
      CHECK(plan.makespan <= builtin.makespan + slack);
      CHECK(plan.gap <= 1.05);  // measured 1.0000 on these shapes
      CHECK(plan.prog.shape == shape);
    }
  }
}

TEST_CASE("synthesize: small shapes reach the optimum of an exhaustive search over every per-rank order, with and "
          "without the built-in programs as candidates",
          "[planner][synthesize][exact]") {
  struct small_case {
    int p, m;
  };
  std::vector<small_case> shapes{{2, 2}, {3, 2}};
#if !defined(BATON_PLANNER_SMALL_GRID)
  shapes.push_back({2, 3});  // 1680 orders per rank, 2.8 million programs
#endif
  baton::cost_model uneven;  // embedding-like first stage, slow last stage, messages that cost
  uneven.forward = {0.5, 1.0, 1.5};
  uneven.backward_input = {0.5, 1.0, 1.5};
  uneven.backward_weight = {0.5, 1.0, 1.5};
  uneven.backward = {1.0, 2.0, 3.0};
  uneven.communication = 0.25;
  for (const auto& [p, m] : shapes)
    for (bool uniform : {true, false}) {
      baton::cost_model costs = baton::cost_model::uniform(1, 1, 1);
      if (!uniform) {
        costs = uneven;
        for (auto* v : {&costs.forward, &costs.backward_input, &costs.backward_weight, &costs.backward})
          v->resize(static_cast<std::size_t>(p));
      }
      for (double cap : {1.0, 2.0, static_cast<double>(p)}) {
        const baton::schedule_shape shape{p, 1, m};
        INFO("p = " << p << ", m = " << m << ", cap = " << cap << (uniform ? ", uniform" : ", uneven"));
        const double optimum = exhaustive_optimum(shape, costs, cap);
        const auto plan = baton::synthesize(shape, costs, cap);
        CHECK(plan.makespan == Approx(optimum).epsilon(1e-12));
        CHECK(plan.proven_optimal);
        CHECK(plan.lower_bound <= optimum + slack);
        baton::synthesis_options without_builtins;
        without_builtins.include_builtins = false;
        const auto own = baton::synthesize(shape, costs, cap, without_builtins);
        CHECK(own.makespan == Approx(optimum).epsilon(1e-12));
        CHECK(own.best_builtin.empty());
      }
    }
}

// Issue 29: with the choice of recomputation per stage added, (p, m) = (2, 2) still has an
// independent optimum: the exhaustive search above over every per-rank order, for each of the
// four assignments of two options (the costs of an assignment written here from the menu's
// definition: T_I and T_B pay the recompute time, the activation is the option's bytes).
TEST_CASE("synthesize_with_recompute: (p, m) = (2, 2) reaches the optimum over every assignment x every per-rank "
          "order, and its bounds are below it",
          "[planner][memory][exact]") {
  const baton::schedule_shape shape{2, 1, 2};
  baton::cost_model base;
  base.forward = {0.5, 1.5};
  base.backward_input = {0.5, 1.5};
  base.backward_weight = {0.5, 1.5};
  base.backward = {1.0, 3.0};
  base.communication = 0.25;
  const baton::recompute_menu menu{{{"none", 2.0, 0.0}, {"full", 1.0, 0.5}}, {{"none", 3.0, 0.0}, {"full", 1.0, 1.25}}};
  for (double cap : {2.5, 3.0, 4.0, 5.0, 7.0}) {
    INFO("cap " << cap << " (fixed 0.5)");
    double optimum = std::numeric_limits<double>::infinity();
    for (int a = 0; a < 4; ++a) {
      const int k0 = a & 1, k1 = a >> 1;
      const auto& o0 = menu[0][static_cast<std::size_t>(k0)];
      const auto& o1 = menu[1][static_cast<std::size_t>(k1)];
      baton::cost_model c = base;
      c.backward_input = {0.5 + o0.extra_backward_input, 1.5 + o1.extra_backward_input};
      c.backward = {1.0 + o0.extra_backward_input, 3.0 + o1.extra_backward_input};
      c.activation = {o0.saved_bytes, o1.saved_bytes};
      if (0.5 + std::max(o0.saved_bytes, o1.saved_bytes) > cap) continue;
      optimum = std::min(optimum, exhaustive_optimum(shape, c, cap - 0.5));
    }
    REQUIRE(std::isfinite(optimum));
    const baton::recompute_plan plan = baton::synthesize_with_recompute(shape, base, menu, {cap, {0.5}});
    CHECK(plan.makespan == Approx(optimum).epsilon(1e-12));
    CHECK(plan.lower_bound <= optimum + slack);
    baton::recompute_search_options relaxed;
    relaxed.max_exhaustive_assignments = 0;
    relaxed.max_bound_assignments = 0;
    const baton::recompute_plan quick = baton::synthesize_with_recompute(shape, base, menu, {cap, {0.5}}, relaxed);
    CHECK(quick.lower_bound <= plan.lower_bound + slack);
    CHECK(quick.makespan >= optimum - slack);
  }
}

TEST_CASE("synthesize: the plan is an ordinary program: valid, lowered, written and read as CSV", "[planner][synthesize]") {
  baton::cost_model costs = baton::cost_model::uniform(1, 1, 1, 0.1);
  costs.forward = {0.5, 1, 1, 1.5};
  for (const baton::schedule_shape shape : {baton::schedule_shape{4, 1, 8}, baton::schedule_shape{2, 2, 6, baton::placement::v}}) {
    const auto plan = baton::synthesize(shape, costs, 4);
    CHECK(baton::is_valid(plan.prog));
    CHECK(baton::is_valid(baton::lower(plan.prog)));
    const auto sim = baton::simulate(plan.prog, costs);
    CHECK(sim.makespan == Approx(plan.makespan));
    CHECK(sim.peak_activation() <= 4 + slack);
    const auto again = baton::csv_schedule::from_string(baton::to_csv(plan.prog)).generate(shape);
    CHECK(again == plan.prog);
    // Deterministic: the same input plans the same program.
    CHECK(baton::synthesize(shape, costs, 4).prog == plan.prog);
  }
}

TEST_CASE("makespan_lower_bound: no built-in beats it, on uneven costs with messages", "[planner][bound]") {
  baton::cost_model costs;
  costs.forward = {0.3, 1.0, 0.7, 1.2, 0.9, 1.6};
  costs.backward_input = {0.4, 1.1, 0.8, 1.0, 1.3, 1.5};
  costs.backward_weight = {0.2, 0.9, 0.6, 1.1, 0.7, 1.4};
  costs.backward = {0.6, 2.0, 1.4, 2.1, 2.0, 2.9};
  costs.communication = 0.15;
  int compared = 0;
  for (const auto& info : baton::builtin_policies) {
    for (const auto& shape : {baton::schedule_shape{6, 1, 12}, baton::schedule_shape{3, 2, 12, baton::placement::v},
                              baton::schedule_shape{3, 2, 12, baton::placement::loop}}) {
      baton::program prog;
      try {
        prog = info.generate(shape);
      } catch (const baton::schedule_error&) {
        continue;
      }
      if (baton::is_forward_only(prog)) continue;
      const auto sim = baton::simulate(prog, costs);
      INFO(info.name);
      CHECK(baton::makespan_lower_bound(shape, costs) <= sim.makespan + slack);
      // With the program's own peak as the cap, the memory terms must not exceed it either.
      CHECK(baton::makespan_lower_bound(shape, costs, sim.peak_activation()) <= sim.makespan + slack);
      ++compared;
    }
  }
  CHECK(compared >= 8);
}

TEST_CASE("synthesize: bad input throws schedule_error naming the fix", "[planner][synthesize][errors]") {
  const auto costs = baton::cost_model::uniform(1, 1, 1);
  CHECK_THROWS_WITH(baton::synthesize({4, 1, 8}, costs, 0.5),
                    Catch::Matchers::Contains("memory_cap 0.5") && Catch::Matchers::Contains("raise memory_cap to at least that"));
  // A V rank holds two stages of one microbatch at once: 2 is the least cap.
  CHECK_THROWS_WITH(baton::synthesize({4, 2, 8, baton::placement::v}, costs, 1.5), Catch::Matchers::Contains("2.000000 here"));
  CHECK(baton::least_memory_cap({4, 2, 8, baton::placement::v}, costs) == 2.0);
  CHECK_THROWS_WITH(baton::synthesize({0, 1, 8}, costs, 4), Catch::Matchers::Contains("must all be at least 1"));
  baton::cost_model negative = costs;
  negative.forward = {-1};
  CHECK_THROWS_WITH(baton::synthesize({4, 1, 8}, negative, 4), Catch::Matchers::Contains("costs must be finite and >= 0"));
  CHECK_THROWS_WITH(baton::synthesize({4, 1, 8}, costs, std::nan("")), Catch::Matchers::Contains("memory_cap must be >= 0"));
}

// 106 and 104 are the planner's figures for this shape, copied from its output (the makespan of
// an unproven plan cannot be derived independently): the checks detect a change, not an error.
TEST_CASE("docs/schedules.md: planning in code (makespan 106, bound 104 pinned: detects a change, not an error)",
          "[planner][docs]") {
  // [doc:planner_in_code]
  // 8 ranks of one stage, 32 microbatches, T_F = T_I = T_W = 1, at most 7 live activations a rank.
  const baton::schedule_shape shape{8, 1, 32};
  const baton::cost_model costs = baton::cost_model::uniform(1, 1, 1);
  const baton::synthesis_result plan = baton::synthesize(shape, costs, /*memory_cap=*/7);
  // plan.prog is an ordinary program: lower(), validate(), to_csv() and the executor take it.
  baton::validate(baton::lower(plan.prog));
  // plan.makespan >= plan.lower_bound; plan.gap = makespan / lower_bound bounds how far from optimal.

  // Stages from a chain of layers: a light embedding, 30 blocks, a heavy head (T_F, T_I, T_W).
  std::vector<baton::layer_cost> layers{{0.2, 0.2, 0.2}};
  std::vector<double> layer_memory{0.2};
  for (int i = 0; i < 30; ++i) {
    layers.push_back({1, 1, 1});
    layer_memory.push_back(1);
  }
  layers.push_back({4.8, 4.8, 4.8});
  layer_memory.push_back(2);
  const baton::partition_result cut = baton::partition(layers, layer_memory, /*ranks=*/4, /*stages_per_rank=*/1,
                                                       /*memory_cap=*/30, /*microbatches=*/16);
  const baton::synthesis_result planned = baton::synthesize({4, 1, 16}, cut.costs, 30);
  // cut.first_layer: where each stage starts; cut.costs: the per-stage cost model it implies.
  // [/doc:planner_in_code]
  CHECK(plan.makespan == Approx(106));
  CHECK(plan.lower_bound == Approx(104));
  CHECK(plan.gap == Approx(106.0 / 104.0));
  CHECK(cut.first_layer.size() == 5);
  CHECK(cut.bottleneck <= 11.8 * 3);  // the even cut's bottleneck: 11.8 blocks' F + I + W
  CHECK(planned.makespan < baton::simulate(baton::zb1p::generate({4, 1, 16}),
                                           baton::stage_costs(layers, layer_memory, {0, 8, 16, 24, 32}))
                               .makespan);
}
