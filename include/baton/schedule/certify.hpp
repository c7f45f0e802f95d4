// baton/schedule/certify.hpp — a checkable proof that a program cannot deadlock.
//
// The transport baton's executor assumes (docs/pipeline.md): a SEND posts its message and
// returns (non-blocking, buffered until the receiver takes it); a RECV's data is waited for
// before the compute it feeds, and validation waits already at the RECV, which is stricter.
// Under that model a program runs to completion exactly when the graph of its waits is
// acyclic. The graph's edges:
//   - program order: step t of a rank before step t + 1;
//   - messages: in a lowered program each RECV after its SEND (same stage boundary,
//     direction and microbatch); in a compute-only program, where the messages are implicit,
//     each compute whose input comes from another rank after the compute producing it;
//   - an overlapped F/B pair starts only when the inputs of both are there, so its forward
//     also comes after the message its backward waits for.
// A certificate is a topological order of that graph, every action once, plus the SEND (or
// producer) matched to every RECV (or consumer). check_certificate() verifies it in one pass
// without running anything: an order in which every action follows its predecessor on the
// rank and every wait follows what it waits for is a complete run, so no rank can block
// forever. certify_deadlock_free() builds one, or throws schedule_error naming the problem
// (for a deadlock: the cycle of waiting ranks, their steps and actions).
#pragma once

#include <baton/schedule/detail/analysis.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/validate.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace baton {

// (rank, step) of an action in its program.
using action_place = std::array<int, 2>;

// A wait between ranks: the action at `waiter` cannot start before the one at `awaited`.
struct matched_wait {
  action_place awaited;  // the SEND (lowered) or the producing compute (compute-only)
  action_place waiter;   // the RECV (lowered) or the consuming compute; for an overlapped pair, its forward
};

struct deadlock_certificate {
  schedule_shape shape{};
  std::vector<action_place> order;   // every action once, each after everything it waits for
  std::vector<matched_wait> waits;   // every wait between ranks, with both ends
};

namespace detail::schedule {

inline std::string place_text(const program& prog, action_place place) {
  const auto& row = prog.ranks[static_cast<std::size_t>(place[0])];
  return "rank " + int_to_string(place[0]) + ", step " + int_to_string(place[1]) + " (" +
         to_string(row[static_cast<std::size_t>(place[1])]) + ")";
}

}  // namespace detail::schedule

// Builds the certificate of a valid program (compute-only or lowered). Throws schedule_error
// with validate()'s message when the program is invalid; for a deadlock that message names
// the cycle: "deadlock under blocking receives: rank 0 waits at step 1 (0B0) for rank 1, ...".
[[nodiscard]] inline deadlock_certificate certify_deadlock_free(const program& prog) {
  if (auto problem = find_problem(prog))
    throw schedule_error(describe(*problem, prog), problem->rank, problem->step, problem->act);
  detail::schedule::action_index index(prog, is_lowered(prog));
  for (int r = 0; r < static_cast<int>(prog.ranks.size()); ++r)
    for (int t = 0; t < static_cast<int>(prog.ranks[static_cast<std::size_t>(r)].size()); ++t)
      index.at(index.key(prog.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)])) = {r, t};

  deadlock_certificate cert;
  cert.shape = prog.shape;
  cert.order.reserve(action_count(prog));
  detail::schedule::walk_in_dependency_order(
      prog, index, [&](int r, int step, const action&, const std::optional<action>& dependency) {
        cert.order.push_back({r, step});
        if (dependency) {
          const auto at = index.at(index.key(*dependency));
          cert.waits.push_back({{at.rank, at.step}, {r, step}});
        }
        // An overlapped pair starts when its backward's input is there too.
        const auto& row = prog.ranks[static_cast<std::size_t>(r)];
        if (row[static_cast<std::size_t>(step)].overlaps_next) {
          if (const auto partner = index.remote_dependency(row[static_cast<std::size_t>(step) + 1])) {
            const auto at = index.at(index.key(*partner));
            cert.waits.push_back({{at.rank, at.step}, {r, step}});
          }
        }
      });
  if (cert.order.size() != action_count(prog))  // find_problem runs the same walk: unreachable
    throw schedule_error("baton: internal error: a program that validated did not run to its end; please report it");
  return cert;
}

// Verifies a certificate against the program without running it: nullopt when it proves the
// program deadlock-free, else what is wrong with it. Independent of how the certificate was
// made: it recomputes every wait from the actions' kinds, stages and microbatches.
[[nodiscard]] inline std::optional<std::string> check_certificate(const program& prog,
                                                                 const deadlock_certificate& cert) {
  using detail::schedule::place_text;
  if (cert.shape != prog.shape) return std::string("the certificate is for another shape");
  if (cert.order.size() != action_count(prog))
    return "the order holds " + std::to_string(cert.order.size()) + " actions, the program " +
           std::to_string(action_count(prog));
  const std::size_t ranks = prog.ranks.size();
  // rank_offset[r] + step numbers every action; position[] is its place in the order.
  std::vector<std::size_t> rank_offset(ranks + 1, 0);
  for (std::size_t r = 0; r < ranks; ++r) rank_offset[r + 1] = rank_offset[r] + prog.ranks[r].size();
  std::vector<std::size_t> position(action_count(prog), 0);
  std::vector<int> next_step(ranks, 0);
  for (std::size_t i = 0; i < cert.order.size(); ++i) {
    const auto [r, t] = cert.order[i];
    if (r < 0 || static_cast<std::size_t>(r) >= ranks || t < 0 ||
        static_cast<std::size_t>(t) >= prog.ranks[static_cast<std::size_t>(r)].size())
      return "entry " + std::to_string(i) + " of the order is not an action of the program";
    // Program order: each rank's steps appear as 0, 1, 2, ... (so each exactly once).
    if (t != next_step[static_cast<std::size_t>(r)])
      return "entry " + std::to_string(i) + " of the order is " + place_text(prog, cert.order[i]) +
             " but the rank's next step is " + std::to_string(next_step[static_cast<std::size_t>(r)]);
    ++next_step[static_cast<std::size_t>(r)];
    position[rank_offset[static_cast<std::size_t>(r)] + static_cast<std::size_t>(t)] = i;
  }

  // Where each action is, to find what a wait waits for: indexed by (kind, stage, microbatch).
  const bool lowered = is_lowered(prog);
  detail::schedule::action_index index(prog, lowered);
  for (std::size_t r = 0; r < ranks; ++r)
    for (std::size_t t = 0; t < prog.ranks[r].size(); ++t)
      index.at(index.key(prog.ranks[r][t])) = {static_cast<int>(r), static_cast<int>(t)};
  const auto order_of = [&](action_place p) {
    return position[rank_offset[static_cast<std::size_t>(p[0])] + static_cast<std::size_t>(p[1])];
  };
  for (std::size_t r = 0; r < ranks; ++r) {
    const auto& row = prog.ranks[r];
    for (std::size_t t = 0; t < row.size(); ++t) {
      const action_place waiter{static_cast<int>(r), static_cast<int>(t)};
      // An overlapped forward waits for its own input and for its backward's.
      for (std::size_t j = t; j <= t + (row[t].overlaps_next && t + 1 < row.size() ? 1 : 0); ++j) {
        // What (kind, stage, microbatch) of another rank it waits for: the rule of the walk
        // that validation runs, applied here to the program's own actions.
        const auto awaited = index.remote_dependency(row[j]);
        if (!awaited) continue;
        const auto at = index.at(index.key(*awaited));
        if (!at.found())
          return place_text(prog, waiter) + " waits for " + to_string(*awaited) + ", which is not in the program";
        if (order_of({at.rank, at.step}) > order_of(waiter))
          return place_text(prog, waiter) + " comes before " + place_text(prog, {at.rank, at.step}) +
                 ", which it waits for";
      }
    }
  }
  const auto in_program = [&](action_place p) {
    return p[0] >= 0 && static_cast<std::size_t>(p[0]) < ranks && p[1] >= 0 &&
           static_cast<std::size_t>(p[1]) < prog.ranks[static_cast<std::size_t>(p[0])].size();
  };
  for (const auto& w : cert.waits)
    if (!in_program(w.awaited) || !in_program(w.waiter))
      return std::string("a listed wait names an action that is not in the program");
    else if (order_of(w.awaited) > order_of(w.waiter))
      return "the listed wait of " + place_text(prog, w.waiter) + " comes before what it waits for";
  return std::nullopt;
}

}  // namespace baton
