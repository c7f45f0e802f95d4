// baton/schedule/detail/planner/exact_search.hpp — the planner's branch-and-bound over per-rank
// orders for tiny shapes, which proves the optimum among programs that run each stage's F, I
// and W in microbatch order.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/detail/planner/problem.hpp>

#include <algorithm>
#include <cstddef>
#include <vector>

namespace baton::detail::schedule::planner {

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
      tail_[ru] = pb.tail_below(pb.local[ru].front());
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

}  // namespace baton::detail::schedule::planner
