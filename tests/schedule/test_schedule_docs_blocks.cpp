// The code blocks of docs/schedules.md and of the comment of baton/schedule/policy.hpp,
// compiled and run. Each block between "// [doc:NAME]" and "// [/doc:NAME]" is shown verbatim
// in a document (ctest -L docs checks it); a region of one NAME may come in parts (the
// #include at the top of this file, the rest inside a TEST_CASE), joined in order.
// [doc:schedules_in_code]
#include <baton/schedule.hpp>
// [/doc:schedules_in_code]

#include "catch.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

TEST_CASE("docs/schedules.md blocks: generate, lower, validate, simulate", "[schedule][docs]") {
  std::ostringstream out;
  // [doc:schedules_in_code]
  constexpr baton::schedule_shape shape = baton::shape_for<baton::zbv>(4, 8);  // {4, 2, 8, placement::v}
  static_assert(baton::is_valid(baton::lower(baton::zbv::generate(shape))));    // checked while compiling

  baton::program prog = baton::zbv::generate(shape);  // compute only: F, I, W per rank
  baton::program with_messages = baton::lower(prog);  // + SEND_F/RECV_F/SEND_B/RECV_B
  baton::validate(with_messages);                     // throws baton::schedule_error if wrong

  // T_F = T_I = T_W = 1 for one rank's share of the model, split over its 2 stages.
  baton::cost_model costs = baton::cost_model::uniform(1, 1, 1).per_rank_share(shape.stages_per_rank);
  baton::simulation sim = baton::simulate(prog, costs);
  out << "bubble " << sim.bubble_ratio << ", peak live on rank 0: " << sim.ranks[0].peak_live << "\n";
  out << baton::format_grid(prog);
  // [/doc:schedules_in_code]
  STATIC_REQUIRE(shape == baton::schedule_shape{4, 2, 8, baton::placement::v});
  // The expectation, from the shape and the costs rather than from a printed run: each rank
  // computes m (T_F + T_I + T_W) = 8 x 3 = 24, and rank p - 1 cannot start before microbatch 0
  // has gone forward through the p - 1 stages before it, (p - 1) x T_F / 2 = 1.5 (a stage
  // costs half a rank's share). A zero-bubble schedule idles that much and no more on every
  // rank: makespan 24 + 1.5, bubble ratio 1.5 / 25.5 = 1/17.
  const double busy = shape.microbatches * (1.0 + 1.0 + 1.0);
  const double ramp = (shape.ranks - 1) * (1.0 / shape.stages_per_rank);
  const double expected_bubble = ramp / (busy + ramp);
  CHECK(sim.makespan == Approx(busy + ramp).epsilon(1e-12));
  CHECK(sim.bubble_ratio == Approx(expected_bubble).epsilon(1e-12));
  std::ostringstream expected_line;
  expected_line << "bubble " << expected_bubble << ", ";
  CHECK(out.str().rfind(expected_line.str(), 0) == 0);  // what the block prints starts so
  CHECK(baton::is_lowered(with_messages));
  CHECK_FALSE(baton::is_lowered(prog));
}

namespace {

// Runs the block "A schedule from a file" on a file holding `csv`; returns what it printed.
std::string read_schedule_file(const std::string& csv, const char* name) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << csv;
  std::ostringstream out;
  // [doc:schedule_from_file]
  auto schedule = baton::csv_schedule::from_file(path);  // one row per rank, torch's format
  try {
    baton::program prog = schedule.generate(schedule.shape());  // the shape the rows imply
    out << "valid, " << baton::action_count(prog) << " actions\n";
  } catch (const baton::schedule_error& e) {
    // e.what(): "... rank 1, step 0, action 1B0: backward before its forward 1F0 ..." + grid
    out << "invalid at rank " << e.rank() << ", step " << e.step() << "\n";
  }
  // [/doc:schedule_from_file]
  std::filesystem::remove(path);
  return out.str();
}

}  // namespace

TEST_CASE("docs/schedules.md blocks: a schedule from a file", "[schedule][docs]") {
  // 1F1B for 2 ranks and 2 microbatches, written by hand: 2 x 2 x (F + B) = 8 actions.
  CHECK(read_schedule_file("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n", "baton_docs_blocks_valid.csv") ==
        "valid, 8 actions\n");
  // Rank 1 starts with the backward of microbatch 0, before its forward.
  CHECK(read_schedule_file("0F0,0B0\n1B0,1F0\n", "baton_docs_blocks_invalid.csv") == "invalid at rank 1, step 0\n");
}

// The policy of baton/schedule/policy.hpp's comment.
namespace policy_comment {
// [doc:policy_comment]
struct forward_then_backward {
  static constexpr bool splits_backward = false;
  static constexpr baton::placement default_placement = baton::placement::loop;
  static constexpr baton::program generate(const baton::schedule_shape& s) {
    baton::program p{s, std::vector<std::vector<baton::action>>(s.ranks)};
    for (int r = 0; r < s.ranks; ++r) {
      for (int mb = 0; mb < s.microbatches; ++mb) p.ranks[r].push_back({r, baton::action_kind::forward, mb});
      for (int mb = 0; mb < s.microbatches; ++mb) p.ranks[r].push_back({r, baton::action_kind::backward, mb});
    }
    return p;
  }
};
static_assert(baton::schedule_policy<forward_then_backward>);
static_assert(baton::is_valid(forward_then_backward::generate({4, 1, 8})));
// [/doc:policy_comment]
}  // namespace policy_comment

TEST_CASE("baton/schedule/policy.hpp: the policy of its comment", "[schedule][docs]") {
  using policy_comment::forward_then_backward;
  STATIC_REQUIRE(baton::shape_for<forward_then_backward>(2, 3) == baton::schedule_shape{2, 1, 3});
  const baton::program p = forward_then_backward::generate({2, 1, 3});
  // Every forward of a rank, then every backward: GPipe's order.
  REQUIRE(p.ranks.size() == 2);
  const std::vector<baton::action_kind> kinds{baton::action_kind::forward,  baton::action_kind::forward,
                                              baton::action_kind::forward,  baton::action_kind::backward,
                                              baton::action_kind::backward, baton::action_kind::backward};
  for (int r = 0; r < 2; ++r) {
    REQUIRE(p.ranks[static_cast<std::size_t>(r)].size() == kinds.size());
    for (std::size_t i = 0; i < kinds.size(); ++i) {
      CHECK(p.ranks[static_cast<std::size_t>(r)][i].kind == kinds[i]);
      CHECK(p.ranks[static_cast<std::size_t>(r)][i].stage == r);
      CHECK(p.ranks[static_cast<std::size_t>(r)][i].microbatch == static_cast<int>(i % 3));
    }
  }
  baton::validate(baton::lower(p));
}
