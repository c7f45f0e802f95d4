// baton/train/generate.hpp — greedy_generate: a one-stage language model's greedy
// continuation of a prompt (after training, from gather_model or lm_reference::model).
#pragma once

#include <baton/nn/error.hpp>
#include <baton/nn/lm_stage.hpp>
#include <baton/nn/sequence.hpp>
#include <baton/payload/host_tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace baton::train {

/// The model's greedy continuation of `prompt`: `count` tokens, each the argmax of the
/// logits after the last `context` tokens (the model sees at most that many). `model` is a
/// one-stage lm_stage (gather_model, lm_reference::model) whose attention needs no peers.
template <class Model>
std::vector<std::int64_t> greedy_generate(Model& model, std::vector<std::int64_t> prompt, std::int64_t count,
                                          std::int64_t context) {
  using T = typename Model::value_type;
  if (prompt.empty()) throw nn::nn_error("baton::train::greedy_generate: the prompt is empty");
  std::vector<std::int64_t> out;
  for (std::int64_t n = 0; n < count; ++n) {
    const auto len = std::min<std::int64_t>(context, static_cast<std::int64_t>(prompt.size()));
    host_tensor<std::int64_t> tokens({1, len});
    std::copy(prompt.end() - len, prompt.end(), tokens.data());
    typename Model::saved st;
    const auto result = model.forward(nn::lm_input<T>(std::move(tokens)), nn::sequence_info::whole(len), st);
    const host_tensor<T>& logits = get<"hidden">(result);
    const std::int64_t vocab = logits.shape()[2];
    const T* last = logits.data() + (len - 1) * vocab;
    const auto next = static_cast<std::int64_t>(std::max_element(last, last + vocab) - last);
    prompt.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace baton::train
