// baton/nn/rms_norm.hpp — RMSNorm over the last axis, with split backward.
#pragma once

#include <baton/nn/detail/checks.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/detail/storage.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/payload/host_tensor.hpp>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton::nn {

/// y = x / rms(x) * g over the last axis, rms(x) = sqrt(mean(x²) + eps); the gain g [features]
/// starts at one and has no weight decay. Sums run in double.
///
/// As a piece: forward(x, saved) keeps x̂ = x / rms(x) and 1 / rms(x) (not x);
/// backward_input(saved, dy) returns dx = (g∘dy - x̂ mean(g∘dy∘x̂)) / rms(x) and keeps dy;
/// backward_weight(saved) adds dg = Σ_rows dy∘x̂. output(saved) is the forward's output
/// again, from x̂ (what a block that does not keep it recomputes: recompute_policy).
template <class T>
class rms_norm : public detail::nn::piece<rms_norm<T>, T, "baton::nn::rms_norm"> {
 public:
  using tensor = host_tensor<T>;

  struct saved : detail::nn::saved_state {
    tensor x_hat, inv_rms, dy;
    std::size_t bytes() const { return static_cast<std::size_t>(x_hat.size() + inv_rms.size() + dy.size()) * sizeof(T); }
  };

  rms_norm(std::int64_t features, double eps = 1e-5) : features_(features), eps_(eps) {
    if (features < 1) throw nn_error("baton::nn::rms_norm: features (" + std::to_string(features) + ") must be at least 1");
    if (!(eps > 0)) throw nn_error("baton::nn::rms_norm: eps must be positive, got " + std::to_string(eps));
    gain_ = parameter<T>(tensor::filled({features}, T(1)), false);
  }

  std::int64_t features() const noexcept { return features_; }
  double eps() const noexcept { return eps_; }
  parameter<T>& gain() noexcept { return gain_; }
  const parameter<T>& gain() const noexcept { return gain_; }

  template <class Visit>
  void visit_parameters(Visit&& visit) {
    visit("weight", gain_);
  }

  tensor forward(const tensor& x, saved& st) const {
    const std::int64_t rows =
        detail::nn::rows_of(x, features_, rms_norm::name, "input", "features = " + std::to_string(features_));
    tensor y = tensor::for_overwrite(x.shape());
    st.x_hat = tensor::for_overwrite(x.shape());
    st.inv_rms = tensor::for_overwrite({rows});
    const T* g = gain_.value.data();
    for (std::int64_t r = 0; r < rows; ++r) {
      T* hr = st.x_hat.data() + r * features_;
      st.inv_rms[r] = normalize_row(x.data() + r * features_, hr);
      scale_row(hr, g, y.data() + r * features_);
    }
    return y;
  }

  /// Where a forward under bf16 storage (activation_storage::bf16, float only) puts x̂, which
  /// it then keeps in bf16 only, and optionally a bf16 copy of its output (the float output is
  /// returned as always): each row rounded in the row loop, while it is in cache. The same
  /// bits as forward followed by detail::nn::to_bf16.
  struct bf16_copies {
    host_tensor<bfloat16>* x_hat = nullptr;
    host_tensor<bfloat16>* output = nullptr;
  };
  tensor forward(const tensor& x, saved& st, bf16_copies copies) const {
    static_assert(std::is_same_v<T, float>, "baton::nn::rms_norm: bf16 storage is for float norms");
    const std::int64_t rows =
        detail::nn::rows_of(x, features_, rms_norm::name, "input", "features = " + std::to_string(features_));
    if (copies.x_hat == nullptr)
      throw nn_error(std::string(rms_norm::name) + ": a bf16-storage forward needs somewhere to put x̂");
    tensor y = tensor::for_overwrite(x.shape());
    st.x_hat = tensor();
    st.inv_rms = tensor::for_overwrite({rows});
    *copies.x_hat = host_tensor<bfloat16>::for_overwrite(x.shape());
    if (copies.output != nullptr) *copies.output = host_tensor<bfloat16>::for_overwrite(x.shape());
    const T* g = gain_.value.data();
    std::vector<T> x_hat_row(static_cast<std::size_t>(features_));
    for (std::int64_t r = 0; r < rows; ++r) {
      T* yr = y.data() + r * features_;
      st.inv_rms[r] = normalize_row(x.data() + r * features_, x_hat_row.data());
      scale_row(x_hat_row.data(), g, yr);
      detail::nn::round_to_bf16(x_hat_row.data(), features_, copies.x_hat->data() + r * features_);
      if (copies.output != nullptr) detail::nn::round_to_bf16(yr, features_, copies.output->data() + r * features_);
    }
    return y;
  }

  /// The output forward returned, x̂∘g, from the state it kept: bit for bit the same (the
  /// same product of the same rounded x̂), under the gain the forward saw.
  tensor output(const saved& st) const {
    const std::int64_t rows = detail::nn::rows_of(st.x_hat, features_, rms_norm::name, "the saved x̂",
                                                  "a saved state that forward filled and backward_weight has not freed");
    tensor y = tensor::for_overwrite(st.x_hat.shape());
    const T* g = gain_.value.data();
    for (std::int64_t r = 0; r < rows; ++r) scale_row(st.x_hat.data() + r * features_, g, y.data() + r * features_);
    return y;
  }

  tensor backward_input(saved& st, const tensor& dy) const { return backward_input(st, tensor(dy)); }
  /// The same, keeping a temporary dy without copying it.
  tensor backward_input(saved& st, tensor&& dy) const {
    tensor dx = input_grad(st, dy);
    st.dy = std::move(dy);
    this->mark_input_done(st);
    return dx;
  }

  void backward_weight(saved& st) {
    this->expect_input_done(st);
    add_gain_grad(st.x_hat, st.dy);
    st = saved{};
  }

 private:
  // x̂ of one row and its 1/rms: both forwards share it, so they compute the same bits.
  T normalize_row(const T* xr, T* hr) const {
    const double sum_sq = sum_products(xr, xr, nullptr);
    const double inv = 1.0 / std::sqrt(sum_sq / static_cast<double>(features_) + eps_);
    for (std::int64_t j = 0; j < features_; ++j) hr[j] = static_cast<T>(static_cast<double>(xr[j]) * inv);
    return static_cast<T>(inv);
  }

  // y = x̂∘g for one row: forward and output() share it, so a recomputed output has the bits
  // of the first.
  void scale_row(const T* x_hat, const T* g, T* y) const {
    for (std::int64_t j = 0; j < features_; ++j) y[j] = x_hat[j] * g[j];
  }

  tensor input_grad(const saved& st, const tensor& dy) const {
    detail::nn::expect_shape(dy, st.x_hat.shape(), rms_norm::name, "dy", "the output gradient has the input's shape");
    tensor dx = tensor::for_overwrite(dy.shape());
    const std::int64_t rows = st.inv_rms.size();
    const T* g = gain_.value.data();
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* hr = st.x_hat.data() + r * features_;
      const T* dyr = dy.data() + r * features_;
      const double dot = sum_products(dyr, hr, g);  // Σ_j g_j dy_j x̂_j
      const double mean = dot / static_cast<double>(features_);
      const double inv = static_cast<double>(st.inv_rms[r]);
      T* dxr = dx.data() + r * features_;
      for (std::int64_t j = 0; j < features_; ++j)
        dxr[j] = static_cast<T>(inv * (static_cast<double>(g[j]) * static_cast<double>(dyr[j]) -
                                       static_cast<double>(hr[j]) * mean));
    }
    return dx;
  }

  // Σ_j a_j b_j (c_j when given) in double, in eight partial sums (a fixed order, so still
  // deterministic) that the compiler keeps in one vector register.
  double sum_products(const T* a, const T* b, const T* c) const {
    double part[8] = {};
    std::int64_t j = 0;
    if (c) {
      for (; j + 8 <= features_; j += 8)
        for (int l = 0; l < 8; ++l)
          part[l] += static_cast<double>(c[j + l]) * static_cast<double>(a[j + l]) * static_cast<double>(b[j + l]);
    } else {
      for (; j + 8 <= features_; j += 8)
        for (int l = 0; l < 8; ++l) part[l] += static_cast<double>(a[j + l]) * static_cast<double>(b[j + l]);
    }
    double sum = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    for (; j < features_; ++j)
      sum += (c ? static_cast<double>(c[j]) : 1.0) * static_cast<double>(a[j]) * static_cast<double>(b[j]);
    return sum;
  }

  void add_gain_grad(const tensor& x_hat, const tensor& dy) {
    const std::int64_t rows = x_hat.size() / features_;
    std::vector<double> sum(static_cast<std::size_t>(features_), 0.0);
    for (std::int64_t r = 0; r < rows; ++r) {
      const T* dyr = dy.data() + r * features_;
      const T* hr = x_hat.data() + r * features_;
      for (std::int64_t j = 0; j < features_; ++j)
        sum[static_cast<std::size_t>(j)] += static_cast<double>(dyr[j]) * static_cast<double>(hr[j]);
    }
    T* dg = gain_.grad.data();
    for (std::int64_t j = 0; j < features_; ++j) dg[j] += static_cast<T>(sum[static_cast<std::size_t>(j)]);
  }

  std::int64_t features_;
  double eps_;
  parameter<T> gain_;
};

}  // namespace baton::nn
