// baton/pipeline/detail/microbatch_state.hpp — what an executor keeps per stage it holds and
// per microbatch of that stage between actions: the input, saved state, output and gradients
// in flight, the microbatch's hooks and its pending receives; and the per-type store of a
// rank's stages with their receive-buffer pools and forward hooks.
#pragma once

#include <baton/payload/grad.hpp>
#include <baton/pipeline/detail/buffer_pool.hpp>
#include <baton/pipeline/detail/receives.hpp>
#include <baton/pipeline/detail/sends.hpp>
#include <baton/pipeline/stage.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <utility>
#include <vector>

namespace baton::detail::pipeline {

template <class S, class Request>
struct microbatch_state {
  using input = typename S::input;
  using output = typename S::output;
  using grad_in = grad_t<input>;
  using grad_out = grad_t<output>;

  std::optional<input> x;                  // what forward saw; kept until saved is freed
  bool x_pooled = false;                   // x came from the receive pool
  std::optional<typename S::saved> saved;  // forward -> B, or forward -> I -> W
  std::size_t saved_bytes = 0;
  bool input_grad_done = false;            // I ran, W pending
  std::optional<output> y;                 // until SEND_F or the next local stage's F
  std::optional<grad_out> dy;              // loss gradient, received, or handed over
  bool dy_pooled = false;
  std::optional<grad_in> dx;               // until SEND_B or the previous local stage's backward
  std::optional<hooks_for<S>> hooks;       // this microbatch's hooks: die with it
  incoming<Request, input> recv_x;         // pending receive of x (active() while posted)
  incoming<Request, grad_out> recv_dy;     // pending receive of dy

  [[nodiscard]] bool idle() const noexcept {
    return !x && !saved && !y && !dy && !dx && !hooks && !recv_x.active() && !recv_dy.active();
  }
};

// One stage this rank holds, with the state of each of its microbatches.
template <class S, class Request>
struct local_stage {
  template <class Make>
  local_stage(int stage_index, int microbatches, Make&& make)
      : index(stage_index), stage(make()), mb(static_cast<std::size_t>(microbatches)) {}

  int index;
  S stage;
  std::vector<microbatch_state<S, Request>> mb;
};

template <class S>
using forward_hook_fn = std::function<void(int, int, const typename S::input&, const typename S::output&,
                                           hooks_for<S>&)>;

// The stages of one type a rank holds (one for a stage_list type, any number for
// uniform_stages), and what they share: receive pools, spare send objects and forward hooks.
template <class S, class Request>
struct stage_store {
  std::vector<std::unique_ptr<local_stage<S, Request>>> slots;
  buffer_pool<typename S::input> input_pool;
  buffer_pool<grad_t<typename S::output>> grad_pool;
  send_spares<Request, typename S::output> output_sends;
  send_spares<Request, grad_t<typename S::input>> input_grad_sends;
  std::vector<forward_hook_fn<S>> forward_hooks;
};

template <class Tuple, class Request>
struct stores_of;
template <class... S, class Request>
struct stores_of<std::tuple<S...>, Request> {
  using type = std::tuple<stage_store<S, Request>...>;
};

}  // namespace baton::detail::pipeline
