// Lowering to messages, and validation: malformed schedules are rejected with a message that
// names rank, step and action and shows the grid around them.
#include <baton/schedule.hpp>

#include "catch.hpp"
#include "rejection.hpp"
#include "oracle.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <string>

namespace {

using schedule_test::rejection;

using baton::action;
using baton::action_kind;
using Catch::Matchers::Contains;

// Validates a CSV text (with `shape` or the inferred one) and returns the error.
baton::schedule_error rejection(const std::string& csv, std::optional<baton::schedule_shape> shape = std::nullopt) {
  try {
    baton::validate(baton::parse_csv(csv, shape));
  } catch (const baton::schedule_error& e) {
    return e;
  }
  FAIL("accepted:\n" << csv);
  return baton::schedule_error("unreachable");
}


void check_place(const baton::schedule_error& e, int rank, int step, const std::string& action_text) {
  const std::string what = e.what();
  INFO(what);
  CHECK_THAT(what, Contains("rank " + std::to_string(rank) + ", step " + std::to_string(step) + ", action " +
                            action_text + ":"));
  CHECK(e.rank() == rank);
  CHECK(e.step() == step);
}

}  // namespace

TEST_CASE("lowering adds exactly the messages between ranks", "[schedule][lower]") {
  for (const auto& info : baton::builtin_policies) {
    for (int p : {1, 2, 4}) {
      const auto shape = info.shape(p, 2 * p);
      const baton::program compute = info.generate(shape);
      const baton::program lowered = baton::lower(compute);
      INFO(info.name << " p=" << p);
      REQUIRE(baton::is_lowered(lowered) == (p > 1));
      CHECK(baton::lower(lowered) == lowered);
      const int S = shape.num_stages();
      int cross_boundaries = 0;
      for (int s = 0; s + 1 < S; ++s) cross_boundaries += oracle::owner(shape, s) != oracle::owner(shape, s + 1);
      std::map<action_kind, int> counts;
      std::set<int> tags;
      for (std::size_t r = 0; r < lowered.ranks.size(); ++r) {
        const auto& row = lowered.ranks[r];
        std::vector<action> compute_only;
        for (std::size_t i = 0; i < row.size(); ++i) {
          const action& a = row[i];
          ++counts[a.kind];
          if (baton::is_compute(a.kind)) {
            compute_only.push_back(a);
            continue;
          }
          tags.insert(baton::message_tag(shape, a));
          // A receive sits right before the compute that consumes it, a send right after the
          // compute that produces it; an overlapped pair (DualPipeV) is one step, with the
          // receives of both its actions before it and their sends after it.
          const bool receive = a.kind == action_kind::recv_forward || a.kind == action_kind::recv_backward;
          // The compute the message belongs to: the next one after a receive, the last one before a send.
          std::size_t j = i;
          if (receive) {
            do ++j;
            while (j < row.size() && !baton::is_compute(row[j].kind));
          } else {
            while (j > 0 && !baton::is_compute(row[--j].kind)) {
            }
          }
          REQUIRE((j < row.size() && baton::is_compute(row[j].kind)));
          std::vector<action> step{row[j]};
          if (receive && row[j].overlaps_next) step.push_back(row[j + 1]);
          if (!receive && j > 0 && row[j - 1].overlaps_next) step.push_back(row[j - 1]);
          const bool forward_message = a.kind == action_kind::recv_forward || a.kind == action_kind::send_forward;
          const auto consumer_or_producer = [&](const action& c) {
            return c.stage == a.stage && c.microbatch == a.microbatch &&
                   (forward_message ? c.kind == action_kind::forward : baton::is_input_backward(c.kind));
          };
          CHECK(std::any_of(step.begin(), step.end(), consumer_or_producer));
          // Only messages of that step lie in between.
          for (std::size_t k = std::min(i, j) + 1; k < std::max(i, j); ++k) CHECK(baton::is_communication(row[k].kind));
        }
        CHECK(compute_only == compute.ranks[r]);  // the compute order is untouched
      }
      const int per_direction = cross_boundaries * shape.microbatches;
      const int backward_messages = baton::is_forward_only(compute) ? 0 : per_direction;
      CHECK(counts[action_kind::send_forward] == per_direction);
      CHECK(counts[action_kind::recv_forward] == per_direction);
      CHECK(counts[action_kind::send_backward] == backward_messages);
      CHECK(counts[action_kind::recv_backward] == backward_messages);
      // Both ends of a message share its tag; different messages have different tags.
      CHECK(tags.size() == static_cast<std::size_t>(per_direction + backward_messages));
    }
  }
}

TEST_CASE("V placement: the two stages at the bottom of the V hand over by call", "[schedule][lower]") {
  const auto lowered = baton::lower(baton::zbv::generate(baton::shape_for<baton::zbv>(4, 8)));
  for (const auto& row : lowered.ranks)
    for (const auto& a : row) {
      CHECK_FALSE((a.kind == action_kind::send_forward && a.stage == 3));
      CHECK_FALSE((a.kind == action_kind::recv_forward && a.stage == 4));
      CHECK_FALSE((a.kind == action_kind::send_backward && a.stage == 4));
      CHECK_FALSE((a.kind == action_kind::recv_backward && a.stage == 3));
    }
}

TEST_CASE("lower() refuses an invalid program with the validation message", "[schedule][lower]") {
  auto prog = baton::one_f_one_b::generate({2, 1, 2});
  std::swap(prog.ranks[1][0], prog.ranks[1][1]);
  CHECK_THROWS_WITH(baton::lower(prog), Contains("rank 1, step 0, action 1B0"));
}

TEST_CASE("malformed schedules are rejected with rank, step and action", "[schedule][validate]") {
  // The well-formed starting points: 1F1B and ZB1P with p = 2, m = 2.
  //   1F1B: 0F0,0F1,0B0,0B1 / 1F0,1B0,1F1,1B1
  //   ZB1P: 0F0,0F1,0I0,0W0,0I1,0W1 / 1F0,1I0,1F1,1I1,1W0,1W1
  REQUIRE(baton::is_valid(baton::parse_csv("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n")));
  REQUIRE(baton::to_csv(baton::zb1p::generate({2, 1, 2})) == "0F0,0F1,0I0,0W0,0I1,0W1\n1F0,1I0,1F1,1I1,1W0,1W1\n");

  SECTION("1. missing forward") {
    const auto e = rejection("0F0,0F1,0B0,0B1\n1F0,1B0\n", baton::schedule_shape{2, 1, 2});
    check_place(e, 1, 2, "1F1");
    CHECK_THAT(e.what(), Contains("missing forward: stage 1 never runs microbatch 1 forward"));
    CHECK_THAT(e.what(), Contains("[end]"));
  }
  SECTION("2. W before I") {
    const auto e = rejection("0F0,0F1,0W0,0I0,0I1,0W1\n1F0,1I0,1F1,1I1,1W0,1W1\n");
    check_place(e, 0, 2, "0W0");
    CHECK_THAT(e.what(), Contains("weight gradient before its input gradient 0I0 (which is at rank 0, step 3)"));
  }
  SECTION("3. duplicate action") {
    const auto e = rejection("0F0,0F1,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
    check_place(e, 0, 2, "0F1");
    CHECK_THAT(e.what(), Contains("duplicate action: 0F1 already ran at rank 0, step 1"));
  }
  SECTION("4. wrong number of rows") {
    const auto e = rejection("0F0,0B0\n1F0,1B0\n2F0,2B0\n", baton::schedule_shape{4, 1, 1});
    check_place(e, 3, 0, "(none)");
    CHECK_THAT(e.what(), Contains("the program has 3 rank rows but the shape has 4 ranks"));
    // Without a shape, a missing middle row leaves a stage count that the rows cannot hold: a
    // problem of the whole file, with no rank to point at (there is no rank 3 row).
    const auto inferred = rejection("0F0,0B0\n1F0,1B0\n3F0,3B0\n");
    CHECK(inferred.rank() == -1);
    CHECK_THAT(inferred.what(), Contains("3 rows (one per rank) but uses 4 stages (0..3)") && !Contains("rank 3"));
  }
  SECTION("5. a stage on two ranks") {
    const auto e = rejection("0F0,1F0,0B0\n1F0,1B0\n");
    check_place(e, 0, 1, "1F0");
    CHECK_THAT(e.what(), Contains("stage 1 runs on rank 0, but loop placement puts it on rank 1") &&
                             Contains("each stage lives on exactly one rank"));
  }
  SECTION("6. a receive nobody sends") {
    const auto e = rejection("0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
    check_place(e, 1, 0, "1RECV_F0");
    CHECK_THAT(e.what(), Contains("a receive nobody sends: it waits for 0SEND_F0 from rank 0"));
  }
  SECTION("7. a cycle that deadlocks") {
    const auto e = rejection("0F0,0B0,0F1,0B1\n1F1,1B1,1F0,1B0\n");
    check_place(e, 0, 1, "0B0");
    CHECK_THAT(e.what(), Contains("deadlock under blocking receives: rank 0 waits at step 1 (0B0) for rank 1, which "
                                  "is blocked at step 0; rank 1 waits at step 0 (1F1) for rank 0"));
    CHECK_THAT(e.what(), Contains("first awaited: 1B0, which is at rank 1, step 3"));
    // The grid excerpt marks the blocked action and shows both ranks.
    CHECK_THAT(e.what(), Contains("rank 0:  0F0  [0B0]  0F1") && Contains("rank 1:  1F1  1B1"));
  }
  SECTION("7b. the same deadlock in a lowered program") {
    const auto e = rejection(
        "0F0,0SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1\n"
        "1RECV_F1,1F1,1B1,1SEND_B1,1RECV_F0,1F0,1B0,1SEND_B0\n");
    check_place(e, 0, 2, "0RECV_B0");
    CHECK_THAT(e.what(), Contains("deadlock"));
  }
  SECTION("8. a bad token") {
    const auto e = rejection("0F0,0X1,0B0\n1F0,1B0\n");  // parse_csv itself throws
    check_place(e, 0, 1, "'0X1'");
    CHECK_THAT(e.what(), Contains("bad token: expected {stage}{F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B}{microbatch}"));
  }
  SECTION("9. an out-of-range microbatch") {
    const auto e = rejection("0F0,0F1,0F2,0B0,0B1\n1F0,1B0,1F1,1B1\n", baton::schedule_shape{2, 1, 2});
    check_place(e, 0, 2, "0F2");
    CHECK_THAT(e.what(), Contains("microbatch 2 is out of range: the shape has 2 microbatches (0..1)"));
  }
  SECTION("10. an empty file") {
    for (const char* empty : {"", "\n\n", "# nothing but a comment\n", " , ,\n"}) {
      const auto e = rejection(empty);
      CHECK(e.rank() == -1);  // the whole file: no rank, step or action to point at
      CHECK_THAT(e.what(), Contains("the schedule is empty") || Contains("the schedule has rows but no actions"));
    }
  }
  SECTION("11. backward before forward") {
    const auto e = rejection("0F0,0F1,0B0,0B1\n1B0,1F0,1F1,1B1\n");
    check_place(e, 1, 0, "1B0");
    CHECK_THAT(e.what(), Contains("backward before its forward 1F0 (which is at rank 1, step 1)"));
  }
  SECTION("12. a send before the compute it sends") {
    const auto e = rejection("0SEND_F0,0F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
    check_place(e, 0, 0, "0SEND_F0");
    CHECK_THAT(e.what(), Contains("sends what 0F0 has not produced yet (which is at rank 0, step 1)"));
  }
  SECTION("13. a stage out of range") {
    const auto e = rejection("0F0,0B0\n1F0,1B0,2F0\n", baton::schedule_shape{2, 1, 1});
    check_place(e, 1, 2, "2F0");
    CHECK_THAT(e.what(), Contains("stage 2 is out of range: the shape has 2 stages (0..1)"));
  }
  SECTION("14. a message between stages on the same rank") {
    auto prog = baton::lower(baton::zbv::generate(baton::shape_for<baton::zbv>(2, 1)));
    auto& row = prog.ranks[1];
    const auto f = std::find(row.begin(), row.end(), action{1, action_kind::forward, 0});
    const auto step = static_cast<int>(f - row.begin()) + 1;
    row.insert(f + 1, action{1, action_kind::send_forward, 0});
    const auto e = rejection(prog);
    check_place(e, 1, step, "1SEND_F0");
    CHECK_THAT(e.what(), Contains("stages 1 and 2 are both on rank 1: co-located stages hand over by call"));
  }
  SECTION("15. a missing weight gradient") {
    const auto e = rejection("0F0,0F1,0I0,0W0,0I1\n1F0,1I0,1F1,1I1,1W0,1W1\n");
    check_place(e, 0, 5, "0W1");
    CHECK_THAT(e.what(), Contains("missing weight gradient: 0I1 at step 4 is never followed by 0W1"));
  }
  SECTION("16. a weight gradient after a full backward") {
    const auto e = rejection("0F0,0F1,0B0,0W0,0B1\n1F0,1B0,1F1,1B1\n");
    check_place(e, 0, 3, "0W0");
    CHECK_THAT(e.what(), Contains("whose full backward 0B0 (at step 2) already computed it"));
  }
  SECTION("17. both B and I for one microbatch") {
    const auto e = rejection("0F0,0F1,0I0,0B0,0W0,0B1\n1F0,1B0,1F1,1B1\n");
    check_place(e, 0, 3, "0B0");
    CHECK_THAT(e.what(), Contains("stage 0 microbatch 0 has both 0I0 (step 2) and 0B0"));
  }
  SECTION("18. co-located stages out of order") {
    const auto e = rejection("1F0,0F0,1B0,0B0\n", baton::schedule_shape{1, 2, 1});
    check_place(e, 0, 0, "1F0");
    CHECK_THAT(e.what(), Contains("needs 0F0 of a stage on the same rank, which must come earlier in this row"));
  }
  SECTION("19. compute before its receive") {
    const auto e = rejection("0F0,0SEND_F0,0RECV_B0,0B0\n1F0,1RECV_F0,1B0,1SEND_B0\n");
    check_place(e, 1, 0, "1F0");
    CHECK_THAT(e.what(), Contains("runs before receiving its input: 1RECV_F0 must come earlier in this row"));
  }
  SECTION("20. a send nobody receives") {
    const auto e = rejection("0F0,0SEND_F0,0RECV_B0,0B0\n1RECV_F0,1F0,1B0,1SEND_B0,1SEND_F0\n");
    // 1SEND_F0 leaves the last stage: nothing follows it.
    check_place(e, 1, 4, "1SEND_F0");
    CHECK_THAT(e.what(), Contains("a message past the end of the pipeline"));
    const auto unmatched = rejection("0F0,0SEND_F0\n1RECV_F0,1F0,1B0,1SEND_B0\n");
    check_place(unmatched, 1, 3, "1SEND_B0");
    CHECK_THAT(unmatched.what(), Contains("a send nobody receives: rank 0 has no 0RECV_B0"));
  }
  SECTION("21. an invalid shape") {
    baton::program prog{{0, 1, 1}, {}};
    CHECK_THROWS_WITH(baton::validate(prog), Contains("invalid schedule shape (ranks 0"));
  }
}

TEST_CASE("csv_schedule validates against the shape it is given", "[schedule][validate]") {
  const auto schedule = baton::csv_schedule::from_string("0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  CHECK(schedule.shape() == baton::schedule_shape{2, 1, 2});
  CHECK(baton::is_valid(schedule.generate({2, 1, 2})));
  CHECK_THROWS_WITH(schedule.generate({2, 1, 3}), Contains("missing forward: stage 0 never runs microbatch 2"));
  CHECK_THROWS_WITH(schedule.generate({2, 1, 1}), Contains("microbatch 1 is out of range"));
}

TEST_CASE("huge indices in a small file are reported, not allocated", "[schedule][validate]") {
  const auto e = rejection("0F0,0F1048575,0B0\n1F0,1B0\n");
  check_place(e, 0, 3, "0F1");  // the first (stage, microbatch) without a forward
  CHECK_THAT(e.what(), Contains("missing forward"));
}
