// baton/train/reference.hpp — lm_reference: the model of an lm_trainer trained on one rank,
// the oracle the mesh runs are compared with (tests, baton-train --check).
#pragma once

#include <baton/attention/masks.hpp>
#include <baton/nn/cp_attention.hpp>
#include <baton/nn/lm_stage.hpp>
#include <baton/nn/loss.hpp>
#include <baton/nn/optim.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/nn/sequence.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/pipeline/clip.hpp>
#include <baton/train/config.hpp>
#include <baton/train/detail/global_batch.hpp>
#include <baton/train/detail/parameter_values.hpp>
#include <baton/train/guard.hpp>
#include <baton/train/report.hpp>
#include <baton/train/text_data.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

namespace baton::train {

/// The same model trained on one rank: the oracle of the mesh runs, and the model behind
/// --check. One forward and backward of the whole global batch (the loss is the mean over
/// all its tokens, as the mesh's), clipping over every parameter, AdamW.
template <class T, class Backend, class Mask = causal_mask>
class lm_reference {
 public:
  using model_type = nn::lm_stage<T, nn::no_cp<Backend>, Mask>;

  explicit lm_reference(const lm_config& config, Backend backend = {}, Mask mask = {})
      : config_(config),
        model_(config.model, nn::lm_stage_layout::of(0, 1, config.layers), nn::initializer(config.seed),
               [&] { return nn::no_cp<Backend>(backend); }, mask),
        params_(nn::parameters_of<T>(model_)),
        optimizer_(params_, config.optimizer) {}

  lm_step_report step(const lm_batch& batch) { return run(batch, true); }
  lm_step_report eval(const lm_batch& batch) { return run(batch, false); }

  model_type& model() noexcept { return model_; }
  std::map<std::string, host_tensor<T>> parameters() { return detail::train::values_of<T>(model_); }

  // What a checkpoint saves and restores, as lm_trainer has them (baton/train/json/lm_checkpoint.hpp).
  const lm_config& config() const noexcept { return config_; }
  const std::vector<nn::named_parameter<host_tensor<T>>>& local_parameters() const noexcept { return params_; }
  nn::adamw<T>& optimizer() noexcept { return optimizer_; }
  std::int64_t steps() const noexcept { return optimizer_.steps(); }

 private:
  lm_step_report run(const lm_batch& batch, bool train) {
    const auto start = std::chrono::steady_clock::now();
    const std::int64_t seq = batch.tokens.rank() == 2 ? batch.tokens.shape()[1] : 0;
    nn::sequence_info info = nn::sequence_info::whole(seq);
    info.documents = batch.documents;
    typename model_type::saved st;
    const auto out = model_.forward(nn::lm_input<T>(batch.tokens), info, st);
    const auto result = nn::cross_entropy<T>(ignore_target)(get<"hidden">(out), batch.targets);
    lm_step_report r;
    r.loss = result.value;
    r.tokens = detail::train::counted_tokens(batch.targets);
    if (train) {
      nn::zero_grad(params_);
      const host_tensor<bfloat16> no_bf16(get<"hidden_bf16">(out).shape());  // logits come in hidden
      model_.backward(st, grad_t<nn::lm_activation<T>>(result.grad, no_bf16));
      r.grad_norm = clip_grad_norm(nn::gradient_spans(params_),
                                   config_.clip_norm > 0 ? config_.clip_norm : std::numeric_limits<double>::infinity(), 2.0);
      // The same schedule and guard as lm_trainer's.
      const std::int64_t taken = optimizer_.steps();
      if (config_.stop_on_non_finite) guard_.check(taken, r.loss, r.grad_norm);
      r.lr = config_.learning_rate.at(taken, config_.optimizer.lr);
      optimizer_.set_lr(r.lr);
      optimizer_.step();
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return r;
  }

  lm_config config_;
  model_type model_;
  std::vector<nn::named_parameter<host_tensor<T>>> params_;
  nn::adamw<T> optimizer_;
  non_finite_guard guard_;
};

}  // namespace baton::train
