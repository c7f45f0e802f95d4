// baton/schedule/program.hpp — the shape of a pipeline and the per-rank programs that run it.
#pragma once

#include <baton/schedule/action.hpp>

#include <cstddef>
#include <vector>

namespace baton {

// How stages are laid out on ranks.
//   loop: stage s on rank s % ranks (rank r holds r, r + ranks, r + 2 ranks, ...);
//   v:    stages run down the ranks and back up: with 2 stages per rank, rank r holds
//         r and 2 ranks - 1 - r, so the first and the last stage share rank 0. More than two
//         stages per rank continue the zigzag (down, up, down, ...).
enum class placement { loop, v };

[[nodiscard]] constexpr std::string_view to_string(placement place) noexcept {
  return place == placement::v ? "v" : "loop";
}

// ranks x stages_per_rank stages, each running every one of `microbatches` microbatches.
struct schedule_shape {
  int ranks = 1;
  int stages_per_rank = 1;
  int microbatches = 1;
  placement place = placement::loop;

  [[nodiscard]] constexpr int num_stages() const noexcept { return ranks * stages_per_rank; }
  friend constexpr bool operator==(const schedule_shape&, const schedule_shape&) = default;
};

// The rank that holds `stage` under the shape's placement.
[[nodiscard]] constexpr int stage_rank(const schedule_shape& shape, int stage) noexcept {
  const int chunk = stage / shape.ranks;
  const int within = stage % shape.ranks;
  if (shape.place == placement::loop || chunk % 2 == 0) return within;
  return shape.ranks - 1 - within;
}

// The stages `rank` holds, in increasing order.
[[nodiscard]] constexpr std::vector<int> rank_stages(const schedule_shape& shape, int rank) {
  std::vector<int> stages;
  for (int s = 0; s < shape.num_stages(); ++s)
    if (stage_rank(shape, s) == rank) stages.push_back(s);
  return stages;
}

// Each rank's ordered actions: compute-only as a policy generates it, or compute plus
// communication after lower(); either may also hold the stage-level UNSHARD, RESHARD and
// REDUCE_GRAD of torch's runtime schedules. ranks[r][i] is step i of rank r (an overlapped
// F/B pair is two steps).
struct program {
  schedule_shape shape{};
  std::vector<std::vector<action>> ranks;

  friend constexpr bool operator==(const program&, const program&) = default;
};

// True when the program carries SEND/RECV actions (the output of lower()).
[[nodiscard]] constexpr bool is_lowered(const program& prog) noexcept {
  for (const auto& row : prog.ranks)
    for (const auto& a : row)
      if (is_communication(a.kind)) return true;
  return false;
}

// True when the program has no backward at all (no B, I or W): a forward-only schedule, for
// inference or evaluation (torch's _ScheduleForwardOnly; baton::forward_only). Validation then
// asks for every forward and no backward; a training step needs a program with backwards.
[[nodiscard]] constexpr bool is_forward_only(const program& prog) noexcept {
  for (const auto& row : prog.ranks)
    for (const auto& a : row)
      if (a.kind == action_kind::backward || a.kind == action_kind::backward_input ||
          a.kind == action_kind::backward_weight)
        return false;
  return true;
}

// True when some backward is split into I and W: the stages must then model
// split_backward_stage. (A policy's splits_backward says the same before generation.)
[[nodiscard]] constexpr bool uses_split_backward(const program& prog) noexcept {
  for (const auto& row : prog.ranks)
    for (const auto& a : row)
      if (a.kind == action_kind::backward_input || a.kind == action_kind::backward_weight) return true;
  return false;
}

[[nodiscard]] constexpr std::size_t action_count(const program& prog) noexcept {
  std::size_t count = 0;
  for (const auto& row : prog.ranks) count += row.size();
  return count;
}

// A message tag that is unique per (direction, stage boundary, microbatch) for a shape:
// sends and receives of one pair of ranks need not then happen in the same order.
// Defined for SEND_*/RECV_* actions; both ends of a pair get the same tag.
[[nodiscard]] constexpr int message_tag(const schedule_shape& shape, const action& a) noexcept {
  // The activation from s to s + 1 and the gradient from s + 1 to s are named by the
  // boundary's lower stage s.
  int boundary = a.stage;
  int direction = 0;
  switch (a.kind) {
    case action_kind::send_forward: boundary = a.stage; break;
    case action_kind::recv_forward: boundary = a.stage - 1; break;
    case action_kind::send_backward: boundary = a.stage - 1; direction = 1; break;
    case action_kind::recv_backward: boundary = a.stage; direction = 1; break;
    default: break;
  }
  return (a.microbatch * shape.num_stages() + boundary) * 2 + direction;
}

}  // namespace baton
