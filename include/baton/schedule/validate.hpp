// baton/schedule/validate.hpp — prove a program correct before it runs.
//
// A valid program (compute-only or lowered) has one row per rank and:
//   - every action in range, each stage's actions on the rank the placement gives it;
//   - every action exactly once; for each stage and microbatch one F and either one B, or
//     one I followed by one W; I/B after F of the same stage and microbatch, W after I;
//   - data dependencies across stages: F of s after F of s - 1, the backward of s after
//     the backward of s + 1 (in the same row when the two stages share a rank);
//   - lowered programs: each cross-rank F/B/I preceded by its receive, each send after the
//     compute it sends, every send matched by a receive and vice versa, no message between
//     stages that share a rank;
//   - a forward-only program (no B, I or W anywhere) needs every forward and no backward;
//   - an overlapped pair is a forward followed at once by a B or I; it starts when the inputs
//     of both are there;
//   - stage-level actions (microbatch 0): a stage with any UNSHARD or RESHARD computes only
//     between an UNSHARD and the next RESHARD, UNSHARD and RESHARD alternate, and each UNSHARD
//     is used by a compute before its RESHARD or the end (torch's _PipelineScheduleRuntime
//     asserts the same for an FSDP stage); REDUCE_GRAD at most once per stage, after its last
//     B or W, and for every stage once any stage has one;
//   - no deadlock: run with blocking receives and buffered sends, every rank finishes.
// find_problem() and is_valid() are constexpr, so a fixed shape can be checked by
// static_assert; validate() throws schedule_error with the place and a grid excerpt. The
// problems and their messages are in problem.hpp.
#pragma once

#include <baton/schedule/detail/analysis.hpp>
#include <baton/schedule/problem.hpp>
#include <baton/schedule/program.hpp>

#include <algorithm>
#include <array>
#include <optional>
#include <vector>

namespace baton {

namespace detail::schedule {

constexpr schedule_problem make_problem(problem_kind kind, int rank, int step, std::optional<action> act) {
  schedule_problem p;
  p.kind = kind;
  p.rank = rank;
  p.step = step;
  p.act = act;
  return p;
}

constexpr schedule_problem with_other(schedule_problem p, action other, position where) {
  p.other = other;
  p.other_rank = where.rank;
  p.other_step = where.step;
  return p;
}

// Visits every action in row order; the first problem check(rank, step, action) returns. Each
// pass of find_problem is one such walk.
template <class Check>
constexpr std::optional<schedule_problem> first_problem(const program& prog, Check&& check) {
  for (int r = 0; r < static_cast<int>(prog.ranks.size()); ++r) {
    const auto& row = prog.ranks[static_cast<std::size_t>(r)];
    for (int t = 0; t < static_cast<int>(row.size()); ++t)
      if (auto problem = check(r, t, row[static_cast<std::size_t>(t)])) return problem;
  }
  return std::nullopt;
}

// When stages x microbatches dwarfs the program (a corrupt file naming microbatch 900000),
// some forward is missing; find the first one without allocating the full index.
constexpr schedule_problem first_missing_forward(const program& prog) {
  std::vector<std::array<int, 2>> forwards;
  for (const auto& row : prog.ranks)
    for (const auto& a : row)
      if (a.kind == action_kind::forward) forwards.push_back({a.stage, a.microbatch});
  std::sort(forwards.begin(), forwards.end());
  forwards.erase(std::unique(forwards.begin(), forwards.end()), forwards.end());
  const int m = prog.shape.microbatches;
  long long expected = 0;  // the (stage, microbatch) pairs in order, as stage * m + microbatch
  for (const auto& f : forwards) {
    const long long id = static_cast<long long>(f[0]) * m + f[1];
    if (id != expected) break;
    ++expected;
  }
  const int stage = static_cast<int>(expected / m);
  const int microbatch = static_cast<int>(expected % m);
  const int rank = stage_rank(prog.shape, stage);
  return make_problem(problem_kind::missing_forward, rank,
                      static_cast<int>(prog.ranks[static_cast<std::size_t>(rank)].size()),
                      action{stage, action_kind::forward, microbatch});
}

// The order of the stage-level actions, rank by rank (see the header comment), in a program
// that has some.
constexpr std::optional<schedule_problem> stage_level_problem(const program& prog) {
  using K = action_kind;
  const int S = prog.shape.num_stages();

  std::vector<unsigned char> sharding_managed(static_cast<std::size_t>(S), 0);
  std::vector<int> last_weight_step(static_cast<std::size_t>(S), -1);  // the stage's last B or W
  for (const auto& row : prog.ranks)
    for (int t = 0; t < static_cast<int>(row.size()); ++t) {
      const action& a = row[static_cast<std::size_t>(t)];
      const auto s = static_cast<std::size_t>(a.stage);
      if (a.kind == K::unshard || a.kind == K::reshard) sharding_managed[s] = 1;
      if (a.kind == K::backward || a.kind == K::backward_weight) last_weight_step[s] = t;
    }

  enum : unsigned char { sharded, unsharded_unused, unsharded_used };
  std::vector<unsigned char> state(static_cast<std::size_t>(S), sharded);
  std::vector<int> changed_at(static_cast<std::size_t>(S), -1);  // step of the stage's last UNSHARD or RESHARD
  for (int r = 0; r < static_cast<int>(prog.ranks.size()); ++r) {
    const auto& row = prog.ranks[static_cast<std::size_t>(r)];
    auto at_step = [&](int step) { return row[static_cast<std::size_t>(step)]; };
    for (int t = 0; t < static_cast<int>(row.size()); ++t) {
      const action& a = row[static_cast<std::size_t>(t)];
      const auto s = static_cast<std::size_t>(a.stage);
      auto fail = [&](problem_kind kind, int other_step) {
        auto p = make_problem(kind, r, t, a);
        return other_step >= 0 ? with_other(p, at_step(other_step), position{r, other_step}) : p;
      };
      switch (a.kind) {
        case K::unshard:
          if (state[s] != sharded) return fail(problem_kind::unshard_twice, changed_at[s]);
          state[s] = unsharded_unused;
          changed_at[s] = t;
          break;
        case K::reshard:
          if (state[s] == sharded) return fail(problem_kind::reshard_without_unshard, changed_at[s]);
          if (state[s] == unsharded_unused) return fail(problem_kind::unshard_unused, changed_at[s]);
          state[s] = sharded;
          changed_at[s] = t;
          break;
        case K::reduce_grad:
          if (last_weight_step[s] < 0) return fail(problem_kind::reduce_grad_without_backward, -1);
          if (last_weight_step[s] > t) return fail(problem_kind::reduce_grad_before_backward, last_weight_step[s]);
          break;
        default:
          if (!is_compute(a.kind) || !sharding_managed[s]) break;
          if (state[s] == sharded) {
            // Point at what to move: the RESHARD before this compute, else the UNSHARD after it.
            int other = changed_at[s];
            for (int u = t + 1; other < 0 && u < static_cast<int>(row.size()); ++u)
              if (at_step(u).kind == K::unshard && at_step(u).stage == a.stage) other = u;
            return fail(problem_kind::compute_while_sharded, other);
          }
          state[s] = unsharded_used;
          break;
      }
    }
  }
  for (int s = 0; s < S; ++s) {
    if (state[static_cast<std::size_t>(s)] != unsharded_unused) continue;
    const int r = stage_rank(prog.shape, s);
    const int t = changed_at[static_cast<std::size_t>(s)];
    return make_problem(problem_kind::unshard_unused, r, t, prog.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)]);
  }
  return std::nullopt;
}

}  // namespace detail::schedule

// The first problem of the program, in this order: shape, rows, ranges and placement,
// overlapped pairs, duplicates, order within a rank, stage-level actions, message pairing,
// completeness, deadlock.
[[nodiscard]] constexpr std::optional<schedule_problem> find_problem(const program& prog) {
  using detail::schedule::make_problem;
  using detail::schedule::position;
  using detail::schedule::with_other;
  using K = action_kind;
  const schedule_shape& shape = prog.shape;
  constexpr int limit = detail::schedule::max_index;
  if (shape.ranks < 1 || shape.stages_per_rank < 1 || shape.microbatches < 1 || shape.ranks > limit ||
      shape.stages_per_rank > limit || shape.microbatches > limit ||
      static_cast<long long>(shape.ranks) * shape.stages_per_rank > limit)
    return make_problem(problem_kind::bad_shape, -1, -1, std::nullopt);

  const int ranks = shape.ranks;
  const int rows = static_cast<int>(prog.ranks.size());
  if (rows != ranks) {
    auto p = make_problem(problem_kind::wrong_row_count, std::min(rows, ranks), 0, std::nullopt);
    if (rows > ranks && !prog.ranks[static_cast<std::size_t>(ranks)].empty())
      p.act = prog.ranks[static_cast<std::size_t>(ranks)].front();
    p.expected = ranks;
    p.got = rows;
    return p;
  }

  const int S = shape.num_stages();
  const int m = shape.microbatches;
  const bool lowered = is_lowered(prog);
  bool has_stage_level = false;
  bool forward_only = true;  // no B, I or W anywhere: see is_forward_only
  using maybe_problem = std::optional<schedule_problem>;
  using detail::schedule::first_problem;

  // Ranges, placement, messages that need to exist, overlapped pairs.
  const auto in_range = [&](int r, int t, const action& a) -> maybe_problem {
    const auto& row = prog.ranks[static_cast<std::size_t>(r)];
    const int s = a.stage;
    if (is_compute(a.kind) && a.kind != K::forward) forward_only = false;
    if (s < 0 || s >= S) {
      auto p = make_problem(problem_kind::stage_out_of_range, r, t, a);
      p.expected = S;
      return p;
    }
    if (is_stage_level(a.kind)) {
      has_stage_level = true;
      if (a.microbatch != 0) return make_problem(problem_kind::stage_action_with_microbatch, r, t, a);
    }
    if (a.microbatch < 0 || a.microbatch >= m) {
      auto p = make_problem(problem_kind::microbatch_out_of_range, r, t, a);
      p.expected = m;
      return p;
    }
    if (stage_rank(shape, s) != r) {
      auto p = make_problem(problem_kind::wrong_rank, r, t, a);
      p.other_rank = stage_rank(shape, s);
      return p;
    }
    int peer = -1;  // the stage at the other end of a message
    if (a.kind == K::send_forward) peer = s + 1;
    if (a.kind == K::recv_forward) peer = s - 1;
    if (a.kind == K::send_backward) peer = s - 1;
    if (a.kind == K::recv_backward) peer = s + 1;
    if (is_communication(a.kind) && (peer < 0 || peer >= S || stage_rank(shape, peer) == r)) {
      auto p = make_problem(problem_kind::message_not_needed, r, t, a);
      p.other_rank = peer;  // the peer stage, or out of range at the pipeline's ends
      return p;
    }
    if (a.overlaps_next) {
      const bool has_next = t + 1 < static_cast<int>(row.size());
      const action* next = has_next ? &row[static_cast<std::size_t>(t + 1)] : nullptr;
      if (a.kind != K::forward || !next || !is_input_backward(next->kind) || next->overlaps_next) {
        auto p = make_problem(problem_kind::malformed_overlap, r, t, a);
        return next ? with_other(p, *next, position{r, t + 1}) : p;
      }
    }
    return std::nullopt;
  };
  if (auto problem = first_problem(prog, in_range)) return problem;

  // Every (stage, microbatch) needs a forward; a program shorter than that is missing one,
  // and the full index would be needlessly large.
  if (static_cast<long long>(S) * m > static_cast<long long>(action_count(prog)))
    return detail::schedule::first_missing_forward(prog);

  detail::schedule::action_index index(prog, lowered);
  const auto first_occurrence = [&](int r, int t, const action& a) -> maybe_problem {
    if (a.kind == K::unshard || a.kind == K::reshard) return std::nullopt;  // a stage may be unsharded again
    position& first = index.at(index.key(a));
    if (first.found()) return with_other(make_problem(problem_kind::duplicate_action, r, t, a), a, first);
    first = position{r, t};
    return std::nullopt;
  };
  if (auto problem = first_problem(prog, first_occurrence)) return problem;

  // Order within a rank. All actions of a stage are on one rank now, so "earlier in this
  // row" is a comparison of steps.
  auto before = [&](K kind, int s, int mb, int step) {
    const position& p = index.at(kind, s, mb);
    return p.found() && p.step < step;
  };
  const auto in_order = [&](int r, int t, const action& a) -> maybe_problem {
    const int s = a.stage;
    const int mb = a.microbatch;
    auto fail = [&](problem_kind kind, action other) {
      return with_other(make_problem(kind, r, t, a), other, index.at(index.key(other)));
    };
    switch (a.kind) {
      case K::forward:
        if (s > 0 && index.colocated(s - 1, s) && !before(K::forward, s - 1, mb, t))
          return fail(problem_kind::input_not_ready, action{s - 1, K::forward, mb});
        if (lowered && s > 0 && !index.colocated(s - 1, s) && !before(K::recv_forward, s, mb, t))
          return fail(problem_kind::compute_before_receive, action{s, K::recv_forward, mb});
        break;
      case K::backward:
      case K::backward_input: {
        const K other_kind = a.kind == K::backward ? K::backward_input : K::backward;
        if (index.has(other_kind, s, mb)) {
          const position& o = index.at(other_kind, s, mb);
          if (o.step < t) return fail(problem_kind::mixed_backward, action{s, other_kind, mb});
        }
        if (!before(K::forward, s, mb, t))
          return fail(problem_kind::backward_before_forward, action{s, K::forward, mb});
        if (s + 1 < S && index.colocated(s + 1, s)) {
          const action next = index.input_backward(s + 1, mb);
          if (!before(next.kind, s + 1, mb, t)) return fail(problem_kind::input_not_ready, next);
        }
        if (lowered && s + 1 < S && !index.colocated(s + 1, s) && !before(K::recv_backward, s, mb, t))
          return fail(problem_kind::compute_before_receive, action{s, K::recv_backward, mb});
        break;
      }
      case K::backward_weight:
        if (index.has(K::backward, s, mb))
          return fail(problem_kind::weight_after_full_backward, action{s, K::backward, mb});
        if (!before(K::backward_input, s, mb, t))
          return fail(problem_kind::weight_before_input, action{s, K::backward_input, mb});
        break;
      case K::send_forward:
        if (!before(K::forward, s, mb, t)) return fail(problem_kind::send_before_compute, action{s, K::forward, mb});
        break;
      case K::send_backward: {
        const action produced = index.input_backward(s, mb);
        if (!before(produced.kind, s, mb, t)) return fail(problem_kind::send_before_compute, produced);
        break;
      }
      default:
        break;
    }
    return std::nullopt;
  };
  if (auto problem = first_problem(prog, in_order)) return problem;

  if (has_stage_level)
    if (auto problem = detail::schedule::stage_level_problem(prog)) return problem;

  // Every message has both ends.
  const auto paired = [&](int r, int t, const action& a) -> maybe_problem {
    const int s = a.stage;
    const int mb = a.microbatch;
    std::optional<action> partner;
    problem_kind kind = problem_kind::receive_without_send;
    if (a.kind == K::recv_forward) partner = action{s - 1, K::send_forward, mb};
    if (a.kind == K::recv_backward) partner = action{s + 1, K::send_backward, mb};
    if (a.kind == K::send_forward) partner = action{s + 1, K::recv_forward, mb}, kind = problem_kind::send_without_receive;
    if (a.kind == K::send_backward) partner = action{s - 1, K::recv_backward, mb}, kind = problem_kind::send_without_receive;
    if (partner && !index.at(index.key(*partner)).found()) {
      auto p = make_problem(kind, r, t, a);
      p.other = partner;
      p.other_rank = stage_rank(shape, partner->stage);
      return p;
    }
    return std::nullopt;
  };
  if (auto problem = first_problem(prog, paired)) return problem;

  // Every stage runs every microbatch forward and, unless the program is forward-only,
  // backward; and reduces its gradients if any stage does.
  bool reduces_gradients = false;
  for (int s = 0; s < S && !reduces_gradients; ++s) reduces_gradients = index.has(K::reduce_grad, s, 0);
  for (int s = 0; s < S; ++s) {
    const int r = stage_rank(shape, s);
    const int end = static_cast<int>(prog.ranks[static_cast<std::size_t>(r)].size());
    for (int mb = 0; mb < m; ++mb) {
      if (!index.has(K::forward, s, mb)) {
        auto p = make_problem(problem_kind::missing_forward, r, end, action{s, K::forward, mb});
        p.expected = m;
        return p;
      }
      if (forward_only) continue;
      if (!index.has(K::backward, s, mb) && !index.has(K::backward_input, s, mb))
        return make_problem(problem_kind::missing_backward, r, end, action{s, K::backward, mb});
      if (index.has(K::backward_input, s, mb) && !index.has(K::backward_weight, s, mb)) {
        const action input{s, K::backward_input, mb};
        return with_other(make_problem(problem_kind::missing_weight, r, end, action{s, K::backward_weight, mb}), input,
                          index.at(index.key(input)));
      }
    }
    if (reduces_gradients && !index.has(K::reduce_grad, s, 0))
      return make_problem(problem_kind::missing_reduce_grad, r, end, action{s, K::reduce_grad, 0});
  }

  // Run it: receives block, sends are buffered.
  const auto walked = detail::schedule::walk_in_dependency_order(prog, index, [](int, int, const action&, auto) {});
  int blocked = -1;
  for (int r = 0; r < ranks && blocked < 0; ++r)
    if (walked.next_step[static_cast<std::size_t>(r)] < static_cast<int>(prog.ranks[static_cast<std::size_t>(r)].size()))
      blocked = r;
  if (blocked < 0) return std::nullopt;

  // Each blocked rank waits for an action of a rank that is itself blocked before it; follow
  // the waits until a rank repeats: that is the cycle.
  std::vector<int> seen_at(static_cast<std::size_t>(ranks), -1);
  std::vector<int> chain;
  int r = blocked;
  while (seen_at[static_cast<std::size_t>(r)] < 0) {
    seen_at[static_cast<std::size_t>(r)] = static_cast<int>(chain.size());
    chain.push_back(r);
    r = index.at(walked.waiting[static_cast<std::size_t>(r)]).rank;
  }
  std::vector<std::array<int, 2>> cycle;
  for (std::size_t i = static_cast<std::size_t>(seen_at[static_cast<std::size_t>(r)]); i < chain.size(); ++i)
    cycle.push_back({chain[i], walked.next_step[static_cast<std::size_t>(chain[i])]});
  const int head_rank = cycle.front()[0];
  const int head_step = cycle.front()[1];
  auto p = make_problem(problem_kind::deadlock, head_rank, head_step,
                        prog.ranks[static_cast<std::size_t>(head_rank)][static_cast<std::size_t>(head_step)]);
  const std::size_t awaited_key = walked.waiting[static_cast<std::size_t>(head_rank)];
  const position awaited_at = index.at(awaited_key);
  p = with_other(p, prog.ranks[static_cast<std::size_t>(awaited_at.rank)][static_cast<std::size_t>(awaited_at.step)],
                 awaited_at);
  p.wait_cycle = cycle;
  return p;
}

[[nodiscard]] constexpr bool is_valid(const program& prog) { return !find_problem(prog).has_value(); }

// Throws schedule_error naming rank, step and action, with the grid around them.
inline void validate(const program& prog) {
  if (auto problem = find_problem(prog))
    throw schedule_error(describe(*problem, prog), problem->rank, problem->step, problem->act);
}

}  // namespace baton
