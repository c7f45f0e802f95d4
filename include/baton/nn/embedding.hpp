// baton/nn/embedding.hpp — token embedding: a table lookup with a scatter-add gradient.
#pragma once

#include <baton/nn/detail/checks.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/payload/host_tensor.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace baton::nn {

/// y[..., :] = table[token, :] for tokens [...] of std::int64_t in [0, vocab); table
/// [vocab, d] ~ N(0, init_stddev²), parameter "weight".
///
/// As a piece: forward(tokens, saved) keeps the tokens; tokens have no gradient, so
/// backward_input(saved, dy) only keeps dy, and backward_weight(saved) scatter-adds it into
/// the rows of the table that were used (each occurrence of a token adds its row of dy).
template <class T>
class embedding {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "baton::nn::embedding<T>: T is float or double");

 public:
  using value_type = T;
  using tensor = host_tensor<T>;
  using tokens = host_tensor<std::int64_t>;
  using parameter_type = parameter<T>;

  struct saved {
    tokens ids;
    tensor dy;
    std::size_t bytes() const {
      return static_cast<std::size_t>(ids.size()) * sizeof(std::int64_t) + static_cast<std::size_t>(dy.size()) * sizeof(T);
    }
  };

  embedding(std::int64_t vocab, std::int64_t d_model, const initializer& init, double init_stddev = 1.0)
      : vocab_(vocab), d_(d_model) {
    if (vocab < 1 || d_model < 1)
      throw nn_error("baton::nn::embedding: vocab (" + std::to_string(vocab) + ") and d_model (" +
                     std::to_string(d_model) + ") must be at least 1");
    table_ = parameter<T>(init.normal<T>("weight", {vocab, d_model}, init_stddev), true);
  }

  std::int64_t vocab() const noexcept { return vocab_; }
  std::int64_t d_model() const noexcept { return d_; }
  parameter<T>& weight() noexcept { return table_; }

  template <class Visit>
  void visit_parameters(Visit&& visit) {
    visit("weight", table_);
  }

  tensor forward(const tokens& ids, saved& st) const {
    std::vector<std::int64_t> shape = ids.shape();
    shape.push_back(d_);
    tensor y = tensor::for_overwrite(std::move(shape));
    for (std::int64_t i = 0; i < ids.size(); ++i) {
      const std::int64_t t = ids[i];
      if (t < 0 || t >= vocab_)
        throw nn_error("baton::nn::embedding: token " + std::to_string(t) + " at flat index " + std::to_string(i) +
                       " of tokens " + baton::detail::core::shape_text(ids.shape()) + " is outside the vocabulary [0, " +
                       std::to_string(vocab_) + ")");
      std::copy_n(table_.value.data() + t * d_, d_, y.data() + i * d_);
    }
    st.ids = ids;
    return y;
  }

  void backward_input(saved& st, const tensor& dy) const {
    check_dy(st, dy);
    st.dy = dy;
  }

  void backward_weight(saved& st) {
    scatter(st.ids, st.dy);
    st = saved{};
  }

  void backward(saved& st, const tensor& dy) {
    check_dy(st, dy);
    scatter(st.ids, dy);
    st = saved{};
  }

 private:
  void check_dy(const saved& st, const tensor& dy) const {
    std::vector<std::int64_t> expected = st.ids.shape();
    expected.push_back(d_);
    detail::expect_shape(dy, expected, "baton::nn::embedding", "dy", "the output gradient is [tokens..., d_model]");
  }

  void scatter(const tokens& ids, const tensor& dy) {
    T* g = table_.grad.data();
    for (std::int64_t i = 0; i < ids.size(); ++i) {
      T* row = g + ids[i] * d_;
      const T* src = dy.data() + i * d_;
      for (std::int64_t j = 0; j < d_; ++j) row[j] += src[j];
    }
  }

  std::int64_t vocab_, d_;
  parameter<T> table_;
};

}  // namespace baton::nn
