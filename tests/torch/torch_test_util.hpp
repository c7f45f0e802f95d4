// Helpers shared by the LibTorch adapter's tests.
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace torch_test {

// One intra-op thread for LibTorch on this thread: the ranks are threads already.
inline void one_torch_thread() { at::set_num_threads(1); }

// |a - b| / max(|b|, tiny).
inline double relative_error(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// max |a - b| / max |b|, in double.
inline double relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  const auto ad = a.detach().to(torch::kDouble), bd = b.detach().to(torch::kDouble);
  const double scale = std::max(bd.abs().max().item<double>(), 1e-30);
  return (ad - bd).abs().max().item<double>() / scale;
}

}  // namespace torch_test
