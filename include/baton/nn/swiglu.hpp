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
#include <numbers>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton::nn {

/// y = (silu(x W_gate) ∘ (x W_up)) W_down, silu(z) = z σ(z); W_gate, W_up [d, hidden],
/// W_down [hidden, d], no biases. Parameters "gate.weight", "up.weight", "down.weight".
///
/// As a piece: forward(x, saved) keeps x, the gate and up pre-activations and the product;
/// backward_input(saved, dy) returns dx and keeps the gradients the weights need;
/// backward_weight(saved) adds the three weight gradients. For recomputation
/// (recompute_policy): forward_state(x, saved) is the forward without its output projection,
/// and restore_product(saved) recomputes a product that was freed from gate and up.
///
/// bf16 storage (activation_storage::bf16, float only): the overloads taking bf16_copies keep
/// gate and up (and the product) in bf16, written by the pass that computes the product from
/// the values it has in registers rather than by a later pass over each tensor; the
/// backward_input taking gate16 and up16 reads them widened as it goes.
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
  /// The operands of the three projections from now on (matmul_precision).
  void set_matmul(matmul_precision precision) {
    for (linear<T>* l : {&gate_, &up_, &down_}) l->set_matmul(precision);
  }

  template <class Visit>
  void visit_parameters(Visit&& visit) {
    visit("gate", gate_);
    visit("up", up_);
    visit("down", down_);
  }

  /// Where a forward under bf16 storage puts its bf16 copies, each of gate's shape: gate and
  /// up (required), the product (optional: recompute selective recomputes it instead).
  struct bf16_copies {
    host_tensor<bfloat16>* gate = nullptr;
    host_tensor<bfloat16>* up = nullptr;
    host_tensor<bfloat16>* product = nullptr;
  };

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
  /// bf16 storage: forward with gate and up kept in `copies` (rounded to bf16 as
  /// detail::nn::to_bf16 rounds) and freed in float; the float product stays in `st` for the
  /// down projection (the caller frees it once copies.product holds it).
  tensor forward(tensor&& x, saved& st, bf16_copies copies) const {
    forward_state(std::move(x), st, copies);
    return down_.apply(st.product);
  }
  void forward_state(tensor&& x, saved& st, bf16_copies copies) const {
    static_assert(std::is_same_v<T, float>, "baton::nn::swiglu_mlp: bf16 storage is for float blocks");
    detail::nn::rows_of(x, d_model(), swiglu_mlp::name, "input", "d_model = " + std::to_string(d_model()));
    st.gate = gate_.apply(x);
    st.up = up_.apply(x);
    product_with_copies(st, copies);
    st.x = std::move(x);
  }

  /// product = silu(gate)∘up again from the saved pre-activations: bit for bit what forward
  /// computed (forward computes it here too, and never inlined, so both run one machine code
  /// whatever the compiler fuses).
  BATON_NEVER_INLINE void restore_product(saved& st) const {
    check_pre_activations(st.gate.shape(), st.up.shape(), "restore_product");
    st.product = tensor::for_overwrite(st.gate.shape());
    silu_product<T>(st.gate.data(), st.up.data(), st.product.data(), st.gate.size(), {});
  }

  /// bf16 storage, recompute selective: the product again from gate and up held in bf16, in
  /// bf16 only (backward_weight is its one reader): the bits restore_product gives on the
  /// widened values, rounded.
  BATON_NEVER_INLINE host_tensor<bfloat16> restore_product(const host_tensor<bfloat16>& gate16,
                                                           const host_tensor<bfloat16>& up16) const {
    static_assert(std::is_same_v<T, float>, "baton::nn::swiglu_mlp: bf16 storage is for float blocks");
    check_pre_activations(gate16.shape(), up16.shape(), "restore_product");
    auto product16 = host_tensor<bfloat16>::for_overwrite(gate16.shape());
    silu_product<bfloat16>(gate16.data(), up16.data(), nullptr, gate16.size(), {.product = product16.data()});
    return product16;
  }
  tensor backward_input(saved& st, const tensor& dy) const {
    const tensor d_product = down_.input_grad(dy);
    // The gradients overwrite the pre-activations they come from, element by element (nothing
    // needs gate or up afterwards): no new buffers.
    st.d_gate = std::move(st.gate);
    st.d_up = std::move(st.up);
    silu_product_grad(st.d_gate.data(), st.d_up.data(), d_product.data(), st.d_gate.data(), st.d_up.data(),
                      st.d_gate.size());
    return finish_input_grad(st, dy);
  }
  /// bf16 storage: backward_input with gate and up read from their bf16 copies (widened as the
  /// gradient pass reads them: no float copy of either), which it frees after that pass. The
  /// gate's gradient overwrites the product's, so the pass holds no more than the float route
  /// (gate and up widened, then overwritten by their gradients) did.
  tensor backward_input(saved& st, const tensor& dy, host_tensor<bfloat16>&& gate16,
                        host_tensor<bfloat16>&& up16) const {
    static_assert(std::is_same_v<T, float>, "baton::nn::swiglu_mlp: bf16 storage is for float blocks");
    check_pre_activations(gate16.shape(), up16.shape(), "backward_input");
    tensor d_product = down_.input_grad(dy);
    if (d_product.size() != gate16.size())
      throw nn_error(std::string(swiglu_mlp::name) + ": backward_input: dy has " +
                     std::to_string(d_product.size() / hidden()) + " rows, the saved gate " +
                     std::to_string(gate16.size() / hidden()));
    st.d_gate = std::move(d_product);
    st.d_up = tensor::for_overwrite(gate16.shape());
    silu_product_grad(gate16.data(), up16.data(), st.d_gate.data(), st.d_gate.data(), st.d_up.data(), gate16.size());
    gate16 = host_tensor<bfloat16>();
    up16 = host_tensor<bfloat16>();
    return finish_input_grad(st, dy);
  }

  void backward_weight(saved& st) {
    this->expect_input_done(st);
    down_.add_weight_grad(st.product, st.dy);
    gate_.add_weight_grad(st.x, st.d_gate);
    up_.add_weight_grad(st.x, st.d_up);
    st = saved{};
  }

 private:
  tensor finish_input_grad(saved& st, const tensor& dy) const {
    tensor dx = gate_.input_grad(st.d_gate);
    up_.add_input_grad(st.d_up, dx, true);
    st.dy = dy;
    this->mark_input_done(st);
    return dx;
  }

  static T sigmoid(T z) {
    if (z >= T(0)) return T(1) / (T(1) + std::exp(-z));
    const T e = std::exp(z);
    return e / (T(1) + e);
  }
  static T silu(T z) { return z * sigmoid(z); }

  void check_pre_activations(const std::vector<std::int64_t>& gate_shape, const std::vector<std::int64_t>& up_shape,
                             const char* what) const {
    if (gate_shape != up_shape || gate_shape.empty() || gate_shape.back() != hidden())
      throw nn_error(std::string(swiglu_mlp::name) + ": " + what +
                     " needs the gate and up pre-activations of a forward that backward_input has not processed yet");
  }

  // bf16 storage's forward: the product as restore_product computes it (the same function),
  // with gate, up and the product rounded to bf16 in the same pass. The product overwrites
  // the gate (read first, element by element) and the float up is freed: the pass holds no
  // more than the float route (product beside gate and up, each then rounded in turn) did.
  BATON_NEVER_INLINE void product_with_copies(saved& st, bf16_copies copies) const {
    check_pre_activations(st.gate.shape(), st.up.shape(), "forward");
    if (copies.gate == nullptr || copies.up == nullptr)
      throw nn_error(std::string(swiglu_mlp::name) + ": a bf16-storage forward needs somewhere to put gate and up");
    *copies.gate = host_tensor<bfloat16>::for_overwrite(st.gate.shape());
    *copies.up = host_tensor<bfloat16>::for_overwrite(st.gate.shape());
    rounded_outputs out{.gate = copies.gate->data(), .up = copies.up->data()};
    if (copies.product != nullptr) {
      *copies.product = host_tensor<bfloat16>::for_overwrite(st.gate.shape());
      out.product = copies.product->data();
    }
    silu_product<T>(st.gate.data(), st.up.data(), st.gate.data(), st.gate.size(), out);
    st.product = std::move(st.gate);
    st.gate = tensor();
    st.up = tensor();
  }

  // Where silu_product also writes bf16 roundings (each optional).
  struct rounded_outputs {
    bfloat16* gate = nullptr;
    bfloat16* up = nullptr;
    bfloat16* product = nullptr;
  };

  // The elementwise parts a vector at a time, with the scalar formulas above for the tail.
  // Gate and up are stored as S: T, or bf16 (float blocks), widened exactly as they are read.
  // silu_product writes the product where `product` is given, and the bf16 roundings in
  // `rounded` that are given (float blocks only). An output may be an input (product = gate;
  // d_gate = gate or d_product, d_up = up): every element is read before it is written.
  template <class S>
  static void silu_product(const S* gate, const S* up, T* product, std::int64_t n, rounded_outputs rounded) {
    [[maybe_unused]] const bool any_rounded =
        rounded.gate != nullptr || rounded.up != nullptr || rounded.product != nullptr;
    std::int64_t i = 0;
#if defined(__GNUC__)
    namespace va = detail::core::simd;
    for (; i + width <= n; i += width) {
      const V z = load(gate + i), u = load(up + i);
      const V p = z * vector_sigmoid(z) * u;
      if (product != nullptr) va::store(product + i, p);
      if constexpr (std::is_same_v<T, float>) {
        if (any_rounded) {
          if (rounded.gate != nullptr) detail::nn::store_bf16(rounded.gate + i, z);
          if (rounded.up != nullptr) detail::nn::store_bf16(rounded.up + i, u);
          if (rounded.product != nullptr) detail::nn::store_bf16(rounded.product + i, p);
        }
      }
    }
#endif
    for (; i < n; ++i) {
      const T z = detail::nn::widen_value<T>(gate[i]), u = detail::nn::widen_value<T>(up[i]);
      const T p = silu(z) * u;
      if (product != nullptr) product[i] = p;
      if constexpr (std::is_same_v<T, float>) {
        if (rounded.gate != nullptr) rounded.gate[i] = bfloat16(z);
        if (rounded.up != nullptr) rounded.up[i] = bfloat16(u);
        if (rounded.product != nullptr) rounded.product[i] = bfloat16(p);
      }
    }
  }
  template <class S>
  static void silu_product_grad(const S* gate, const S* up, const T* d_product, T* d_gate, T* d_up, std::int64_t n) {
    std::int64_t i = 0;
#if defined(__GNUC__)
    namespace va = detail::core::simd;
    const V one = va::broadcast(T(1));
    for (; i + width <= n; i += width) {
      const V z = load(gate + i), u = load(up + i), dy = va::load(d_product + i);
      const V s = vector_sigmoid(z);
      va::store(d_up + i, dy * z * s);
      va::store(d_gate + i, dy * u * (s + z * s * (one - s)));
    }
#endif
    for (; i < n; ++i) {
      const T z = detail::nn::widen_value<T>(gate[i]), u = detail::nn::widen_value<T>(up[i]);
      const T s = sigmoid(z);
      d_up[i] = d_product[i] * z * s;
      d_gate[i] = d_product[i] * u * (s + z * s * (T(1) - s));
    }
  }

#if defined(__GNUC__)
  using V = detail::core::simd::vec_t<T>;
  static constexpr std::int64_t width = detail::core::simd::width_v<T>;

  template <class S>
  BATON_ALWAYS_INLINE static V load(const S* p) noexcept {
    if constexpr (std::is_same_v<S, bfloat16>)
      return detail::nn::load_widened(p);
    else
      return detail::core::simd::load(p);
  }

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
