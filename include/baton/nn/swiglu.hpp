// baton/nn/swiglu.hpp — the SwiGLU feed-forward network of Llama-style blocks.
#pragma once

#include <baton/core/simd.hpp>
#include <baton/nn/detail/checks.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/detail/storage.hpp>
#include <baton/nn/linear.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/payload/host_tensor.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <algorithm>
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
/// and restore_product(saved) recomputes a product that was freed from gate and up. With
/// saved::keep_bf16 set before forward (activation_storage::bf16), gate, up and the product
/// are kept in bf16 instead.
template <class T>
class swiglu_mlp : public detail::nn::piece<swiglu_mlp<T>, T, "baton::nn::swiglu_mlp"> {
 public:
  using tensor = host_tensor<T>;

  struct saved : detail::nn::saved_state {
    tensor x, gate, up, product, dy, d_gate, d_up;
    /// Set before forward: keep gate, up and the product in bf16 (gate16, up16, product16;
    /// the float ones stay empty). Each is rounded in the loop that computes the product, a
    /// cache-sized chunk at a time, and gate and up are widened in the loop of backward_input
    /// that reads them: no separate pass over a whole tensor. product16 is for the caller to
    /// widen into `product` before backward_weight (transformer_block does).
    bool keep_bf16 = false;
    host_tensor<bfloat16> gate16, up16, product16;
    std::size_t bytes() const {
      return static_cast<std::size_t>(x.size() + gate.size() + up.size() + product.size() + dy.size() + d_gate.size() +
                                      d_up.size()) *
                 sizeof(T) +
             static_cast<std::size_t>(gate16.size() + up16.size() + product16.size()) * sizeof(bfloat16);
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
    compute_product(st, st.keep_bf16);
    st.x = std::move(x);
  }

  /// product = silu(gate)∘up again from the saved pre-activations (widened first when they
  /// are kept in bf16): bit for bit what forward computed (both run compute_product).
  void restore_product(saved& st) const {
    if (st.gate16.size() > 0) {  // kept in bf16: the product of the widened values
      st.gate = detail::nn::widened<T>(st.gate16);
      st.up = detail::nn::widened<T>(st.up16);
      st.gate16 = host_tensor<bfloat16>();
      st.up16 = host_tensor<bfloat16>();
    }
    compute_product(st, false);
  }

  tensor backward_input(saved& st, const tensor& dy) const {
    const tensor d_product = down_.input_grad(dy);
    if (st.gate.size() == 0 && st.gate16.size() > 0) {
      // bf16: a chunk of gate and up widened into the gradients' buffers, then overwritten
      // by the gradients while it is in cache.
      st.d_gate = tensor::for_overwrite(st.gate16.shape());
      st.d_up = tensor::for_overwrite(st.gate16.shape());
      const std::int64_t n = st.d_gate.size();
      for (std::int64_t c0 = 0; c0 < n; c0 += chunk) {
        const std::int64_t c = std::min(chunk, n - c0);
        T* dg = st.d_gate.data() + c0;
        T* du = st.d_up.data() + c0;
        const bfloat16* g = st.gate16.data() + c0;
        const bfloat16* u = st.up16.data() + c0;
        for (std::int64_t i = 0; i < c; ++i) dg[i] = static_cast<T>(g[i].to_float());
        for (std::int64_t i = 0; i < c; ++i) du[i] = static_cast<T>(u[i].to_float());
        silu_product_grad(dg, du, d_product.data() + c0, dg, du, c);
      }
      st.gate16 = host_tensor<bfloat16>();
      st.up16 = host_tensor<bfloat16>();
    } else {
      // The gradients overwrite the pre-activations they come from, element by element
      // (nothing needs gate or up afterwards): no new buffers.
      st.d_gate = std::move(st.gate);
      st.d_up = std::move(st.up);
      const std::int64_t n = st.d_gate.size();
      for (std::int64_t c0 = 0; c0 < n; c0 += chunk) {
        const std::int64_t c = std::min(chunk, n - c0);
        T* dg = st.d_gate.data() + c0;
        T* du = st.d_up.data() + c0;
        silu_product_grad(dg, du, d_product.data() + c0, dg, du, c);
      }
    }
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
  // Elements per chunk of the elementwise loops: a multiple of every vector width (so each
  // element takes the vector or the scalar path it takes in one loop over the whole tensor)
  // whose gate, up, product and bf16 copies stay in L1.
  static constexpr std::int64_t chunk = 1024;

  // product = silu(gate)∘up; with `round`, gate, up and the product also go to bf16 a chunk at
  // a time and the float gate and up are freed. The forward and restore_product run this one
  // function (never inlined: one machine code, whatever the compiler fuses), so a recomputed
  // product has the bits of the first.
  BATON_NEVER_INLINE void compute_product(saved& st, bool round) const {
    if (st.gate.size() != st.up.size() || st.gate.rank() < 1 || st.gate.shape().back() != hidden())
      throw nn_error(std::string(swiglu_mlp::name) +
                     ": restore_product needs the gate and up pre-activations of a forward that backward_input "
                     "has not processed yet");
    st.product = tensor::for_overwrite(st.gate.shape());
    const std::int64_t n = st.gate.size();
    if (round) {
      st.gate16 = host_tensor<bfloat16>::for_overwrite(st.gate.shape());
      st.up16 = host_tensor<bfloat16>::for_overwrite(st.gate.shape());
      st.product16 = host_tensor<bfloat16>::for_overwrite(st.gate.shape());
    }
    for (std::int64_t c0 = 0; c0 < n; c0 += chunk) {
      const std::int64_t c = std::min(chunk, n - c0);
      silu_product(st.gate.data() + c0, st.up.data() + c0, st.product.data() + c0, c);
      if (round) {
        round_chunk(st.gate.data() + c0, st.gate16.data() + c0, c);
        round_chunk(st.up.data() + c0, st.up16.data() + c0, c);
        round_chunk(st.product.data() + c0, st.product16.data() + c0, c);
      }
    }
    if (round) {
      st.gate = tensor();
      st.up = tensor();
    }
  }
  static void round_chunk(const T* src, bfloat16* dst, std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = bfloat16(static_cast<float>(src[i]));
  }

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
