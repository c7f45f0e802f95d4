// The code shown in docs/schedules.md, compiled and run.
#include <baton/schedule.hpp>

#include "catch.hpp"

#include <filesystem>
#include <iostream>
#include <sstream>

// --- docs/schedules.md, "In code" ---
constexpr baton::schedule_shape shape = baton::shape_for<baton::zbv>(4, 8);  // {4, 2, 8, placement::v}
static_assert(baton::is_valid(baton::lower(baton::zbv::generate(shape))));    // checked while compiling

TEST_CASE("docs: generate, lower, simulate", "[schedule][docs]") {
  std::ostringstream out;
  // --- begin snippet
  baton::program prog = baton::zbv::generate(shape);  // compute only: F, I, W per rank
  baton::program with_messages = baton::lower(prog);  // + SEND_F/RECV_F/SEND_B/RECV_B
  baton::validate(with_messages);                     // throws baton::schedule_error if wrong

  // T_F = T_I = T_W = 1 for one rank's share of the model, split over its 2 stages.
  baton::cost_model costs = baton::cost_model::uniform(1, 1, 1).per_rank_share(shape.stages_per_rank);
  baton::simulation sim = baton::simulate(prog, costs);
  out << "bubble " << sim.bubble_ratio << ", peak live on rank 0: " << sim.ranks[0].peak_live << "\n";
  out << baton::format_grid(prog);
  // --- end snippet
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
  CHECK(out.str().rfind(expected_line.str(), 0) == 0);  // what the snippet prints starts so
  CHECK(baton::is_lowered(with_messages));
}

TEST_CASE("docs: a CSV schedule and its errors", "[schedule][docs]") {
  const auto path = std::filesystem::temp_directory_path() / "baton_docs_schedule.csv";
  baton::write_csv_file(path, baton::one_f_one_b::generate({2, 1, 2}));
  std::ostringstream out;
  // --- begin snippet
  auto schedule = baton::csv_schedule::from_file(path);  // one row per rank, torch's format
  try {
    baton::program prog = schedule.generate(schedule.shape());  // the shape the rows imply
    out << "valid, " << baton::action_count(prog) << " actions\n";
  } catch (const baton::schedule_error& e) {
    // e.what(): "... rank 1, step 0, action 1B0: backward before its forward 1F0 ..." + grid
    out << "invalid at rank " << e.rank() << ", step " << e.step() << "\n";
  }
  // --- end snippet
  CHECK(out.str() == "valid, 8 actions\n");
  std::filesystem::remove(path);
}
