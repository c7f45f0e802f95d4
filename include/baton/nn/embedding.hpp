// baton/nn/embedding.hpp — token embedding: a table lookup with a scatter-add gradient.
#pragma once

#include <baton/core/sizes.hpp>
#include <baton/nn/detail/checks.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/payload/host_tensor.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace baton::nn {

/// y[..., :] = table[token, :] for tokens [...] of std::int64_t in [0, vocab); table
/// [vocab, d] ~ N(0, init_stddev²), parameter "weight".
///
/// As a piece: forward(tokens, saved) keeps the tokens; tokens have no gradient, so
/// backward_input(saved, dy) only keeps dy, and backward_weight(saved) scatter-adds it into
/// the rows of the table that were used (each occurrence of a token adds its row of dy).
template <class T>
class embedding : public detail::nn::piece<embedding<T>, T, "baton::nn::embedding"> {
 public:
  using tensor = host_tensor<T>;
  using tokens = host_tensor<std::int64_t>;

  struct saved : detail::nn::saved_state {
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
                       " of tokens " + detail::core::shape_text(ids.shape()) + " is outside the vocabulary [0, " +
                       std::to_string(vocab_) + ")");
      std::copy_n(table_.value.data() + t * d_, d_, y.data() + i * d_);
    }
    st.ids = ids;
    return y;
  }

  void backward_input(saved& st, const tensor& dy) const {
    std::vector<std::int64_t> expected = st.ids.shape();
    expected.push_back(d_);
    detail::nn::expect_shape(dy, expected, embedding::name, "dy", "the output gradient is [tokens..., d_model]");
    st.dy = dy;
    this->mark_input_done(st);
  }

  void backward_weight(saved& st) {
    this->expect_input_done(st);
    T* g = table_.grad.data();
    for (std::int64_t i = 0; i < st.ids.size(); ++i) {
      T* row = g + st.ids[i] * d_;
      const T* src = st.dy.data() + i * d_;
      for (std::int64_t j = 0; j < d_; ++j) row[j] += src[j];
    }
    st = saved{};
  }

 private:
  std::int64_t vocab_, d_;
  parameter<T> table_;
};

}  // namespace baton::nn
