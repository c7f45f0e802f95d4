// baton/torch/detail/weight_pass.hpp — the weight half of a split backward over a LibTorch
// graph, without walking the graph a second time.
//
// Calling autograd::grad(outputs, parameters) for W would run every node between the outputs
// and the weights again — the whole input path, a context-parallel attention's ring backward
// and its communication included — and fire every tensor hook on it a second time. Instead,
// before the input pass (I), the graph is split:
//  - a node *reaches the input* when a path leads from it to an input leaf, and *reaches a
//    weight* when one leads to a parameter's accumulator;
//  - the *frontier* is every node that reaches the input and has a child that reaches only
//    weights (Linear's AddmmBackward, whose weight edge goes to TBackward -> the weight);
//  - I runs as usual (autograd::grad for the inputs); a pre-hook added last to each frontier
//    node records the gradient that entered it, after the user's hooks;
//  - W cuts every frontier node's edges but those to weight-only children, drops its
//    pre-hooks (they ran in I) and runs the engine from the frontier with the recorded
//    gradients, accumulating into the parameters' .grad(). Each frontier node then computes
//    only its weight outputs, and weight-only nodes run for the first time.
// So I + W do the work of one backward, and every node's hooks run once per microbatch.
// Outputs that reach only weights (no input path at all) start W directly with their dY.
#pragma once

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace baton::detail::torch_adapter {

namespace autograd = ::torch::autograd;

class weight_pass {
 public:
  // Splits the graph of `outputs` (those that require grad, with their gradients `output_grads`)
  // between the input leaves `inputs` and the parameters `params`, and hooks the frontier.
  // Call after forward, before the input pass.
  void prepare(const std::vector<at::Tensor>& outputs, const std::vector<at::Tensor>& output_grads,
               const std::vector<at::Tensor>& inputs, const std::vector<at::Tensor>& params) {
    clear();
    std::unordered_map<const autograd::Node*, std::uint8_t> flags;
    for (const at::Tensor& leaf : inputs)
      if (leaf.defined() && leaf.requires_grad()) flags[autograd::impl::gradient_edge(leaf).function.get()] |= reaches_input;
    for (const at::Tensor& p : params)
      if (p.requires_grad()) flags[autograd::impl::gradient_edge(p).function.get()] |= reaches_param;

    // Post-order over the graph from the outputs: a node's flags are the union of its children's.
    std::vector<std::shared_ptr<autograd::Node>> order;
    std::unordered_set<const autograd::Node*> done;
    struct frame {
      std::shared_ptr<autograd::Node> node;
      std::size_t next = 0;
    };
    std::vector<frame> stack;
    const auto visit = [&](const std::shared_ptr<autograd::Node>& root) {
      if (!root || done.count(root.get())) return;
      stack.push_back({root});
      while (!stack.empty()) {
        frame& top = stack.back();
        const auto& edges = top.node->next_edges();
        if (top.next < edges.size()) {
          const auto& child = edges[top.next++].function;
          if (child && !done.count(child.get())) stack.push_back({child});
          continue;
        }
        std::uint8_t f = flags[top.node.get()];
        for (const auto& e : edges)
          if (e.function) f |= flags[e.function.get()];
        flags[top.node.get()] = f;
        done.insert(top.node.get());
        order.push_back(std::move(top.node));
        stack.pop_back();
      }
    };
    std::vector<autograd::Edge> roots;
    for (const at::Tensor& out : outputs) {
      roots.push_back(autograd::impl::gradient_edge(out));
      visit(roots.back().function);
    }

    for (const auto& node : order) {
      const std::uint8_t f = flags[node.get()];
      if (f == reaches_param) param_only_.insert(node.get());
    }
    for (const auto& node : order) {
      if (!(flags[node.get()] & reaches_input)) continue;
      bool frontier = false;
      for (const auto& e : node->next_edges())
        if (e.function && param_only_.count(e.function.get())) frontier = true;
      if (!frontier) continue;
      auto slot = std::make_shared<std::vector<at::Tensor>>();
      node->add_pre_hook(std::make_unique<record_gradient>(slot));
      frontier_.push_back({node, std::move(slot)});
    }
    for (std::size_t i = 0; i < roots.size(); ++i) {
      if (roots[i].function && param_only_.count(roots[i].function.get())) {
        weight_only_roots_.push_back(roots[i]);
        weight_only_grads_.push_back(output_grads.at(i));
      }
    }
  }

  // Runs the weight pass (after the input pass) and forgets the graph.
  void run() {
    autograd::edge_list roots;
    autograd::variable_list grads;
    for (frontier_node& f : frontier_) {
      for (autograd::Edge& e : f.node->next_edges())
        if (e.function && !param_only_.count(e.function.get())) e = autograd::Edge();
      f.node->pre_hooks().clear();
      for (std::size_t k = 0; k < f.entered->size(); ++k) {
        if (!(*f.entered)[k].defined()) continue;
        roots.emplace_back(f.node, static_cast<std::uint32_t>(k));
        grads.push_back((*f.entered)[k]);
      }
    }
    for (std::size_t i = 0; i < weight_only_roots_.size(); ++i) {
      roots.push_back(weight_only_roots_[i]);
      grads.push_back(weight_only_grads_[i]);
    }
    if (!roots.empty()) {
      autograd::Engine::get_default_engine().execute(roots, grads, /*keep_graph=*/false, /*create_graph=*/false,
                                                     /*accumulate_grad=*/true);
    }
    clear();
  }

  void clear() {
    frontier_.clear();
    param_only_.clear();
    weight_only_roots_.clear();
    weight_only_grads_.clear();
  }

 private:
  static constexpr std::uint8_t reaches_input = 1;
  static constexpr std::uint8_t reaches_param = 2;

  // Records the gradient entering a frontier node in the input pass (after the user's hooks:
  // it is added last).
  struct record_gradient : autograd::FunctionPreHook {
    explicit record_gradient(std::shared_ptr<std::vector<at::Tensor>> slot) : slot_(std::move(slot)) {}
    autograd::variable_list operator()(const autograd::variable_list& grads) override {
      *slot_ = grads;
      return grads;
    }
    std::shared_ptr<std::vector<at::Tensor>> slot_;
  };

  struct frontier_node {
    std::shared_ptr<autograd::Node> node;
    std::shared_ptr<std::vector<at::Tensor>> entered;
  };

  std::vector<frontier_node> frontier_;
  std::unordered_set<const autograd::Node*> param_only_;
  autograd::edge_list weight_only_roots_;
  std::vector<at::Tensor> weight_only_grads_;
};

}  // namespace baton::detail::torch_adapter
