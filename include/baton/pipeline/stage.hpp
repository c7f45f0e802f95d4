// baton/pipeline/stage.hpp — what a pipeline stage is: the `stage` and `split_backward_stage`
// concepts, the per-microbatch hooks a stage may register, the loss result, and the lists of
// stage types an executor is built over.
//
// A stage is a plain C++ object. Its forward keeps what backward needs in a per-microbatch
// `saved` object that the executor owns (C++'s stand-in for an autograd graph), so one stage
// object serves every microbatch in flight:
//
// ```cpp
//   struct my_stage {
//     using input = baton::host_tensor<double>;   // payloads (tensors or records)
//     using output = baton::host_tensor<double>;
//     using side = baton::no_side;                // per-microbatch inputs given locally
//     struct saved { baton::host_tensor<double> x, y; };
//     output forward(const input& x, const side&, saved& st);
//     baton::grad_t<input> backward(saved& st, const baton::grad_t<output>& dy);
//     // split backward (zero-bubble schedules) adds:
//     baton::grad_t<input> backward_input(saved& st, const baton::grad_t<output>& dy);
//     void backward_weight(saved& st);
//   };
// ```
//
// The full example, with the function bodies, is in docs/pipeline.md.
#pragma once

#include <baton/core/meta.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/record.hpp>
#include <baton/payload/traits.hpp>

#include <concepts>
#include <cstddef>
#include <functional>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// The `side` type of a stage that takes no side input.
struct no_side {
  friend constexpr bool operator==(const no_side&, const no_side&) = default;
};

/// no_side is an opaque value: it is never sent and never differentiated.
template <>
struct payload_traits<no_side> {
  static constexpr payload_role role = payload_role::opaque;
};

/// Hooks that live exactly as long as one microbatch of one stage in one step (seed 002).
///
/// The executor creates a fresh object for every (stage, microbatch) at forward and destroys
/// it when that microbatch's saved state is freed (after B, or after W for split schedules),
/// so a hook registered on a stage input can never survive into the next microbatch or step,
/// whatever the executor does with its pooled receive buffers.
///
/// A stage receives it as an optional 4th parameter of forward; executor-level forward
/// hooks (pipeline_executor::add_forward_hook) receive it too.
template <class Input, class Output>
class microbatch_hooks {
 public:
  using input_grad_hook = std::function<void(const grad_t<Input>&)>;
  using output_grad_hook = std::function<void(const grad_t<Output>&)>;

  /// `f(dx)` runs once, right after backward (or backward_input) produced the gradient of this
  /// microbatch's stage input — the gradient hook of a framework's activation tensor.
  void on_input_grad(input_grad_hook f) { input_grad_.push_back(std::move(f)); }

  /// `f(dy)` runs once, when the gradient of this microbatch's stage output is available,
  /// just before backward uses it.
  void on_output_grad(output_grad_hook f) { output_grad_.push_back(std::move(f)); }

  /// Number of hooks registered (both kinds).
  [[nodiscard]] std::size_t size() const noexcept { return input_grad_.size() + output_grad_.size(); }

  // Called by the executor.
  void fire_input_grad(const grad_t<Input>& g) const {
    for (const auto& f : input_grad_) f(g);
  }
  void fire_output_grad(const grad_t<Output>& g) const {
    for (const auto& f : output_grad_) f(g);
  }
  [[nodiscard]] bool empty() const noexcept { return input_grad_.empty() && output_grad_.empty(); }

 private:
  std::vector<input_grad_hook> input_grad_;
  std::vector<output_grad_hook> output_grad_;
};

namespace detail::pipeline {

template <class S>
concept has_stage_types = requires {
  typename S::input;
  typename S::output;
  typename S::side;
  typename S::saved;
};

template <class S>
using hooks_for = microbatch_hooks<typename S::input, typename S::output>;

template <class S>
concept forward_plain = requires(S& s, const typename S::input& x, const typename S::side& c,
                                 typename S::saved& st) {
  { s.forward(x, c, st) } -> std::same_as<typename S::output>;
};

template <class S>
concept forward_with_hooks = requires(S& s, const typename S::input& x, const typename S::side& c,
                                      typename S::saved& st, hooks_for<S>& h) {
  { s.forward(x, c, st, h) } -> std::same_as<typename S::output>;
};

template <class S>
concept full_backward = requires(S& s, typename S::saved& st, const grad_t<typename S::output>& gy) {
  { s.backward(st, gy) } -> std::same_as<grad_t<typename S::input>>;
};

template <class S>
concept split_backward = requires(S& s, typename S::saved& st, const grad_t<typename S::output>& gy) {
  { s.backward_input(st, gy) } -> std::same_as<grad_t<typename S::input>>;
  s.backward_weight(st);
};

}  // namespace detail::pipeline

/// A pipeline stage.
///
/// Requirements, for `S s`:
///  1. member types `input`, `output` (payloads: tensors or records), `side` (the per-
///     microbatch inputs every stage receives locally, never through the pipe; `no_side` when
///     none) and `saved` (what forward keeps for backward; default-constructible, movable);
///  2. `s.forward(x, side, saved) -> output`, or `s.forward(x, side, saved, hooks) -> output`
///     with `hooks` a `microbatch_hooks<input, output>&`;
///  3. `s.backward(saved, dy) -> grad_t<input>`: returns the input gradient and *adds* the
///     weight gradients into the stage's accumulators (one call per microbatch).
template <class S>
concept stage = detail::pipeline::has_stage_types<S> && std::default_initializable<typename S::saved> &&
                std::movable<typename S::saved> &&
                (detail::pipeline::forward_plain<S> || detail::pipeline::forward_with_hooks<S>) &&
                detail::pipeline::full_backward<S>;

/// A stage whose backward can run in two halves, as zero-bubble schedules need:
///  4. `s.backward_input(saved, dy) -> grad_t<input>` computes only the input gradient and keeps
///     in `saved` what the weight gradient needs;
///  5. `s.backward_weight(saved)` adds the weight gradients. The executor frees `saved` after it.
template <class S>
concept split_backward_stage = stage<S> && detail::pipeline::split_backward<S>;

/// What a loss function returns for one microbatch: the loss value and the gradient of that
/// value with respect to the last stage's output. The executor scales both (by 1/m, or by the
/// microbatch's share of tokens) — return them unscaled.
template <class Grad>
struct loss_result {
  double value = 0;
  Grad grad;
};

/// The stage types of a pipeline, one per stage, in pipeline order: the output type of
/// stage i must be the input type of stage i + 1 (checked at compile time).
template <class... Stages>
struct stage_list {
  static constexpr std::size_t size = sizeof...(Stages);
};

/// A pipeline whose stages all have type S; the number of stages comes from the schedule.
template <class S>
struct uniform_stages {};

/// Bytes a saved state holds, for the executor's memory report: `st.bytes()` when the saved
/// type provides it, otherwise sizeof.
template <class Saved>
[[nodiscard]] std::size_t saved_state_bytes(const Saved& st) {
  if constexpr (requires {
                  { st.bytes() } -> std::convertible_to<std::size_t>;
                }) {
    return static_cast<std::size_t>(st.bytes());
  } else {
    return sizeof(Saved);
  }
}

namespace detail::pipeline {

// Compile-time diagnosis of a type that should be a stage: the first missing requirement
// fires, with a message that says what to write.
template <class S>
constexpr bool check_stage() {
  if constexpr (!has_stage_types<S>) {
    static_assert(core::dependent_false_v<S>,
                  "baton: a pipeline stage must declare the member types `input`, `output`, "
                  "`side` and `saved` (use `using side = baton::no_side;` when the stage takes no "
                  "side input)");
  } else if constexpr (!std::default_initializable<typename S::saved> ||
                       !std::movable<typename S::saved>) {
    static_assert(core::dependent_false_v<S>,
                  "baton: a stage's `saved` type (the per-microbatch state forward keeps for "
                  "backward) must be default-constructible and movable: the executor creates one "
                  "per microbatch in flight");
  } else if constexpr (!forward_plain<S> && !forward_with_hooks<S>) {
    static_assert(core::dependent_false_v<S>,
                  "baton: a stage needs `output forward(const input&, const side&, saved&)` (or "
                  "the same with a 4th parameter `baton::microbatch_hooks<input, output>&`) "
                  "returning exactly its `output` type");
  } else if constexpr (!full_backward<S>) {
    static_assert(core::dependent_false_v<S>,
                  "baton: a stage needs `baton::grad_t<input> backward(saved&, const "
                  "baton::grad_t<output>&)` that returns the input gradient and accumulates the "
                  "weight gradients");
  } else {
    // Stage inputs and outputs cross stage boundaries: an opaque value there (seed 000's
    // BlockMask) is a compile error that says to pass it as a side input.
    (void)require_sendable<typename S::input>();
    (void)require_sendable<typename S::output>();
  }
  return true;
}

template <class S>
constexpr bool check_split_stage() {
  check_stage<S>();
  if constexpr (stage<S> && !split_backward<S>) {
    static_assert(core::dependent_false_v<S>,
                  "baton: this split-backward schedule needs a stage with backward_input/"
                  "backward_weight: give the stage `baton::grad_t<input> backward_input(saved&, "
                  "const baton::grad_t<output>&)` and `void backward_weight(saved&)`, or use a "
                  "full-backward schedule (baton::gpipe, baton::one_f_one_b, "
                  "baton::interleaved_1f1b, baton::looped_bfs)");
  }
  return true;
}

template <class L>
struct split_stages_checker;
template <class... S>
struct split_stages_checker<stage_list<S...>> {
  static constexpr bool check() { return (check_split_stage<S>() && ...); }
};
template <class S>
struct split_stages_checker<uniform_stages<S>> {
  static constexpr bool check() { return check_split_stage<S>(); }
};

// Every stage type of a stage_list / uniform_stages models split_backward_stage (or a
// static_assert says what is missing).
template <class Stages>
constexpr bool check_split_stages() {
  return split_stages_checker<Stages>::check();
}

// Calls forward with or without the hooks parameter, whichever the stage declares.
template <class S>
typename S::output call_forward(S& s, const typename S::input& x, const typename S::side& c,
                                typename S::saved& st, hooks_for<S>& hooks) {
  if constexpr (forward_with_hooks<S>) {
    return s.forward(x, c, st, hooks);
  } else {
    return s.forward(x, c, st);
  }
}

}  // namespace detail::pipeline
}  // namespace baton
