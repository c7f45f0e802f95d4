// baton/pipeline/clip.hpp — gradient-norm clipping over parameters sharded across ranks.
//
// Under pipeline parallelism each rank holds the gradients of its own stages only, so the
// norm of "the model's gradient" is a reduction over the pipeline group (seed 004: clipping
// each stage by its local norm silently changes training). The same holds for every group
// that shards parameters (tensor parallel, FSDP); pass each one.
#pragma once

#include <baton/comm/concepts.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace baton {

namespace detail::pipeline {

// One gradient buffer: a contiguous range of floating-point values (std::span<float>,
// std::vector<double>&, host_tensor values...).
template <class R>
concept gradient_buffer = std::ranges::contiguous_range<R> && std::ranges::sized_range<R> &&
                          std::floating_point<std::ranges::range_value_t<R>>;

// A collection of gradient buffers: std::vector<std::span<double>>, std::array<...>, ...
template <class R>
concept gradient_buffers = std::ranges::input_range<R> && gradient_buffer<std::ranges::range_reference_t<R>>;

// Σ g² in double, over eight partial sums in a fixed order: deterministic, and the compiler
// keeps them in vector registers (one running sum would serialise every addition).
template <class V>
double sum_of_squares(std::span<V> buffer) {
  double part[8] = {};
  std::size_t i = 0;
  for (; i + 8 <= buffer.size(); i += 8)
    for (std::size_t l = 0; l < 8; ++l) part[l] += static_cast<double>(buffer[i + l]) * static_cast<double>(buffer[i + l]);
  double sum = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
  for (; i < buffer.size(); ++i) sum += static_cast<double>(buffer[i]) * static_cast<double>(buffer[i]);
  return sum;
}

template <class Visit, class Grads>
void for_each_gradient_buffer(Grads&& grads, Visit&& visit) {
  if constexpr (gradient_buffer<Grads>) {
    visit(std::span(std::ranges::data(grads), std::ranges::size(grads)));
  } else {
    for (auto&& g : grads) visit(std::span(std::ranges::data(g), std::ranges::size(g)));
  }
}

}  // namespace detail::pipeline

/// Clips gradients by their total norm over every rank of `groups`, in place, and returns the
/// total norm (before clipping) — torch.nn.utils.clip_grad_norm_ for sharded parameters.
///
/// - `grads`: this rank's gradients: one contiguous floating-point range, or a range of them
///   (for example `std::vector<std::span<double>>` gathered from every local stage).
/// - `norm_type`: p > 0, or `std::numeric_limits<double>::infinity()` for the max-norm.
/// - `groups...`: the communicators over which parameters are *sharded* (the pipeline group;
///   tensor- or fully-sharded data-parallel groups). Each contributes an all_reduce: SUM of
///   the p-th powers (MAX for the inf-norm). Do not pass a group over which parameters are
///   replicated (plain data parallel): that would count each parameter once per replica.
///
/// Every rank of every group must call it (it is collective) and gets the same norm. The
/// gradients are multiplied by max_norm / (norm + 1e-6) when that is below one. Sums are in
/// double whatever the gradient type. A non-finite norm is returned as is and no scaling is
/// applied, so that the caller can skip the step.
template <class Grads, class... Groups>
  requires(detail::pipeline::gradient_buffer<Grads> || detail::pipeline::gradient_buffers<Grads>)
double clip_grad_norm(Grads&& grads, double max_norm, double norm_type, Groups&... groups) {
  static_assert((all_reduce_communicator<Groups> && ...),
                "baton::clip_grad_norm: every group must be a communicator with all_reduce "
                "(baton::all_reduce_communicator), e.g. the pipeline communicator");
  if (!(norm_type > 0)) {
    throw std::invalid_argument("baton::clip_grad_norm: norm_type must be positive (2 for the "
                                "Euclidean norm, infinity for the max-norm), got " +
                                std::to_string(norm_type));
  }
  if (!(max_norm >= 0)) {
    throw std::invalid_argument("baton::clip_grad_norm: max_norm must be non-negative, got " +
                                std::to_string(max_norm));
  }
  const bool inf_norm = std::isinf(norm_type);
  double local = 0;
  detail::pipeline::for_each_gradient_buffer(grads, [&](auto buffer) {
    if (norm_type == 2) {
      local += detail::pipeline::sum_of_squares(buffer);
      return;
    }
    for (const auto g : buffer) {
      const double a = std::abs(static_cast<double>(g));
      if (inf_norm) {
        // NaN must survive the max so that a NaN gradient is reported, not hidden.
        if (a > local || std::isnan(a)) local = a;
      } else if (norm_type == 1) {
        local += a;
      } else {
        local += std::pow(a, norm_type);
      }
    }
  });
  double total = local;
  [[maybe_unused]] const auto reduce = [&](auto& group) {
    std::span<double> one(&total, 1);
    group.all_reduce(one, inf_norm ? reduce_op::max : reduce_op::sum);
  };
  (reduce(groups), ...);
  const double norm = inf_norm || norm_type == 1 ? total
                      : norm_type == 2            ? std::sqrt(total)
                                                  : std::pow(total, 1.0 / norm_type);
  if (!std::isfinite(norm)) return norm;
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1) {
    detail::pipeline::for_each_gradient_buffer(grads, [&](auto buffer) {
      using value = std::remove_cvref_t<decltype(buffer[0])>;
      for (auto& g : buffer) g = static_cast<value>(static_cast<double>(g) * coefficient);
    });
  }
  return norm;
}

}  // namespace baton
