// baton/pipeline/detail/compiled_actions.hpp — a rank's row of the program compiled once, when
// the executor is built: each action with its handler, the slot of its stage, the stage on
// this rank it hands over to, the peer rank and tag of its message; and how an error names an
// action.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/program.hpp>

#include <cstddef>
#include <string>
#include <vector>

namespace baton::detail::pipeline {

// One action ready to run: `run` is Runner's handler for the action's stage type and kind.
template <class Runner>
struct compiled_action {
  action act;
  void (Runner::*run)(const compiled_action&) = nullptr;
  int slot = -1;       // this stage's position in its store
  int neighbour = -1;  // F: slot of stage - 1, B/I: slot of stage + 1, when on this rank
  int peer = -1;       // SEND/RECV: the other rank
  int tag = 0;
};

// A row compiled: every action for step(), and the forward ones for eval().
template <class Runner>
struct compiled_row {
  std::vector<compiled_action<Runner>> train;
  std::vector<compiled_action<Runner>> eval;
};

// Compiles `row` of a program of `shape`. slot_of[s] is stage s's slot on this rank (-1 when
// another rank holds it), handler_for(a) the handler of action a (it throws for an action its
// stage cannot run), tag_of(a) the tag of a communication action's messages.
//
// Every action of the row is for a stage this rank holds: validate() rejects stages out of
// range and actions on the wrong rank, and lower() only adds messages of the row's own stages.
// Missing receives or hand-overs cannot get here either (the program was validated), and the
// handlers still report a missing input naming the action if a stage's state says otherwise.
template <class Runner, class HandlerFor, class TagOf>
compiled_row<Runner> compile_row(const std::vector<action>& row, const schedule_shape& shape,
                                 const std::vector<int>& slot_of, HandlerFor&& handler_for, TagOf&& tag_of) {
  const auto local_slot = [&](int s) {
    return s >= 0 && s < shape.num_stages() ? slot_of[static_cast<std::size_t>(s)] : -1;
  };
  compiled_row<Runner> out;
  for (const action& a : row) {
    compiled_action<Runner> c;
    c.act = a;
    c.run = handler_for(a);
    c.slot = slot_of[static_cast<std::size_t>(a.stage)];
    switch (a.kind) {
      case action_kind::forward: c.neighbour = local_slot(a.stage - 1); break;
      case action_kind::backward:
      case action_kind::backward_input: c.neighbour = local_slot(a.stage + 1); break;
      case action_kind::send_forward:
      case action_kind::recv_backward: c.peer = stage_rank(shape, a.stage + 1); break;
      case action_kind::recv_forward:
      case action_kind::send_backward: c.peer = stage_rank(shape, a.stage - 1); break;
      default: break;
    }
    if (is_communication(a.kind)) c.tag = tag_of(a);
    out.train.push_back(c);
    if (a.kind == action_kind::forward || a.kind == action_kind::send_forward ||
        a.kind == action_kind::recv_forward) {
      out.eval.push_back(c);
    }
  }
  return out;
}

// What an action does, in the words of an error message.
inline std::string describe(action_kind kind) {
  switch (kind) {
    case action_kind::forward: return "forward";
    case action_kind::backward: return "backward";
    case action_kind::backward_input: return "backward_input";
    case action_kind::backward_weight: return "backward_weight";
    case action_kind::send_forward: return "send of the activation";
    case action_kind::recv_forward: return "receive of the activation";
    case action_kind::send_backward: return "send of the gradient";
    case action_kind::recv_backward: return "receive of the gradient";
    default: return std::string(token(kind));
  }
}

}  // namespace baton::detail::pipeline
