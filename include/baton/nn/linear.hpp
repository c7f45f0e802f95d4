// baton/nn/linear.hpp — y = x W + b over the last axis, with split backward.
#pragma once

#include <baton/nn/config.hpp>
#include <baton/nn/detail/checks.hpp>
#include <baton/nn/detail/gemm.hpp>
#include <baton/nn/detail/gemm_bf16.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/payload/host_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

namespace baton::nn {

/// A dense layer on the last axis: x [..., in] -> y = x W + b [..., out], with W [in, out]
/// and an optional bias b [out]. Every product is one gemm (cblas when baton::blas is linked),
/// or under matmul_precision::bf16 one gemm_bf16 (x, W and dy rounded to bf16, sums in float).
///
/// As a piece (split backward):
///  - forward(x, saved) keeps x;
///  - backward_input(saved, dy) returns dx = dy Wᵀ and keeps dy;
///  - backward_weight(saved) adds dW = xᵀ dy and db = Σ_rows dy, then frees what it kept;
///  - backward(saved, dy) is both.
/// Pieces that share one input between several projections (attention's q, k, v) call the
/// building blocks apply / add_input_grad / add_weight_grad directly and keep x once.
template <class T>
class linear : public detail::nn::piece<linear<T>, T, "baton::nn::linear"> {
 public:
  using tensor = host_tensor<T>;

  struct saved : detail::nn::saved_state {
    tensor x, dy;
    std::size_t bytes() const { return static_cast<std::size_t>(x.size() + dy.size()) * sizeof(T); }
  };

  /// Weights drawn by `init` as "<path>.weight" ~ N(0, (init_scale / sqrt(in))^2); bias zero.
  linear(std::int64_t in_features, std::int64_t out_features, bool bias, const initializer& init,
         double init_scale = 1.0)
      : in_(in_features), out_(out_features) {
    if (in_features < 1 || out_features < 1)
      throw nn_error("baton::nn::linear: in_features (" + std::to_string(in_features) + ") and out_features (" +
                     std::to_string(out_features) + ") must be at least 1");
    weight_ = parameter<T>(
        init.normal<T>("weight", {in_, out_}, init_scale / std::sqrt(static_cast<double>(in_))), true);
    if (bias) bias_ = parameter<T>(tensor({out_}), false);
    has_bias_ = bias;
  }

  std::int64_t in_features() const noexcept { return in_; }
  std::int64_t out_features() const noexcept { return out_; }
  bool has_bias() const noexcept { return has_bias_; }
  parameter<T>& weight() noexcept { return weight_; }
  const parameter<T>& weight() const noexcept { return weight_; }
  parameter<T>& bias() noexcept { return bias_; }
  const parameter<T>& bias() const noexcept { return bias_; }

  /// The operands of this layer's products from now on (matmul_precision); nn_error for bf16
  /// on a double layer.
  matmul_precision matmul() const noexcept { return matmul_; }
  void set_matmul(matmul_precision precision) {
    if (std::string problem = detail::nn::matmul_problem(precision); !problem.empty())
      throw nn_error(std::string(linear::name) + ": " + problem);
    if (precision == matmul_precision::bf16 && !std::is_same_v<T, float>)
      throw nn_error(std::string(linear::name) +
                     ": matmul_precision::bf16 rounds float operands to bf16 and sums in float; this layer's element "
                     "type is not float: use matmul_precision::native, or float layers");
    matmul_ = precision;
  }

  template <class Visit>
  void visit_parameters(Visit&& visit) {
    visit("weight", weight_);
    if (has_bias_) visit("bias", bias_);
  }

  // ---- building blocks ----

  /// y = x W + b.
  tensor apply(const tensor& x) const {
    const std::int64_t rows = check_input(x, "input");
    tensor y = tensor::for_overwrite(detail::nn::with_last(x.shape(), out_));
    if (has_bias_) {
      for (std::int64_t r = 0; r < rows; ++r) std::copy_n(bias_.value.data(), out_, y.data() + r * out_);
    }
    product(op::none, op::none, rows, out_, in_, x.data(), in_, weight_.value.data(), out_, has_bias_ ? T(1) : T(0),
            y.data(), out_);
    return y;
  }

  /// dx = dy Wᵀ (accumulate: dx += dy Wᵀ). dx must have the input's shape.
  void add_input_grad(const tensor& dy, tensor& dx, bool accumulate) const {
    const std::int64_t rows =
        detail::nn::rows_of(dy, out_, linear::name, "dy", "the output gradient is [..., out_features]");
    if (dx.size() != rows * in_)
      detail::nn::shape_mismatch(linear::name, "dx", dx.shape(),
                                 "[..., " + std::to_string(in_) + "] with " + std::to_string(rows) + " rows",
                                 "the input gradient has the input's shape");
    product(op::none, op::transpose, rows, in_, out_, dy.data(), out_, weight_.value.data(), out_,
            accumulate ? T(1) : T(0), dx.data(), in_);
  }

  /// dx = dy Wᵀ as a new tensor of shape [..., in].
  tensor input_grad(const tensor& dy) const {
    tensor dx = tensor::for_overwrite(detail::nn::with_last(dy.shape(), in_));
    add_input_grad(dy, dx, false);
    return dx;
  }

  /// dW += xᵀ dy, db += Σ_rows dy.
  void add_weight_grad(const tensor& x, const tensor& dy) {
    const std::int64_t rows = check_input(x, "input");
    if (dy.size() != rows * out_)
      detail::nn::shape_mismatch(linear::name, "dy", dy.shape(),
                                 "[..., " + std::to_string(out_) + "] with " + std::to_string(rows) + " rows",
                                 "the output gradient matches the input's rows");
    product(op::transpose, op::none, in_, out_, rows, x.data(), in_, dy.data(), out_, T(1), weight_.grad.data(), out_);
    if (has_bias_) {
      T* db = bias_.grad.data();
      for (std::int64_t r = 0; r < rows; ++r)
        for (std::int64_t j = 0; j < out_; ++j) db[j] += dy[r * out_ + j];
    }
  }

  // ---- the piece ----

  tensor forward(const tensor& x, saved& st) const {
    tensor y = apply(x);
    st.x = x;
    return y;
  }
  tensor forward(tensor&& x, saved& st) const {
    tensor y = apply(x);
    st.x = std::move(x);
    return y;
  }
  tensor backward_input(saved& st, const tensor& dy) const {
    tensor dx = input_grad(dy);
    st.dy = dy;
    this->mark_input_done(st);
    return dx;
  }
  void backward_weight(saved& st) {
    this->expect_input_done(st);
    add_weight_grad(st.x, st.dy);
    st = saved{};
  }

 private:
  using op = detail::nn::op;

  // C = op(A) op(B) + beta C in this layer's matmul precision.
  void product(op op_a, op op_b, std::int64_t m, std::int64_t n, std::int64_t k, const T* a, std::int64_t lda,
               const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) const {
    if constexpr (std::is_same_v<T, float>) {
      if (matmul_ == matmul_precision::bf16) {
        detail::nn::gemm_bf16(op_a, op_b, m, n, k, 1.0f, a, lda, b, ldb, beta, c, ldc);
        return;
      }
    }
    detail::nn::gemm<T>(op_a, op_b, m, n, k, T(1), a, lda, b, ldb, beta, c, ldc);
  }

  std::int64_t check_input(const tensor& x, const char* tensor_name) const {
    return detail::nn::rows_of(x, in_, linear::name, tensor_name, "in_features = " + std::to_string(in_));
  }

  std::int64_t in_, out_;
  bool has_bias_ = false;
  matmul_precision matmul_ = matmul_precision::native;
  parameter<T> weight_, bias_;
};

}  // namespace baton::nn
