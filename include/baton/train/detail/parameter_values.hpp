// baton/train/detail/parameter_values.hpp — every parameter of a model by name, copied: what
// a trainer's and the one-rank model's parameters() return for comparison and checkpoints.
#pragma once

#include <baton/nn/parameter.hpp>
#include <baton/payload/host_tensor.hpp>

#include <map>
#include <string>

namespace baton::detail::train {

template <class T>
std::map<std::string, host_tensor<T>> values_of(baton::nn::module_with_parameters auto& model) {
  std::map<std::string, host_tensor<T>> out;
  baton::nn::for_each_parameter(model, [&](const std::string& name, baton::nn::parameter<T>& p) { out[name] = p.value; });
  return out;
}

}  // namespace baton::detail::train
