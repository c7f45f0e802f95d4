// Shared by the model-layer tests: random tensors, the error measure every nn tolerance is
// stated in, and gradient snapshots of a module.
#pragma once

#include <baton/nn.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace nn_test {

template <class T>
baton::host_tensor<T> random_tensor(std::vector<std::int64_t> shape, std::uint32_t seed, double scale = 1.0) {
  baton::host_tensor<T> t(std::move(shape));
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, scale);
  for (std::int64_t i = 0; i < t.size(); ++i) t[i] = static_cast<T>(normal(gen));
  return t;
}

inline baton::host_tensor<std::int64_t> random_tokens(std::vector<std::int64_t> shape, std::int64_t vocab,
                                                      std::uint32_t seed) {
  baton::host_tensor<std::int64_t> t(std::move(shape));
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> pick(0, vocab - 1);
  for (std::int64_t i = 0; i < t.size(); ++i) t[i] = pick(gen);
  return t;
}

/// max |a - b| / max |b|: the error measure of every tolerance in the nn tests ("relative to
/// the largest magnitude" of the reference b). A zero reference compares absolutely.
template <class A, class B>
double max_rel_error(std::span<const A> a, std::span<const B> b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
    if (std::isnan(static_cast<double>(a[i])) != std::isnan(static_cast<double>(b[i]))) return INFINITY;
  }
  return ref > 0 ? diff / ref : diff;
}

template <class A, class B>
double max_rel_error(const baton::host_tensor<A>& a, const baton::host_tensor<B>& b) {
  if (a.shape() != b.shape()) return INFINITY;
  return max_rel_error(a.values(), b.values());
}

/// Every gradient of a module, by parameter name.
template <class T, class Module>
std::map<std::string, baton::host_tensor<T>> gradients_of(Module& m, std::string_view prefix = {}) {
  std::map<std::string, baton::host_tensor<T>> out;
  baton::nn::for_each_parameter(m, [&](const std::string& name, baton::nn::parameter<T>& p) { out[name] = p.grad; },
                                prefix);
  return out;
}

}  // namespace nn_test
