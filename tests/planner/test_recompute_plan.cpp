// synthesize_with_recompute (issue 29): the options and schedule it chooses against a brute
// force that plans every assignment of options with synthesize(); plans that fit a cap in bytes
// (checked by simulating the plan independently); a lower bound no plan beats; bad input.
// Tagged [memory]: ctest runs these cases as test_planner.memory (label memory).
// [doc:recompute_plan]
#include <baton/schedule.hpp>

#include <iostream>
// [/doc:recompute_plan]

#include "catch.hpp"
#include "doc_output.hpp"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace recompute_plan_test {

constexpr double GiB = 1024.0 * 1024 * 1024;
// Makespans are sums of a few dozen costs of order 1: 1e-9 is far above their rounding.
constexpr double tol = 1e-9;

// The costs of one assignment, built here from the menu's definition (T_I and T_B pay the
// recompute time, activation = saved bytes), independently of the planner's own.
baton::cost_model costs_of(const baton::cost_model& base, const baton::recompute_menu& menu, const std::vector<int>& choice) {
  baton::cost_model c = base;
  c.backward_input.clear();
  c.backward.clear();
  c.activation.clear();
  c.forward.clear();
  c.backward_weight.clear();
  for (std::size_t s = 0; s < choice.size(); ++s) {
    const auto& o = (menu.size() == 1 ? menu[0] : menu[s])[static_cast<std::size_t>(choice[s])];
    const int st = static_cast<int>(s);
    c.forward.push_back(base.cost(baton::action_kind::forward, st));
    c.backward_weight.push_back(base.cost(baton::action_kind::backward_weight, st));
    c.backward_input.push_back(base.cost(baton::action_kind::backward_input, st) + o.extra_backward_input);
    c.backward.push_back(base.cost(baton::action_kind::backward, st) + o.extra_backward_input);
    c.activation.push_back(o.saved_bytes);
  }
  return c;
}

struct brute_force {
  double makespan = std::numeric_limits<double>::infinity();
  double least_bound = std::numeric_limits<double>::infinity();
};

// Every assignment of options (one fixed part for all ranks): those whose ranks hold their
// fixed part and one microbatch per stage under the cap are planned with synthesize() under
// the room cap - fixed; the fastest wins.
brute_force plan_every_assignment(const baton::schedule_shape& shape, const baton::cost_model& base,
                                  const baton::recompute_menu& menu, double cap, double fixed) {
  brute_force best;
  const int S = shape.num_stages();
  std::vector<int> choice(static_cast<std::size_t>(S), 0);
  while (true) {
    const baton::cost_model c = costs_of(base, menu, choice);
    if (fixed + baton::least_memory_cap(shape, c) <= cap) {
      best.makespan = std::min(best.makespan, baton::synthesize(shape, c, cap - fixed).makespan);
      best.least_bound = std::min(best.least_bound, baton::makespan_lower_bound(shape, c, cap - fixed));
    }
    int s = 0;
    for (; s < S; ++s) {
      int& k = choice[static_cast<std::size_t>(s)];
      if (++k < static_cast<int>((menu.size() == 1 ? menu[0] : menu[static_cast<std::size_t>(s)]).size())) break;
      k = 0;
    }
    if (s == S) return best;
  }
}

// The plan's own program simulated under the costs its choice implies: per rank, fixed + peak
// saved bytes must fit.
void check_plan_fits(const baton::recompute_plan& plan, const baton::schedule_shape& shape, const baton::cost_model& base,
                     const baton::recompute_menu& menu, double cap, const std::vector<double>& fixed) {
  REQUIRE(plan.choice.size() == static_cast<std::size_t>(shape.num_stages()));
  const baton::simulation sim = baton::simulate(plan.prog, costs_of(base, menu, plan.choice));
  CHECK(sim.makespan == Approx(plan.makespan).epsilon(tol));
  for (int r = 0; r < shape.ranks; ++r) {
    const double f = fixed.size() == 1 ? fixed[0] : fixed[static_cast<std::size_t>(r)];
    const double peak = f + sim.ranks[static_cast<std::size_t>(r)].peak_activation;
    CHECK(peak <= cap * (1 + tol));
    CHECK(plan.peak_bytes[static_cast<std::size_t>(r)] == Approx(peak).epsilon(tol));
  }
  CHECK(plan.lower_bound <= plan.makespan + tol);
  CHECK(std::isfinite(plan.gap));
  CHECK(plan.gap >= 1 - tol);
}

// Uneven stages (a light first one, a heavy last one) with messages, and per-stage menus.
baton::cost_model uneven_stages(int stages) {
  baton::cost_model c;
  c.forward.clear();
  c.backward_input.clear();
  c.backward_weight.clear();
  c.backward.clear();
  for (int s = 0; s < stages; ++s) {
    const double w = s == 0 ? 0.6 : s + 1 == stages ? 1.5 : 1.0;
    c.forward.push_back(w);
    c.backward_input.push_back(w);
    c.backward_weight.push_back(0.8 * w);
    c.backward.push_back(1.8 * w);
  }
  c.communication = 0.1;
  return c;
}

baton::recompute_menu two_options(int stages) {
  baton::recompute_menu menu;
  for (int s = 0; s < stages; ++s)
    menu.push_back({{"none", (2.0 + 0.5 * s) * GiB, 0.0}, {"full", 0.5 * GiB, 0.7 + 0.1 * s}});
  return menu;
}

}  // namespace recompute_plan_test

using namespace recompute_plan_test;

TEST_CASE("synthesize_with_recompute equals planning every assignment of options with synthesize, on small shapes",
          "[planner][memory]") {
  const double fixed = 1.0 * GiB;
  for (const baton::schedule_shape shape : {baton::schedule_shape{2, 1, 2}, baton::schedule_shape{2, 1, 4},
                                            baton::schedule_shape{3, 1, 3}, baton::schedule_shape{2, 2, 2, baton::placement::v}}) {
    const int S = shape.num_stages();
    const baton::cost_model base = uneven_stages(S);
    const baton::recompute_menu menu = two_options(S);
    // Caps from "one full microbatch per stage" (the least) to "none everywhere, deep".
    for (double cap_gib : {2.5, 3.6, 5.0, 8.0, 20.0}) {
      const double cap = cap_gib * GiB;
      DYNAMIC_SECTION("shape " << shape.ranks << "x" << shape.stages_per_rank << ", m " << shape.microbatches << ", cap "
                               << cap_gib << " GiB") {
        const brute_force oracle = plan_every_assignment(shape, base, menu, cap, fixed);
        if (!std::isfinite(oracle.makespan)) {
          CHECK_THROWS_AS(baton::synthesize_with_recompute(shape, base, menu, {cap, {fixed}}), baton::schedule_error);
          continue;
        }
        const baton::recompute_plan plan = baton::synthesize_with_recompute(shape, base, menu, {cap, {fixed}});
        INFO(plan.method << "; bound: " << plan.bound_method);
        CHECK(plan.method.rfind("exhaustive", 0) == 0);
        CHECK(plan.makespan == Approx(oracle.makespan).epsilon(tol));
        CHECK(plan.lower_bound == Approx(oracle.least_bound).epsilon(tol));
        check_plan_fits(plan, shape, base, menu, cap, {fixed});
        // The greedy search plans some of the same assignments: never better than the optimum
        // over them, and its relaxed bound is no more than the least bound over every assignment.
        baton::recompute_search_options greedy;
        greedy.max_exhaustive_assignments = 0;
        greedy.max_bound_assignments = 0;
        const baton::recompute_plan quick = baton::synthesize_with_recompute(shape, base, menu, {cap, {fixed}}, greedy);
        CHECK(quick.method.rfind("greedy", 0) == 0);
        CHECK(quick.bound_method.rfind("relaxed", 0) == 0);
        CHECK(quick.makespan >= oracle.makespan - tol);
        CHECK(quick.lower_bound <= oracle.least_bound + tol);
        check_plan_fits(quick, shape, base, menu, cap, {fixed});
      }
    }
  }
}

TEST_CASE("synthesize_with_recompute under a cap that rules out 'none' everywhere: the plan fits and states its gap",
          "[planner][memory]") {
  const baton::schedule_shape shape{4, 1, 8};
  const baton::cost_model base = baton::cost_model::uniform(1, 1, 1, 0.05);
  const baton::recompute_menu menu{{{"none", 3.0 * GiB, 0.0}, {"selective", 1.5 * GiB, 0.15}, {"full", 0.5 * GiB, 1.0}}};
  const std::vector<int> all_none(4, 0), all_full(4, 2);
  // Rank 3 holds the head: a larger fixed part (per-rank rooms differ, so the planner scales).
  const std::vector<double> fixed{2.0 * GiB, 2.0 * GiB, 2.0 * GiB, 2.5 * GiB};
  const double cap = 4.75 * GiB;  // none needs 2 + 3 = 5 GiB on every rank
  for (int r = 0; r < 4; ++r) CHECK(fixed[static_cast<std::size_t>(r)] + 3.0 * GiB > cap);
  const baton::recompute_plan plan = baton::synthesize_with_recompute(shape, base, menu, {cap, fixed});
  INFO(plan.method << "; chosen: " << plan.option_names[0] << ", " << plan.option_names[1] << ", "
                   << plan.option_names[2] << ", " << plan.option_names[3] << "; makespan " << plan.makespan
                   << ", bound " << plan.lower_bound << ", gap " << plan.gap);
  for (const std::string& name : plan.option_names) CHECK(name != "none");
  check_plan_fits(plan, shape, base, menu, cap, fixed);
  // Spending the room: no slower than full recomputation everywhere under the same rooms (the
  // least room, 2.25 GiB, holds 4 full microbatches on every rank: 1F1B's depth).
  const baton::cost_model full = costs_of(base, menu, all_full);
  CHECK(plan.makespan <= baton::synthesize(shape, full, cap - 2.5 * GiB).makespan + tol);
  // The same with one fixed part, against the brute force.
  const brute_force oracle = plan_every_assignment(shape, base, menu, cap, 2.5 * GiB);
  const baton::recompute_plan uniform_room = baton::synthesize_with_recompute(shape, base, menu, {cap, {2.5 * GiB}});
  CHECK(uniform_room.makespan == Approx(oracle.makespan).epsilon(tol));
  CHECK(plan.makespan <= uniform_room.makespan + tol);  // more room on ranks 0-2 can only help
}

TEST_CASE("synthesize_with_recompute's greedy search on a three-option menu: fits, never loses to one option everywhere",
          "[planner][memory]") {
  const baton::schedule_shape shape{4, 1, 8};  // 3^4 assignments; the search told to be greedy
  const baton::cost_model base = uneven_stages(4);
  const baton::recompute_menu menu{{{"none", 1.5 * GiB, 0.0}, {"selective", 0.8 * GiB, 0.05}, {"full", 0.25 * GiB, 0.4}}};
  const double cap = 6.0 * GiB, fixed = 2.0 * GiB;
  baton::recompute_search_options greedy;
  greedy.max_exhaustive_assignments = 80;
  const baton::recompute_plan plan = baton::synthesize_with_recompute(shape, base, menu, {cap, {fixed}}, greedy);
  INFO(plan.method << "; bound: " << plan.bound_method << "; makespan " << plan.makespan << ", gap " << plan.gap);
  CHECK(plan.method.rfind("greedy + descent", 0) == 0);
  CHECK(plan.assignments == 81);
  CHECK(plan.bound_method == "least over the 81 assignments that fit");
  check_plan_fits(plan, shape, base, menu, cap, {fixed});
  for (int k = 0; k < 3; ++k) {
    const baton::cost_model c = costs_of(base, menu, std::vector<int>(4, k));
    if (fixed + baton::least_memory_cap(shape, c) <= cap)
      CHECK(plan.makespan <= baton::synthesize(shape, c, cap - fixed).makespan + tol);
  }
}

// Each microbatch-stage holding more between its I and W (what W reads) than before its I:
// the plan's peak, counted here by a walk written from that definition, fits the cap.
TEST_CASE("synthesize_with_recompute counts the bytes held between I and W: the plan fits", "[planner][memory]") {
  const baton::schedule_shape shape{4, 1, 6};
  const baton::cost_model base = baton::cost_model::uniform(1, 1, 1, 0.05);
  const baton::recompute_menu menu{{{"none", 2.0 * GiB, 0.0, 2.5 * GiB}, {"full", 0.25 * GiB, 1.0, 1.5 * GiB}}};
  for (double cap_gib : {4.5, 6.5}) {
    INFO("cap " << cap_gib << " GiB, fixed 1 GiB");
    const double cap = cap_gib * GiB, fixed = 1.0 * GiB;
    const baton::recompute_plan plan = baton::synthesize_with_recompute(shape, base, menu, {cap, {fixed}});
    INFO(plan.method << "; " << plan.schedule_method);
    // Live states of rank r: +saved at F; at I the state grows to weight; W frees it.
    const auto peak_of = [&](const baton::program& prog, int r) {
      double live = 0, peak = 0;
      for (const baton::action& a : prog.ranks[static_cast<std::size_t>(r)]) {
        const auto& o = menu[0][static_cast<std::size_t>(plan.choice[static_cast<std::size_t>(a.stage)])];
        if (a.kind == baton::action_kind::forward) live += o.saved_bytes;
        if (a.kind == baton::action_kind::backward_input) live += *o.weight_bytes - o.saved_bytes;
        if (a.kind == baton::action_kind::backward_weight) live -= *o.weight_bytes;
        peak = std::max(peak, live);
      }
      return fixed + peak;
    };
    double naive_peak = 0;  // the same options planned on the saved bytes alone
    const baton::program naive = baton::synthesize(shape, costs_of(base, menu, plan.choice), cap - fixed).prog;
    for (int r = 0; r < 4; ++r) {
      CHECK(peak_of(plan.prog, r) <= cap * (1 + tol));
      CHECK(plan.peak_bytes[static_cast<std::size_t>(r)] == Approx(peak_of(plan.prog, r)).epsilon(tol));
      naive_peak = std::max(naive_peak, peak_of(naive, r));
    }
    // Here a plan blind to the bytes between I and W would not fit: the case tests something.
    if (cap_gib == 4.5) CHECK(naive_peak > cap);
    CHECK(plan.lower_bound <= plan.makespan + tol);
    CHECK(baton::simulate(plan.prog, costs_of(base, menu, plan.choice)).makespan == Approx(plan.makespan).epsilon(tol));
  }
}

TEST_CASE("stage_menu sums the layers' options over partition's cut", "[planner][memory]") {
  // Three layers, two options each: a stage's option j is the sum of its layers' option j.
  const baton::recompute_menu layers{{{"none", 1, 0}, {"full", 0.5, 1, 2.0}},
                                     {{"none", 2, 0}, {"full", 0.25, 2}},
                                     {{"none", 4, 0}, {"full", 0.125, 4, 8.0}}};
  const baton::recompute_menu stages = baton::stage_menu(layers, {0, 2, 3});
  REQUIRE(stages.size() == 2);
  CHECK(stages[0][0].name == "none");
  CHECK(stages[0][0].saved_bytes == 3);
  CHECK(stages[0][1].saved_bytes == 0.75);
  CHECK(stages[0][1].extra_backward_input == 3);
  CHECK(*stages[0][1].weight_bytes == 2.25);  // 2 + the second layer's saved bytes (no weight_bytes given)
  CHECK(*stages[1][1].weight_bytes == 8);
  CHECK_THROWS_WITH(baton::stage_menu(layers, {0, 2, 2, 3}), Catch::Matchers::Contains("every stage non-empty"));
  CHECK_THROWS_WITH(baton::stage_menu(layers, {0, 4}), Catch::Matchers::Contains("from 0 to the number of layers (3)"));
  const baton::recompute_menu ragged{{{"none", 1, 0}, {"full", 0.5, 1}}, {{"none", 2, 0}}};
  CHECK_THROWS_WITH(baton::stage_menu(ragged, {0, 2}), Catch::Matchers::Contains("layer 1 has 1 options but layer 0 has 2"));
}

TEST_CASE("synthesize_with_recompute: bad input throws schedule_error naming the problem and the fix",
          "[planner][memory][errors]") {
  const baton::schedule_shape shape{2, 1, 4};
  const auto base = baton::cost_model::uniform(1, 1, 1);
  const baton::recompute_menu menu{{{"none", 4.0 * GiB, 0}, {"full", 1.0 * GiB, 1}}};
  const baton::memory_budget budget{8.0 * GiB, {2.0 * GiB}};
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, {}, budget), Contains("the recompute menu is empty"));
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, {{}}, budget), Contains("has no options"));
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, {menu[0], menu[0], menu[0]}, budget),
                    Contains("has 3 lists; give one for every stage or one per stage (2)"));
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, {{{"none", -1.0, 0}}}, budget),
                    Contains("option 'none' has saved_bytes -1") && Contains("must be finite and >= 0"));
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, {{{"full", 1.0, std::nan("")}}}, budget),
                    Contains("recompute time must be finite and >= 0"));
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, {{{"", 1.0, 0}}}, budget), Contains("without a name"));
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, menu, {8.0 * GiB, {1.0, 2.0, 3.0}}),
                    Contains("fixed_bytes has 3 values"));
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, menu, {8.0 * GiB, {-5.0}}),
                    Contains("fixed bytes must be finite and >= 0"));
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, menu, {std::nan(""), {0.0}}), Contains("cap_bytes must be > 0"));
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, menu, {0.0, {0.0}}), Contains("cap_bytes must be > 0"));
  // Full everywhere needs 2 + 1 = 3 GiB a rank: 2.5 GiB is refused with that least cap named.
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, menu, {2.5 * GiB, {2.0 * GiB}}),
                    Contains("even keeping the fewest bytes on every stage ('full' on stage 0)") &&
                        Contains("raise cap_bytes to at least 3221225472 bytes (3.000 GiB)"));
  CHECK_NOTHROW(baton::synthesize_with_recompute(shape, base, menu, {3.0 * GiB, {2.0 * GiB}}));
  // A rank whose fixed part is the whole cap has no room, even for an option that keeps nothing.
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, {{{"full", 0.0, 1}}}, {2.0 * GiB, {2.0 * GiB}}),
                    Contains("leaves no room for live state"));
  // What W reads counts too: one microbatch between its I and W holds 5 GiB, so 1 + 5 = 6 GiB.
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, {{{"none", 1.0 * GiB, 0, 5.0 * GiB}}}, {4.0 * GiB, {GiB}}),
                    Contains("one of them between its I and its W; raise cap_bytes to at least 6442450944 bytes"));
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, base, {{{"none", 1.0, 0, -2.0}}}, budget),
                    Contains("option 'none' has weight_bytes -2"));
  baton::cost_model negative = base;
  negative.backward_input = {-1};
  CHECK_THROWS_WITH(baton::synthesize_with_recompute(shape, negative, menu, budget), Contains("costs must be finite and >= 0"));
}

// The figures are the planner's for this input, copied from its output (an unproven plan's
// makespan cannot be derived independently): the comparison detects a change, not an error.
// What is checked independently: the plan fits the cap per rank and beats one option everywhere.
TEST_CASE("docs/schedules.md: spending memory on recomputation (output pinned: detects a change)", "[planner][memory][docs]") {
  baton_test::capture_cout out;
  // [doc:recompute_plan]
  // 4 ranks of one stage, 8 microbatches: T_F = T_I = T_W = 1 ms per microbatch, messages 0.05 ms.
  const baton::schedule_shape shape{4, 1, 8};
  const baton::cost_model costs = baton::cost_model::uniform(1, 1, 1, 0.05);
  // Per policy: the bytes one live microbatch of a stage keeps, and the time its I pays to recompute.
  constexpr double gib = 1024.0 * 1024 * 1024;
  const baton::recompute_menu menu{
      {{"none", 3.0 * gib, 0.0}, {"selective", 1.5 * gib, 0.15}, {"full", 0.5 * gib, 1.0}}};
  // 7 GiB a rank; parameters, gradients and optimiser state take 2 GiB (2.5 GiB with the head).
  const baton::memory_budget budget{7.0 * gib, {2.0 * gib, 2.0 * gib, 2.0 * gib, 2.5 * gib}};
  const baton::recompute_plan plan = baton::synthesize_with_recompute(shape, costs, menu, budget);
  for (int s = 0; s < 4; ++s)
    std::cout << "stage " << s << ": " << plan.option_names[static_cast<std::size_t>(s)] << ", rank peak "
              << plan.peak_bytes[static_cast<std::size_t>(s)] / gib << " GiB\n";
  std::cout << "makespan " << plan.makespan << " ms, lower bound " << plan.lower_bound << " ms, gap " << plan.gap
            << "\n" << plan.method << "\n";
  // The same cap with one policy everywhere: a menu of one option.
  for (const baton::recompute_option& only : menu[0])
    std::cout << only.name << " everywhere: makespan "
              << baton::synthesize_with_recompute(shape, costs, {{only}}, budget).makespan << " ms\n";
  // [/doc:recompute_plan]
  CHECK(out.finish() == baton_test::doc_output(
                            // [doc-output:recompute_plan]
                            R"(
stage 0: full, rank peak 6 GiB
stage 1: selective, rank peak 6.5 GiB
stage 2: selective, rank peak 6.5 GiB
stage 3: none, rank peak 5.5 GiB
makespan 32.35 ms, lower bound 29.65 ms, gap 1.09106
exhaustive: 81 of 81 assignments fit; planned best bound first, 73 cut off by their lower bound
none everywhere: makespan 74.4 ms
selective everywhere: makespan 33.75 ms
full everywhere: makespan 35.15 ms
)"
                            // [/doc-output:recompute_plan]
                            ));
  for (int r = 0; r < 4; ++r) CHECK(plan.peak_bytes[static_cast<std::size_t>(r)] <= budget.cap_bytes);
  for (const baton::recompute_option& only : menu[0])
    CHECK(plan.makespan <= baton::synthesize_with_recompute(shape, costs, {{only}}, budget).makespan);
}
