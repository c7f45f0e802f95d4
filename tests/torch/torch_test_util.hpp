// Helpers shared by the LibTorch adapter's tests.
#pragma once

#include <torch/torch.h>

// Debian's LibTorch is built with glog, whose CHECK (abort the process) replaces Catch's CHECK
// (record and go on) in every file that includes torch after catch.hpp. Each torch test
// includes this header first and catch.hpp after it, so Catch's CHECK is the one defined.
#undef CHECK

#include <algorithm>
#include <cmath>

namespace torch_test {

// One intra-op thread for LibTorch on this thread: the ranks are threads already.
inline void one_torch_thread() { at::set_num_threads(1); }

// |a - b| / max(|b|, tiny).
inline double relative_error(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// max |a - b| / scale, in double.
inline double error_relative_to(const torch::Tensor& a, const torch::Tensor& b, double scale) {
  const auto ad = a.detach().to(torch::kDouble), bd = b.detach().to(torch::kDouble);
  return (ad - bd).abs().max().item<double>() / std::max(scale, 1e-30);
}

// max |a - b| / max |b|, in double.
inline double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto ad = a.detach().to(torch::kDouble), bd = b.detach().to(torch::kDouble);
  const double scale = std::max(bd.abs().max().item<double>(), 1e-30);
  return (ad - bd).abs().max().item<double>() / scale;
}

}  // namespace torch_test
