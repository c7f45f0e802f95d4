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
// program runs exactly as the compute-only one does: it cannot deadlock. A program that
// is already lowered is returned unchanged; an invalid one throws schedule_error.
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
    for (const action& a : row) {
      const int s = a.stage;
      const int mb = a.microbatch;
      const bool forward = a.kind == action_kind::forward;
      const bool input_backward = is_input_backward(a.kind);
      if (forward && s > 0 && stage_rank(shape, s - 1) != rank) lowered.push_back({s, action_kind::recv_forward, mb});
      if (input_backward && s + 1 < S && stage_rank(shape, s + 1) != rank)
        lowered.push_back({s, action_kind::recv_backward, mb});
      lowered.push_back(a);
      if (forward && s + 1 < S && stage_rank(shape, s + 1) != rank) lowered.push_back({s, action_kind::send_forward, mb});
      if (input_backward && s > 0 && stage_rank(shape, s - 1) != rank)
        lowered.push_back({s, action_kind::send_backward, mb});
    }
  }
  return out;
}

}  // namespace baton
