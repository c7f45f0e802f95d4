// baton/schedule/policies.hpp — the built-in schedule policies.
//
// The orders follow torch.distributed.pipelining's schedules (same action sequence per
// rank, idle slots dropped), so programs are interchangeable with its CSV files:
//   gpipe                    all forwards, then all backwards (one stage per rank)
//   one_f_one_b              1F1B: p - 1 - r warm-up forwards, then alternate (one stage per rank)
//   interleaved_1f1b         Megatron's interleaved 1F1B, depth first (several stages per rank, loop)
//   looped_bfs               breadth first: every microbatch through a local stage before the next
//   zb1p                     zero-bubble ZB-H1: 1F1B with split backward, W deferred to fill bubbles
//   interleaved_zero_bubble  ZB1P over several stages per rank (loop)
//   zbv                      ZB-V of the zero-bubble paper: 2 stages per rank in a V, split
//                            backward (a small bubble remains: see zbv below)
//   dual_pipe_v              DeepSeek's DualPipeV: 2 stages per rank in a V, F and B paired
//   forward_only             torch's _ScheduleForwardOnly: every forward, no backward (inference)
// Each generate() is constexpr and checks the shape it is given.
#pragma once

#include <baton/core/meta.hpp>
#include <baton/schedule/policy.hpp>
#include <baton/schedule/program.hpp>

#include <algorithm>
#include <string>
#include <vector>

namespace baton {

namespace detail::schedule {

inline constexpr action_kind F = action_kind::forward;
inline constexpr action_kind B = action_kind::backward;
inline constexpr action_kind I = action_kind::backward_input;
inline constexpr action_kind W = action_kind::backward_weight;

constexpr void check_common(const char* name, const schedule_shape& s) {
  if (s.ranks < 1 || s.stages_per_rank < 1 || s.microbatches < 1)
    shape_error(name, "ranks (" + std::to_string(s.ranks) + "), stages_per_rank (" +
                          std::to_string(s.stages_per_rank) + ") and microbatches (" +
                          std::to_string(s.microbatches) + ") must all be at least 1");
  if (s.ranks > max_index || s.microbatches > max_index ||
      static_cast<long long>(s.ranks) * s.stages_per_rank > max_index)
    shape_error(name, "the shape is too large: ranks x stages_per_rank and microbatches must be at most 1048576");
  // Checked before anything is allocated: a program holds 2 or 3 actions per stage and
  // microbatch, so a shape past this limit would take minutes and gigabytes to build.
  const long long work = static_cast<long long>(s.ranks) * s.stages_per_rank * s.microbatches;
  if (work > max_stage_microbatches)
    shape_error(name, "the shape is too large: ranks x stages_per_rank x microbatches = " + std::to_string(work) +
                          " stage-microbatches, more than the " + std::to_string(max_stage_microbatches) +
                          " a program may hold (2 or 3 actions each); use fewer microbatches or ranks");
}

constexpr void check_one_stage_per_rank(const char* name, const schedule_shape& s) {
  check_common(name, s);
  if (s.stages_per_rank != 1)
    shape_error(name, "runs one stage per rank, but stages_per_rank is " + std::to_string(s.stages_per_rank) +
                          ": set stages_per_rank = 1, or use interleaved_1f1b, looped_bfs or "
                          "interleaved_zero_bubble for several stages per rank");
  if (s.place != placement::loop)
    shape_error(name, "needs placement::loop (with one stage per rank, stage r is on rank r)");
}

constexpr void check_loop(const char* name, const schedule_shape& s) {
  check_common(name, s);
  if (s.place != placement::loop)
    shape_error(name, "needs placement::loop (rank r holds stages r, r + ranks, ...); the V-shaped "
                      "schedules are zbv and dual_pipe_v");
}

constexpr void check_v(const char* name, const schedule_shape& s) {
  check_common(name, s);
  if (s.stages_per_rank != 2 || s.place != placement::v)
    shape_error(name, std::string("needs exactly 2 stages per rank in a V (got stages_per_rank = ") +
                          std::to_string(s.stages_per_rank) + ", placement::" + std::string(to_string(s.place)) +
                          "): use {ranks, 2, microbatches, baton::placement::v}, e.g. baton::shape_for<baton::" +
                          name + ">(ranks, microbatches)");
}

// Interleaved schedules cycle through their local stages in rounds of `per_round`
// microbatches; torch's flexible variant needs the microbatches to split into whole rounds.
constexpr int rounds_of(const schedule_shape& s) { return std::max(1, s.microbatches / s.ranks); }

constexpr void check_rounds(const char* name, const schedule_shape& s) {
  const int rounds = rounds_of(s);
  if (s.microbatches % rounds != 0) {
    const int lower = s.microbatches / s.ranks * s.ranks;
    shape_error(name, "microbatches (" + std::to_string(s.microbatches) +
                          ") must be a multiple of the number of rounds max(1, microbatches / ranks) = " +
                          std::to_string(rounds) + ": use a multiple of ranks, e.g. " + std::to_string(lower) +
                          " or " + std::to_string(lower + s.ranks));
  }
}

constexpr program empty_program(const schedule_shape& s) {
  return program{s, std::vector<std::vector<action>>(static_cast<std::size_t>(s.ranks))};
}

// The program whose row r is row_of(r): the policies that compute each rank's order alone.
template <class RowOf>
constexpr program program_of_rows(const schedule_shape& s, RowOf&& row_of) {
  program prog = empty_program(s);
  for (int r = 0; r < s.ranks; ++r) prog.ranks[static_cast<std::size_t>(r)] = row_of(r);
  return prog;
}

// Fill, then drain: every rank runs the forwards of its stages (first local stage first, each
// over every microbatch), then their backwards (last local stage first), each stage's in
// microbatch order (GPipe) or in reverse (looped BFS).
constexpr program fill_then_drain(const schedule_shape& s, bool backwards_reversed) {
  program prog = empty_program(s);
  const int m = s.microbatches;
  for (int r = 0; r < s.ranks; ++r) {
    auto& row = prog.ranks[static_cast<std::size_t>(r)];
    for (int local = 0; local < s.stages_per_rank; ++local)
      for (int mb = 0; mb < m; ++mb) row.push_back({local * s.ranks + r, F, mb});
    for (int local = s.stages_per_rank - 1; local >= 0; --local)
      for (int i = 0; i < m; ++i) row.push_back({local * s.ranks + r, B, backwards_reversed ? m - 1 - i : i});
  }
  return prog;
}

// torch's _get_1f1b_rank_ops for one rank: warm-up forwards, then one forward and one
// backward per step, then the remaining backwards. With zero_bubble the backward is I and
// W runs once the rank has done `rank` plain steps (filling the bubble of later ranks).
constexpr std::vector<action> interleaved_row(const schedule_shape& s, int rank, int warmup_factor, bool zero_bubble) {
  const int p = s.ranks;
  const int v = s.stages_per_rank;
  const int m = s.microbatches;
  const int per_round = m / rounds_of(s);
  const int warmup = std::min((v - 1) * per_round + warmup_factor * (p - 1 - rank), m * v);
  const int steady = m * v - warmup;
  const int total = warmup + steady + warmup;
  const auto forward_stage = [&](int op) { return ((op / per_round) % v) * p + rank; };
  const auto backward_stage = [&](int op) { return (v - 1 - ((op - warmup) / per_round) % v) * p + rank; };
  std::vector<int> next_forward(static_cast<std::size_t>(v), 0);
  std::vector<int> next_backward(static_cast<std::size_t>(v), 0);
  std::vector<int> next_weight(static_cast<std::size_t>(v), 0);
  std::vector<int> backward_ops;
  std::size_t weights_done = 0;
  const action_kind backward_kind = zero_bubble ? I : B;
  const int plain_steps = zero_bubble ? rank : 0;
  std::vector<action> row;
  row.reserve(static_cast<std::size_t>(m * v * (zero_bubble ? 3 : 2)));
  auto add = [&](std::vector<int>& counters, int stage, action_kind kind) {
    int& mb = counters[static_cast<std::size_t>(stage / p)];
    row.push_back(action{stage, kind, mb++});
  };
  auto add_weight = [&] {
    add(next_weight, backward_stage(backward_ops[weights_done]), W);
    ++weights_done;
  };
  for (int op = 0; op < total; ++op) {
    if (op < warmup) {
      add(next_forward, forward_stage(op), F);
      continue;
    }
    if (op < warmup + steady) add(next_forward, forward_stage(op), F);
    add(next_backward, backward_stage(op), backward_kind);
    backward_ops.push_back(op);
    if (zero_bubble && op - warmup >= plain_steps) add_weight();
  }
  while (zero_bubble && weights_done < backward_ops.size()) add_weight();
  return row;
}

// The program whose every rank runs interleaved_row: the 1F1B family (1F1B, interleaved
// 1F1B, ZB1P, interleaved zero bubble) differs only in the warm-up and the split backward.
constexpr program interleaved_program(const schedule_shape& s, int warmup_factor, bool zero_bubble) {
  return program_of_rows(s, [&](int r) { return interleaved_row(s, r, warmup_factor, zero_bubble); });
}

// ZB-V's order for rank r (see zbv): the pattern of max(2p - 1, m) microbatches, those past m
// dropped.
constexpr std::vector<action> zbv_row(const schedule_shape& s, int r) {
  const int p = s.ranks;
  const int m = s.microbatches;
  const int n = std::max(2 * p - 1, m);
  const int c0 = r;
  const int c1 = 2 * p - 1 - r;
  int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  std::vector<action> all;
  all.reserve(static_cast<std::size_t>(6 * n));
  for (int i = 0; i < 2 * (p - r) - 1; ++i) all.push_back({c0, F, f0++});
  for (int i = 0; i < r; ++i) {
    all.push_back({c1, F, f1++});
    all.push_back({c0, F, f0++});
  }
  for (int i = 0; i < p - r; ++i) {
    all.push_back({c1, F, f1++});
    all.push_back({c1, I, b1});
    all.push_back({c1, W, b1++});
  }
  while (f1 < f0 || f0 < n) {
    if (f0 < n) all.push_back({c0, F, f0++});
    all.push_back({c0, I, b0});
    all.push_back({c0, W, b0++});
    all.push_back({c1, F, f1++});
    all.push_back({c1, I, b1});
    all.push_back({c1, W, b1++});
  }
  int w0 = b0, w1 = b1;
  for (int i = 0; i < r; ++i) {
    all.push_back({c0, I, b0++});
    all.push_back({c1, I, b1++});
  }
  for (int i = 0; i < p - r; ++i) {
    all.push_back({c0, I, b0++});
    all.push_back({c0, W, w0++});
  }
  while (w1 < b1) all.push_back({c1, W, w1++});
  while (w0 < b0) all.push_back({c0, W, w0++});
  std::vector<action> row;
  for (const action& a : all)
    if (a.microbatch < m) row.push_back(a);
  return row;
}

// DualPipeV's order for rank r (see dual_pipe_v), as torch's generator builds it.
constexpr std::vector<action> dual_pipe_v_row(const schedule_shape& s, int r) {
  const int p = s.ranks;
  const int m = s.microbatches;
  const int stage[2] = {r, 2 * p - 1 - r};
  int next_f[2] = {0, 0};
  int next_i[2] = {0, 0};  // full backwards count here too: B and I share microbatch order
  std::vector<action> pending_weights;
  std::size_t weights_done = 0;
  std::vector<action> row;
  auto add = [&](int chunk, action_kind kind) {
    if (kind == F) {
      row.push_back({stage[chunk], F, next_f[chunk]++});
      return;
    }
    const action a{stage[chunk], kind, next_i[chunk]++};
    row.push_back(a);
    if (kind == I) pending_weights.push_back({a.stage, W, a.microbatch});
  };
  auto add_weight_if_pending = [&] {
    if (weights_done < pending_weights.size()) row.push_back(pending_weights[weights_done++]);
  };
  // torch's add_overlap_f_b: the forward of one chunk and the full backward of the other.
  auto add_overlapped = [&](int forward_chunk, int backward_chunk) {
    add(forward_chunk, F);
    row.back().overlaps_next = true;
    add(backward_chunk, B);
  };
  for (int i = 0; i < 2 * (p - r - 1); ++i) add(0, F);
  for (int i = 0; i < r + 1; ++i) {
    add(0, F);
    add(1, F);
  }
  for (int i = 0; i < p - r - 1; ++i) {
    add(1, I);
    add_weight_if_pending();
    add(1, F);
  }
  for (int i = 0; i < m - 2 * p + r + 1; ++i) {
    if (i == 0 && r == p - 1) {  // torch leaves this first pair of the last rank unpaired
      add(0, F);
      add(1, B);
    } else {
      add_overlapped(0, 1);
    }
    add_overlapped(1, 0);
  }
  for (int i = 0; i < p - r - 1; ++i) {
    add(1, B);
    add_overlapped(1, 0);
  }
  bool split = false;
  const int tail = r + 1;
  for (int i = 0; i < tail; ++i) {
    if (i == tail / 2 && r % 2 == 1) split = true;
    add(1, split ? I : B);
    if (i == tail / 2 && r % 2 == 0) split = true;
    add(0, split ? I : B);
  }
  for (int i = 0; i < p - r - 1; ++i) {
    add_weight_if_pending();
    add(0, split ? I : B);
  }
  while (weights_done < pending_weights.size()) add_weight_if_pending();
  return row;
}

// The loop-placement policies form two families whose members differ only in parameters, so
// each family is one policy template; Name is what its errors call the member. A Looped member
// serves any stages per rank in loop placement (2 by default), the others one stage per rank.
//   fill_then_drain_family: GPipe and looped BFS, backwards in microbatch order or reversed;
//   one_f_one_b_family: interleaved_row's warm-up factor and split backward, the looped
//   members in whole rounds.
template <fixed_string Name, bool Looped>
constexpr void check_loop_family(const schedule_shape& s) {
  if constexpr (Looped)
    check_loop(Name.chars, s);
  else
    check_one_stage_per_rank(Name.chars, s);
}

template <fixed_string Name, bool BackwardsReversed, bool Looped>
struct fill_then_drain_family : policy_traits<false, placement::loop, Looped ? 2 : 1> {
  [[nodiscard]] static constexpr program generate(const schedule_shape& s) {
    check_loop_family<Name, Looped>(s);
    return fill_then_drain(s, BackwardsReversed);
  }
};

template <fixed_string Name, int WarmupFactor, bool ZeroBubble, bool Looped>
struct one_f_one_b_family : policy_traits<ZeroBubble, placement::loop, Looped ? 2 : 1> {
  [[nodiscard]] static constexpr program generate(const schedule_shape& s) {
    check_loop_family<Name, Looped>(s);
    if constexpr (Looped) check_rounds(Name.chars, s);
    return interleaved_program(s, WarmupFactor, ZeroBubble);
  }
};

}  // namespace detail::schedule

// GPipe: fill with every forward, drain with every backward. Peak live activations: all m
// microbatches on every rank. One stage per rank, any number of microbatches.
struct gpipe : detail::schedule::fill_then_drain_family<"gpipe", false, false> {};

// 1F1B: rank r runs min(m, p - 1 - r) warm-up forwards, then alternates forward and
// backward, then drains. Same bubble as GPipe, at most p live microbatches (on rank 0).
struct one_f_one_b : detail::schedule::one_f_one_b_family<"one_f_one_b", 1, false, false> {};

// Interleaved 1F1B (Narayanan et al. 2021), torch's flexible variant: stages_per_rank = v
// chunks per rank in loop placement, depth first, bubble (p - 1) / (v m + p - 1) of the
// 1F1B time when m is a multiple of p. Needs m to be a multiple of max(1, m / p).
struct interleaved_1f1b : detail::schedule::one_f_one_b_family<"interleaved_1f1b", 2, false, true> {};

// Looped BFS (Lamy-Poirier 2022): each rank runs all microbatches through its first local
// stage, then its next; backwards in reverse. Any stages per rank (loop placement).
struct looped_bfs : detail::schedule::fill_then_drain_family<"looped_bfs", true, true> {};

// ZB-H1 of the zero-bubble paper (Qi et al. 2024): 1F1B with the backward split into I and
// W; rank r postpones its first W by r steps, so W fills the cool-down bubble. Bubble
// (p - 1)(T_F + T_I - T_W) instead of (p - 1)(T_F + T_B), same peak memory as 1F1B.
struct zb1p : detail::schedule::one_f_one_b_family<"zb1p", 1, true, false> {};

// torch's ScheduleInterleavedZeroBubble: ZB1P over stages_per_rank chunks in loop placement.
// Needs m to be a multiple of max(1, m / p).
struct interleaved_zero_bubble : detail::schedule::one_f_one_b_family<"interleaved_zero_bubble", 1, true, true> {};

// ZB-V (zero-bubble paper, section 6): 2 stages per rank in a V (rank r holds r and
// 2p - 1 - r), split backward, at 1F1B's peak memory. Not bubble-free: with T_F = T_I = T_W
// (one rank's share of the model) and no communication cost, each rank idles
// (p - 1) T_F / 2 (a sixth of 1F1B's (p - 1)(T_F + T_B)) while the first microbatches
// fill the V: a bubble ratio of (p - 1) / (6m + p - 1) for m >= 2p - 1, 0.0588 at p = 4,
// m = 8 (`baton-schedule simulate --policy zbv --ranks 4 --microbatches 8`; pinned by
// tests/schedule/test_simulate.cpp). For m < 2p - 1 the bubble is larger.
// For m < 2p - 1 the full pattern is built and the missing microbatches dropped.
struct zbv : detail::schedule::policy_traits<true, placement::v, 2> {
  [[nodiscard]] static constexpr program generate(const schedule_shape& s) {
    using namespace detail::schedule;
    check_v("zbv", s);
    return program_of_rows(s, [&](int r) { return zbv_row(s, r); });
  }
};

// DualPipeV (DeepSeek-V3's DualPipe folded into a V, as torch implements it): 2 stages
// per rank in a V; in the steady phase each forward of one stage is paired with a full
// backward of the other (torch's OVERLAP_F_B: the forward has overlaps_next, the CSV cell is
// `(0F3;3B1)OVERLAP_F_B`), and the tails use I/W. Needs at least 2 x ranks microbatches.
struct dual_pipe_v : detail::schedule::policy_traits<true, placement::v, 2> {
  [[nodiscard]] static constexpr program generate(const schedule_shape& s) {
    using namespace detail::schedule;
    check_v("dual_pipe_v", s);
    if (s.microbatches < 2 * s.ranks)
      shape_error("dual_pipe_v", "needs at least 2 x ranks = " + std::to_string(2 * s.ranks) + " microbatches (got " +
                                     std::to_string(s.microbatches) + "): raise microbatches, or use zbv for fewer");
    return program_of_rows(s, [&](int r) { return dual_pipe_v_row(s, r); });
  }
};

// torch's _ScheduleForwardOnly: each rank runs the forward of its one stage for every
// microbatch in order, and nothing else (inference, evaluation). One stage per rank, any
// number of microbatches. A training step needs backwards: use it with eval-style runs.
struct forward_only : detail::schedule::policy_traits<false, placement::loop, 1> {
  [[nodiscard]] static constexpr program generate(const schedule_shape& s) {
    using namespace detail::schedule;
    check_common("forward_only", s);
    if (s.stages_per_rank != 1 || s.place != placement::loop)
      shape_error("forward_only", "runs one stage per rank, as torch's _ScheduleForwardOnly does (got stages_per_rank = " +
                                      std::to_string(s.stages_per_rank) + ", placement::" +
                                      std::string(to_string(s.place)) + "): use {ranks, 1, microbatches}");
    program prog = empty_program(s);
    for (int r = 0; r < s.ranks; ++r)
      for (int mb = 0; mb < s.microbatches; ++mb) prog.ranks[static_cast<std::size_t>(r)].push_back({r, F, mb});
    return prog;
  }
};

}  // namespace baton
