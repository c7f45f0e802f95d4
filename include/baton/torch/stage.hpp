// baton/torch/stage.hpp — a torch::nn::Module as a baton pipeline stage, with autograd doing
// the gradients, split into the input and weight halves that zero-bubble schedules need.
//
// What the adapter guarantees, microbatch by microbatch:
//  - the module sees fresh input tensors: each floating-point activation field is detached
//    from whatever buffer it arrived in and made to require grad, so nothing of one
//    microbatch (a graph, a tensor hook) is attached to another's tensors (seed 002: torch's
//    PipelineStage handed the same receive buffer to every microbatch, and hooks on it fired
//    2, 4, 6, ... times);
//  - constant fields and the side input reach the module as they are and never reach
//    autograd: gradients are asked for the activation fields only, so a mask object (seed
//    000's BlockMask) is never asked for requires_grad;
//  - backward_input = torch::autograd::grad(outputs, inputs, dY, retain_graph = true);
//    backward_weight runs only the part of the graph that leads to the weights and that I did
//    not run, from the gradients I left at its frontier (detail/weight_pass.hpp), adding to
//    the parameters' .grad(); I + W cost one backward, and every hook runs once. The graph
//    is released after W (after B for a full backward).
#pragma once

#include <baton/core/meta.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/record.hpp>
#include <baton/payload/visit.hpp>
#include <baton/pipeline/stage.hpp>
#include <baton/torch/detail/weight_pass.hpp>
#include <baton/torch/payload.hpp>

#include <torch/torch.h>

#include <concepts>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

namespace detail::torch_adapter {

// Every tensor field of P is a torch::Tensor (possibly constant<torch::Tensor>).
template <class P>
constexpr bool all_torch_tensors() {
  using U = std::remove_cvref_t<P>;
  if constexpr (is_record_v<U>) {
    return []<class... Fs>(std::type_identity<record<Fs...>>) {
      return ((!tensor_payload<typename Fs::type> || std::is_same_v<typename Fs::type, at::Tensor> ||
               std::is_same_v<typename Fs::type, constant<at::Tensor>>)&&...);
    }(std::type_identity<U>{});
  } else {
    return std::is_same_v<U, at::Tensor> || std::is_same_v<U, constant<at::Tensor>>;
  }
}

// Calls module->forward(args...) for a ModuleHolder (torch::nn::Linear, TORCH_MODULE types) and
// module.forward(args...) for a plain object.
template <class M, class... A>
decltype(auto) call_forward(M& module, const A&... args) {
  if constexpr (requires { module->forward(args...); }) {
    return module->forward(args...);
  } else {
    return module.forward(args...);
  }
}

template <class M, class... A>
concept module_callable = requires(M& m, const A&... a) { call_forward(m, a...); };

// The parameters of a ModuleHolder or of a module object.
template <class M>
std::vector<at::Tensor> parameters_of(M& module) {
  if constexpr (requires { module->parameters(); }) {
    return module->parameters();
  } else {
    return module.parameters();
  }
}

inline bool differentiable(const at::Tensor& t) { return t.defined() && at::isFloatingType(t.scalar_type()); }

}  // namespace detail::torch_adapter

/// A pipeline stage that runs a LibTorch module under autograd.
///
/// - `Module`: a `torch::nn::ModuleHolder` (torch::nn::Sequential, a TORCH_MODULE type) or any
///   object with `forward` and `parameters()`. Its forward is called as `forward(x)`, or
///   `forward(x, side)` when `Side` is not `no_side`, and must return exactly `Output`.
/// - `Input`, `Output`: `torch::Tensor` or a record whose tensor fields are `torch::Tensor`
///   (activations) or `constant<torch::Tensor>` (split and sent, never differentiated), and
///   any opaque fields.
/// - `Side`: the per-microbatch side input (a mask object, a config): opaque, never sent,
///   never differentiated.
///
/// It models `split_backward_stage`, so every built-in schedule runs it. Every node of the
/// microbatch's graph runs once over I and W together, and so does every tensor hook
/// registered in forward: a hook on the module's input or on an intermediate on the input
/// path runs in backward_input, one on a weight-only branch in backward_weight.
template <class Module, class Input = at::Tensor, class Output = at::Tensor, class Side = no_side>
class torch_stage {
  static_assert(detail::torch_adapter::all_torch_tensors<Input>() && detail::torch_adapter::all_torch_tensors<Output>(),
                "baton::torch_stage<Module, Input, Output, Side>: every tensor field of Input and Output must be "
                "torch::Tensor (an activation) or baton::constant<torch::Tensor>; other tensor types cannot go "
                "through autograd");
  static_assert(std::is_same_v<Side, no_side> ? detail::torch_adapter::module_callable<Module, Input>
                                              : detail::torch_adapter::module_callable<Module, Input, Side>,
                "baton::torch_stage: the module must have forward(const Input&) (or forward(const Input&, const "
                "Side&) when the stage has a side input) returning Output");

 public:
  using input = Input;
  using output = Output;
  using side = Side;
  using module_type = Module;

  /// What one microbatch keeps from forward to backward: the graph hangs off `outputs`.
  struct saved {
    // One per activation field: the leaf made for it, or the input itself when it is not
    // differentiated (integer token ids; kept for its shape and dtype).
    std::vector<at::Tensor> inputs;
    std::vector<at::Tensor> outputs;       // the activation outputs, attached to the graph
    std::vector<at::Tensor> output_grads;  // dY
    detail::torch_adapter::weight_pass weights;  // the graph's weight half, between I and W

    /// Bytes of the inputs, outputs and dY held (the graph's own saved tensors are not
    /// counted: LibTorch does not expose them).
    [[nodiscard]] std::size_t bytes() const {
      std::size_t n = 0;
      for (const auto* list : {&inputs, &outputs, &output_grads})
        for (const at::Tensor& t : *list)
          if (t.defined()) n += t.nbytes();
      return n;
    }
  };

  explicit torch_stage(Module module) : module_(std::move(module)) {}

  Module& module() noexcept { return module_; }
  const Module& module() const noexcept { return module_; }

  /// The module's parameters (what backward_weight accumulates into).
  std::vector<at::Tensor> parameters() { return detail::torch_adapter::parameters_of(module_); }

  output forward(const input& x, const side& s, saved& st) {
    at::AutoGradMode grad_mode(true);
    input fresh = x;
    st = saved{};
    for_each_activation(fresh, [&](at::Tensor& t) {
      if (detail::torch_adapter::differentiable(t)) {
        at::Tensor leaf = t.detach().requires_grad_(true);
        st.inputs.push_back(leaf);
        // The module sees a view of the leaf, not the leaf: a tensor hook it registers on its input
        // then belongs to this microbatch's graph, and runs when backward passes through it (LibTorch
        // 1.13's autograd::grad does not run hooks registered on the leaves it differentiates for).
        t = leaf.view_as(leaf);
      } else {
        st.inputs.push_back(t);  // not differentiated (token ids): kept for its shape and dtype only
      }
    });
    output y = [&] {
      if constexpr (std::is_same_v<side, no_side>) {
        (void)s;
        return detail::torch_adapter::call_forward(module_, fresh);
      } else {
        return detail::torch_adapter::call_forward(module_, fresh, s);
      }
    }();
    for_each_activation(y, [&](at::Tensor& t) {
      if (!t.defined()) {
        throw std::invalid_argument("baton::torch_stage: the module's forward returned an undefined tensor for an "
                                    "activation output; return a tensor");
      }
      st.outputs.push_back(t);
    });
    // What leaves the stage is plain data: detached (the graph stays here, in `saved`) and
    // contiguous (it may be sent as bytes).
    for_each_tensor(y, [&](at::Tensor& t) {
      if (t.defined()) t = t.detach().contiguous();
    });
    return y;
  }

  /// dX only. The graph stays, split at the weights' frontier for backward_weight
  /// (detail/weight_pass.hpp).
  grad_t<input> backward_input(saved& st, const grad_t<output>& dy) {
    st.output_grads = copy_output_grads(dy);
    const auto [roots, root_grads] = differentiable_outputs(st);
    st.weights.prepare(roots, root_grads, st.inputs, trainable_parameters());
    return input_grads(st, input_pass(st, roots, root_grads));
  }

  /// Adds dW to the parameters' .grad(), running only the nodes that lead to the weights and
  /// were not done by backward_input, and releases the graph.
  void backward_weight(saved& st) {
    st.weights.run();
    st = saved{};
  }

  /// Both halves in one walk of the graph: dX, and dW added to the parameters' .grad().
  grad_t<input> backward(saved& st, const grad_t<output>& dy) {
    st.output_grads = copy_output_grads(dy);
    const auto [roots, root_grads] = differentiable_outputs(st);
    std::vector<at::Tensor> targets;
    for (const at::Tensor& leaf : st.inputs)
      if (leaf.defined() && leaf.requires_grad()) targets.push_back(leaf);
    for (const at::Tensor& p : trainable_parameters()) targets.push_back(p);
    if (!roots.empty() && !targets.empty()) {
      ::torch::autograd::backward(roots, root_grads, /*retain_graph=*/false, /*create_graph=*/false, targets);
    }
    std::vector<at::Tensor> grads;
    for (const at::Tensor& leaf : st.inputs) grads.push_back(leaf.defined() && leaf.requires_grad() ? leaf.grad() : at::Tensor());
    auto dx = input_grads(st, grads);
    st = saved{};
    return dx;
  }

 private:
  std::vector<at::Tensor> trainable_parameters() {
    std::vector<at::Tensor> out;
    for (at::Tensor& p : parameters())
      if (p.requires_grad()) out.push_back(p);
    return out;
  }

  // dY is copied: the executor may hand the stage a pooled receive buffer that the next
  // message overwrites before backward_weight runs.
  std::vector<at::Tensor> copy_output_grads(const grad_t<output>& dy) {
    std::vector<at::Tensor> out;
    for_each_tensor(dy, [&](const at::Tensor& g) { out.push_back(g.detach().clone()); });
    return out;
  }

  // The outputs that require grad, with their gradients dY.
  static std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> differentiable_outputs(const saved& st) {
    std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> out;
    for (std::size_t i = 0; i < st.outputs.size(); ++i) {
      if (st.outputs[i].requires_grad()) {
        out.first.push_back(st.outputs[i]);
        out.second.push_back(st.output_grads.at(i));
      }
    }
    return out;
  }

  // d(outputs)/d(input leaves) · dY, one entry per input (undefined where the input is not
  // differentiated or not reached); the graph is kept.
  static std::vector<at::Tensor> input_pass(const saved& st, const std::vector<at::Tensor>& roots,
                                            const std::vector<at::Tensor>& root_grads) {
    std::vector<at::Tensor> targets;
    std::vector<std::size_t> where;
    for (std::size_t i = 0; i < st.inputs.size(); ++i) {
      if (st.inputs[i].defined() && st.inputs[i].requires_grad()) {
        targets.push_back(st.inputs[i]);
        where.push_back(i);
      }
    }
    std::vector<at::Tensor> out(st.inputs.size());
    if (roots.empty() || targets.empty()) return out;
    auto grads = ::torch::autograd::grad(roots, targets, root_grads, /*retain_graph=*/true, /*create_graph=*/false,
                                         /*allow_unused=*/true);
    for (std::size_t j = 0; j < grads.size(); ++j) out[where[j]] = grads[j];
    return out;
  }

  grad_t<input> input_grads(const saved& st, const std::vector<at::Tensor>& grads) {
    // A field autograd did not reach (or cannot: integer token ids) gets zeros of its shape
    // and dtype, which is its gradient.
    grad_t<input> dx{};
    std::size_t i = 0;
    for_each_tensor(dx, [&](at::Tensor& g) {
      const at::Tensor& got = grads.at(i);
      const at::Tensor& leaf = st.inputs.at(i);
      if (got.defined()) {
        g = got.contiguous();
      } else if (leaf.defined()) {
        g = at::zeros_like(leaf, at::MemoryFormat::Contiguous).detach();
      }
      ++i;
    });
    return dx;
  }

  Module module_;
};

}  // namespace baton
