// baton/nn/swiglu.hpp — the SwiGLU feed-forward network of Llama-style blocks.
#pragma once

#include <baton/core/simd.hpp>
#include <baton/nn/detail/checks.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/linear.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/payload/host_tensor.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <string>
#include <utility>

namespace baton::nn {

/// y = (silu(x W_gate) ∘ (x W_up)) W_down, silu(z) = z σ(z); W_gate, W_up [d, hidden],
/// W_down [hidden, d], no biases. Parameters "gate.weight", "up.weight", "down.weight".
///
/// As a piece: forward(x, saved) keeps x, the gate and up pre-activations and the product;
/// backward_input(saved, dy) returns dx and keeps the gradients the weights need;
/// backward_weight(saved) adds the three weight gradients. For recomputation
/// (recompute_policy): forward_state(x, saved) is the forward without its output projection,
/// and restore_product(saved) recomputes a product that was freed from gate and up.
template <class T>
class swiglu_mlp : public detail::nn::piece<swiglu_mlp<T>, T, "baton::nn::swiglu_mlp"> {
 public:
  using tensor = host_tensor<T>;

  struct saved : detail::nn::saved_state {
    tensor x, gate, up, product, dy, d_gate, d_up;
    std::size_t bytes() const {
      return static_cast<std::size_t>(x.size() + gate.size() + up.size() + product.size() + dy.size() + d_gate.size() +
                                      d_up.size()) *
             sizeof(T);
    }
  };

  swiglu_mlp(std::int64_t d_model, std::int64_t hidden, const initializer& init)
      : gate_(d_model, hidden, false, init / "gate"),
        up_(d_model, hidden, false, init / "up"),
        down_(hidden, d_model, false, init / "down") {}

  std::int64_t d_model() const noexcept { return gate_.in_features(); }
  std::int64_t hidden() const noexcept { return gate_.out_features(); }
  linear<T>& gate() noexcept { return gate_; }
  linear<T>& up() noexcept { return up_; }
  linear<T>& down() noexcept { return down_; }

  template <class Visit>
  void visit_parameters(Visit&& visit) {
    visit("gate", gate_);
    visit("up", up_);
    visit("down", down_);
  }

  tensor forward(const tensor& x, saved& st) const { return forward(tensor(x), st); }
  tensor forward(tensor&& x, saved& st) const {
    forward_state(std::move(x), st);
    return down_.apply(st.product);
  }

  /// What forward keeps, without computing the output (a recomputed forward needs the state
  /// only: the down projection is a third of the MLP's work).
  void forward_state(tensor&& x, saved& st) const {
    detail::nn::rows_of(x, d_model(), swiglu_mlp::name, "input", "d_model = " + std::to_string(d_model()));
    st.gate = gate_.apply(x);
    st.up = up_.apply(x);
    restore_product(st);
    st.x = std::move(x);
  }

  /// product = silu(gate)∘up again from the saved pre-activations: bit for bit what forward
  /// computed (forward computes it here too, and never inlined, so both run one machine code
  /// whatever the compiler fuses).
  BATON_NEVER_INLINE void restore_product(saved& st) const {
    if (st.gate.size() != st.up.size() || st.gate.rank() < 1 || st.gate.shape().back() != hidden())
      throw nn_error(std::string(swiglu_mlp::name) +
                     ": restore_product needs the gate and up pre-activations of a forward that backward_input "
                     "has not processed yet");
    st.product = tensor::for_overwrite(st.gate.shape());
    silu_product(st.gate.data(), st.up.data(), st.product.data(), st.gate.size());
  }

  tensor backward_input(saved& st, const tensor& dy) const {
    const tensor d_product = down_.input_grad(dy);
    // The gradients overwrite the pre-activations they come from, element by element (nothing
    // needs gate or up afterwards): no new buffers.
    st.d_gate = std::move(st.gate);
    st.d_up = std::move(st.up);
    silu_product_grad(st.d_gate.data(), st.d_up.data(), d_product.data(), st.d_gate.data(), st.d_up.data(),
                      st.d_gate.size());
    tensor dx = gate_.input_grad(st.d_gate);
    up_.add_input_grad(st.d_up, dx, true);
    st.dy = dy;
    this->mark_input_done(st);
    return dx;
  }

  void backward_weight(saved& st) {
    this->expect_input_done(st);
    down_.add_weight_grad(st.product, st.dy);
    gate_.add_weight_grad(st.x, st.d_gate);
    up_.add_weight_grad(st.x, st.d_up);
    st = saved{};
  }

 private:
  static T sigmoid(T z) {
    if (z >= T(0)) return T(1) / (T(1) + std::exp(-z));
    const T e = std::exp(z);
    return e / (T(1) + e);
  }
  static T silu(T z) { return z * sigmoid(z); }

  // The elementwise parts a vector at a time, with the scalar formulas above for the tail. The
  // outputs may be the inputs (d_gate = gate, d_up = up): every element is read before it is
  // written.
  static void silu_product(const T* gate, const T* up, T* product, std::int64_t n) {
    std::int64_t i = 0;
#if defined(__GNUC__)
    namespace va = detail::core::simd;
    for (; i + width <= n; i += width) {
      const V z = va::load(gate + i);
      va::store(product + i, z * vector_sigmoid(z) * va::load(up + i));
    }
#endif
    for (; i < n; ++i) product[i] = silu(gate[i]) * up[i];
  }
  static void silu_product_grad(const T* gate, const T* up, const T* d_product, T* d_gate, T* d_up, std::int64_t n) {
    std::int64_t i = 0;
#if defined(__GNUC__)
    namespace va = detail::core::simd;
    const V one = va::broadcast(T(1));
    for (; i + width <= n; i += width) {
      const V z = va::load(gate + i), u = va::load(up + i), dy = va::load(d_product + i);
      const V s = vector_sigmoid(z);
      va::store(d_up + i, dy * z * s);
      va::store(d_gate + i, dy * u * (s + z * s * (one - s)));
    }
#endif
    for (; i < n; ++i) {
      const T z = gate[i], u = up[i];
      const T s = sigmoid(z);
      d_up[i] = d_product[i] * z * s;
      d_gate[i] = d_product[i] * u * (s + z * s * (T(1) - s));
    }
  }

#if defined(__GNUC__)
  using V = detail::core::simd::vec_t<T>;
  static constexpr std::int64_t width = detail::core::simd::width_v<T>;

  // sigmoid(z) = 1 / (1 + 2^(-z log2 e)) through the attention kernels' exp2: branch-free,
  // relative error ~1e-7 in float.
  BATON_ALWAYS_INLINE static V vector_sigmoid(V z) noexcept {
    namespace va = detail::core::simd;
    const V one = va::broadcast(T(1));
    return one / (one + va::exp2(z * va::broadcast(-std::numbers::log2e_v<T>)));
  }
#endif

  linear<T> gate_, up_, down_;
};

}  // namespace baton::nn
