// baton/schedule/problem.hpp — what validation reports about an invalid program: the kinds
// of problem, where one is (rank, step, action and the related action), and describe(), the
// message that says what is wrong and what to do, with the grid around it.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/grid.hpp>
#include <baton/schedule/program.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace baton {

enum class problem_kind : std::uint8_t {
  bad_shape,                   // ranks, stages per rank or microbatches not in 1..2^20
  wrong_row_count,             // not one row per rank
  stage_out_of_range,
  microbatch_out_of_range,
  wrong_rank,                  // a stage's action on a rank that does not hold it
  message_not_needed,          // SEND/RECV past the pipeline's ends or between co-located stages
  duplicate_action,
  mixed_backward,              // both B and I for one stage and microbatch
  backward_before_forward,     // B or I before F of the same stage and microbatch
  weight_before_input,         // W before I
  weight_after_full_backward,  // W for a microbatch whose backward is a full B
  input_not_ready,             // co-located neighbour stage's F/backward not earlier in the row
  compute_before_receive,      // lowered: compute before the receive of its input
  send_before_compute,         // lowered: send before the compute that produces it
  receive_without_send,
  send_without_receive,
  missing_forward,
  missing_backward,
  missing_weight,
  deadlock,
  malformed_overlap,             // overlaps_next on anything but a forward followed at once by a B or I
  stage_action_with_microbatch,  // UNSHARD, RESHARD or REDUCE_GRAD with a microbatch other than 0
  unshard_twice,                 // UNSHARD of a stage that is already unsharded
  reshard_without_unshard,       // RESHARD of a stage that is not unsharded
  unshard_unused,                // UNSHARD with no compute of its stage before the RESHARD or the end
  compute_while_sharded,         // compute of an UNSHARD/RESHARD stage outside UNSHARD..RESHARD
  reduce_grad_before_backward,   // a B or W of the stage after its REDUCE_GRAD
  reduce_grad_without_backward,  // REDUCE_GRAD of a stage that runs no backward
  missing_reduce_grad,           // some stages have a REDUCE_GRAD, this one has none
};

// Where and what. `other` is the related action (the first occurrence of a duplicate, the
// action waited for, the receive that is missing...) at (other_rank, other_step) when it
// exists. For a deadlock, wait_cycle lists the blocked (rank, step) pairs, each waiting for
// an action of the next.
struct schedule_problem {
  problem_kind kind = problem_kind::bad_shape;
  int rank = -1;
  int step = -1;
  std::optional<action> act;
  std::optional<action> other;
  int other_rank = -1;
  int other_step = -1;
  long long expected = 0;
  long long got = 0;
  std::vector<std::array<int, 2>> wait_cycle;
};

// The problem in words: "rank R, step S, action A: what is wrong and what to do", then the
// grid around it.
[[nodiscard]] inline std::string describe(const schedule_problem& p, const program& prog) {
  using detail::schedule::int_to_string;
  const auto str = [](const std::optional<action>& a) { return a ? to_string(*a) : std::string("(none)"); };
  const auto num = [](long long v) { return int_to_string(v); };
  const auto where_other = [&]() -> std::string {
    if (p.other_rank < 0 || p.other_step < 0) return "which never runs";
    return "which is at rank " + num(p.other_rank) + ", step " + num(p.other_step);
  };
  const std::string place_name(to_string(prog.shape.place));
  const std::string a = str(p.act);
  const std::string o = str(p.other);
  std::string text;
  switch (p.kind) {
    case problem_kind::bad_shape:
      return "baton: invalid schedule shape (ranks " + num(prog.shape.ranks) + ", stages_per_rank " +
             num(prog.shape.stages_per_rank) + ", microbatches " + num(prog.shape.microbatches) +
             "): each must be at least 1, and ranks x stages_per_rank at most 1048576";
    case problem_kind::wrong_row_count:
      text = "the program has " + num(p.got) + " rank rows but the shape has " + num(p.expected) +
             " ranks: give exactly one row per rank";
      break;
    case problem_kind::stage_out_of_range:
      text = "stage " + num(p.act->stage) + " is out of range: the shape has " + num(p.expected) + " stages (0.." +
             num(p.expected - 1) + ")";
      break;
    case problem_kind::microbatch_out_of_range:
      text = "microbatch " + num(p.act->microbatch) + " is out of range: the shape has " + num(p.expected) +
             " microbatches (0.." + num(p.expected - 1) + ")";
      break;
    case problem_kind::wrong_rank:
      text = "stage " + num(p.act->stage) + " runs on rank " + num(p.rank) + ", but " + place_name +
             " placement puts it on rank " + num(p.other_rank) +
             "; each stage lives on exactly one rank (move the action to that rank's row, or change the placement)";
      break;
    case problem_kind::message_not_needed:
      if (p.other_rank < 0 || p.other_rank >= prog.shape.num_stages())
        text = "a message past the end of the pipeline (there is no stage " + num(p.other_rank) + "): remove it";
      else
        text = "stages " + num(p.act->stage) + " and " + num(p.other_rank) + " are both on rank " + num(p.rank) +
               ": co-located stages hand over by call, without a message; remove this action";
      break;
    case problem_kind::duplicate_action:
      text = "duplicate action: " + a + " already ran at rank " + num(p.other_rank) + ", step " + num(p.other_step) +
             "; every action runs exactly once";
      break;
    case problem_kind::mixed_backward:
      text = "stage " + num(p.act->stage) + " microbatch " + num(p.act->microbatch) + " has both " + o + " (step " +
             num(p.other_step) + ") and " + a + ": use either a full backward B, or I followed by W";
      break;
    case problem_kind::backward_before_forward:
      text = "backward before its forward " + o + " (" + where_other() + "); a backward needs the forward's saved state";
      break;
    case problem_kind::weight_before_input:
      text = "weight gradient before its input gradient " + o + " (" + where_other() + "); W must follow I";
      break;
    case problem_kind::weight_after_full_backward:
      text = "weight gradient for a microbatch whose full backward " + o + " (at step " + num(p.other_step) +
             ") already computed it: use I then W, or B alone";
      break;
    case problem_kind::input_not_ready:
      text = "needs " + o + " of a stage on the same rank, which must come earlier in this row (" + where_other() + ")";
      break;
    case problem_kind::compute_before_receive:
      text = "runs before receiving its input: " + o + " must come earlier in this row (" + where_other() + ")";
      break;
    case problem_kind::send_before_compute:
      text = "sends what " + o + " has not produced yet (" + where_other() + ")";
      break;
    case problem_kind::receive_without_send:
      text = "a receive nobody sends: it waits for " + o + " from rank " + num(p.other_rank) +
             ", which is not in the program";
      break;
    case problem_kind::send_without_receive:
      text = "a send nobody receives: rank " + num(p.other_rank) + " has no " + o;
      break;
    case problem_kind::missing_forward:
      text = "missing forward: stage " + num(p.act->stage) + " never runs microbatch " + num(p.act->microbatch) +
             " forward (" + a + "); every stage runs one forward per microbatch";
      break;
    case problem_kind::missing_backward:
      text = "missing backward: stage " + num(p.act->stage) + " never runs microbatch " + num(p.act->microbatch) +
             " backward (B, or I and W)";
      break;
    case problem_kind::missing_weight:
      text = "missing weight gradient: " + o + " at step " + num(p.other_step) + " is never followed by " + a;
      break;
    case problem_kind::malformed_overlap:
      if (p.act->kind != action_kind::forward)
        text = "only a forward starts an overlapped F/B pair, but overlaps_next is set on " + a +
               ": clear it, or set it on the forward right before a B or I";
      else if (!p.other)
        text = "an overlapped forward pairs with the next action of its row, a backward (B or I), but the row ends "
               "here: put the backward right after it, or clear overlaps_next";
      else
        text = "an overlapped forward pairs with the next action of its row, which must be a backward (B or I) that "
               "starts no pair itself, not " + o + ": put the backward right after it, or clear overlaps_next";
      break;
    case problem_kind::stage_action_with_microbatch:
      text = std::string(token(p.act->kind)) + " acts on a whole stage and has no microbatch, but this one carries "
             "microbatch " + num(p.act->microbatch) + ": set it to 0";
      break;
    case problem_kind::unshard_twice:
      text = "stage " + num(p.act->stage) + " is already unsharded by " + o + " at step " + num(p.other_step) +
             ": RESHARD it before unsharding it again, or remove this UNSHARD";
      break;
    case problem_kind::reshard_without_unshard:
      text = "RESHARD of stage " + num(p.act->stage) + ", which is not unsharded (" +
             (p.other ? "it was resharded at step " + num(p.other_step) : std::string("no UNSHARD before it")) +
             "): put an UNSHARD of the stage before its compute, or remove this RESHARD";
      break;
    case problem_kind::unshard_unused:
      if (p.act->kind == action_kind::reshard)
        text = "stage " + num(p.act->stage) + " is resharded before any compute used its " + o + " at step " +
               num(p.other_step) + ": remove both, or move the stage's compute between them";
      else
        text = "no compute of stage " + num(p.act->stage) + " follows this UNSHARD: remove it, or move it before "
               "the compute it is for";
      break;
    case problem_kind::compute_while_sharded: {
      const std::string stage = num(p.act->stage);
      if (p.other && p.other->kind == action_kind::reshard && p.other_step < p.step)
        text = "runs after stage " + stage + " was resharded (" + o + " at step " + num(p.other_step) +
               "): move that RESHARD after the stage's last compute, or UNSHARD the stage again before this";
      else if (p.other)
        text = "runs before stage " + stage + " is unsharded (" + o + " at step " + num(p.other_step) +
               "): move the UNSHARD before the stage's first compute";
      else
        text = "runs while stage " + stage + " is sharded: the program RESHARDs the stage but no UNSHARD comes "
               "before this; put " + stage + "UNSHARD before the stage's first compute";
      break;
    }
    case problem_kind::reduce_grad_before_backward:
      text = "reduces the gradients of stage " + num(p.act->stage) + " before its backward " + o + " (step " +
             num(p.other_step) + ") has produced them: move the REDUCE_GRAD after the stage's last B or W";
      break;
    case problem_kind::reduce_grad_without_backward:
      text = "stage " + num(p.act->stage) + " runs no backward (B or W)" +
             (is_forward_only(prog) ? std::string(": the program is forward-only") : std::string()) +
             ", so there are no gradients to reduce: remove the REDUCE_GRAD";
      break;
    case problem_kind::missing_reduce_grad:
      text = "the program reduces the gradients of other stages (REDUCE_GRAD) but never those of stage " +
             num(p.act->stage) + ": add " + a + " after its last B or W, or remove every REDUCE_GRAD";
      break;
    case problem_kind::deadlock: {
      text = "deadlock under blocking receives:";
      for (std::size_t i = 0; i < p.wait_cycle.size(); ++i) {
        const auto [r, t] = p.wait_cycle[i];
        const action& blocked = prog.ranks[static_cast<std::size_t>(r)][static_cast<std::size_t>(t)];
        const auto [nr, nt] = p.wait_cycle[(i + 1) % p.wait_cycle.size()];
        text += (i == 0 ? " " : "; ") + std::string("rank ") + num(r) + " waits at step " + num(t) + " (" +
                to_string(blocked) + ") for rank " + num(nr) + ", which is blocked at step " + num(nt);
      }
      text += ". Reorder so that what each rank waits for comes before its own wait (first awaited: " + o + ", " +
              where_other() + ")";
      break;
    }
  }
  std::string message = "baton: invalid schedule: rank " + num(p.rank) + ", step " + num(p.step) + ", action " + a +
                        ": " + text;
  if (p.rank >= 0 && p.rank < static_cast<int>(prog.ranks.size()))
    message += "\n" + format_grid_excerpt(prog, p.rank, p.step);
  return message;
}

}  // namespace baton
