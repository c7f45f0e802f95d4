// baton/schedule/synthesize.hpp — plan a pipeline schedule for a cost model and a memory cap,
// and say how far it can be from the best possible.
//
// synthesize(shape, costs, memory_cap) searches orders of F, I and W (split backward) for the
// smallest simulated makespan whose per-rank peak of live activations (simulation::
// rank_figures::peak_activation, weighted by cost_model::activation) stays at or under the cap:
//   1. list scheduling: the ranks are advanced in time order and each, when free, picks one of
//      its ready actions by a priority rule. The rules vary what the policies of the literature
//      fix: I before F or F before I, how long W may be deferred to fill bubbles (0: right after
//      its I; unbounded: only when nothing else is ready), whether a W may delay an I known to
//      arrive while it runs, which local stage goes first (V shapes), and how many microbatches
//      a rank admits ahead of its backwards (its warm-up depth), always within the memory cap;
//   2. local improvement: coordinate descent over each rank's warm-up depth from the best rule;
//   3. the programs of the built-in policies (the registry, for this very shape) that fit the
//      cap, so the result never loses to them;
//   4. for tiny shapes (3 x stages x microbatches <= 36 actions), branch-and-bound over the
//      per-rank orders, which proves the optimum among programs that run each stage's F, I and
//      W in microbatch order (proven_optimal says whether it finished within its node budget).
// Everything is deterministic (no clock, no randomness): the same input gives the same program.
//
// makespan_lower_bound(shape, costs, memory_cap) is what no schedule can beat (see its comment);
// gap = makespan / lower_bound, so a gap of 1.03 means the plan is at most 3 % slower than the
// best possible one, whatever schedule that would be.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/registry.hpp>
#include <baton/schedule/simulate.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

namespace baton {

struct synthesis_options {
  // Branch-and-bound runs when the shape has at most this many compute actions (3 per stage
  // and microbatch), and explores at most max_search_nodes partial programs.
  int exact_search_max_actions = 36;
  long long max_search_nodes = 3'000'000;
  // Take the built-in policies' programs as candidates too.
  bool include_builtins = true;
  // Rounds of coordinate descent over the ranks' warm-up depths.
  int improvement_rounds = 3;
};

struct synthesis_result {
  program prog;                      // compute-only; lower(), validate(), to_csv(), the executor apply
  double makespan = 0;               // simulate(prog, costs).makespan
  double lower_bound = 0;            // makespan_lower_bound(shape, costs, memory_cap)
  double gap = 1;                    // makespan / lower_bound (1 when both are 0)
  std::vector<double> peak_memory;   // per rank: peak_activation, each <= memory_cap
  std::string method;                // which candidate won, e.g. "list(I-first, W lag 2, depth p-r+1)" or "zb1p"
  bool proven_optimal = false;       // the branch-and-bound finished: no F/I/W program in stage-wise
                                     // microbatch order is faster
  double best_builtin_makespan = std::numeric_limits<double>::infinity();  // inf: none fits
  std::string best_builtin;          // its name, empty when none fits
};

namespace detail::planner {

// The problem in flat arrays: one entry per stage.
struct problem {
  schedule_shape shape{};
  int stages = 0;
  int ranks = 0;
  int microbatches = 0;
  std::vector<double> tf, ti, tw, tb, act;
  double comm = 0;
  double cap = 0;
  std::vector<int> rank_of;                 // per stage
  std::vector<std::vector<int>> local;      // per rank, its stages ascending

  problem(const schedule_shape& s, const cost_model& costs, double memory_cap)
      : shape(s), stages(s.num_stages()), ranks(s.ranks), microbatches(s.microbatches), comm(costs.communication),
        cap(memory_cap) {
    for (int st = 0; st < stages; ++st) {
      tf.push_back(costs.cost(action_kind::forward, st));
      ti.push_back(costs.cost(action_kind::backward_input, st));
      tw.push_back(costs.cost(action_kind::backward_weight, st));
      tb.push_back(costs.cost(action_kind::backward, st));
      act.push_back(costs.activation_of(st));
      rank_of.push_back(stage_rank(s, st));
    }
    local.resize(static_cast<std::size_t>(ranks));
    for (int st = 0; st < stages; ++st) local[static_cast<std::size_t>(rank_of[static_cast<std::size_t>(st)])].push_back(st);
  }
  [[nodiscard]] double hop(int a, int b) const {
    return rank_of[static_cast<std::size_t>(a)] == rank_of[static_cast<std::size_t>(b)] ? 0.0 : comm;
  }
  [[nodiscard]] double duration(const action& a) const {
    const auto s = static_cast<std::size_t>(a.stage);
    switch (a.kind) {
      case action_kind::forward: return tf[s];
      case action_kind::backward_input: return ti[s];
      case action_kind::backward_weight: return tw[s];
      case action_kind::backward: return tb[s];
      default: return 0.0;
    }
  }
};

inline double tolerance(double scale) { return 1e-9 * std::max(1.0, std::abs(scale)); }

// The least per-rank peak any training schedule needs: when the last stage's forward of a
// microbatch runs, every stage of that microbatch holds its activation (each W or B needs the
// I chain that starts there), so a rank holds at least the sum over its stages.
inline double least_peak(const problem& pb) {
  double least = 0;
  for (const auto& stages : pb.local) {
    double sum = 0;
    for (int s : stages) sum += pb.act[static_cast<std::size_t>(s)];
    least = std::max(least, sum);
  }
  return least;
}

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
    const int count = static_cast<int>(stages.size());
    for (int j = 0; j < count; ++j) {
      const int s = stages[static_cast<std::size_t>(ru.deep_first ? count - 1 - j : j)];
      const auto su = static_cast<std::size_t>(s);
      // F
      const int mf = next_f[su];
      if (mf < M) {
        double arrival = 0;
        bool known = true;
        if (s > 0) {
          const double dep = fin_f[idx(s - 1, mf)];
          if (dep < 0) known = false;
          else arrival = dep + pb.hop(s - 1, s);
        }
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
        if (known && admitted) {
          const double start = std::max(now, arrival);
          if (start <= now + tol) {
            if (best_f.start == never) best_f = {action{s, action_kind::forward, mf}, now};
          } else {
            next_arrival = std::min(next_arrival, start);
          }
        }
      }
      // I
      const int mi = next_i[su];
      if (mi < next_f[su]) {
        double arrival = 0;
        bool known = true;
        if (s + 1 < S) {
          const double dep = fin_i[idx(s + 1, mi)];
          if (dep < 0) known = false;
          else arrival = dep + pb.hop(s + 1, s);
        }
        if (known) {
          const double start = std::max(now, arrival);
          if (start <= now + tol) {
            if (best_i.start == never) best_i = {action{s, action_kind::backward_input, mi}, now};
          } else {
            next_arrival = std::min(next_arrival, start);
          }
        }
      }
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

// Branch-and-bound over per-rank orders (each stage's F, I and W in microbatch order). A
// program is built by placing actions in order of (start time, rank): each program has exactly
// one such sequence when every action takes time, so nothing is explored twice.
class exact_search {
 public:
  exact_search(const problem& pb, double upper_bound, long long node_budget)
      : pb_(pb), best_(upper_bound), budget_(node_budget) {
    const auto S = static_cast<std::size_t>(pb.stages);
    const auto M = static_cast<std::size_t>(pb.microbatches);
    fin_f_.assign(S * M, -1);
    fin_i_.assign(S * M, -1);
    next_f_.assign(S, 0);
    next_i_.assign(S, 0);
    next_w_.assign(S, 0);
    clock_.assign(static_cast<std::size_t>(pb.ranks), 0);
    live_.assign(clock_.size(), 0);
    left_work_.assign(clock_.size(), 0);
    left_fi_.assign(clock_.size(), 0);
    tail_.assign(clock_.size(), 0);
    rows_.resize(clock_.size());
    for (int r = 0; r < pb.ranks; ++r) {
      const auto ru = static_cast<std::size_t>(r);
      for (int s : pb.local[ru]) {
        const auto su = static_cast<std::size_t>(s);
        left_work_[ru] += pb.microbatches * (pb.tf[su] + pb.ti[su] + pb.tw[su]);
        left_fi_[ru] += pb.microbatches * (pb.tf[su] + pb.ti[su]);
      }
      // After this rank's last I on its first stage, the I chain runs down to stage 0 and
      // stage 0's W follows.
      const int first = pb.local[ru].front();
      double tail = 0;
      for (int s = first; s > 0; --s) tail += pb.hop(s, s - 1) + pb.ti[static_cast<std::size_t>(s - 1)];
      if (first > 0) tail += pb.tw[0];
      tail_[ru] = tail;
    }
    remaining_ = 3LL * pb.stages * pb.microbatches;
  }

  // True when the search finished within its budget; found() when it beat the upper bound.
  bool run() {
    dfs(0.0, -1);
    return nodes_ <= budget_;
  }
  [[nodiscard]] bool found() const { return !best_rows_.empty(); }
  [[nodiscard]] double best() const { return best_; }
  [[nodiscard]] const std::vector<std::vector<action>>& best_rows() const { return best_rows_; }

 private:
  struct candidate {
    action act;
    int rank;
    double start;
  };

  void dfs(double last_start, int last_rank) {
    if (++nodes_ > budget_) return;
    if (remaining_ == 0) {
      double makespan = 0;
      for (double c : clock_) makespan = std::max(makespan, c);
      if (makespan < best_ - tolerance(best_)) {
        best_ = makespan;
        best_rows_ = rows_;
      }
      return;
    }
    // Bound: each rank still has its work to do, none of it before last_start.
    for (std::size_t r = 0; r < clock_.size(); ++r) {
      const double from = std::max(clock_[r], last_start);
      double bound = from + left_work_[r];
      if (left_fi_[r] > 0) bound = std::max(bound, from + left_fi_[r] + tail_[r]);
      if (bound >= best_ - tolerance(best_)) return;
    }
    std::vector<candidate> options;
    const int S = pb_.stages, M = pb_.microbatches;
    const auto at = [M](int s, int mb) { return static_cast<std::size_t>(s * M + mb); };
    for (int r = 0; r < pb_.ranks; ++r) {
      const auto ru = static_cast<std::size_t>(r);
      for (int s : pb_.local[ru]) {
        const auto su = static_cast<std::size_t>(s);
        const auto consider = [&](action a, double arrival) {
          const double start = std::max(clock_[ru], arrival);
          if (start < last_start - tolerance(last_start)) return;
          if (start <= last_start + tolerance(last_start) && r < last_rank) return;
          options.push_back({a, r, start});
        };
        if (const int mb = next_f_[su]; mb < M && live_[ru] + pb_.act[su] <= pb_.cap + tolerance(pb_.cap)) {
          if (s == 0) consider({s, action_kind::forward, mb}, 0.0);
          else if (fin_f_[at(s - 1, mb)] >= 0) consider({s, action_kind::forward, mb}, fin_f_[at(s - 1, mb)] + pb_.hop(s - 1, s));
        }
        if (const int mb = next_i_[su]; mb < next_f_[su]) {
          if (s + 1 == S) consider({s, action_kind::backward_input, mb}, 0.0);
          else if (fin_i_[at(s + 1, mb)] >= 0)
            consider({s, action_kind::backward_input, mb}, fin_i_[at(s + 1, mb)] + pb_.hop(s + 1, s));
        }
        if (const int mb = next_w_[su]; mb < next_i_[su]) consider({s, action_kind::backward_weight, mb}, 0.0);
      }
    }
    // Promising first: earliest start, then I, F, W.
    std::sort(options.begin(), options.end(), [](const candidate& x, const candidate& y) {
      if (x.start != y.start) return x.start < y.start;
      const auto order = [](action_kind k) { return k == action_kind::backward_input ? 0 : k == action_kind::forward ? 1 : 2; };
      if (order(x.act.kind) != order(y.act.kind)) return order(x.act.kind) < order(y.act.kind);
      return x.rank < y.rank;
    });
    for (const candidate& c : options) {
      place(c);
      dfs(c.start, c.rank);
      unplace(c);
      if (nodes_ > budget_) return;
    }
  }

  void place(const candidate& c) {
    const auto ru = static_cast<std::size_t>(c.rank);
    const auto su = static_cast<std::size_t>(c.act.stage);
    const double d = pb_.duration(c.act);
    saved_clock_.push_back(clock_[ru]);
    clock_[ru] = c.start + d;
    rows_[ru].push_back(c.act);
    left_work_[ru] -= d;
    --remaining_;
    const auto k = su * static_cast<std::size_t>(pb_.microbatches) + static_cast<std::size_t>(c.act.microbatch);
    switch (c.act.kind) {
      case action_kind::forward: fin_f_[k] = c.start + d; ++next_f_[su]; live_[ru] += pb_.act[su]; left_fi_[ru] -= d; break;
      case action_kind::backward_input: fin_i_[k] = c.start + d; ++next_i_[su]; left_fi_[ru] -= d; break;
      default: ++next_w_[su]; live_[ru] -= pb_.act[su]; break;
    }
  }
  void unplace(const candidate& c) {
    const auto ru = static_cast<std::size_t>(c.rank);
    const auto su = static_cast<std::size_t>(c.act.stage);
    const double d = pb_.duration(c.act);
    clock_[ru] = saved_clock_.back();
    saved_clock_.pop_back();
    rows_[ru].pop_back();
    left_work_[ru] += d;
    ++remaining_;
    const auto k = su * static_cast<std::size_t>(pb_.microbatches) + static_cast<std::size_t>(c.act.microbatch);
    switch (c.act.kind) {
      case action_kind::forward: fin_f_[k] = -1; --next_f_[su]; live_[ru] -= pb_.act[su]; left_fi_[ru] += d; break;
      case action_kind::backward_input: fin_i_[k] = -1; --next_i_[su]; left_fi_[ru] += d; break;
      default: --next_w_[su]; live_[ru] += pb_.act[su]; break;
    }
  }

  const problem& pb_;
  double best_;
  long long budget_;
  long long nodes_ = 0;
  long long remaining_ = 0;
  std::vector<double> fin_f_, fin_i_, clock_, live_, left_work_, left_fi_, tail_, saved_clock_;
  std::vector<int> next_f_, next_i_, next_w_;
  std::vector<std::vector<action>> rows_, best_rows_;
};

inline void check_inputs(const schedule_shape& shape, const cost_model& costs, double memory_cap) {
  if (shape.ranks < 1 || shape.stages_per_rank < 1 || shape.microbatches < 1)
    throw schedule_error("baton::synthesize: ranks (" + std::to_string(shape.ranks) + "), stages_per_rank (" +
                         std::to_string(shape.stages_per_rank) + ") and microbatches (" +
                         std::to_string(shape.microbatches) + ") must all be at least 1");
  if (static_cast<long long>(shape.num_stages()) * shape.microbatches > (1LL << 20))
    throw schedule_error("baton::synthesize: " + std::to_string(shape.num_stages()) + " stages x " +
                         std::to_string(shape.microbatches) +
                         " microbatches is more than the planner searches (2^20 stage-microbatches); plan a smaller "
                         "shape");
  costs.check(shape.num_stages());
  if (std::isnan(memory_cap) || memory_cap < 0)
    throw schedule_error("baton::synthesize: memory_cap must be >= 0 (got " + std::to_string(memory_cap) +
                         "); pass std::numeric_limits<double>::infinity() for no cap");
}

}  // namespace detail::planner

// What no program of this shape can beat under these costs and memory cap: the largest of
//   - the critical path of one microbatch: F through every stage, then I back through every
//     stage, then stage 0's W, with `communication` wherever consecutive stages sit on
//     different ranks;
//   - for each rank r, with head_r the earliest time an F of its first stage can start (the F
//     of the stages before it, and their messages) and work_r all its F, I and W:
//       head_r + work_r (the rank cannot start before its first input, and must do it all);
//       head_r + F_r + I_r + tail_r, where tail_r is the I chain below the rank's first stage and
//       stage 0's W, which follow the rank's last I there;
//       head_r + (sum over its stages of m x activation x chain) / memory_cap, where chain is the
//       least time from an F of the stage to its W (through the later stages and back): the
//       memory a rank holds over time can be no less, and at no moment more than the cap;
//       headI_r + I_r + W_r + (F_r - k_r x max F), where headI_r is the earliest any of its I
//       can start (every F, then the I of the later stages) and k_r the most forwards the cap
//       lets it hold before then (each stays live until its W, after headI_r).
[[nodiscard]] inline double makespan_lower_bound(const schedule_shape& shape, const cost_model& costs,
                                                 double memory_cap = std::numeric_limits<double>::infinity()) {
  detail::planner::check_inputs(shape, costs, memory_cap);
  const detail::planner::problem pb(shape, costs, memory_cap);
  const int S = pb.stages;
  const double M = pb.microbatches;
  // Earliest start of F on stage s, and of I on stage s.
  std::vector<double> early_f(static_cast<std::size_t>(S), 0), early_i(static_cast<std::size_t>(S), 0);
  for (int s = 1; s < S; ++s)
    early_f[static_cast<std::size_t>(s)] =
        early_f[static_cast<std::size_t>(s - 1)] + pb.tf[static_cast<std::size_t>(s - 1)] + pb.hop(s - 1, s);
  early_i[static_cast<std::size_t>(S - 1)] = early_f[static_cast<std::size_t>(S - 1)] + pb.tf[static_cast<std::size_t>(S - 1)];
  for (int s = S - 2; s >= 0; --s)
    early_i[static_cast<std::size_t>(s)] =
        early_i[static_cast<std::size_t>(s + 1)] + pb.ti[static_cast<std::size_t>(s + 1)] + pb.hop(s + 1, s);
  double bound = early_i[0] + pb.ti[0] + pb.tw[0];
  for (int r = 0; r < pb.ranks; ++r) {
    const auto& stages = pb.local[static_cast<std::size_t>(r)];
    double f = 0, i = 0, w = 0, max_f = 0, min_act = std::numeric_limits<double>::infinity();
    for (int s : stages) {
      const auto su = static_cast<std::size_t>(s);
      f += M * pb.tf[su];
      i += M * pb.ti[su];
      w += M * pb.tw[su];
      max_f = std::max(max_f, pb.tf[su]);
      min_act = std::min(min_act, pb.act[su]);
    }
    const int first = stages.front(), last = stages.back();
    const double head = early_f[static_cast<std::size_t>(first)];
    double tail = 0;
    for (int s = first; s > 0; --s) tail += pb.hop(s, s - 1) + pb.ti[static_cast<std::size_t>(s - 1)];
    if (first > 0) tail += pb.tw[0];
    bound = std::max({bound, head + f + i + w, head + f + i + tail});
    const double head_i = early_i[static_cast<std::size_t>(last)];
    double held = M * static_cast<double>(stages.size());  // forwards that could run before head_i
    if (min_act > 0 && std::isfinite(memory_cap)) held = std::min(held, std::floor(memory_cap / min_act + 1e-9));
    bound = std::max(bound, head_i + i + w + std::max(0.0, f - held * max_f));
    // Memory over time: stage s's activation of a microbatch lives from its F to its W, at
    // least the chain between them; the cap bounds how much of it the rank holds at once.
    if (std::isfinite(memory_cap) && memory_cap > 0) {
      double held_time = 0;
      for (int s : stages) {
        const auto su = static_cast<std::size_t>(s);
        const double chain = early_i[su] - early_f[su] + pb.ti[su] + pb.tw[su];
        held_time += M * pb.act[su] * chain;
      }
      bound = std::max(bound, head + held_time / memory_cap);
    }
  }
  return bound;
}

// The least memory cap any training program of this shape fits under (see least_peak).
[[nodiscard]] inline double least_memory_cap(const schedule_shape& shape, const cost_model& costs) {
  detail::planner::check_inputs(shape, costs, 0);
  return detail::planner::least_peak(detail::planner::problem(shape, costs, 0));
}

// Plans a program for `shape` (placement::loop with any stages per rank, or placement::v) that
// minimises the simulated makespan under `costs` with every rank's peak_activation at or under
// `memory_cap` (the simulator's unit: cost_model::activation per live microbatch-stage). Throws
// schedule_error when the cap is below what any schedule needs, naming that least cap.
[[nodiscard]] inline synthesis_result synthesize(const schedule_shape& shape, const cost_model& costs, double memory_cap,
                                                 const synthesis_options& options = {}) {
  using namespace detail::planner;
  check_inputs(shape, costs, memory_cap);
  const problem pb(shape, costs, memory_cap);
  const double least = least_peak(pb);
  if (memory_cap < least - tolerance(least))
    throw schedule_error("baton::synthesize: memory_cap " + std::to_string(memory_cap) +
                         " is below what any schedule of this shape needs: a rank holds one microbatch on each of "
                         "its stages at once, " + std::to_string(least) +
                         " here; raise memory_cap to at least that, or split the model over more ranks");

  synthesis_result result;
  result.lower_bound = makespan_lower_bound(shape, costs, memory_cap);
  result.makespan = std::numeric_limits<double>::infinity();
  std::vector<std::vector<action>> best_rows;
  const auto consider = [&](const std::vector<std::vector<action>>& rows, const std::string& how) {
    if (rows.empty()) return false;
    const evaluation e = evaluate(pb, rows);
    if (!e.complete) return false;
    for (double peak : e.peak)
      if (peak > memory_cap + tolerance(memory_cap)) return false;
    if (e.makespan < result.makespan - tolerance(e.makespan)) {
      result.makespan = e.makespan;
      result.method = how;
      best_rows = rows;
      return true;
    }
    return false;
  };

  // 1. The rules. Depths: the 1F1B family (the rank's distance to the end, in stages, plus a
  // few) and constant depths.
  const int P = shape.ranks, M = shape.microbatches, V = shape.stages_per_rank;
  std::vector<std::pair<std::vector<int>, std::string>> depths;
  for (int extra : {-1, 0, 1, 2, 3, 4, P / 2, P, 2 * P, M}) {
    std::vector<int> d(static_cast<std::size_t>(P));
    for (int r = 0; r < P; ++r) d[static_cast<std::size_t>(r)] = std::clamp(V * (P - r) + extra, 1, M);
    depths.emplace_back(d, "depth " + std::to_string(V) + "(p-r)" + (extra >= 0 ? "+" : "") + std::to_string(extra));
  }
  for (int c : {1, 2, P, 2 * P}) depths.emplace_back(std::vector<int>(static_cast<std::size_t>(P), std::clamp(c, 1, M)),
                                                     "depth " + std::to_string(std::clamp(c, 1, M)));
  rule best_rule;
  // Once a candidate reaches the lower bound nothing can beat it: stop searching.
  const auto reached_bound = [&] { return result.makespan <= result.lower_bound + tolerance(result.lower_bound); };
  for (const auto& [depth, depth_name] : depths)
    for (bool input_first : {true, false})
      for (int lag : {0, 1, 2, P, 1 << 30})
        for (bool lookahead : {false, true})
          for (bool deep_first : {true, false})
            for (bool when_full : {false, true}) {
              if (lookahead && lag == 0) continue;
              if (!deep_first && V == 1) continue;
              if (when_full && (lag == 0 || !std::isfinite(memory_cap))) continue;
              if (reached_bound()) break;
              rule ru{input_first, lag, lookahead, deep_first, when_full, depth, "", {}, {}};
              ru.name = std::string("list(") + (input_first ? "I-first" : "F-first") + ", W lag " +
                        (lag >= (1 << 30) ? std::string("unbounded") : std::to_string(lag)) +
                        (lookahead ? " + lookahead" : "") + (when_full ? " + W when full" : "") +
                        (V > 1 ? (deep_first ? ", later stage first" : ", earlier stage first") : "") + ", " +
                        depth_name + ")";
              if (consider(list_schedule(pb, ru), ru.name)) best_rule = ru;
            }

  // 2. Coordinate descent from the best rule over each rank's own depth, W lag and I/F order.
  if (!best_rule.depth.empty()) {
    best_rule.lag_of.assign(static_cast<std::size_t>(P), best_rule.weight_lag);
    best_rule.input_first_of.assign(static_cast<std::size_t>(P), best_rule.input_first ? 1 : 0);
    const std::string base_name = best_rule.name;
    for (int round = 0; round < options.improvement_rounds && !reached_bound(); ++round) {
      bool improved = false;
      for (int r = 0; r < P && !reached_bound(); ++r) {
        const auto ru_ = static_cast<std::size_t>(r);
        std::vector<rule> neighbours;
        for (int delta : {-1, 1, -2, 2}) {
          rule ru = best_rule;
          int& d = ru.depth[ru_];
          if (d + delta < 1 || d + delta > M) continue;
          d += delta;
          neighbours.push_back(ru);
        }
        for (int lag : {0, 1, 2, P, 1 << 30}) {
          if (lag == best_rule.lag_of[ru_]) continue;
          rule ru = best_rule;
          ru.lag_of[ru_] = lag;
          neighbours.push_back(ru);
        }
        rule flipped = best_rule;
        flipped.input_first_of[ru_] = static_cast<char>(!flipped.input_first_of[ru_]);
        neighbours.push_back(flipped);
        for (rule& ru : neighbours) {
          ru.name = base_name + " + per-rank tuning";
          if (consider(list_schedule(pb, ru), ru.name)) {
            best_rule = ru;
            improved = true;
          }
        }
      }
      if (!improved) break;
    }
  }
  // Where a full backward is cheaper than its halves, fuse each I that is followed by its W.
  if (!best_rows.empty() && !reached_bound()) consider(fuse_backwards(pb, best_rows), result.method + " + fused backwards");

  // 3. The built-in policies for this very shape.
  if (options.include_builtins) {
    for (const auto& info : builtin_policies) {
      program prog;
      try {
        prog = info.generate(shape);
      } catch (const schedule_error&) {
        continue;  // the policy does not serve this shape
      }
      if (is_forward_only(prog)) continue;
      const simulation sim = simulate(prog, costs);
      if (sim.peak_activation() > memory_cap + tolerance(memory_cap)) continue;
      if (sim.makespan < result.best_builtin_makespan) {
        result.best_builtin_makespan = sim.makespan;
        result.best_builtin = std::string(info.name);
      }
      consider(prog.ranks, std::string(info.name));
    }
  }

  // The sequential program (one microbatch at a time) fits any cap the check above let through.
  if (best_rows.empty()) {
    std::vector<std::vector<action>> rows(static_cast<std::size_t>(P));
    for (int mb = 0; mb < M; ++mb) {
      for (int s = 0; s < pb.stages; ++s) rows[static_cast<std::size_t>(pb.rank_of[static_cast<std::size_t>(s)])].push_back({s, action_kind::forward, mb});
      for (int s = pb.stages - 1; s >= 0; --s) {
        auto& row = rows[static_cast<std::size_t>(pb.rank_of[static_cast<std::size_t>(s)])];
        row.push_back({s, action_kind::backward_input, mb});
        row.push_back({s, action_kind::backward_weight, mb});
      }
    }
    consider(rows, "sequential");
  }

  // 4. Branch-and-bound on tiny shapes, seeded with the best so far.
  bool all_take_time = true;
  for (int s = 0; s < pb.stages; ++s) {
    const auto su = static_cast<std::size_t>(s);
    if (!(pb.tf[su] > 0 && pb.ti[su] > 0 && pb.tw[su] > 0)) all_take_time = false;
  }
  if (all_take_time && 3LL * pb.stages * M <= options.exact_search_max_actions &&
      result.makespan > result.lower_bound + tolerance(result.lower_bound)) {
    exact_search search(pb, result.makespan, options.max_search_nodes);
    const bool finished = search.run();
    if (search.found()) consider(search.best_rows(), "branch-and-bound");
    result.proven_optimal = finished;
  }
  if (result.makespan <= result.lower_bound + tolerance(result.lower_bound)) result.proven_optimal = true;

  result.prog = program{shape, best_rows};
  const simulation sim = simulate(result.prog, costs);  // validates, and times it as everyone else will
  result.makespan = sim.makespan;
  for (const auto& f : sim.ranks) result.peak_memory.push_back(f.peak_activation);
  result.gap = result.lower_bound > 0 ? result.makespan / result.lower_bound : 1.0;
  return result;
}

}  // namespace baton
