// baton/nn/optim.hpp — AdamW and SGD over a list of named parameters.
#pragma once

#include <baton/core/block_cache.hpp>
#include <baton/nn/error.hpp>
#include <baton/nn/parameter.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace baton::nn {

/// AdamW's settings (torch.optim.AdamW's defaults).
struct adamw_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  /// Decoupled weight decay, applied to parameters whose `decay` flag is set.
  double weight_decay = 0.01;
};

/// "lr 0.001, betas 0.9, 0.999, eps 1e-08, weight_decay 0.01": every setting in %g, so a
/// small eps reads as itself (std::to_string would print 1e-8 as 0.000000).
inline std::string adamw_options_text(const adamw_options& o) {
  char text[160];
  std::snprintf(text, sizeof text, "lr %g, betas %g, %g, eps %g, weight_decay %g", o.lr, o.beta1, o.beta2, o.eps,
                o.weight_decay);
  return text;
}

/// Adam with decoupled weight decay (Loshchilov & Hutter), step for step as torch.optim.AdamW:
///   p ← p (1 - lr λ)                        (only where p.decay)
///   m ← β1 m + (1 - β1) g,   v ← β2 v + (1 - β2) g²
///   p ← p - lr / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + ε)
/// Moments are kept, and the update computed, in the parameter's element type (the bias
/// corrections in double). It holds pointers to the parameters: keep the modules alive and
/// in place.
template <class Tensor>
class basic_adamw {
 public:
  using value_type = typename payload_traits<Tensor>::value_type;

  basic_adamw(std::vector<named_parameter<Tensor>> parameters, adamw_options options = {})
      : params_(std::move(parameters)), options_(options) {
    if (!(options.lr >= 0 && std::isfinite(options.lr)) || !(options.beta1 >= 0 && options.beta1 < 1) ||
        !(options.beta2 >= 0 && options.beta2 < 1) || !(options.eps > 0 && std::isfinite(options.eps)) ||
        !(options.weight_decay >= 0 && std::isfinite(options.weight_decay)))
      throw nn_error("baton::nn::adamw: need a finite lr >= 0, 0 <= beta1, beta2 < 1, a finite eps > 0 and a finite "
                     "weight_decay >= 0 (got " + adamw_options_text(options) + ")");
    for (const auto& p : params_) {
      const auto n = detail::nn::elements(p.parameter->value).size();
      for (auto* moments : {&m_, &v_}) {
        moments->emplace_back(n);
        std::fill_n(moments->back().get(), n, value_type(0));
      }
    }
  }

  /// One update of every parameter from its current gradient.
  void step() {
    ++t_;
    const double lr = options_.lr, b1 = options_.beta1, b2 = options_.beta2;
    const double step_size = lr / (1 - std::pow(b1, static_cast<double>(t_)));
    const double correction2_sqrt = std::sqrt(1 - std::pow(b2, static_cast<double>(t_)));
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = *params_[i].parameter;
      const auto value = detail::nn::elements(p.value);
      const auto grad = detail::nn::elements(p.grad);
      if (grad.size() != value.size())
        throw nn_error("baton::nn::adamw: parameter '" + params_[i].name + "' has " + std::to_string(value.size()) +
                       " values but " + std::to_string(grad.size()) + " gradients");
      // In the parameter's own type, as torch does: one multiply-add chain per element that
      // the compiler vectorises.
      using V = value_type;
      const V decay = static_cast<V>(p.decay ? 1 - lr * options_.weight_decay : 1.0);
      const V beta1 = static_cast<V>(b1), beta2 = static_cast<V>(b2), one_minus_beta1 = static_cast<V>(1 - b1),
              one_minus_beta2 = static_cast<V>(1 - b2), step = static_cast<V>(step_size),
              inv_correction2 = static_cast<V>(1 / correction2_sqrt), eps = static_cast<V>(options_.eps);
      V* m = m_[i].get();
      V* v = v_[i].get();
      V* w = value.data();
      const V* g = grad.data();
      for (std::size_t j = 0; j < value.size(); ++j) {
        const V mj = beta1 * m[j] + one_minus_beta1 * g[j];
        const V vj = beta2 * v[j] + one_minus_beta2 * g[j] * g[j];
        m[j] = mj;
        v[j] = vj;
        w[j] = w[j] * decay - step * mj / (std::sqrt(vj) * inv_correction2 + eps);
      }
    }
  }

  /// Sets the learning rate for the next steps (schedules).
  void set_lr(double lr) { options_.lr = lr; }
  const adamw_options& options() const noexcept { return options_; }
  /// Steps taken so far.
  std::int64_t steps() const noexcept { return t_; }
  const std::vector<named_parameter<Tensor>>& parameters() const noexcept { return params_; }

  /// The state a checkpoint saves and restores (torch's names: exp_avg, exp_avg_sq, step): the
  /// first and second moments of parameters()[i], one element per value, and the step count
  /// the bias corrections use. Restoring all three continues training exactly where it was.
  std::span<value_type> first_moment(std::size_t i) { return {m_.at(i).get(), m_.at(i).size()}; }
  std::span<value_type> second_moment(std::size_t i) { return {v_.at(i).get(), v_.at(i).size()}; }
  void set_steps(std::int64_t steps) {
    if (steps < 0) throw nn_error("baton::nn::adamw::set_steps: the step count " + std::to_string(steps) + " is negative");
    t_ = steps;
  }

 private:
  std::vector<named_parameter<Tensor>> params_;
  adamw_options options_;
  // From the block cache, so that a rank's measured memory (host_tensor_memory) counts them.
  std::vector<detail::core::cached_array<value_type>> m_, v_;
  std::int64_t t_ = 0;
};

template <class T>
using adamw = basic_adamw<host_tensor<T>>;

/// SGD's settings (torch.optim.SGD's meaning).
struct sgd_options {
  double lr = 1e-2;
  double momentum = 0;
  double dampening = 0;
  /// L2 weight decay added to the gradient, for parameters whose `decay` flag is set.
  double weight_decay = 0;
  bool nesterov = false;
};

/// Stochastic gradient descent with optional momentum, as torch.optim.SGD:
///   g ← g + λ p (where p.decay);  b ← g (first step) or μ b + (1 - dampening) g;
///   g ← g + μ b (nesterov) or b;  p ← p - lr g.
template <class Tensor>
class basic_sgd {
 public:
  basic_sgd(std::vector<named_parameter<Tensor>> parameters, sgd_options options = {})
      : params_(std::move(parameters)), options_(options), momentum_(params_.size()) {
    if (!(options.lr >= 0) || !(options.momentum >= 0) || !(options.weight_decay >= 0))
      throw nn_error("baton::nn::sgd: need lr, momentum and weight_decay >= 0");
    if (options.nesterov && (options.momentum <= 0 || options.dampening != 0))
      throw nn_error("baton::nn::sgd: nesterov momentum needs momentum > 0 and dampening 0");
  }

  void step() {
    const double mu = options_.momentum;
    for (std::size_t i = 0; i < params_.size(); ++i) {
      auto& p = *params_[i].parameter;
      const auto value = detail::nn::elements(p.value);
      const auto grad = detail::nn::elements(p.grad);
      const double wd = p.decay ? options_.weight_decay : 0.0;
      auto& buffer = momentum_[i];
      const bool first = buffer.empty();
      if (mu != 0 && first) buffer.resize(value.size());
      for (std::size_t j = 0; j < value.size(); ++j) {
        double g = static_cast<double>(grad[j]) + wd * static_cast<double>(value[j]);
        if (mu != 0) {
          const double b = first ? g : mu * static_cast<double>(buffer[j]) + (1 - options_.dampening) * g;
          buffer[j] = static_cast<value_type>(b);
          g = options_.nesterov ? g + mu * b : b;
        }
        value[j] = static_cast<value_type>(static_cast<double>(value[j]) - options_.lr * g);
      }
    }
  }

  void set_lr(double lr) { options_.lr = lr; }
  const sgd_options& options() const noexcept { return options_; }

 private:
  using value_type = typename payload_traits<Tensor>::value_type;
  std::vector<named_parameter<Tensor>> params_;
  sgd_options options_;
  std::vector<std::vector<value_type>> momentum_;
};

template <class T>
using sgd = basic_sgd<host_tensor<T>>;

}  // namespace baton::nn
