// baton/schedule/detail/planner/evaluate.hpp — the planner's timing of candidate per-rank
// orders: simulate()'s rules without building a program, for the thousands of candidates a
// search tries.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/detail/planner/problem.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace baton::detail::schedule::planner {

struct evaluation {
  bool complete = false;  // false: the orders deadlock (or break a dependency inside a rank)
  double makespan = 0;
  std::vector<double> peak;
};

// Times per-rank orders of F, I, W and B exactly as simulate() does (same start rule, same
// messages, same memory accounting), without building a program or validating it: the search
// calls this thousands of times.
inline evaluation evaluate(const problem& pb, const std::vector<std::vector<action>>& rows) {
  const auto S = static_cast<std::size_t>(pb.stages);
  const auto M = static_cast<std::size_t>(pb.microbatches);
  constexpr double unset = -1.0;
  std::vector<double> fin_f(S * M, unset), fin_b(S * M, unset), fin_w(S * M, unset);
  std::vector<std::size_t> next(rows.size(), 0);
  std::vector<double> clock(rows.size(), 0.0), live(rows.size(), 0.0);
  evaluation out;
  out.peak.assign(rows.size(), 0.0);
  std::size_t remaining = 0;
  for (const auto& row : rows) remaining += row.size();
  bool progress = true;
  while (remaining > 0 && progress) {
    progress = false;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      const auto& row = rows[r];
      while (next[r] < row.size()) {
        const action& a = row[next[r]];
        const auto s = static_cast<std::size_t>(a.stage);
        const std::size_t k = s * M + static_cast<std::size_t>(a.microbatch);
        double ready = clock[r];
        if (a.kind == action_kind::forward) {
          if (s > 0) {
            const double dep = fin_f[k - M];
            if (dep < 0) break;
            ready = std::max(ready, dep + pb.hop(a.stage - 1, a.stage));
          }
        } else if (a.kind == action_kind::backward_input || a.kind == action_kind::backward) {
          if (fin_f[k] < 0) return out;  // its own forward must come first on this rank
          if (s + 1 < S) {
            const double dep = fin_b[k + M];
            if (dep < 0) break;
            ready = std::max(ready, dep + pb.hop(a.stage + 1, a.stage));
          }
        } else if (a.kind == action_kind::backward_weight) {
          if (fin_b[k] < 0) return out;
        }
        const double end = ready + pb.duration(a);
        clock[r] = end;
        if (a.kind == action_kind::forward) {
          fin_f[k] = end;
          live[r] += pb.act[s];
          out.peak[r] = std::max(out.peak[r], live[r]);
        } else if (a.kind == action_kind::backward_weight) {
          fin_w[k] = end;
          live[r] -= pb.act[s];
        } else {
          fin_b[k] = end;
          if (a.kind == action_kind::backward) live[r] -= pb.act[s];
        }
        ++next[r];
        --remaining;
        progress = true;
      }
    }
  }
  if (remaining > 0) return out;
  out.complete = true;
  for (double c : clock) out.makespan = std::max(out.makespan, c);
  return out;
}

}  // namespace baton::detail::schedule::planner
