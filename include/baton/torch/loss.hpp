// baton/torch/loss.hpp — a LibTorch loss expression as the executor's loss: autograd gives
// the gradient with respect to the last stage's output.
#pragma once

#include <baton/pipeline/stage.hpp>
#include <baton/torch/payload.hpp>

#include <torch/torch.h>

#include <concepts>
#include <stdexcept>
#include <string>
#include <utility>

namespace baton {

/// Wraps `fn(const torch::Tensor& output, const Target& target) -> torch::Tensor` (a scalar,
/// e.g. `torch::nn::functional::cross_entropy(output, target)`) as a pipeline loss: called
/// on the last stage's rank per microbatch, it returns the loss value and its gradient with
/// respect to the output, unscaled (the executor scales both per microbatch).
///
/// ```cpp
///   auto loss = baton::torch_loss([](const torch::Tensor& y, const torch::Tensor& target) {
///     return torch::mse_loss(y, target);
///   });
/// ```
template <class Fn>
class torch_loss {
 public:
  explicit torch_loss(Fn fn) : fn_(std::move(fn)) {}

  template <class Target>
  loss_result<at::Tensor> operator()(const at::Tensor& output, const Target& target) {
    static_assert(std::is_invocable_r_v<at::Tensor, Fn&, const at::Tensor&, const Target&>,
                  "baton::torch_loss: the function must be callable as fn(const torch::Tensor& output, const "
                  "Target& target) and return the loss as a scalar torch::Tensor");
    at::AutoGradMode grad_mode(true);
    at::Tensor y = output.detach().requires_grad_(true);
    at::Tensor value = fn_(y, target);
    if (!value.defined() || value.numel() != 1 || !at::isFloatingType(value.scalar_type())) {
      throw std::invalid_argument(
          "baton::torch_loss: the loss function must return a floating-point scalar (one element), got " +
          (value.defined() ? std::to_string(value.numel()) + " elements of " + detail::torch_adapter::dtype_name(value)
                           : std::string("an undefined tensor")) +
          "; reduce it (mean or sum)");
    }
    at::Tensor grad;
    if (value.requires_grad()) {
      grad = ::torch::autograd::grad({value}, {y}, {}, /*retain_graph=*/false, /*create_graph=*/false,
                                     /*allow_unused=*/true)[0];
    }
    if (!grad.defined()) grad = at::zeros_like(y);
    return {value.item<double>(), grad.detach().contiguous()};
  }

 private:
  Fn fn_;
};

}  // namespace baton
