// baton/schedule/controllable_v.hpp — V-Half and V-Min, the memory-capped V schedules of
// "Pipeline Parallelism with Controllable Memory" (Qi, Wan, Amar, Lin, NeurIPS 2024).
//
// Both use ZB-V's layout (2 stages per rank in a V: rank r holds stages r and 2p - 1 - r)
// and its split backward, but bound the activations a rank keeps alive. In the simulator's
// unit (simulation::rank_figures::peak_live: one (stage, microbatch) activation from its F
// to its W; a V stage is half the rank's share of the model):
//   v_half  at most p + 2 per rank: (p + 2) / 2 microbatches' worth, against p for 1F1B and
//           ZB-V (2p stage-activations). The paper's bubble: about p / 2m of the work.
//   v_min   at most ceil(2 (p + 4) / 3) per rank: at most ceil((p + 4) / 3) microbatches'
//           worth, about a third of 1F1B's. The paper's bubble: about 2p / 3m of the work.
//           (At p <= 4 this cap is p + 2 or more, so v_min is v_half there.)
// The paper builds each from a hand-made repeating building block whose lifespan sets the
// memory. Baton gets the same memory bound for every shape (any ranks and microbatches, 2
// stages per rank in a V; one rank is the degenerate V of 2 stages) from a list
// scheduler instead: all ranks advance in unit steps (T_F = T_I = T_W = 1 per stage, no
// communication cost), and in each step every rank runs the most urgent action it can:
//   1. an input gradient I, the older microbatch first (the ranks below wait for it, and it
//      takes no memory);
//   2. a forward F, the V's second stage before its first, only while the rank's live
//      activations stay within the cap, and a new microbatch (stage 0's F) at most every
//      2 steps (V-Half) or 3 (V-Min): the spacing of the paper's building blocks. Without
//      it the first microbatches enter in a burst, fill the caps of the ranks below at once
//      and leave them idle until the first backwards come back;
//   3. the oldest weight gradient W, which frees memory: W fills the bubbles, and when the
//      cap stops every forward, W is what runs.
// Each stage runs its forwards and its input gradients in microbatch order. How close the
// result comes to the paper's bubble, and to 1F1B's and ZB-V's, is measured in
// docs/schedules.md (tests/schedule/test_controllable_v.cpp checks it).
//
// Why it cannot stall: a forward of the V's first stage leaves one slot free whenever an
// older microbatch that passed this rank's first stage has still to come back up through its
// second; so the oldest microbatch whose forwards are unfinished always finds room (what fills
// a rank is either younger first-stage activations, which left it a slot, or microbatches
// ahead of it, whose forwards are done and whose I and W need no room), and a microbatch
// waiting for its entry step waits for time, which passes. The step loop checks anyway and
// throws rather than loop forever.
#pragma once

#include <baton/schedule/policies.hpp>
#include <baton/schedule/policy.hpp>
#include <baton/schedule/program.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace baton {

namespace detail::schedule {

// The stage-activation cap of each schedule, in the simulator's unit (one (stage, microbatch)
// activation, counted from its F to its W: simulation::rank_figures::peak_live).
constexpr int v_half_live_cap(int ranks) { return ranks + 2; }
constexpr int v_min_live_cap(int ranks) { return (2 * (ranks + 4) + 2) / 3; }

// Every rank's program under the cap; see the header comment for the order of preference.
constexpr program capped_v_program(const schedule_shape& s, int live_cap, int entry_interval) {
  const int p = s.ranks;
  const int m = s.microbatches;
  const int S = 2 * p;
  // The step at whose end each F and I of (stage, microbatch) finished; -1: not yet. W
  // gates nothing, so it needs no record.
  const std::size_t cells = static_cast<std::size_t>(S) * static_cast<std::size_t>(m);
  std::vector<int> forward_done(cells, -1);
  std::vector<int> input_done(cells, -1);
  const auto cell = [m](int stage, int mb) {
    return static_cast<std::size_t>(stage) * static_cast<std::size_t>(m) + static_cast<std::size_t>(mb);
  };

  struct rank_state {
    int stage[2] = {0, 0};  // the V's first (down) and second (up) stage on this rank
    int next_forward[2] = {0, 0};
    int next_input[2] = {0, 0};
    std::vector<action> pending_weights;  // in the order of their I; run from weights_done on
    std::size_t weights_done = 0;
    int live = 0;  // activations saved by an F and not yet freed by the W
  };
  std::vector<rank_state> ranks(static_cast<std::size_t>(p));
  for (int r = 0; r < p; ++r) {
    ranks[static_cast<std::size_t>(r)].stage[0] = r;
    ranks[static_cast<std::size_t>(r)].stage[1] = S - 1 - r;
  }
  program prog = empty_program(s);
  for (auto& row : prog.ranks) row.reserve(static_cast<std::size_t>(6 * m));

  // Ready at step t: its input finished at a step before t (a neighbour on another rank
  // hands over at the step's end; on the same rank the row's order does it).
  const auto forward_ready = [&](int stage, int mb, int t) {
    return stage == 0 || (forward_done[cell(stage - 1, mb)] >= 0 && forward_done[cell(stage - 1, mb)] < t);
  };
  const auto input_ready = [&](int stage, int mb, int t) {
    const int f = forward_done[cell(stage, mb)];
    if (f < 0 || f >= t) return false;
    if (stage == S - 1) return true;
    const int above = input_done[cell(stage + 1, mb)];
    return above >= 0 && above < t;
  };

  const long long total = 3LL * S * m;
  long long done = 0;
  for (int t = 0; done < total; ++t) {
    const long long done_before = done;
    bool entry_pending = false;  // stage 0's next forward waits only for its entry step
    for (int r = 0; r < p; ++r) {
      auto& st = ranks[static_cast<std::size_t>(r)];
      auto& row = prog.ranks[static_cast<std::size_t>(r)];
      // 1. An input gradient: the older microbatch first, the second stage on a tie.
      int best_chunk = -1;
      for (int c = 1; c >= 0; --c) {
        const int mb = st.next_input[c];
        if (mb >= m || !input_ready(st.stage[c], mb, t)) continue;
        if (best_chunk < 0 || mb < st.next_input[best_chunk]) best_chunk = c;
      }
      if (best_chunk >= 0) {
        const int stage = st.stage[best_chunk];
        const int mb = st.next_input[best_chunk]++;
        row.push_back({stage, action_kind::backward_input, mb});
        input_done[cell(stage, mb)] = t;
        st.pending_weights.push_back({stage, action_kind::backward_weight, mb});
        ++done;
        continue;
      }
      bool ran = false;
      // 2. A forward within the cap.
      for (int c = 1; c >= 0 && !ran; --c) {
        const int mb = st.next_forward[c];
        // A first-stage forward leaves a slot for the second-stage forward of an older
        // microbatch that has passed this rank's first stage and still has to come back up.
        const bool older_coming_back = st.next_forward[0] > st.next_forward[1];
        const int slots = c == 0 && older_coming_back ? 2 : 1;
        if (mb >= m || st.live + slots > live_cap || !forward_ready(st.stage[c], mb, t)) continue;
        if (st.stage[c] == 0 && static_cast<long long>(t) < static_cast<long long>(entry_interval) * mb) {
          entry_pending = true;
          continue;
        }
        row.push_back({st.stage[c], action_kind::forward, mb});
        forward_done[cell(st.stage[c], mb)] = t;
        ++st.next_forward[c];
        ++st.live;
        ++done;
        ran = true;
      }
      if (ran) continue;
      // 3. The oldest weight gradient.
      if (st.weights_done < st.pending_weights.size()) {
        row.push_back(st.pending_weights[st.weights_done++]);
        --st.live;
        ++done;
      }
    }
    if (done == done_before && !entry_pending)  // nothing ran anywhere, nothing waits: nothing ever will
      throw schedule_error("baton: internal error: the capped V scheduler stalled at step " + std::to_string(t) +
                           " for shape (ranks " + std::to_string(p) + ", microbatches " + std::to_string(m) +
                           ", cap " + std::to_string(live_cap) + "); please report it");
  }
  return prog;
}

}  // namespace detail::schedule

// V-Half: ZB-V's V with at most ranks + 2 live stage-activations per rank, (p + 2) / 2
// microbatches of the rank's share against 1F1B's p; see the header comment.
struct v_half : detail::schedule::policy_traits<true, placement::v, 2> {
  [[nodiscard]] static constexpr program generate(const schedule_shape& s) {
    detail::schedule::check_v("v_half", s);
    return detail::schedule::capped_v_program(s, detail::schedule::v_half_live_cap(s.ranks), 2);
  }
};

// V-Min: the same with at most ceil(2 (p + 4) / 3) live stage-activations per rank, about a
// third of 1F1B's memory for large p, for a larger bubble.
struct v_min : detail::schedule::policy_traits<true, placement::v, 2> {
  [[nodiscard]] static constexpr program generate(const schedule_shape& s) {
    detail::schedule::check_v("v_min", s);
    return detail::schedule::capped_v_program(s, detail::schedule::v_min_live_cap(s.ranks), 3);
  }
};

}  // namespace baton
