// torch CSV parity: every kind of file torch.distributed.pipelining writes is read, validated
// and written back byte for byte — compute-only files with idle cells and DualPipeV's
// `(0F3;3B1)OVERLAP_F_B` pairs, runtime files with UNSHARD, RESHARD and REDUCE_GRAD — and bad
// input of those kinds is refused naming the problem and the fix.
//
// The files (tests/schedule/data, README there): data/torch/ holds three files PyTorch's own
// generator wrote; data/derived/ holds other shapes derived from torch's algorithm
// (schedules.py at commit 00722e648b740f91d0e71494baa17891749fd291) without baton. Every
// expectation below comes from those files' text or from a rule of torch's code, cited where
// it is used, never from baton's output.
#include <baton/schedule.hpp>

#include "catch.hpp"
#include "rejection.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#ifndef BATON_SCHEDULE_TEST_DATA
#error "BATON_SCHEDULE_TEST_DATA (the path of tests/schedule/data) is set by tests/schedule/CMakeLists.txt"
#endif

using baton::action;
using baton::action_kind;
using Catch::Matchers::Contains;

namespace {

using schedule_test::rejection;

const std::filesystem::path data_dir{BATON_SCHEDULE_TEST_DATA};

std::string file_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>{});
}

// The cells of a torch CSV, split by hand: rows end in "\r\n", cells are separated by ','.
std::vector<std::vector<std::string>> cells_of(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t end = text.find("\r\n", begin);
    REQUIRE(end != std::string::npos);  // torch (Python's csv module) ends every row so
    std::vector<std::string> row;
    std::size_t cell = begin;
    while (true) {
      const std::size_t comma = text.find(',', cell);
      const std::size_t stop = comma == std::string::npos || comma > end ? end : comma;
      row.push_back(text.substr(cell, stop - cell));
      if (stop == end) break;
      cell = stop + 1;
    }
    rows.push_back(row);
    begin = end + 2;
  }
  return rows;
}

long long count_cells(const std::string& text, auto&& predicate) {
  long long n = 0;
  for (const auto& row : cells_of(text))
    for (const auto& cell : row) n += predicate(cell) ? 1 : 0;
  return n;
}

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// The compute actions of a program in order, overlapped flags cleared: what a policy generates.
baton::program compute_only(const baton::program& prog) {
  baton::program out{prog.shape, {}};
  for (const auto& row : prog.ranks) {
    auto& kept = out.ranks.emplace_back();
    for (action a : row)
      if (baton::is_compute(a.kind)) kept.push_back(a);
  }
  return out;
}

baton::program without_pair_marks(baton::program prog) {
  for (auto& row : prog.ranks)
    for (auto& a : row) a.overlaps_next = false;
  return prog;
}

struct torch_file {
  const char* path;                    // under data_dir
  baton::schedule_shape shape;         // what the file name says (V placement for ZBV and DualPipeV)
  baton::program (*policy)(const baton::schedule_shape&);  // baton's policy for the same schedule
};

constexpr auto V = baton::placement::v;
const torch_file torch_files[] = {
    {"torch/dualpipev_p2_m4_compute.csv", {2, 2, 4, V}, &baton::dual_pipe_v::generate},
    {"torch/interleaved1f1b_p2_m4_compute.csv", {2, 1, 4}, &baton::interleaved_1f1b::generate},
    {"torch/zbv_p2_m4_runtime.csv", {2, 2, 4, V}, &baton::zbv::generate},
    {"derived/dualpipev_p4_m8_compute.csv", {4, 2, 8, V}, &baton::dual_pipe_v::generate},
    {"derived/dualpipev_p4_m8_runtime.csv", {4, 2, 8, V}, &baton::dual_pipe_v::generate},
    {"derived/zbv_p4_m8_runtime.csv", {4, 2, 8, V}, &baton::zbv::generate},
    {"derived/interleaved1f1b_p4_v2_m8_compute.csv", {4, 2, 8}, &baton::interleaved_1f1b::generate},
    {"derived/interleaved1f1b_p2_v4_m4_runtime.csv", {2, 4, 4}, &baton::interleaved_1f1b::generate},
};

baton::program rejected_program(const std::string& csv) {
  return baton::parse_csv(csv);  // the tests below parse fine and fail validation
}


baton::schedule_error csv_rejection(const std::string& csv) {
  try {
    (void)baton::parse_csv(csv);
  } catch (const baton::schedule_error& e) {
    return e;
  }
  FAIL("parse_csv() accepted: " << csv);
  return baton::schedule_error("unreachable");
}

}  // namespace

TEST_CASE("torch's files: read, validated, written back byte for byte", "[schedule][csv][torch]") {
  for (const auto& file : torch_files) {
    INFO(file.path);
    const std::string text = file_text(data_dir / file.path);
    const baton::csv_document doc = baton::parse_csv_document(text);
    CHECK(doc.prog.shape == file.shape);  // inferred: ranks from the rows, V placement from the stages
    CHECK_NOTHROW(baton::validate(doc.prog));
    CHECK(doc.layout.line_end == "\r\n");
    CHECK(baton::to_csv(doc.prog, doc.layout) == text);
    // The same through files, and through csv_schedule (the policy that runs a CSV).
    const auto copy = std::filesystem::temp_directory_path() / "baton_torch_csv_roundtrip.csv";
    baton::write_csv_file(copy, doc.prog, doc.layout);
    CHECK(file_text(copy) == text);
    CHECK(baton::read_csv_document(copy).prog == doc.prog);
    std::filesystem::remove(copy);
    CHECK(baton::csv_schedule::from_string(text).generate(file.shape) == doc.prog);
  }
}

TEST_CASE("docs/schedules.md: a torch file read, validated and written back", "[schedule][csv][torch][docs]") {
  const std::filesystem::path path = data_dir / "torch/zbv_p2_m4_runtime.csv";
  const std::filesystem::path copy = std::filesystem::temp_directory_path() / "baton_docs_torch_copy.csv";
  // [doc:schedules_torch_file]
  baton::csv_document doc = baton::read_csv_document(path);  // a file torch wrote, of any kind
  baton::validate(doc.prog);                                  // pairs, UNSHARD/RESHARD/REDUCE_GRAD included
  baton::write_csv_file(copy, doc.prog, doc.layout);          // the bytes torch wrote
  // [/doc:schedules_torch_file]
  CHECK(file_text(copy) == file_text(path));
  std::filesystem::remove(copy);
}

TEST_CASE("torch's files hold the schedules baton's policies generate", "[schedule][csv][torch]") {
  // The cross-check found baton's orders identical to torch's; these files pin it for
  // every kind torch writes. Runtime files are compared on their compute actions.
  for (const auto& file : torch_files) {
    INFO(file.path);
    const baton::program read = baton::parse_csv_document(file_text(data_dir / file.path)).prog;
    const baton::program generated = file.policy(file.shape);
    CHECK(compute_only(read) == generated);  // overlapped pairs included: DualPipeV marks them as torch does
  }
  // DualPipeV has no idle steps: baton's program with torch's line ends is torch's file.
  for (const char* path : {"torch/dualpipev_p2_m4_compute.csv", "derived/dualpipev_p4_m8_compute.csv"}) {
    INFO(path);
    const baton::program read = baton::parse_csv(file_text(data_dir / path));
    CHECK(baton::to_csv(baton::dual_pipe_v::generate(read.shape), baton::csv_layout{{}, "\r\n"}) ==
          file_text(data_dir / path));
  }
}

TEST_CASE("DualPipeV's OVERLAP_F_B cells become marked forward/backward pairs", "[schedule][csv][torch]") {
  const std::string text = file_text(data_dir / "torch/dualpipev_p2_m4_compute.csv");
  const baton::program prog = baton::parse_csv(text);
  // torch wrote rank 0 as 0F0,0F1,0F2,3F0,3I0,3W0,3F1,(0F3;3B1)OVERLAP_F_B,...: the pair's
  // forward is step 7 and its backward step 8.
  const auto& rank0 = prog.ranks[0];
  CHECK(rank0[7] == action{0, action_kind::forward, 3, true});
  CHECK(rank0[8] == action{3, action_kind::backward, 1});
  long long marked = 0;
  for (const auto& row : prog.ranks)
    for (const auto& a : row) marked += a.overlaps_next ? 1 : 0;
  CHECK(marked == count_cells(text, [](const std::string& cell) { return ends_with(cell, ")OVERLAP_F_B"); }));
  // torch's add_overlap_f_b pairs a forward with a full backward, never I.
  for (const auto& row : prog.ranks)
    for (std::size_t i = 0; i < row.size(); ++i)
      if (row[i].overlaps_next) CHECK(row[i + 1].kind == action_kind::backward);
  // Without the marks the schedule is the same work in the same order, and still valid.
  CHECK(baton::is_valid(without_pair_marks(prog)));
  CHECK(baton::to_csv(without_pair_marks(prog)).find("OVERLAP") == std::string::npos);
}

TEST_CASE("runtime files keep UNSHARD, RESHARD and REDUCE_GRAD where torch put them", "[schedule][csv][torch]") {
  for (const char* path : {"torch/zbv_p2_m4_runtime.csv", "derived/zbv_p4_m8_runtime.csv",
                           "derived/dualpipev_p4_m8_runtime.csv", "derived/interleaved1f1b_p2_v4_m4_runtime.csv"}) {
    INFO(path);
    const std::string text = file_text(data_dir / path);
    const baton::program prog = baton::parse_csv(text);
    CHECK(baton::is_lowered(prog));
    std::map<action_kind, long long> counted;
    for (const auto& row : prog.ranks)
      for (const auto& a : row) counted[a.kind] += 1;
    for (const auto& [kind, token] : {std::pair{action_kind::unshard, "UNSHARD"}, {action_kind::reshard, "RESHARD"},
                                      {action_kind::reduce_grad, "REDUCE_GRAD"}}) {
      const std::string_view suffix = token;  // a lambda may not capture a structured binding (clang 14)
      CHECK(counted[kind] == count_cells(text, [&](const std::string& cell) { return ends_with(cell, suffix); }));
    }
    // torch's _add_reduce_grad: one REDUCE_GRAD per stage, right after the stage's m-th B or W
    // (counting the backward of an overlapped pair), with only messages in between.
    const int m = prog.shape.microbatches;
    CHECK(counted[action_kind::reduce_grad] == prog.shape.num_stages());
    for (const auto& row : prog.ranks) {
      std::map<int, int> weight_gradients;
      int last_completed_stage = -1;
      for (const auto& a : row) {
        if (a.kind == action_kind::backward || a.kind == action_kind::backward_weight) {
          if (++weight_gradients[a.stage] == m) last_completed_stage = a.stage;
        } else if (a.kind == action_kind::reduce_grad) {
          CHECK(a.stage == last_completed_stage);
          last_completed_stage = -1;
        } else if (!baton::is_communication(a.kind) && a.kind != action_kind::reshard) {
          last_completed_stage = -1;  // torch's REDUCE_GRAD comes before anything else runs
        }
      }
    }
  }
  // torch's _add_unshard_reshard keeps at most three stages unsharded: with four stages per rank
  // it reshards one and unshards it again later, which baton accepts as torch's runtime does.
  const baton::program four_per_rank =
      baton::parse_csv(file_text(data_dir / "derived/interleaved1f1b_p2_v4_m4_runtime.csv"));
  long long unshards_of_stage_0 = 0;
  for (const auto& a : four_per_rank.ranks[0]) unshards_of_stage_0 += a == action{0, action_kind::unshard, 0} ? 1 : 0;
  CHECK(unshards_of_stage_0 > 1);
  CHECK(baton::is_valid(four_per_rank));
}

TEST_CASE("idle cells and line ends are kept apart from the program", "[schedule][csv][torch]") {
  const std::string text = file_text(data_dir / "torch/interleaved1f1b_p2_m4_compute.csv");
  const baton::csv_document doc = baton::parse_csv_document(text);
  long long idle = 0;
  for (const auto& row : doc.layout.idle_cells)
    for (int n : row) idle += n;
  CHECK(idle == count_cells(text, [](const std::string& cell) { return cell.empty(); }));
  // torch wrote rank 1 as ",1F0,1B0,...": one idle cell before its first action.
  REQUIRE(doc.layout.idle_cells.size() == 2);
  CHECK(doc.layout.idle_cells[1].front() == 1);
  // Baton's own form: no idle cells, "\n".
  const std::string baton_form = baton::to_csv(doc.prog);
  CHECK(baton_form.find(",,") == std::string::npos);
  CHECK(baton_form.find('\r') == std::string::npos);
  CHECK(baton::parse_csv(baton_form) == doc.prog);
  // A layout belongs to the program it was read with.
  baton::program other = doc.prog;
  other.ranks[0].pop_back();
  CHECK_THROWS_WITH(baton::to_csv(other, doc.layout),
                    Contains("the CSV layout of rank 0 is for 8 actions but the row has 7") &&
                        Contains("write this one without it (to_csv(prog))"));
  other.ranks.pop_back();
  other.shape.ranks = 1;
  CHECK_THROWS_WITH(baton::to_csv(other, doc.layout), Contains("the CSV layout has 2 rows but the program has 1"));
}

TEST_CASE("lower() keeps an overlapped pair one step, receives before it and sends after", "[schedule][lower]") {
  // torch's _add_send_recv schedules a pair when all its actions are ready and appends the
  // sends of both after it; baton's receives sit right before what consumes them.
  const baton::program prog = baton::dual_pipe_v::generate(baton::shape_for<baton::dual_pipe_v>(4, 8));
  const baton::program lowered = baton::lower(prog);
  CHECK(baton::is_valid(lowered));
  CHECK(compute_only(lowered) == prog);
  int pairs = 0;
  int pair_receives = 0;
  for (const auto& row : lowered.ranks) {
    const auto position_of = [&](const action& wanted) {
      return static_cast<std::size_t>(std::find(row.begin(), row.end(), wanted) - row.begin());
    };
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (!row[i].overlaps_next) continue;
      ++pairs;
      const action& f = row[i];
      const action& b = row[i + 1];
      CHECK(baton::is_input_backward(b.kind));
      // The messages right around the pair: [first_before, i) and [i + 2, end_after).
      std::size_t first_before = i;
      while (first_before > 0 && baton::is_communication(row[first_before - 1].kind)) --first_before;
      std::size_t end_after = i + 2;
      while (end_after < row.size() && baton::is_communication(row[end_after].kind)) ++end_after;
      for (const action receive : {action{f.stage, action_kind::recv_forward, f.microbatch},
                                   action{b.stage, action_kind::recv_backward, b.microbatch}}) {
        const std::size_t at = position_of(receive);
        if (at == row.size()) continue;  // its producer is on this rank
        ++pair_receives;
        CHECK((at >= first_before && at < i));
      }
      for (const action send : {action{f.stage, action_kind::send_forward, f.microbatch},
                                action{b.stage, action_kind::send_backward, b.microbatch}}) {
        const std::size_t at = position_of(send);
        if (at != row.size()) CHECK((at >= i + 2 && at < end_after));
      }
    }
  }
  CHECK(pair_receives > pairs);  // most pairs receive for both their actions: the check is not vacuous
  // p = 4, m = 8: per torch's DualPipeV, rank r pairs in step 4 (m - 2p + r + 1 rounds of
  // two, less one on the last rank) and step 5 (p - r - 1): 2(r + 1) - [r = 3] + 3 - r.
  int expected = 0;
  for (int r = 0; r < 4; ++r) expected += 2 * (8 - 8 + r + 1) - (r == 3 ? 1 : 0) + (4 - r - 1);
  CHECK(pairs == expected);
}

TEST_CASE("an overlapped pair starts when both its inputs are there", "[schedule][validate]") {
  // rank 0 pairs 0F1 with 0B0; 0B0 needs 1B0 from rank 1, which runs 1F1 first, and 1F1 needs
  // 0F1. Run F then B on their own, it finishes; as one step it cannot (torch's _add_send_recv
  // stops with "Malformed compute schedule" on such a pair).
  const std::string sequential = "0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n";
  const std::string paired = "0F0,(0F1;0B0)OVERLAP_F_B,0B1\n1F0,1F1,1B0,1B1\n";
  CHECK(baton::is_valid(baton::parse_csv(sequential)));
  const auto problem = baton::find_problem(baton::parse_csv(paired));
  REQUIRE(problem);
  CHECK(problem->kind == baton::problem_kind::deadlock);
  CHECK(problem->rank == 0);
  CHECK(problem->step == 1);
}

TEST_CASE("forward_only: torch's _ScheduleForwardOnly", "[schedule][policy]") {
  // torch: for i in range(n_microbatches): receive, forward_one_chunk(i), send. Nothing else.
  const baton::program prog = baton::forward_only::generate({3, 1, 4});
  for (int r = 0; r < 3; ++r) {
    std::vector<action> expected;
    for (int mb = 0; mb < 4; ++mb) expected.push_back({r, action_kind::forward, mb});
    CHECK(prog.ranks[static_cast<std::size_t>(r)] == expected);
  }
  CHECK(baton::is_forward_only(prog));
  CHECK(baton::is_valid(prog));
  const baton::program lowered = baton::lower(prog);
  CHECK(baton::is_valid(lowered));
  CHECK(lowered.ranks[1] == std::vector<action>{{1, action_kind::recv_forward, 0}, {1, action_kind::forward, 0},
                                                {1, action_kind::send_forward, 0}, {1, action_kind::recv_forward, 1},
                                                {1, action_kind::forward, 1},      {1, action_kind::send_forward, 1},
                                                {1, action_kind::recv_forward, 2}, {1, action_kind::forward, 2},
                                                {1, action_kind::send_forward, 2}, {1, action_kind::recv_forward, 3},
                                                {1, action_kind::forward, 3},      {1, action_kind::send_forward, 3}});
  // T_F = 1: the last rank starts after p - 1 forwards and then runs m, m + p - 1 in all; a
  // forward-only run saves nothing for a backward.
  const baton::simulation sim = baton::simulate(prog, baton::cost_model::uniform(1, 1, 1));
  CHECK(sim.makespan == 4 + 3 - 1);
  CHECK(sim.peak_live() == 0);
  // Only one stage per rank, as torch's (a PipelineScheduleSingle).
  CHECK_THROWS_WITH(baton::forward_only::generate({3, 2, 4}),
                    Contains("baton::forward_only: runs one stage per rank") && Contains("stages_per_rank = 2"));
  // Still every forward.
  baton::program missing = prog;
  missing.ranks[2].pop_back();
  CHECK(baton::find_problem(missing)->kind == baton::problem_kind::missing_forward);
  // A training program with one backward is not forward-only: every backward is then due.
  baton::program one_backward = prog;
  one_backward.ranks[2].push_back({2, action_kind::backward, 0});
  CHECK_FALSE(baton::is_forward_only(one_backward));
  CHECK(baton::find_problem(one_backward)->kind == baton::problem_kind::missing_backward);
}

TEST_CASE("the registry names torch's names only, and marks baton's own", "[schedule][policy]") {
  // The keys of get_schedule_class's map in torch/distributed/pipelining/schedules.py
  // (commit 00722e648b740f91d0e71494baa17891749fd291).
  const std::vector<std::string_view> torch_names = {"1F1B",         "Interleaved1F1B", "GPipe",
                                                     "LoopedBFS",    "InterleavedZeroBubble",
                                                     "PipelineScheduleSingle", "PipelineScheduleMulti",
                                                     "ZBVZeroBubble", "DualPipeV"};
  std::vector<std::string_view> baton_only;
  for (const auto& info : baton::builtin_policies) {
    INFO(info.name);
    CHECK_FALSE(info.origin.empty());
    if (info.torch_name.empty()) {
      baton_only.push_back(info.name);
    } else {
      CHECK(std::find(torch_names.begin(), torch_names.end(), info.torch_name) != torch_names.end());
      CHECK(baton::find_policy(info.torch_name) == &info);
    }
    CHECK(baton::find_policy(info.name) == &info);
  }
  CHECK(baton_only == std::vector<std::string_view>{"zb1p", "forward_only", "v_half", "v_min"});
  CHECK(baton::find_policy("") == nullptr);
  CHECK(baton::find_policy("ZB1P") == baton::find_policy("zb1p"));  // baton's name, any case
  CHECK(baton::find_policy("PipelineScheduleMulti") == nullptr);    // torch's base class: no schedule of its own
}

TEST_CASE("malformed OVERLAP_F_B cells are refused with what to write", "[schedule][csv][reliability]") {
  struct bad_cell {
    const char* cell;
    const char* says;
  };
  const bad_cell cases[] = {
      {"(0F3;3B1", "opens '(' but never closes it"},
      {"(0F3;3B1)OVERLAP", "must end in OVERLAP_F_B, the only pair torch writes, not 'OVERLAP'"},
      {"(0F3;3B1)", "must end in OVERLAP_F_B"},
      {"(0F3)OVERLAP_F_B", "pairs exactly two actions, a forward and then a backward, separated by ';' (it holds 1)"},
      {"(0F3;3B1;0F4)OVERLAP_F_B", "(it holds 3)"},
      {"()OVERLAP_F_B", "(it holds 0)"},
      {"(0F3;3X1)OVERLAP_F_B", "bad token '3X1' in an OVERLAP_F_B cell: expected {stage}"},
      {"((0F3;3B1))OVERLAP_F_B", "bad token '(0F3' in an OVERLAP_F_B cell"},
      {"(3B1;0F3)OVERLAP_F_B", "pairs a forward with the backward (B or I) run after it, but this one holds 3B1 then 0F3"},
      {"(0F3;3W1)OVERLAP_F_B", "but this one holds 0F3 then 3W1"},
      {"(0F3;0SEND_F3)OVERLAP_F_B", "but this one holds 0F3 then 0SEND_F3"},
  };
  for (const auto& c : cases) {
    INFO(c.cell);
    const auto e = csv_rejection("0F0,0F1,0F2," + std::string(c.cell) + "\n");
    CHECK(e.rank() == 0);
    CHECK(e.step() == 3);  // the cell's first action would be the row's fourth
    CHECK_THAT(e.what(), Contains(c.says));
    if (std::string_view(c.says).find("bad token") == std::string_view::npos)
      CHECK_THAT(e.what(), Contains("e.g. (0F3;3B1)OVERLAP_F_B"));
  }
  // A stage-level kind with a microbatch says so.
  const auto e = csv_rejection("0UNSHARD,0F0,0B0\n0RESHARD0\n");
  CHECK(e.rank() == 1);
  CHECK_THAT(e.what(), Contains("RESHARD acts on a whole stage and takes no microbatch: write 0RESHARD"));
}

TEST_CASE("UNSHARD, RESHARD and REDUCE_GRAD out of place are refused with the fix", "[schedule][validate][reliability]") {
  struct case_t {
    const char* name;
    std::string csv;
    baton::problem_kind kind;
    int step;
    const char* says;
  };
  // One rank, one stage, two microbatches (stage 0 on rank 0) unless the rows say otherwise.
  const case_t cases[] = {
      {"UNSHARD after use", "0F0,0UNSHARD,0F1,0B0,0B1,0RESHARD\n", baton::problem_kind::compute_while_sharded, 0,
       "runs before stage 0 is unsharded (0UNSHARD at step 1): move the UNSHARD before the stage's first compute"},
      {"compute after RESHARD", "0UNSHARD,0F0,0F1,0B0,0RESHARD,0B1\n", baton::problem_kind::compute_while_sharded, 5,
       "runs after stage 0 was resharded (0RESHARD at step 4): move that RESHARD after the stage's last compute"},
      {"RESHARD without UNSHARD", "0F0,0F1,0B0,0B1,0RESHARD\n", baton::problem_kind::compute_while_sharded, 0,
       "no UNSHARD comes before this; put 0UNSHARD before the stage's first compute"},
      {"RESHARD twice", "0UNSHARD,0F0,0F1,0B0,0B1,0RESHARD,0RESHARD\n", baton::problem_kind::reshard_without_unshard,
       6, "RESHARD of stage 0, which is not unsharded (it was resharded at step 5)"},
      {"UNSHARD twice", "0UNSHARD,0F0,0UNSHARD,0F1,0B0,0B1,0RESHARD\n", baton::problem_kind::unshard_twice, 2,
       "stage 0 is already unsharded by 0UNSHARD at step 0: RESHARD it before unsharding it again"},
      {"UNSHARD never used", "0UNSHARD,0RESHARD,0UNSHARD,0F0,0F1,0B0,0B1,0RESHARD\n",
       baton::problem_kind::unshard_unused, 1,
       "stage 0 is resharded before any compute used its 0UNSHARD at step 0: remove both"},
      {"UNSHARD at the end", "0UNSHARD,0F0,0F1,0B0,0B1,0RESHARD,0UNSHARD\n", baton::problem_kind::unshard_unused, 6,
       "no compute of stage 0 follows this UNSHARD"},
      {"REDUCE_GRAD before a backward", "0F0,0F1,0B0,0REDUCE_GRAD,0B1\n",
       baton::problem_kind::reduce_grad_before_backward, 3,
       "reduces the gradients of stage 0 before its backward 0B1 (step 4) has produced them: move the REDUCE_GRAD "
       "after the stage's last B or W"},
      {"REDUCE_GRAD before a W", "0F0,0I0,0F1,0I1,0W0,0REDUCE_GRAD,0W1\n",
       baton::problem_kind::reduce_grad_before_backward, 5, "before its backward 0W1 (step 6)"},
      {"REDUCE_GRAD twice", "0F0,0F1,0B0,0B1,0REDUCE_GRAD,0REDUCE_GRAD\n", baton::problem_kind::duplicate_action, 5,
       "duplicate action: 0REDUCE_GRAD already ran at rank 0, step 4"},
      {"REDUCE_GRAD in a forward-only program", "0F0,0F1,0REDUCE_GRAD\n",
       baton::problem_kind::reduce_grad_without_backward, 2,
       "stage 0 runs no backward (B or W): the program is forward-only, so there are no gradients to reduce"},
      {"REDUCE_GRAD of some stages only", "0F0,0F1,0B0,0B1,0REDUCE_GRAD\n1F0,1F1,1B0,1B1\n",
       baton::problem_kind::missing_reduce_grad, 4,
       "reduces the gradients of other stages (REDUCE_GRAD) but never those of stage 1: add 1REDUCE_GRAD"},
      {"UNSHARD on another rank", "0F0,0F1,0B0,0B1,1UNSHARD\n1F0,1F1,1B0,1B1\n", baton::problem_kind::wrong_rank, 4,
       "stage 1 runs on rank 0, but loop placement puts it on rank 1"},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    const baton::program prog = rejected_program(c.csv);
    const auto problem = baton::find_problem(prog);
    REQUIRE(problem);
    CHECK(problem->kind == c.kind);
    const auto e = rejection(prog);
    CHECK(e.step() == c.step);
    CHECK_THAT(e.what(), Contains(c.says));
  }
  // What torch's runtime allows is valid: re-UNSHARD after a RESHARD, no final RESHARD, and
  // stage-level actions in a lowered program.
  for (const char* ok : {"0UNSHARD,0F0,0F1,0RESHARD,0UNSHARD,0B0,0B1,0RESHARD\n", "0UNSHARD,0F0,0F1,0B0,0B1\n",
                         "0UNSHARD,0F0,0F1,0B0,0B1,0REDUCE_GRAD,0RESHARD\n",
                         "0UNSHARD,0F0,0SEND_F0,0F1,0SEND_F1,0RECV_B0,0B0,0RECV_B1,0B1,0REDUCE_GRAD,0RESHARD\n"
                         "1UNSHARD,1RECV_F0,1F0,1B0,1SEND_B0,1RECV_F1,1F1,1B1,1SEND_B1,1REDUCE_GRAD,1RESHARD\n"}) {
    INFO(ok);
    CHECK(baton::is_valid(baton::parse_csv(ok)));
  }
}

TEST_CASE("programs built in code: overlap marks and stage-level microbatches are checked", "[schedule][validate]") {
  const baton::schedule_shape one{1, 1, 2};
  auto problem_of = [&](std::vector<action> row) {
    const auto p = baton::find_problem(baton::program{one, {std::move(row)}});
    REQUIRE(p);
    return *p;
  };
  using K = action_kind;
  // The mark on a backward, on the row's last action, and before something that is not B or I.
  CHECK(problem_of({{0, K::forward, 0}, {0, K::backward, 0, true}, {0, K::forward, 1}, {0, K::backward, 1}}).kind ==
        baton::problem_kind::malformed_overlap);
  CHECK(problem_of({{0, K::forward, 0}, {0, K::backward, 0}, {0, K::forward, 1}, {0, K::backward, 1},
                    {0, K::forward, 1, true}})
            .step == 4);
  const auto before_weight =
      problem_of({{0, K::forward, 0}, {0, K::backward_input, 0}, {0, K::forward, 1, true}, {0, K::backward_weight, 0},
                  {0, K::backward_input, 1}, {0, K::backward_weight, 1}});
  CHECK(before_weight.kind == baton::problem_kind::malformed_overlap);
  CHECK(before_weight.other == action{0, K::backward_weight, 0});
  CHECK_THAT(baton::describe(before_weight, baton::program{one, {}}),
             Contains("must be a backward (B or I) that starts no pair itself, not 0W0"));
  // A stage-level action carries microbatch 0: its text has no room for another.
  const auto with_microbatch =
      problem_of({{0, K::unshard, 1}, {0, K::forward, 0}, {0, K::forward, 1}, {0, K::backward, 0}, {0, K::backward, 1}});
  CHECK(with_microbatch.kind == baton::problem_kind::stage_action_with_microbatch);
  CHECK_THAT(baton::describe(with_microbatch, baton::program{one, {}}),
             Contains("UNSHARD acts on a whole stage and has no microbatch, but this one carries microbatch 1: set it to 0"));
}
