// baton/nn/block.hpp — the pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.)).
#pragma once

#include <baton/attention/masks.hpp>
#include <baton/nn/attention.hpp>
#include <baton/nn/config.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/nn/rms_norm.hpp>
#include <baton/nn/sequence.hpp>
#include <baton/nn/swiglu.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/host_tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

namespace baton::detail::nn {
template <class T>
void add_into(host_tensor<T>& target, const host_tensor<T>& addend) {
  T* t = target.data();
  const T* a = addend.data();
  for (std::int64_t i = 0; i < target.size(); ++i) t[i] += a[i];
}
}  // namespace baton::detail::nn

namespace baton::nn {

/// A Llama-style decoder block on x [batch, seq, d_model]:
///   h = x + self_attention(rms_norm(x)),   y = h + swiglu_mlp(rms_norm(h)).
/// Parameters "attention_norm", "attention" (wq, wk, wv, wo), "mlp_norm", "mlp" (gate, up, down).
///
/// It is a pipeline stage as it stands (baton::split_backward_stage): input and output
/// host_tensor<T> [batch, seq, d_model], side input sequence_info, split backward. The attention
/// runs through `Strategy` (no_cp<Backend>, ring / Ulysses / hybrid attention) under `Mask`.
template <class T, class Strategy, class Mask = causal_mask>
class transformer_block
    : public detail::nn::piece<transformer_block<T, Strategy, Mask>, T, "baton::nn::transformer_block"> {
 public:
  using tensor = host_tensor<T>;
  using input = tensor;
  using output = tensor;
  using side = sequence_info;
  using attention_type = self_attention<T, Strategy, Mask>;

  struct saved : detail::nn::saved_state {
    typename rms_norm<T>::saved attention_norm;
    typename attention_type::saved attention;
    typename rms_norm<T>::saved mlp_norm;
    typename swiglu_mlp<T>::saved mlp;
    std::size_t bytes() const { return attention_norm.bytes() + attention.bytes() + mlp_norm.bytes() + mlp.bytes(); }
  };

  transformer_block(const transformer_config& config, const initializer& init, Strategy strategy, Mask mask = {})
      : config_(config.resolved()),
        attention_norm_(config_.d_model, config_.norm_eps),
        attention_(config_, init / "attention", std::move(strategy), std::move(mask)),
        mlp_norm_(config_.d_model, config_.norm_eps),
        mlp_(config_.d_model, config_.ffn_hidden, init / "mlp") {}

  const transformer_config& config() const noexcept { return config_; }
  rms_norm<T>& attention_norm() noexcept { return attention_norm_; }
  attention_type& attention() noexcept { return attention_; }
  rms_norm<T>& mlp_norm() noexcept { return mlp_norm_; }
  swiglu_mlp<T>& mlp() noexcept { return mlp_; }

  template <class Visit>
  void visit_parameters(Visit&& visit) {
    visit("attention_norm", attention_norm_);
    visit("attention", attention_);
    visit("mlp_norm", mlp_norm_);
    visit("mlp", mlp_);
  }

  // Every check runs before any computation, and a failure goes through the attention's
  // reject(): under context parallelism every rank of the group throws together instead of
  // one rank throwing while its peers wait inside the attention's collective.
  output forward(const input& x, const side& info, saved& st) {
    if (std::string problem = attention_.input_problem(x, info, transformer_block::name); !problem.empty())
      attention_.reject(problem, false);
    tensor h = attention_.forward(attention_norm_.forward(x, st.attention_norm), info, st.attention);
    detail::nn::add_into(h, x);
    tensor y = mlp_.forward(mlp_norm_.forward(h, st.mlp_norm), st.mlp);
    detail::nn::add_into(y, h);
    return y;
  }

  grad_t<input> backward_input(saved& st, const grad_t<output>& dy) {
    if (std::string problem = attention_.grad_problem(st.attention, dy, transformer_block::name); !problem.empty())
      attention_.reject(problem, true);
    tensor dh = mlp_norm_.backward_input(st.mlp_norm, mlp_.backward_input(st.mlp, dy));
    detail::nn::add_into(dh, dy);
    tensor dx = attention_norm_.backward_input(st.attention_norm, attention_.backward_input(st.attention, dh));
    detail::nn::add_into(dx, dh);
    this->mark_input_done(st);
    return dx;
  }

  void backward_weight(saved& st) {
    this->expect_input_done(st);
    mlp_.backward_weight(st.mlp);
    mlp_norm_.backward_weight(st.mlp_norm);
    attention_.backward_weight(st.attention);
    attention_norm_.backward_weight(st.attention_norm);
    st = saved{};
  }

 private:
  transformer_config config_;
  rms_norm<T> attention_norm_;
  attention_type attention_;
  rms_norm<T> mlp_norm_;
  swiglu_mlp<T> mlp_;
};

}  // namespace baton::nn
