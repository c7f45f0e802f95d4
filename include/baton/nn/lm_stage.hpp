// baton/nn/lm_stage.hpp — a decoder-only language model cut into pipeline stages: stage s
// holds a run of consecutive transformer blocks, the first stage also the token embedding,
// the last also the final norm and the LM head. Every stage has the same type, so the
// pipeline is uniform_stages<lm_stage<...>> for any schedule and any number of stages.
#pragma once

#include <baton/attention/masks.hpp>
#include <baton/core/float16.hpp>
#include <baton/core/sizes.hpp>
#include <baton/nn/block.hpp>
#include <baton/nn/config.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/detail/storage.hpp>
#include <baton/nn/embedding.hpp>
#include <baton/nn/error.hpp>
#include <baton/nn/head.hpp>
#include <baton/nn/loss.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/nn/sequence.hpp>
#include <baton/payload/constant.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/payload/record.hpp>
#include <baton/pipeline/stage.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace baton::nn {

/// What flows between the stages of an lm_stage pipeline: the tokens (read by the first
/// stage, a constant: never differentiated) and the hidden states (the activation), in T or,
/// when the sending stage keeps bf16 storage (activation_storage::bf16), in bf16 — half the
/// bytes of each message and of its gradient. The batch given to the first stage holds tokens
/// [batch, seq] and both hidden fields [batch, 0]; every stage outputs tokens [batch, 0] and
/// hidden [batch, seq, d_model] in one of the two fields (the other [batch, 0]) — logits
/// [batch, seq, vocab] in `hidden` from the last. Under context parallelism seq is this rank's
/// shard. A stage reads whichever field its input has filled, and sends the gradient back in
/// the same one.
template <class T>
using lm_activation = record<field<"tokens", constant<host_tensor<std::int64_t>>>, field<"hidden", host_tensor<T>>,
                             field<"hidden_bf16", host_tensor<bfloat16>>>;

/// The first stage's input: tokens [batch, seq] (int64) and empty hidden fields [batch, 0].
template <class T>
lm_activation<T> lm_input(host_tensor<std::int64_t> tokens) {
  const std::int64_t rows = tokens.rank() > 0 ? tokens.shape()[0] : 0;
  return lm_activation<T>(constant<host_tensor<std::int64_t>>(std::move(tokens)), host_tensor<T>({rows, 0}),
                          host_tensor<bfloat16>({rows, 0}));
}

/// Which layers stage `stage` of `stages` holds: layers / stages consecutive blocks.
struct lm_stage_layout {
  int stage = 0;
  int stages = 1;
  std::int64_t layers = 1;

  /// Throws nn_error naming what to change when the layers cannot be split evenly.
  static lm_stage_layout of(int stage, int stages, std::int64_t layers) {
    if (stages < 1 || stage < 0 || stage >= stages)
      throw nn_error("baton::nn::lm_stage_layout: stage " + std::to_string(stage) + " of " + std::to_string(stages) +
                     " stages does not exist");
    if (layers < stages || layers % stages != 0)
      throw nn_error("baton::nn::lm_stage_layout: " + std::to_string(layers) + " layers cannot be split evenly into " +
                     std::to_string(stages) + " pipeline stages; choose a number of layers divisible by " +
                     std::to_string(stages) + " (e.g. " + std::to_string(stages * ((layers + stages - 1) / stages)) +
                     ")");
    return {stage, stages, layers};
  }
  std::int64_t per_stage() const noexcept { return layers / stages; }
  std::int64_t first_layer() const noexcept { return stage * per_stage(); }
  bool has_embedding() const noexcept { return stage == 0; }
  bool has_head() const noexcept { return stage == stages - 1; }
};

/// One pipeline stage of a decoder-only LM: [embedding] → blocks → [final norm + head].
/// Parameters "embed", "layers.<i>" (global layer index) and "head", initialised from the
/// root initializer under those names — the same values as a one-stage model's.
///
/// It is a baton::split_backward_stage with input and output lm_activation<T> and side input
/// sequence_info; every block's attention runs through its own `Strategy` object (built by
/// the factory given to the constructor). Its blocks keep for the backward what the config's
/// `recompute` says (recompute_policy); set_recompute changes it for this stage alone.
template <class T, class Strategy, class Mask = causal_mask>
class lm_stage : public detail::nn::piece<lm_stage<T, Strategy, Mask>, T, "baton::nn::lm_stage"> {
 public:
  using input = lm_activation<T>;
  using output = lm_activation<T>;
  using side = sequence_info;
  using block_type = transformer_block<T, Strategy, Mask>;

  struct saved : detail::nn::saved_state {
    typename embedding<T>::saved embed;
    std::vector<typename block_type::saved> blocks;
    typename lm_head<T>::saved head;
    std::vector<std::int64_t> input_hidden_shape, input_bf16_shape;
    bool input_bf16 = false;  // the input's hidden states came in bf16
    std::size_t bytes() const {
      std::size_t n = embed.bytes() + head.bytes();
      for (const auto& b : blocks) n += b.bytes();
      return n;
    }
  };

  /// `make_strategy()` returns the attention strategy of one block (called once per block).
  template <class MakeStrategy>
  lm_stage(const transformer_config& config, lm_stage_layout layout, const initializer& root,
           MakeStrategy&& make_strategy, Mask mask = {})
      : config_(config.resolved()), layout_(layout) {
    if (layout_.has_embedding()) embed_.emplace(config_.vocab, config_.d_model, root / "embed");
    for (std::int64_t i = 0; i < layout_.per_stage(); ++i)
      blocks_.emplace_back(config_, root / "layers" / (layout_.first_layer() + i), make_strategy(), mask);
    if (layout_.has_head()) head_.emplace(config_, root / "head");
  }

  const lm_stage_layout& layout() const noexcept { return layout_; }
  const transformer_config& config() const noexcept { return config_; }
  std::vector<block_type>& blocks() noexcept { return blocks_; }

  /// The storage of this stage's saved activations and of the hidden states it sends
  /// (activation_storage).
  activation_storage storage() const noexcept { return config_.storage; }
  /// Sets it for every block of this stage and for the messages it sends, from the next
  /// forward on. nn_error when the blocks' attention cannot take bf16.
  void set_storage(activation_storage storage) {
    for (block_type& b : blocks_) b.set_storage(storage);
    config_.storage = storage;
  }

  /// The operands of this stage's blocks' projections (matmul_precision; the embedding and
  /// the head stay in the stage's element type).
  matmul_precision matmul() const noexcept { return config_.matmul; }
  void set_matmul(matmul_precision precision) {
    for (block_type& b : blocks_) b.set_matmul(precision);
    config_.matmul = precision;
  }

  /// The recompute policy of this stage's blocks.
  recompute_policy recompute() const noexcept { return config_.recompute; }
  /// Sets it for every block of this stage, for the forwards from now on (a pipeline may
  /// give each stage its own: executor.for_each_local_stage). nn_error for a value that is no
  /// policy. The embedding and the head keep what they always keep.
  void set_recompute(recompute_policy policy) {
    if (std::string problem = detail::nn::recompute_problem(policy); !problem.empty())
      throw nn_error(std::string(lm_stage::name) + ": " + problem);
    config_.recompute = policy;
    for (block_type& b : blocks_) b.set_recompute(policy);
  }

  template <class Visit>
  void visit_parameters(Visit&& visit) {
    if (embed_) visit("embed", *embed_);
    for (std::size_t i = 0; i < blocks_.size(); ++i)
      visit("layers." + std::to_string(layout_.first_layer() + static_cast<std::int64_t>(i)), blocks_[i]);
    if (head_) visit("head", *head_);
  }

  output forward(const input& x, const side& info, saved& st) {
    const host_tensor<T>& hidden_in = get<"hidden">(x);
    const host_tensor<bfloat16>& hidden_bf16_in = get<"hidden_bf16">(x);
    st.input_hidden_shape = hidden_in.shape();
    st.input_bf16_shape = hidden_bf16_in.shape();
    st.blocks.resize(blocks_.size());
    host_tensor<T> h;
    const host_tensor<T>* current = &hidden_in;  // the first block reads the input in place
    st.input_bf16 = hidden_bf16_in.size() > 0;
    if (st.input_bf16) {  // the previous stage sent bf16
      h = detail::nn::widened<T>(hidden_bf16_in);
      current = &h;
    }
    if (embed_) {
      const host_tensor<std::int64_t>& tokens = get<"tokens">(x).value;
      // Checked before anything runs; under context parallelism the first block's attention
      // rejects on every rank of the group together.
      if (std::string problem = token_problem(tokens); !problem.empty()) blocks_.front().attention().reject(problem, false);
      h = embed_->forward(tokens, st.embed);
      current = &h;
    }
    for (std::size_t i = 0; i < blocks_.size(); ++i) {
      h = blocks_[i].forward(*current, info, st.blocks[i]);
      current = &h;
    }
    if (head_) h = head_->forward(h, st.head);
    const std::int64_t rows = h.rank() > 0 ? h.shape()[0] : 0;
    constant<host_tensor<std::int64_t>> no_tokens(host_tensor<std::int64_t>({rows, 0}));
    if (!head_ && config_.storage == activation_storage::bf16)
      return output(std::move(no_tokens), host_tensor<T>({rows, 0}), detail::nn::to_bf16(h));
    return output(std::move(no_tokens), std::move(h), host_tensor<bfloat16>({rows, 0}));
  }

  grad_t<input> backward_input(saved& st, const grad_t<output>& dy) {
    const host_tensor<bfloat16>& dy_bf16 = get<"hidden_bf16">(dy);
    host_tensor<T> dh = head_                 ? head_->backward_input(st.head, get<"hidden">(dy))
                        : dy_bf16.size() > 0 ? detail::nn::widened<T>(dy_bf16)
                                              : get<"hidden">(dy);
    for (std::size_t i = blocks_.size(); i-- > 0;) dh = blocks_[i].backward_input(st.blocks[i], dh);
    if (embed_) {
      embed_->backward_input(st.embed, dh);
      dh = host_tensor<T>(st.input_hidden_shape);  // tokens have no gradient
    }
    this->mark_input_done(st);
    // The gradient goes back in the field the input came in.
    if (st.input_bf16)
      return grad_t<input>(host_tensor<T>(st.input_hidden_shape), detail::nn::to_bf16(dh));
    return grad_t<input>(std::move(dh), host_tensor<bfloat16>(st.input_bf16_shape));
  }

  /// backward_input then backward_weight, one piece at a time (the head, each block from the
  /// last, the embedding): a piece's weight gradients are made and its state freed before the
  /// next piece's backward_input (a block fuses its own pieces the same way), so a fused
  /// backward holds one piece's backward state above what its forwards kept, not every
  /// block's (docs/memory.md). The gradients are the same
  /// bits as backward_input then backward_weight: no piece reads another's weight gradients.
  grad_t<input> backward(saved& st, const grad_t<output>& dy) {
    const host_tensor<bfloat16>& dy_bf16 = get<"hidden_bf16">(dy);
    host_tensor<T> dh;
    if (head_) {
      dh = head_->backward_input(st.head, get<"hidden">(dy));
      head_->backward_weight(st.head);
      st.head = {};
    } else {
      dh = dy_bf16.size() > 0 ? detail::nn::widened<T>(dy_bf16) : get<"hidden">(dy);
    }
    for (std::size_t i = blocks_.size(); i-- > 0;) {
      dh = blocks_[i].backward(st.blocks[i], dh);  // itself fused, piece by piece
    }
    if (embed_) {
      embed_->backward_input(st.embed, dh);
      embed_->backward_weight(st.embed);
      dh = host_tensor<T>(st.input_hidden_shape);  // tokens have no gradient
    }
    const bool input_bf16 = st.input_bf16;
    const auto hidden_shape = st.input_hidden_shape;
    const auto bf16_shape = st.input_bf16_shape;
    st = saved{};
    if (input_bf16) return grad_t<input>(host_tensor<T>(hidden_shape), detail::nn::to_bf16(dh));
    return grad_t<input>(std::move(dh), host_tensor<bfloat16>(bf16_shape));
  }

  void backward_weight(saved& st) {
    this->expect_input_done(st);
    if (head_) head_->backward_weight(st.head);
    for (std::size_t i = blocks_.size(); i-- > 0;) blocks_[i].backward_weight(st.blocks[i]);
    if (embed_) embed_->backward_weight(st.embed);
    st = saved{};
  }

 private:
  std::string token_problem(const host_tensor<std::int64_t>& tokens) const {
    if (tokens.rank() != 2)
      return "baton::nn::lm_stage: the first stage's tokens have shape " + detail::core::shape_text(tokens.shape()) +
             " but expected [batch, seq]";
    for (std::int64_t i = 0; i < tokens.size(); ++i)
      if (tokens[i] < 0 || tokens[i] >= config_.vocab)
        return "baton::nn::lm_stage: token " + std::to_string(tokens[i]) + " at flat index " + std::to_string(i) +
               " is outside the vocabulary [0, " + std::to_string(config_.vocab) + ")";
    return {};
  }

  transformer_config config_;
  lm_stage_layout layout_;
  std::optional<embedding<T>> embed_;
  std::vector<block_type> blocks_;
  std::optional<lm_head<T>> head_;
};

/// The pipeline loss of an lm_stage pipeline: `Loss` (cross_entropy<T>, or its group form
/// over a data/context-parallel group) of the last stage's logits against int64 targets.
template <class T, class Loss = cross_entropy<T>>
class lm_loss {
 public:
  using targets_type = host_tensor<std::int64_t>;

  explicit lm_loss(Loss loss = Loss{}) : loss_(std::move(loss)) {}

  loss_result<grad_t<lm_activation<T>>> operator()(const lm_activation<T>& out, const targets_type& targets) const {
    auto r = loss_(get<"hidden">(out), targets);
    host_tensor<bfloat16> no_bf16(get<"hidden_bf16">(out).shape());  // the logits come in hidden
    return {r.value, grad_t<lm_activation<T>>(std::move(r.grad), std::move(no_bf16))};
  }
  std::int64_t tokens(const targets_type& targets) const { return loss_.tokens(targets); }

 private:
  Loss loss_;
};

}  // namespace baton::nn
