// A slow, obviously-correct reference checker, written without baton's validator: every
// action at most once, completeness by counting, then a round-robin run in which a rank
// moves only when its next action's inputs are done (receives block, sends do not).
// A program with no backward at all is forward-only and needs only its forwards; an
// overlapped forward must be followed at once by a B or I, and the pair moves only when both
// can. Stage-level actions (UNSHARD, RESHARD, REDUCE_GRAD) are not judged here: the tests of
// torch's files check their placement. Tests compare baton::is_valid against it.
#pragma once

#include <baton/schedule/program.hpp>

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace oracle {

using key = std::tuple<int, int, int>;  // kind, stage, microbatch

inline int owner(const baton::schedule_shape& s, int stage) {
  const int chunk = stage / s.ranks;
  const int within = stage % s.ranks;
  if (s.place == baton::placement::v && chunk % 2 == 1) return s.ranks - 1 - within;
  return within;
}

inline bool check(const baton::program& p, std::string* why = nullptr) {
  auto fail = [&](const std::string& reason) {
    if (why) *why = reason;
    return false;
  };
  using K = baton::action_kind;
  const auto& s = p.shape;
  if (s.ranks < 1 || s.stages_per_rank < 1 || s.microbatches < 1) return fail("shape");
  if (static_cast<int>(p.ranks.size()) != s.ranks) return fail("rows");
  const int S = s.ranks * s.stages_per_rank;
  std::map<key, int> count;
  bool lowered = false;
  bool has_backward = false;
  for (int r = 0; r < s.ranks; ++r) {
    const auto& row = p.ranks[static_cast<std::size_t>(r)];
    for (std::size_t i = 0; i < row.size(); ++i) {
      const auto& a = row[i];
      if (a.stage < 0 || a.stage >= S || a.microbatch < 0 || a.microbatch >= s.microbatches) return fail("range");
      if (owner(s, a.stage) != r) return fail("placement");
      const bool repeatable = a.kind == K::unshard || a.kind == K::reshard;
      if (!repeatable && ++count[{static_cast<int>(a.kind), a.stage, a.microbatch}] > 1) return fail("duplicate");
      if (a.kind == K::send_forward || a.kind == K::recv_forward || a.kind == K::send_backward ||
          a.kind == K::recv_backward)
        lowered = true;
      if (a.kind == K::backward || a.kind == K::backward_input || a.kind == K::backward_weight) has_backward = true;
      if (a.overlaps_next) {
        if (a.kind != K::forward || i + 1 == row.size()) return fail("pair");
        const auto& b = row[i + 1];
        if ((b.kind != K::backward && b.kind != K::backward_input) || b.overlaps_next) return fail("pair");
      }
    }
  }
  auto has = [&](K k, int st, int mb) { return count.count({static_cast<int>(k), st, mb}) > 0; };
  for (int st = 0; st < S; ++st)
    for (int mb = 0; mb < s.microbatches; ++mb) {
      if (!has(K::forward, st, mb)) return fail("forward missing");
      const bool b = has(K::backward, st, mb), i = has(K::backward_input, st, mb), w = has(K::backward_weight, st, mb);
      if (has_backward && !(b && !i && !w) && !(!b && i && w)) return fail("backward missing or mixed");
      // Messages: exactly the cross-rank boundaries, both ends, in a lowered program; backward
      // ones only when there is a backward.
      const bool next_remote = st + 1 < S && owner(s, st + 1) != owner(s, st);
      const bool prev_remote = st > 0 && owner(s, st - 1) != owner(s, st);
      if (lowered) {
        if (has(K::send_forward, st, mb) != next_remote) return fail("send_f");
        if (has(K::recv_forward, st, mb) != prev_remote) return fail("recv_f");
        if (has(K::send_backward, st, mb) != (has_backward && prev_remote)) return fail("send_b");
        if (has(K::recv_backward, st, mb) != (has_backward && next_remote)) return fail("recv_b");
      }
    }

  std::set<key> done;
  auto is_done = [&](K k, int st, int mb) { return done.count({static_cast<int>(k), st, mb}) > 0; };
  auto backward_done = [&](int st, int mb) { return is_done(K::backward, st, mb) || is_done(K::backward_input, st, mb); };
  auto ready = [&](const baton::action& a) {
    const int st = a.stage, mb = a.microbatch;
    const bool prev_local = st > 0 && owner(s, st - 1) == owner(s, st);
    const bool next_local = st + 1 < S && owner(s, st + 1) == owner(s, st);
    switch (a.kind) {
      case K::forward:
        if (st == 0) return true;
        if (!lowered || prev_local) return is_done(K::forward, st - 1, mb);
        return is_done(K::recv_forward, st, mb);
      case K::backward:
      case K::backward_input:
        if (!is_done(K::forward, st, mb)) return false;
        if (st == S - 1) return true;
        if (!lowered || next_local) return backward_done(st + 1, mb);
        return is_done(K::recv_backward, st, mb);
      case K::backward_weight: return is_done(K::backward_input, st, mb);
      case K::send_forward: return is_done(K::forward, st, mb);
      case K::send_backward: return backward_done(st, mb);
      case K::recv_forward: return is_done(K::send_forward, st - 1, mb);
      case K::recv_backward: return is_done(K::send_backward, st + 1, mb);
      case K::unshard:
      case K::reshard:
      case K::reduce_grad: return true;
    }
    return false;
  };
  auto mark = [&](const baton::action& a) { done.insert({static_cast<int>(a.kind), a.stage, a.microbatch}); };
  // A pair moves when its forward can, and its backward could right after.
  auto pair_ready = [&](const baton::action& f, const baton::action& b) {
    if (!ready(f)) return false;
    const key f_key{static_cast<int>(f.kind), f.stage, f.microbatch};
    const bool already = done.count(f_key) > 0;
    mark(f);
    const bool ok = ready(b);
    if (!already) done.erase(f_key);
    return ok;
  };
  std::vector<std::size_t> next(p.ranks.size(), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (std::size_t r = 0; r < p.ranks.size(); ++r) {
      const auto& row = p.ranks[r];
      while (next[r] < row.size()) {
        const auto& a = row[next[r]];
        const std::size_t width = a.overlaps_next ? 2 : 1;  // pairs were checked well-formed above
        if (width == 2 ? !pair_ready(a, row[next[r] + 1]) : !ready(a)) break;
        for (std::size_t k = 0; k < width; ++k) mark(row[next[r]++]);
        progress = true;
      }
    }
  }
  for (std::size_t r = 0; r < p.ranks.size(); ++r)
    if (next[r] < p.ranks[r].size()) return fail("stuck at rank " + std::to_string(r));
  return true;
}

}  // namespace oracle
