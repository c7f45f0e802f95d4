// baton/schedule/detail/analysis.hpp — where every action of a program sits, and the
// dependency-ordered walk that validation (deadlock check) and the simulator share.
//
// Everything is linear in the number of actions (plus stages x microbatches): one
// position per (kind, stage, microbatch) and a wait list per action key, so that a
// 64-rank, 512-microbatch schedule checks in milliseconds.
#pragma once

#include <baton/schedule/program.hpp>

#include <cstddef>
#include <optional>
#include <vector>

namespace baton::detail::schedule {

struct position {
  int rank = -1;
  int step = -1;
  [[nodiscard]] constexpr bool found() const noexcept { return rank >= 0; }
};

// The kinds with a microbatch come first in action_kind, the stage-level ones after them.
inline constexpr std::size_t per_microbatch_kinds = 8;
inline constexpr std::size_t stage_level_kinds = static_cast<std::size_t>(action_kind_count) - per_microbatch_kinds;
static_assert([] {
  for (const auto& info : kind_table)
    if ((info.group == kind_group::stage_level) != (static_cast<std::size_t>(info.kind) >= per_microbatch_kinds))
      return false;
  return true;
}(), "baton: action_kind lists the kinds with a microbatch first, then the stage-level ones; keep that order");

// Index of a program whose actions are all in range (stage < S, microbatch < m, 0 for the
// stage-level kinds).
class action_index {
 public:
  constexpr action_index(const program& prog, bool lowered)
      : shape_(prog.shape), stages_(prog.shape.num_stages()), microbatches_(prog.shape.microbatches),
        lowered_(lowered),
        stage_level_base_(per_microbatch_kinds * static_cast<std::size_t>(stages_) *
                          static_cast<std::size_t>(microbatches_)),
        first_(stage_level_base_ + stage_level_kinds * static_cast<std::size_t>(stages_)),
        owner_(static_cast<std::size_t>(stages_)) {
    // A table, because the walk asks "same rank?" for every action and stage_rank divides.
    for (int s = 0; s < stages_; ++s) owner_[static_cast<std::size_t>(s)] = stage_rank(shape_, s);
  }

  [[nodiscard]] constexpr std::size_t size() const noexcept { return first_.size(); }
  [[nodiscard]] constexpr const schedule_shape& shape() const noexcept { return shape_; }
  [[nodiscard]] constexpr int stages() const noexcept { return stages_; }
  [[nodiscard]] constexpr bool lowered() const noexcept { return lowered_; }

  // All kinds of one (stage, microbatch) are neighbours: the checks of an action look at its
  // siblings (F before I before W, the matching send), which then share a cache line. The
  // stage-level kinds (microbatch 0) get one slot per stage after all of those.
  [[nodiscard]] constexpr std::size_t key(action_kind kind, int stage, int microbatch) const noexcept {
    const auto k = static_cast<std::size_t>(kind);
    if (k >= per_microbatch_kinds)
      return stage_level_base_ + static_cast<std::size_t>(stage) * stage_level_kinds + (k - per_microbatch_kinds);
    return (static_cast<std::size_t>(stage) * static_cast<std::size_t>(microbatches_) +
            static_cast<std::size_t>(microbatch)) *
               per_microbatch_kinds +
           k;
  }
  [[nodiscard]] constexpr std::size_t key(const action& a) const noexcept { return key(a.kind, a.stage, a.microbatch); }

  [[nodiscard]] constexpr position& at(std::size_t k) noexcept { return first_[k]; }
  [[nodiscard]] constexpr const position& at(std::size_t k) const noexcept { return first_[k]; }
  [[nodiscard]] constexpr const position& at(action_kind kind, int stage, int microbatch) const noexcept {
    return first_[key(kind, stage, microbatch)];
  }
  [[nodiscard]] constexpr bool has(action_kind kind, int stage, int microbatch) const noexcept {
    return at(kind, stage, microbatch).found();
  }

  // The input backward (B or I) of (stage, microbatch): I if the program has one, else B.
  [[nodiscard]] constexpr action input_backward(int stage, int microbatch) const noexcept {
    if (has(action_kind::backward_input, stage, microbatch))
      return action{stage, action_kind::backward_input, microbatch};
    return action{stage, action_kind::backward, microbatch};
  }

  [[nodiscard]] constexpr int rank_of(int stage) const noexcept { return owner_[static_cast<std::size_t>(stage)]; }
  [[nodiscard]] constexpr bool colocated(int stage_a, int stage_b) const noexcept {
    return rank_of(stage_a) == rank_of(stage_b);
  }

  // The action on another rank that must have run before `a` can start. In a
  // compute-only program, that is the neighbouring stage's compute (the message is
  // implicit); in a lowered program only a receive waits, for its send.
  [[nodiscard]] constexpr std::optional<action> remote_dependency(const action& a) const noexcept {
    const int s = a.stage;
    const int mb = a.microbatch;
    if (lowered_) {
      if (a.kind == action_kind::recv_forward) return action{s - 1, action_kind::send_forward, mb};
      if (a.kind == action_kind::recv_backward) return action{s + 1, action_kind::send_backward, mb};
      return std::nullopt;
    }
    if (a.kind == action_kind::forward && s > 0 && !colocated(s - 1, s))
      return action{s - 1, action_kind::forward, mb};
    if (is_input_backward(a.kind) && s + 1 < stages_ && !colocated(s + 1, s)) return input_backward(s + 1, mb);
    return std::nullopt;
  }

 private:
  schedule_shape shape_;
  int stages_;
  int microbatches_;
  bool lowered_;
  std::size_t stage_level_base_;
  std::vector<position> first_;
  std::vector<int> owner_;
};

// Runs every rank's program in order, each action as soon as its remote dependency has
// run, with receives blocking and sends buffered. An overlapped pair (a forward with
// overlaps_next) starts only when the remote dependencies of both its actions have run, as
// torch's lowering requires and as lower() places the receives. visit(rank, step, action,
// dependency) is called for each action in an order that respects every dependency. Returns
// how far each rank got; a rank short of its row length is blocked, on waiting[rank].
struct walk_result {
  std::vector<int> next_step;
  std::vector<std::size_t> waiting;
};

template <class Visit>
constexpr walk_result walk_in_dependency_order(const program& prog, const action_index& index, Visit&& visit) {
  const int ranks = static_cast<int>(prog.ranks.size());
  walk_result result{std::vector<int>(static_cast<std::size_t>(ranks), 0),
                     std::vector<std::size_t>(static_cast<std::size_t>(ranks), 0)};
  std::vector<unsigned char> done(index.size(), 0);
  std::vector<int> first_waiter(index.size(), -1);
  std::vector<int> next_waiter(static_cast<std::size_t>(ranks), -1);
  std::vector<int> runnable;
  runnable.reserve(static_cast<std::size_t>(ranks));
  for (int r = ranks - 1; r >= 0; --r) runnable.push_back(r);

  while (!runnable.empty()) {
    const int r = runnable.back();
    runnable.pop_back();
    const auto& row = prog.ranks[static_cast<std::size_t>(r)];
    int& step = result.next_step[static_cast<std::size_t>(r)];
    while (step < static_cast<int>(row.size())) {
      const action& a = row[static_cast<std::size_t>(step)];
      const auto dependency = index.remote_dependency(a);
      std::optional<std::size_t> unmet;
      if (dependency && !done[index.key(*dependency)]) unmet = index.key(*dependency);
      if (!unmet && a.overlaps_next && step + 1 < static_cast<int>(row.size())) {
        const auto partner_dependency = index.remote_dependency(row[static_cast<std::size_t>(step + 1)]);
        if (partner_dependency && !done[index.key(*partner_dependency)]) unmet = index.key(*partner_dependency);
      }
      if (unmet) {
        next_waiter[static_cast<std::size_t>(r)] = first_waiter[*unmet];
        first_waiter[*unmet] = r;
        result.waiting[static_cast<std::size_t>(r)] = *unmet;
        break;
      }
      visit(r, step, a, dependency);
      const std::size_t k = index.key(a);
      done[k] = 1;
      for (int w = first_waiter[k]; w != -1;) {
        const int following = next_waiter[static_cast<std::size_t>(w)];
        runnable.push_back(w);
        w = following;
      }
      first_waiter[k] = -1;
      ++step;
    }
  }
  return result;
}

}  // namespace baton::detail::schedule
