// baton/nn/head.hpp — the end of a decoder: final RMSNorm and the projection to the vocabulary.
#pragma once

#include <baton/nn/config.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/linear.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/nn/rms_norm.hpp>
#include <baton/payload/host_tensor.hpp>

#include <cstddef>
#include <cstdint>

namespace baton::nn {

/// logits = rms_norm(x) W_out: x [batch, seq, d_model] -> [batch, seq, vocab]; W_out
/// [d_model, vocab], no bias. Parameters "norm", "output".
///
/// As a piece: forward(x, saved), backward_input(saved, dlogits) -> dx, backward_weight(saved).
template <class T>
class lm_head : public detail::nn::piece<lm_head<T>, T, "baton::nn::lm_head"> {
 public:
  using tensor = host_tensor<T>;

  struct saved : detail::nn::saved_state {
    typename rms_norm<T>::saved norm;
    typename linear<T>::saved output;
    std::size_t bytes() const { return norm.bytes() + output.bytes(); }
  };

  lm_head(const transformer_config& config, const initializer& init) : lm_head(config.resolved(), init, 0) {}

  rms_norm<T>& norm() noexcept { return norm_; }
  linear<T>& output() noexcept { return output_; }

  template <class Visit>
  void visit_parameters(Visit&& visit) {
    visit("norm", norm_);
    visit("output", output_);
  }

  tensor forward(const tensor& x, saved& st) const { return output_.forward(norm_.forward(x, st.norm), st.output); }
  tensor backward_input(saved& st, const tensor& dlogits) const {
    tensor dx = norm_.backward_input(st.norm, output_.backward_input(st.output, dlogits));
    this->mark_input_done(st);
    return dx;
  }
  void backward_weight(saved& st) {
    this->expect_input_done(st);
    output_.backward_weight(st.output);
    norm_.backward_weight(st.norm);
    st = saved{};
  }

 private:
  lm_head(const transformer_config& resolved, const initializer& init, int)
      : norm_(resolved.d_model, resolved.norm_eps), output_(resolved.d_model, resolved.vocab, false, init / "output") {}

  rms_norm<T> norm_;
  linear<T> output_;
};

}  // namespace baton::nn
