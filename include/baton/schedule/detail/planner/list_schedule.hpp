// baton/schedule/detail/planner/list_schedule.hpp — the planner's list scheduler: per-rank
// orders built by advancing the rank that can act earliest, each rank choosing among its ready
// actions by one priority rule; and the fusion of I + W into B where B is cheaper.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/detail/planner/problem.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace baton::detail::schedule::planner {

// One priority rule of the list scheduler.
struct rule {
  bool input_first = true;     // I before F when both are ready
  int weight_lag = 0;          // W may wait while fewer than this many are pending (huge: only when idle)
  bool weight_lookahead = false;  // do not start a W that would delay an I already on its way
  bool deep_first = true;      // among a rank's stages, the later stage first
  bool weight_when_full = false;  // a rank whose memory admits no new microbatch runs its W first:
                                  // under a tight cap the slot it frees is the rank's throughput
  std::vector<int> depth;      // per rank: microbatches admitted to its first stage and not yet
                               // through its I there
  std::string name;
  // Per-rank overrides of weight_lag and input_first, set by the local improvement (empty: none).
  std::vector<int> lag_of;
  std::vector<char> input_first_of;

  [[nodiscard]] int lag(std::size_t r) const { return lag_of.empty() ? weight_lag : lag_of[r]; }
  [[nodiscard]] bool inputs_first(std::size_t r) const { return input_first_of.empty() ? input_first : input_first_of[r] != 0; }
};

// Builds per-rank orders by advancing the rank that can act earliest. Returns empty rows when
// the rule gets stuck (its admission or memory limits leave no rank anything to do).
inline std::vector<std::vector<action>> list_schedule(const problem& pb, const rule& ru) {
  const int S = pb.stages, M = pb.microbatches, P = pb.ranks;
  const auto idx = [M](int s, int mb) { return static_cast<std::size_t>(s) * static_cast<std::size_t>(M) + static_cast<std::size_t>(mb); };
  std::vector<double> fin_f(static_cast<std::size_t>(S * M), -1), fin_i(static_cast<std::size_t>(S * M), -1);
  std::vector<int> next_f(static_cast<std::size_t>(S), 0), next_i(static_cast<std::size_t>(S), 0),
      next_w(static_cast<std::size_t>(S), 0);
  std::vector<double> clock(static_cast<std::size_t>(P), 0), live(static_cast<std::size_t>(P), 0), reserve(static_cast<std::size_t>(P), 0);
  std::vector<std::vector<action>> rows(static_cast<std::size_t>(P));
  for (int r = 0; r < P; ++r)
    for (int s : pb.local[static_cast<std::size_t>(r)]) reserve[static_cast<std::size_t>(r)] += pb.act[static_cast<std::size_t>(s)];
  long long remaining = 3LL * S * M;
  constexpr double never = std::numeric_limits<double>::infinity();

  struct choice {
    action act{};
    double start = never;
  };
  // What rank r would run if it decided at its earliest opportunity.
  const auto decide = [&](int r) -> choice {
    const auto ru_ = static_cast<std::size_t>(r);
    const auto& stages = pb.local[ru_];
    const int entry = stages.front();
    const double now = clock[ru_];
    const double tol = tolerance(now);
    // Ready F and I, each with the time its input is there.
    choice best_f, best_i, best_w;
    double next_arrival = never;  // of any F or I not ready now
    // When the input of (stage s, microbatch mb) from neighbour stage `from` is there: at once
    // without a neighbour, never while the neighbour has not produced it.
    const auto arrival = [&](const std::vector<double>& finished, int from, int s, int mb) {
      if (from < 0 || from >= S) return 0.0;
      const double dep = finished[idx(from, mb)];
      return dep < 0 ? never : dep + pb.hop(from, s);
    };
    // The first action of its kind whose input is there now is that kind's pick; the others
    // say when the rank could next have something to do.
    const auto offer = [&](choice& best, const action& a, double input_at) {
      if (input_at == never) return;
      const double start = std::max(now, input_at);
      if (start <= now + tol) {
        if (best.start == never) best = {a, now};
      } else {
        next_arrival = std::min(next_arrival, start);
      }
    };
    const int count = static_cast<int>(stages.size());
    for (int j = 0; j < count; ++j) {
      const int s = stages[static_cast<std::size_t>(ru.deep_first ? count - 1 - j : j)];
      const auto su = static_cast<std::size_t>(s);
      // F
      const int mf = next_f[su];
      if (mf < M) {
        bool admitted = true;
        if (s == entry) {
          const int in_flight = mf - next_i[su];
          if (in_flight >= ru.depth[ru_]) admitted = false;
          // Room for the microbatch on every stage of this rank, so that a V rank never fills
          // its memory with first-stage work while its second stage waits.
          if (live[ru_] + reserve[ru_] > pb.cap + tolerance(pb.cap)) admitted = false;
        } else if (live[ru_] + pb.act[su] > pb.cap + tolerance(pb.cap)) {
          admitted = false;
        }
        if (admitted) offer(best_f, action{s, action_kind::forward, mf}, arrival(fin_f, s - 1, s, mf));
      }
      // I
      const int mi = next_i[su];
      if (mi < next_f[su]) offer(best_i, action{s, action_kind::backward_input, mi}, arrival(fin_i, s + 1, s, mi));
      // W: the oldest pending first (its I finished first).
      const int mw = next_w[su];
      if (mw < next_i[su]) {
        if (best_w.start == never || fin_i[idx(s, mw)] < fin_i[idx(best_w.act.stage, best_w.act.microbatch)])
          best_w = {action{s, action_kind::backward_weight, mw}, now};
      }
    }
    int pending_w = 0;
    for (int s : stages) pending_w += next_i[static_cast<std::size_t>(s)] - next_w[static_cast<std::size_t>(s)];
    if (best_w.start != never && pending_w > ru.lag(ru_)) return best_w;
    if (best_w.start != never && ru.weight_when_full && live[ru_] + reserve[ru_] > pb.cap + tolerance(pb.cap))
      return best_w;
    const choice& first = ru.inputs_first(ru_) ? best_i : best_f;
    const choice& second = ru.inputs_first(ru_) ? best_f : best_i;
    if (first.start != never) return first;
    if (second.start != never) return second;
    if (best_w.start != never) {
      if (!ru.weight_lookahead || next_arrival >= now + pb.tw[static_cast<std::size_t>(best_w.act.stage)] - tol)
        return best_w;
    }
    // Nothing to do now: wait for the next input known to come.
    if (next_arrival < never) {
      choice wait;
      wait.start = next_arrival;
      wait.act = action{-1, action_kind::forward, 0};
      return wait;
    }
    return {};
  };

  // A rank's decision changes only when it acts or a neighbouring stage's rank does: cached.
  std::vector<choice> decision(static_cast<std::size_t>(P));
  std::vector<char> stale(static_cast<std::size_t>(P), 1);
  while (remaining > 0) {
    int pick = -1;
    choice chosen;
    for (int r = P - 1; r >= 0; --r) {
      const auto ru_ = static_cast<std::size_t>(r);
      if (stale[ru_]) {
        decision[ru_] = decide(r);
        stale[ru_] = 0;
      }
      const choice& c = decision[ru_];
      if (c.start < chosen.start - tolerance(c.start)) {
        chosen = c;
        pick = r;
      }
    }
    if (pick < 0) return {};  // stuck
    const auto pu = static_cast<std::size_t>(pick);
    stale[pu] = 1;
    if (chosen.act.stage < 0) {  // idle until then
      clock[pu] = chosen.start;
      continue;
    }
    if (chosen.act.stage > 0) stale[static_cast<std::size_t>(pb.rank_of[static_cast<std::size_t>(chosen.act.stage - 1)])] = 1;
    if (chosen.act.stage + 1 < S) stale[static_cast<std::size_t>(pb.rank_of[static_cast<std::size_t>(chosen.act.stage + 1)])] = 1;
    const action a = chosen.act;
    const auto su = static_cast<std::size_t>(a.stage);
    const double end = chosen.start + pb.duration(a);
    clock[pu] = end;
    rows[pu].push_back(a);
    --remaining;
    if (a.kind == action_kind::forward) {
      fin_f[idx(a.stage, a.microbatch)] = end;
      ++next_f[su];
      live[pu] += pb.act[su];
    } else if (a.kind == action_kind::backward_input) {
      fin_i[idx(a.stage, a.microbatch)] = end;
      ++next_i[su];
    } else {
      ++next_w[su];
      live[pu] -= pb.act[su];
    }
  }
  return rows;
}

// Replaces each I directly followed by its own W with one B where B is cheaper than I + W.
inline std::vector<std::vector<action>> fuse_backwards(const problem& pb, std::vector<std::vector<action>> rows) {
  for (auto& row : rows) {
    std::vector<action> fused;
    fused.reserve(row.size());
    for (std::size_t i = 0; i < row.size(); ++i) {
      const action& a = row[i];
      const auto s = static_cast<std::size_t>(a.stage);
      if (a.kind == action_kind::backward_input && i + 1 < row.size() && row[i + 1].kind == action_kind::backward_weight &&
          row[i + 1].stage == a.stage && row[i + 1].microbatch == a.microbatch && pb.tb[s] < pb.ti[s] + pb.tw[s]) {
        fused.push_back({a.stage, action_kind::backward, a.microbatch});
        ++i;
      } else {
        fused.push_back(a);
      }
    }
    row = std::move(fused);
  }
  return rows;
}

}  // namespace baton::detail::schedule::planner
