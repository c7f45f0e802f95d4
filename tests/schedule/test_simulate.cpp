// The simulator against closed forms, the zero-bubble claims, memory, costs, and the
// exported pictures.
#include <baton/schedule.hpp>

#include "catch.hpp"

#include <string>
#include <utility>

namespace {

// T_F = 1, T_B = 2 (T_I = T_W = 1), no communication.
baton::cost_model unit_costs() { return baton::cost_model::uniform(1.0, 1.0, 1.0, 0.0); }

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (std::size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// Balanced braces and brackets outside strings: a cheap well-formedness check for JSON.
bool balanced_json(const std::string& text) {
  int depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') ++depth;
    else if (c == '}' || c == ']') {
      if (--depth < 0) return false;
    }
  }
  return depth == 0 && !in_string;
}

}  // namespace

TEST_CASE("GPipe and 1F1B bubble ratio is (p-1)/(m+p-1) exactly", "[schedule][simulate]") {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      INFO("p=" << p << " m=" << m);
      const double expected = static_cast<double>(p - 1) / static_cast<double>(m + p - 1);
      const auto gpipe = baton::simulate(baton::gpipe::generate({p, 1, m}), unit_costs());
      const auto ofob = baton::simulate(baton::one_f_one_b::generate({p, 1, m}), unit_costs());
      CHECK(gpipe.bubble_ratio == expected);
      CHECK(ofob.bubble_ratio == expected);
      CHECK(gpipe.makespan == 3.0 * (m + p - 1));
      CHECK(ofob.makespan == 3.0 * (m + p - 1));
      // Peak live microbatches: GPipe holds all m on every rank, 1F1B holds p on rank 0.
      for (const auto& r : gpipe.ranks) CHECK(r.peak_live == m);
      CHECK(ofob.ranks[0].peak_live == p);
      CHECK(ofob.ranks[static_cast<std::size_t>(p - 1)].peak_live == 1);
      // The lowered program times the same.
      CHECK(baton::simulate(baton::lower(baton::one_f_one_b::generate({p, 1, m})), unit_costs()).makespan ==
            ofob.makespan);
    }
  }
}

TEST_CASE("Interleaved 1F1B with v chunks of cost 1/v: bubble (p-1)/(v m + p-1)", "[schedule][simulate]") {
  for (int v : {2, 3, 4}) {
    for (int p : {2, 4, 8}) {
      for (int m : {p, 2 * p, 4 * p}) {
        INFO("v=" << v << " p=" << p << " m=" << m);
        const auto sim = baton::simulate(baton::interleaved_1f1b::generate({p, v, m}),
                                         unit_costs().per_rank_share(v));
        const double expected = static_cast<double>(p - 1) / static_cast<double>(v * m + p - 1);
        if (v == 3) {
          // Thirds are not exact in binary: allow the rounding of a few hundred additions.
          CHECK(sim.bubble_ratio == Approx(expected).epsilon(1e-12));
        } else {
          CHECK(sim.bubble_ratio == expected);  // halves and quarters add up exactly
        }
      }
    }
  }
}

TEST_CASE("ZB1P's bubble is at most a third of 1F1B's when T_F = T_I = T_W", "[schedule][simulate]") {
  for (int p : {2, 4, 8}) {
    for (int m : {p, 2 * p, 4 * p}) {
      INFO("p=" << p << " m=" << m);
      const auto zb = baton::simulate(baton::zb1p::generate({p, 1, m}), unit_costs());
      const auto ofob = baton::simulate(baton::one_f_one_b::generate({p, 1, m}), unit_costs());
      // Per rank: (p-1)(T_F + T_I - T_W) = p - 1 against (p-1)(T_F + T_B) = 3(p - 1).
      CHECK(ofob.total_idle() == 3.0 * p * (p - 1));
      CHECK(zb.total_idle() <= ofob.total_idle() / 3.0);
      CHECK(zb.total_idle() == 1.0 * p * (p - 1));
      // Same peak memory as 1F1B.
      CHECK(zb.peak_live() == ofob.peak_live());
    }
  }
}

TEST_CASE("ZBV beats ZB1P at p = 4 at 1F1B's memory; DualPipeV's pairs cost time on a serial rank",
          "[schedule][simulate]") {
  for (int m : {8, 16}) {
    INFO("m=" << m);
    // Costs of one rank's share of the model, split over the rank's stages: a ZBV stage is
    // half a 1F1B stage, in time and in activation memory.
    const auto zb1p = baton::simulate(baton::zb1p::generate({4, 1, m}), unit_costs());
    const auto ofob = baton::simulate(baton::one_f_one_b::generate({4, 1, m}), unit_costs());
    const auto zbv = baton::simulate(baton::zbv::generate(baton::shape_for<baton::zbv>(4, m)),
                                     unit_costs().per_rank_share(2));
    const auto dpv = baton::simulate(baton::dual_pipe_v::generate(baton::shape_for<baton::dual_pipe_v>(4, m)),
                                     unit_costs().per_rank_share(2));
    CHECK(zbv.bubble_ratio < zb1p.bubble_ratio);
    CHECK(zbv.makespan < zb1p.makespan);
    CHECK(zbv.peak_activation() <= ofob.peak_activation());
    CHECK(zbv.peak_activation() == 4.0);  // 2p live half-stages on rank 0
    // DualPipeV's order with each forward's output sent as soon as it is computed beats ZB1P
    // too. Run as torch's OVERLAP_F_B pairs on a rank that computes one thing at a time, a
    // pair's forward output leaves only after the pair's backward (its sends follow both), which
    // cannot be faster: what the pairs buy is the overlap a GPU backend gives, not modelled here.
    auto unpaired = baton::dual_pipe_v::generate(baton::shape_for<baton::dual_pipe_v>(4, m));
    int pairs = 0;
    for (auto& row : unpaired.ranks)
      for (auto& a : row) pairs += std::exchange(a.overlaps_next, false) ? 1 : 0;
    REQUIRE(pairs > 0);
    const auto dpv_unpaired = baton::simulate(unpaired, unit_costs().per_rank_share(2));
    CHECK(dpv_unpaired.makespan < zb1p.makespan);
    CHECK(dpv.makespan >= dpv_unpaired.makespan);
  }
}

TEST_CASE("ZBV is not bubble-free: (p - 1) / (6m + p - 1) at equal costs", "[schedule][simulate]") {
  // The closed form policies.hpp and docs/schedules.md state: T_F = T_I = T_W = 1 per rank's
  // share, each rank idles (p - 1) / 2 while the V fills, for every m >= 2p - 1.
  for (int p : {2, 4, 8}) {
    for (int m : {2 * p - 1, 2 * p, 4 * p, 4 * p + 3}) {
      INFO("p=" << p << " m=" << m);
      const auto zbv = baton::simulate(baton::zbv::generate(baton::shape_for<baton::zbv>(p, m)),
                                       unit_costs().per_rank_share(2));
      CHECK(zbv.total_idle() == Approx(0.5 * p * (p - 1)));
      CHECK(zbv.bubble_ratio == Approx(double(p - 1) / (6.0 * m + p - 1)));
      CHECK(zbv.bubble_ratio > 0.0);
    }
  }
  const auto p4m8 = baton::simulate(baton::zbv::generate(baton::shape_for<baton::zbv>(4, 8)),
                                    unit_costs().per_rank_share(2));
  CHECK(p4m8.bubble_ratio == Approx(3.0 / 51.0));  // 0.0588, the figure of docs/schedules.md
}

TEST_CASE("communication cost and per-stage costs", "[schedule][simulate]") {
  SECTION("two ranks, one microbatch: F, message, F, B, message, B") {
    auto costs = unit_costs();
    costs.communication = 0.5;
    const auto prog = baton::one_f_one_b::generate({2, 1, 1});
    const auto sim = baton::simulate(prog, costs);
    CHECK(sim.makespan == 1 + 0.5 + 1 + 2 + 0.5 + 2);
    CHECK(sim.messages.size() == 2);
    CHECK(baton::simulate(baton::lower(prog), costs).makespan == sim.makespan);
    CHECK(sim.ranks[0].busy == 3.0);
    CHECK(sim.ranks[0].idle == sim.makespan - 3.0);
  }
  SECTION("co-located stages need no message") {
    auto costs = unit_costs();
    costs.communication = 10;
    const auto sim = baton::simulate(baton::looped_bfs::generate({1, 2, 1}), costs);
    CHECK(sim.makespan == 6.0);
    CHECK(sim.messages.empty());
  }
  SECTION("per-stage vectors") {
    baton::cost_model costs;
    costs.forward = {1.0, 3.0};
    costs.backward = {2.0, 5.0};
    const auto sim = baton::simulate(baton::gpipe::generate({2, 1, 1}), costs);
    CHECK(sim.makespan == 1 + 3 + 5 + 2);
    CHECK(sim.ranks[1].busy == 8.0);
  }
  SECTION("the lowered program times like the compute-only one, for every policy") {
    auto costs = unit_costs();
    costs.communication = 0.25;
    for (const auto& info : baton::builtin_policies) {
      const auto prog = info.generate(info.shape(4, 8));
      INFO(info.name);
      CHECK(baton::simulate(baton::lower(prog), costs).makespan == baton::simulate(prog, costs).makespan);
    }
  }
  SECTION("a bad cost model is refused") {
    baton::cost_model costs;
    costs.forward = {1.0, 2.0, 3.0};
    CHECK_THROWS_WITH(baton::simulate(baton::gpipe::generate({2, 1, 1}), costs),
                      Catch::Matchers::Contains("forward has 3 values; give one for all stages or one per stage (2)"));
    costs.forward = {-1.0};
    CHECK_THROWS_WITH(baton::simulate(baton::gpipe::generate({2, 1, 1}), costs),
                      Catch::Matchers::Contains("negative"));
  }
}

TEST_CASE("Chrome trace and SVG Gantt chart", "[schedule][render]") {
  const auto prog = baton::zbv::generate(baton::shape_for<baton::zbv>(4, 8));
  auto costs = unit_costs();
  costs.communication = 0.1;
  const auto sim = baton::simulate(prog, costs);
  const int computes = static_cast<int>(baton::action_count(prog));
  REQUIRE(sim.timeline.size() == static_cast<std::size_t>(computes));

  const std::string trace = baton::to_chrome_trace(sim, "zbv \"p=4\"");
  CHECK(balanced_json(trace));
  CHECK(count(trace, "\"ph\":\"X\"") == computes);
  CHECK(count(trace, "\"ph\":\"s\"") == static_cast<int>(sim.messages.size()));
  CHECK(count(trace, "\"ph\":\"f\"") == static_cast<int>(sim.messages.size()));
  CHECK(trace.find("zbv \\\"p=4\\\"") != std::string::npos);

  baton::svg_options options;
  options.title = "ZBV <p=4>";
  const std::string svg = baton::to_svg(sim, options);
  CHECK(svg.rfind("<svg", 0) == 0);
  CHECK(svg.find("</svg>") != std::string::npos);
  CHECK(count(svg, "<title>") == computes);  // one box per compute action
  CHECK(svg.find("ZBV &lt;p=4&gt;") != std::string::npos);
  CHECK(count(svg, "<rect") == computes + 4 /*rank lanes*/ + 4 /*legend*/ + 1 /*background*/);
}

TEST_CASE("the grid shows each rank's steps", "[schedule][render]") {
  const std::string grid = baton::format_grid(baton::one_f_one_b::generate({2, 1, 2}));
  CHECK(grid == "step     0    1    2    3\n"
                "rank 0:  0F0  0F1  0B0  0B1\n"
                "rank 1:  1F0  1B0  1F1  1B1\n");
}
