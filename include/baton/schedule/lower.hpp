// baton/schedule/lower.hpp — add the messages a compute-only program implies.
#pragma once

#include <baton/schedule/program.hpp>
#include <baton/schedule/validate.hpp>

#include <vector>

namespace baton {

// Lowers a valid compute-only program to compute + communication:
//   - after F of stage s, SEND_F s m when stage s + 1 is on another rank;
//   - before F of stage s + 1, the matching RECV_F s+1 m on that rank;
//   - after B or I of stage s, SEND_B s m when stage s - 1 is on another rank;
//   - before B or I of stage s - 1, the matching RECV_B s-1 m.
// Stages on the same rank hand over by call: no message. Each receive sits right before
// the compute that consumes it, so with blocking receives and buffered sends the lowered
// program runs exactly as the compute-only one does: it cannot deadlock. An overlapped F/B
// pair stays one step: the receives of both come right before it and the sends of both
// right after it (torch's _add_send_recv does the same). Stage-level actions (UNSHARD,
// RESHARD, REDUCE_GRAD) stay where they are. A program that is already lowered is returned
// unchanged; an invalid one throws schedule_error.
[[nodiscard]] constexpr program lower(const program& compute_only) {
  if (find_problem(compute_only)) validate(compute_only);  // throws, naming the problem
  if (is_lowered(compute_only)) return compute_only;
  const schedule_shape& shape = compute_only.shape;
  const int S = shape.num_stages();
  program out{shape, std::vector<std::vector<action>>(compute_only.ranks.size())};
  for (std::size_t r = 0; r < compute_only.ranks.size(); ++r) {
    const auto& row = compute_only.ranks[r];
    auto& lowered = out.ranks[r];
    lowered.reserve(row.size() * 2);
    const int rank = static_cast<int>(r);
    const auto remote = [&](int stage) { return stage >= 0 && stage < S && stage_rank(shape, stage) != rank; };
    const auto add_receive = [&](const action& a) {
      if (a.kind == action_kind::forward && remote(a.stage - 1))
        lowered.push_back({a.stage, action_kind::recv_forward, a.microbatch});
      if (is_input_backward(a.kind) && remote(a.stage + 1))
        lowered.push_back({a.stage, action_kind::recv_backward, a.microbatch});
    };
    const auto add_send = [&](const action& a) {
      if (a.kind == action_kind::forward && remote(a.stage + 1))
        lowered.push_back({a.stage, action_kind::send_forward, a.microbatch});
      if (is_input_backward(a.kind) && remote(a.stage - 1))
        lowered.push_back({a.stage, action_kind::send_backward, a.microbatch});
    };
    for (std::size_t i = 0; i < row.size(); ++i) {
      // A valid program's overlapped forward is followed by its backward (validated above).
      const std::size_t last = row[i].overlaps_next ? i + 1 : i;
      for (std::size_t j = i; j <= last; ++j) add_receive(row[j]);
      for (std::size_t j = i; j <= last; ++j) lowered.push_back(row[j]);
      for (std::size_t j = i; j <= last; ++j) add_send(row[j]);
      i = last;
    }
  }
  return out;
}

}  // namespace baton
