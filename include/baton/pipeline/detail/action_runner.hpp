// baton/pipeline/detail/action_runner.hpp — the stages one rank of a pipeline holds and what
// each action of its row does to them: the handler of every action kind (forward with the
// loss on the last stage, backward, backward_input, backward_weight, and the sends and
// receives between stages), over the state of the call that runs them.
//
// The executor (pipeline/executor.hpp) builds one runner, compiles its row against the
// runner's handlers (detail/compiled_actions.hpp), prepares each call's inputs here and runs
// the compiled actions in order; a handler throws pipeline_error naming what is missing, and
// the executor adds which rank, call and action it was.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/traits.hpp>
#include <baton/pipeline/detail/compiled_actions.hpp>
#include <baton/pipeline/detail/gradient_check.hpp>
#include <baton/pipeline/detail/loss.hpp>
#include <baton/pipeline/detail/microbatch_state.hpp>
#include <baton/pipeline/detail/receives.hpp>
#include <baton/pipeline/detail/sends.hpp>
#include <baton/pipeline/detail/stage_set.hpp>
#include <baton/pipeline/detail/wire.hpp>
#include <baton/pipeline/error.hpp>
#include <baton/pipeline/stage.hpp>
#include <baton/pipeline/timing.hpp>
#include <baton/schedule/action.hpp>
#include <baton/schedule/program.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton::detail::pipeline {

template <class Stages, point_to_point_communicator Comm>
class action_runner {
 public:
  using set = stage_set<Stages>;
  static_assert(check_stage_set<set>());
  using types = typename set::types;
  static constexpr std::size_t type_count = set::type_count;
  template <std::size_t T>
  using stage_t = std::tuple_element_t<T, types>;
  using request = comm_request_t<Comm>;
  using stores_type = typename stores_of<types, request>::type;
  using input_type = typename stage_t<0>::input;
  using output_type = typename stage_t<type_count - 1>::output;
  using side_type = typename side_of<types>::type;
  using action_type = compiled_action<action_runner>;
  using handler = void (action_runner::*)(const action_type&);
  // The loss of microbatch mb's output (the last stage's rank only), unscaled.
  using loss_function = std::function<loss_result<grad_t<output_type>>(const output_type&, int mb)>;

  action_runner(Comm& communicator, const schedule_shape& program_shape)
      : comm(&communicator),
        shape(program_shape),
        rank(communicator.rank()),
        num_stages(program_shape.num_stages()),
        microbatches(program_shape.microbatches) {}

  // ---- the rank's stages -----------------------------------------------------------------

  // Builds the stages this rank holds, by make_stage (see pipeline_executor).
  template <class MakeStage>
  void build_stages(MakeStage& make_stage) {
    slot_of.assign(static_cast<std::size_t>(num_stages), -1);
    local_stage_indices = rank_stages(shape, rank);
    for (int s : local_stage_indices) {
      if constexpr (set::uniform) {
        auto& slots = std::get<0>(stores).slots;
        slot_of[static_cast<std::size_t>(s)] = static_cast<int>(slots.size());
        using S = stage_t<0>;
        static_assert(std::is_invocable_v<MakeStage&, int>,
                      "baton pipeline: the stage factory of uniform_stages<S> is called as make_stage(int "
                      "stage_index) and must return S");
        slots.push_back(std::make_unique<local_stage<S, request>>(
            s, microbatches, [&]() -> S { return make_stage(s); }));
      } else {
        [&]<std::size_t... T>(std::index_sequence<T...>) {
          ((T == static_cast<std::size_t>(s) ? build_one<T>(make_stage) : void()), ...);
        }(std::make_index_sequence<type_count>{});
        slot_of[static_cast<std::size_t>(s)] = 0;
      }
    }
  }

  template <std::size_t T, class MakeStage>
  void build_one(MakeStage& make_stage) {
    using S = stage_t<T>;
    using index = std::integral_constant<std::size_t, T>;
    static_assert(std::is_invocable_v<MakeStage&, index>,
                  "baton pipeline: the stage factory of a stage_list is called as make_stage(i) with i a "
                  "std::integral_constant<std::size_t, I> (use a generic lambda: [&](auto i) { ... }) and "
                  "must return stage type I");
    static_assert(std::is_same_v<std::remove_cvref_t<std::invoke_result_t<MakeStage&, index>>, S>,
                  "baton pipeline: make_stage(std::integral_constant<std::size_t, I>) must return the "
                  "stage_list's type number I");
    std::get<T>(stores).slots.push_back(std::make_unique<local_stage<S, request>>(
        static_cast<int>(T), microbatches, [&]() -> S { return make_stage(index{}); }));
  }

  // Calls f(stage index, stage) for stage s, which this rank holds.
  template <class F>
  void visit_stage(int s, F&& f) {
    const int slot = slot_of[static_cast<std::size_t>(s)];
    const std::size_t t = set::type_of(s);
    [&]<std::size_t... T>(std::index_sequence<T...>) {
      ((T == t ? (void)f(s, std::get<T>(stores).slots[static_cast<std::size_t>(slot)]->stage) : void()), ...);
    }(std::make_index_sequence<type_count>{});
  }

  // ---- one call ----------------------------------------------------------------------------

  // The handler of action a: its stage type's, for its kind. A split backward of a stage type
  // that has none is refused here, when the executor compiles its row.
  [[nodiscard]] handler handler_for(const action& a) const {
    static constexpr auto table = []<std::size_t... T>(std::index_sequence<T...>) {
      return std::array<std::array<handler, action_kind_count>, type_count>{handlers_of<T>()...};
    }(std::make_index_sequence<type_count>{});
    static constexpr auto splits = []<std::size_t... T>(std::index_sequence<T...>) {
      return std::array<bool, type_count>{split_backward_stage<stage_t<T>>...};
    }(std::make_index_sequence<type_count>{});
    const std::size_t t = set::type_of(a.stage);
    if ((a.kind == action_kind::backward_input || a.kind == action_kind::backward_weight) && !splits[t]) {
      throw pipeline_error("baton pipeline: the program runs " + to_string(a) +
                           " (a split backward) but stage " + std::to_string(a.stage) +
                           "'s type has no backward_input/backward_weight: implement them (see "
                           "baton::split_backward_stage) or use a full-backward schedule");
    }
    return table[t][static_cast<std::size_t>(a.kind)];
  }

  // Resets what a call measures, before its first action (the inputs, weights and loss are
  // set by the executor).
  void start_call(bool train) {
    loss_sum = 0;
    training = train;
    live_saved = live_bytes = peak_saved = peak_bytes = 0;
    clock.reset(num_stages);
  }

  // Drops the call's inputs and loss once it has run.
  void end_call() {
    batch_mbs.clear();
    side_mbs.clear();
    loss = nullptr;
  }

  // "" when every microbatch was carried through, otherwise what was left over first: a
  // program that forgets a W (or a send) would otherwise leak saved state into the next step
  // silently.
  [[nodiscard]] std::string work_left_over() {
    std::string problem;
    [&]<std::size_t... T>(std::index_sequence<T...>) {
      (check_finished_in<T>(problem), ...);
    }(std::make_index_sequence<type_count>{});
    return problem;
  }

  // ---- data --------------------------------------------------------------------------------

  Comm* comm;
  schedule_shape shape;
  int rank = 0;
  int num_stages = 0;
  int microbatches = 0;
  std::vector<int> slot_of;  // stage -> position in its store, -1 when not on this rank
  std::vector<int> local_stage_indices;
  stores_type stores;

  // The call being run: its number (in every message id), whether it trains, this rank's
  // microbatches of the batch (first stage) and of the side input, each microbatch's loss
  // weight and the loss (last stage); what it measures: the weighted loss, the compute times,
  // the saved states alive and at their peak.
  std::int64_t call = 0;
  bool training = false;
  std::vector<input_type> batch_mbs;
  std::vector<side_type> side_mbs;
  std::vector<double> weights;
  loss_function loss;
  double loss_sum = 0;
  action_clock clock;
  std::size_t live_saved = 0, live_bytes = 0, peak_saved = 0, peak_bytes = 0;
  send_queue<request> sends;

 private:
  // Which type index precedes / follows type index T in the pipeline.
  template <std::size_t T>
  static constexpr bool has_prev = set::uniform || T > 0;
  template <std::size_t T>
  static constexpr bool has_next = set::uniform || T + 1 < type_count;
  template <std::size_t T>
  static constexpr std::size_t prev = set::uniform ? 0 : (T > 0 ? T - 1 : 0);
  template <std::size_t T>
  static constexpr std::size_t next = set::uniform ? 0 : (T + 1 < type_count ? T + 1 : T);

  template <std::size_t T>
  static constexpr handler handler_of(action_kind kind) {
    switch (kind) {
      case action_kind::forward: return &action_runner::template run_forward<T>;
      case action_kind::backward: return &action_runner::template run_backward<T>;
      case action_kind::backward_input: return &action_runner::template run_backward_input<T>;
      case action_kind::backward_weight: return &action_runner::template run_backward_weight<T>;
      case action_kind::send_forward: return &action_runner::template run_send_forward<T>;
      case action_kind::recv_forward: return &action_runner::template run_recv_forward<T>;
      case action_kind::send_backward: return &action_runner::template run_send_backward<T>;
      case action_kind::recv_backward: return &action_runner::template run_recv_backward<T>;
      // Stage-level kinds (UNSHARD, RESHARD, REDUCE_GRAD): they stay in the program where they
      // stand, and a stage that does not shard its parameters has nothing to do for them.
      default: return &action_runner::run_nothing;
    }
  }
  template <std::size_t T>
  static constexpr std::array<handler, action_kind_count> handlers_of() {
    std::array<handler, action_kind_count> handlers{};
    for (std::size_t k = 0; k < handlers.size(); ++k) handlers[k] = handler_of<T>(static_cast<action_kind>(k));
    return handlers;
  }

  template <std::size_t T>
  void check_finished_in(std::string& problem) {
    for (auto& slot : std::get<T>(stores).slots) {
      for (std::size_t m = 0; m < slot->mb.size(); ++m) {
        auto& st = slot->mb[m];
        if (st.idle() || !problem.empty()) continue;
        const std::string place = "stage " + std::to_string(slot->index) + ", microbatch " + std::to_string(m);
        if (st.saved) problem = place + " still holds its saved state (no B or W ran)";
        else if (st.y) problem = place + " still holds an output that was never sent or used";
        else if (st.dx) problem = place + " still holds an input gradient that was never sent";
        else if (st.recv_x.active() || st.recv_dy.active()) problem = place + " has a receive that no compute consumed";
        else problem = place + " was not finished";
      }
    }
  }

  // ---- action handlers -------------------------------------------------------------------

  // Sends `payload` (the stage's output or input gradient, which leaves the state) to c.peer.
  template <class P>
  void send(std::optional<P>& payload, const action_type& c, int direction, send_spares<request, P>& spares) {
    const message_id id{call, c.act.stage, c.act.microbatch, direction};
    sends.push(post_send(*comm, std::move(*payload), c.peer, c.tag, id, spares));
    payload.reset();
  }

  // Posts the receive of stage `from`'s payload into `in`; if its header is already here, the
  // data receives are posted too, so that they overlap compute.
  template <class P>
  void receive(incoming<request, P>& in, buffer_pool<P>& pool, const action_type& c, int from, int direction) {
    post_recv(*comm, in, c.peer, c.tag, message_id{call, from, c.act.microbatch, direction});
    advance_recv(*comm, in, pool, false);
  }

  template <std::size_t T>
  auto& state(const action_type& c) {
    return std::get<T>(stores).slots[static_cast<std::size_t>(c.slot)]->mb[static_cast<std::size_t>(c.act.microbatch)];
  }
  template <std::size_t T>
  auto& stage_object(const action_type& c) {
    return std::get<T>(stores).slots[static_cast<std::size_t>(c.slot)]->stage;
  }

  template <std::size_t T>
  const typename stage_t<T>::side& side_for(int mb) const {
    using side = typename stage_t<T>::side;
    if constexpr (std::is_same_v<side, no_side>) {
      static const no_side none{};
      return none;
    } else {
      return side_mbs[static_cast<std::size_t>(mb)];
    }
  }

  template <std::size_t T>
  void release_saved(microbatch_state<stage_t<T>, request>& st) {
    auto& store = std::get<T>(stores);
    if (st.saved) {
      st.saved.reset();
      --live_saved;
      live_bytes -= st.saved_bytes;
    }
    st.input_grad_done = false;
    st.hooks.reset();
    if (st.x) {
      if (st.x_pooled) store.input_pool.release(std::move(*st.x));
      st.x.reset();
    }
  }

  template <std::size_t T>
  void run_forward(const action_type& c) {
    using S = stage_t<T>;
    auto& store = std::get<T>(stores);
    auto& st = state<T>(c);
    const int s = c.act.stage;
    const int mb = c.act.microbatch;
    if (st.saved || st.x) throw pipeline_error("forward ran twice for this microbatch");
    // The input: the batch, the previous stage's output on this rank, or a received payload.
    bool have = false;
    if constexpr (T == 0) {
      if (s == 0) {
        st.x.emplace(std::move(batch_mbs[static_cast<std::size_t>(mb)]));
        st.x_pooled = false;
        have = true;
      }
    }
    if (!have && c.neighbour >= 0) {
      if constexpr (has_prev<T>) {
        auto& prev_state = std::get<prev<T>>(stores).slots[static_cast<std::size_t>(c.neighbour)]->mb[static_cast<std::size_t>(mb)];
        if (!prev_state.y) {
          throw pipeline_error("the output of stage " + std::to_string(s - 1) + " for this microbatch is not "
                               "there (its forward has not run, or it was sent away)");
        }
        st.x.emplace(std::move(*prev_state.y));
        prev_state.y.reset();
        st.x_pooled = false;
        have = true;
      }
    }
    if (!have) {
      if (!st.recv_x.active()) {
        throw pipeline_error("no input: stage " + std::to_string(s - 1) + " runs on rank " +
                             std::to_string(stage_rank(shape, s - 1)) +
                             " and the program has no RECV_F before this forward (lower() the program)");
      }
      try {
        st.x.emplace(complete_recv(*comm, st.recv_x, store.input_pool));
      } catch (const std::exception& e) {
        throw pipeline_error(std::string("receiving the input activation from rank ") +
                             std::to_string(st.recv_x.source) + " failed: " + e.what());
      }
      st.x_pooled = true;
    }

    st.hooks.emplace();
    st.saved.emplace();
    st.saved_bytes = 0;
    ++live_saved;
    const auto compute_start = action_clock::clock::now();
    typename S::output y = [&] {
      try {
        return call_forward(stage_object<T>(c), *st.x, side_for<T>(mb), *st.saved, *st.hooks);
      } catch (const std::exception& e) {
        throw pipeline_error(std::string("the stage's forward threw: ") + e.what());
      }
    }();
    st.saved_bytes = saved_state_bytes(*st.saved);
    live_bytes += st.saved_bytes;
    if (live_saved > peak_saved || (live_saved == peak_saved && live_bytes > peak_bytes)) {
      peak_saved = live_saved;
      peak_bytes = live_bytes;
    }
    for (auto& hook : store.forward_hooks) hook(s, mb, *st.x, y, *st.hooks);

    bool consumed = false;
    if (s == num_stages - 1) {
      if constexpr (T == type_count - 1) {
        auto result = [&] {
          try {
            return loss(y, mb);
          } catch (const std::exception& e) {
            throw pipeline_error(std::string("the loss threw: ") + e.what());
          }
        }();
        const double w = weights[static_cast<std::size_t>(mb)];
        loss_sum += w * result.value;
        if (training) {
          if (auto problem = gradient_mismatch(y, result.grad, "the loss", "output"); !problem.empty()) {
            throw pipeline_error(problem);
          }
          scale_payload(result.grad, w);
          st.dy.emplace(std::move(result.grad));
          st.dy_pooled = false;
        }
        consumed = true;
      }
    }
    clock.add(s, action_kind::forward, mb, compute_start, action_clock::clock::now());
    if (!consumed) st.y.emplace(std::move(y));
    if (!training) release_saved<T>(st);
  }

  // Obtains the gradient of stage s's output for backward: the loss gradient (last stage), the
  // next stage's input gradient on this rank, or a received gradient.
  template <std::size_t T>
  void take_output_grad(const action_type& c, microbatch_state<stage_t<T>, request>& st) {
    if (st.dy) return;
    const int s = c.act.stage;
    const int mb = c.act.microbatch;
    if (s == num_stages - 1) throw pipeline_error("the loss gradient of this microbatch is missing");
    if (c.neighbour >= 0) {
      if constexpr (has_next<T>) {
        auto& next_state = std::get<next<T>>(stores).slots[static_cast<std::size_t>(c.neighbour)]->mb[static_cast<std::size_t>(mb)];
        if (!next_state.dx) {
          throw pipeline_error("the input gradient of stage " + std::to_string(s + 1) +
                               " for this microbatch is not there (its backward has not run)");
        }
        st.dy.emplace(std::move(*next_state.dx));
        next_state.dx.reset();
        st.dy_pooled = false;
        return;
      }
    }
    if (!st.recv_dy.active()) {
      throw pipeline_error("no output gradient: stage " + std::to_string(s + 1) + " runs on rank " +
                           std::to_string(stage_rank(shape, s + 1)) +
                           " and the program has no RECV_B before this backward (lower() the program)");
    }
    try {
      st.dy.emplace(complete_recv(*comm, st.recv_dy, std::get<T>(stores).grad_pool));
    } catch (const std::exception& e) {
      throw pipeline_error(std::string("receiving the output gradient from rank ") +
                           std::to_string(st.recv_dy.source) + " failed: " + e.what());
    }
    st.dy_pooled = true;
  }

  template <std::size_t T>
  void release_output_grad(microbatch_state<stage_t<T>, request>& st) {
    if (st.dy_pooled) std::get<T>(stores).grad_pool.release(std::move(*st.dy));
    st.dy.reset();
    st.dy_pooled = false;
  }

  template <std::size_t T>
  void backward_common(const action_type& c, bool split) {
    auto& st = state<T>(c);
    if (!st.saved) throw pipeline_error("backward before the forward of this microbatch");
    if (st.input_grad_done) throw pipeline_error("the input gradient of this microbatch was already computed");
    take_output_grad<T>(c, st);
    st.hooks->fire_output_grad(*st.dy);
    const auto compute_start = action_clock::clock::now();
    auto dx = [&] {
      try {
        if constexpr (split_backward_stage<stage_t<T>>) {
          if (split) return stage_object<T>(c).backward_input(*st.saved, *st.dy);
        }
        return stage_object<T>(c).backward(*st.saved, *st.dy);
      } catch (const std::exception& e) {
        throw pipeline_error(std::string("the stage's ") + (split ? "backward_input" : "backward") +
                             " threw: " + e.what());
      }
    }();
    clock.add(c.act.stage, split ? action_kind::backward_input : action_kind::backward, c.act.microbatch,
              compute_start, action_clock::clock::now());
    // Checked before anything sees it: the previous stage's backward trusts its output's shape.
    if (auto problem = gradient_mismatch(*st.x, dx, split ? "the stage's backward_input"
                                                                      : "the stage's backward",
                                                     "input");
        !problem.empty()) {
      throw pipeline_error(problem);
    }
    release_output_grad<T>(st);
    st.hooks->fire_input_grad(dx);
    if (c.act.stage > 0) st.dx.emplace(std::move(dx));
    if (split) {
      st.input_grad_done = true;
    } else {
      release_saved<T>(st);
    }
  }

  template <std::size_t T>
  void run_backward(const action_type& c) {
    backward_common<T>(c, false);
  }

  template <std::size_t T>
  void run_backward_input(const action_type& c) {
    if constexpr (split_backward_stage<stage_t<T>>) {
      backward_common<T>(c, true);
    } else {
      throw pipeline_error("the stage has no backward_input");  // rejected at construction
    }
  }

  template <std::size_t T>
  void run_backward_weight(const action_type& c) {
    if constexpr (split_backward_stage<stage_t<T>>) {
      auto& st = state<T>(c);
      if (!st.saved || !st.input_grad_done) {
        throw pipeline_error("backward_weight before the backward_input of this microbatch");
      }
      const auto compute_start = action_clock::clock::now();
      try {
        stage_object<T>(c).backward_weight(*st.saved);
      } catch (const std::exception& e) {
        throw pipeline_error(std::string("the stage's backward_weight threw: ") + e.what());
      }
      clock.add(c.act.stage, action_kind::backward_weight, c.act.microbatch, compute_start,
                action_clock::clock::now());
      release_saved<T>(st);
    } else {
      throw pipeline_error("the stage has no backward_weight");  // rejected at construction
    }
  }

  void run_nothing(const action_type&) {}

  template <std::size_t T>
  void run_send_forward(const action_type& c) {
    auto& st = state<T>(c);
    if (!st.y) throw pipeline_error("nothing to send: the forward of this microbatch has not run");
    send(st.y, c, 0, std::get<T>(stores).output_sends);
  }

  template <std::size_t T>
  void run_recv_forward(const action_type& c) {
    auto& st = state<T>(c);
    if (st.recv_x.active() || st.x) throw pipeline_error("the input of this microbatch was already received");
    receive(st.recv_x, std::get<T>(stores).input_pool, c, c.act.stage - 1, 0);
  }

  template <std::size_t T>
  void run_send_backward(const action_type& c) {
    auto& st = state<T>(c);
    if (!st.dx) throw pipeline_error("nothing to send: the backward of this microbatch has not run");
    send(st.dx, c, 1, std::get<T>(stores).input_grad_sends);
  }

  template <std::size_t T>
  void run_recv_backward(const action_type& c) {
    auto& st = state<T>(c);
    if (st.recv_dy.active() || st.dy) {
      throw pipeline_error("the output gradient of this microbatch was already received");
    }
    receive(st.recv_dy, std::get<T>(stores).grad_pool, c, c.act.stage + 1, 1);
  }
};

}  // namespace baton::detail::pipeline
