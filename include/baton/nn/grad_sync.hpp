// baton/nn/grad_sync.hpp — summing weight gradients over the ranks that hold replicas of the
// same parameters (data-parallel and context-parallel groups).
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/core/block_cache.hpp>
#include <baton/nn/parameter.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace baton::nn {

/// How all_reduce_gradients combines the replicas' gradients.
enum class gradient_reduction {
  /// Σ over ranks: context parallelism (each rank's gradient is its shard's part of one loss)
  /// and data parallelism whose loss is already normalised over the global batch.
  sum,
  /// Σ / ranks: data parallelism where each replica's loss is its own batch's mean.
  mean,
};

/// All-reduces the gradient of every parameter of `list` over `group`, in place. Gradients are
/// packed into buckets of at most `bucket_elements` values, one all_reduce per bucket, in the
/// list's order: every rank of the group must pass lists of the same parameters (same order,
/// same sizes) and call it together.
template <class Tensor, all_reduce_communicator Comm>
void all_reduce_gradients(const std::vector<named_parameter<Tensor>>& list, Comm& group,
                          gradient_reduction reduction = gradient_reduction::sum,
                          std::size_t bucket_elements = std::size_t{1} << 22) {
  using V = typename payload_traits<Tensor>::value_type;
  if (group.size() == 1 && reduction == gradient_reduction::sum) return;
  const V scale = reduction == gradient_reduction::mean ? V(1) / static_cast<V>(group.size()) : V(1);
  // One buffer for every bucket, as large as the largest, from the thread's block cache: a
  // step after the first faults in no fresh pages here.
  std::size_t largest = 0, filling = 0;
  for (const auto& p : list) {
    const std::size_t n = detail::nn::elements(p.parameter->grad).size();
    if (filling > 0 && filling + n > bucket_elements) filling = 0;
    filling += n;
    largest = std::max(largest, filling);
  }
  const detail::core::cached_array<V> buffer(largest);
  std::size_t used = 0;
  std::vector<std::span<V>> members;
  const auto flush = [&] {
    if (used == 0) return;
    group.all_reduce(std::span<V>(buffer.get(), used), reduce_op::sum);
    std::size_t offset = 0;
    for (auto& g : members) {
      for (std::size_t j = 0; j < g.size(); ++j) g[j] = buffer[offset + j] * scale;
      offset += g.size();
    }
    used = 0;
    members.clear();
  };
  for (const auto& p : list) {
    const std::span<V> g = detail::nn::elements(p.parameter->grad);
    if (used > 0 && used + g.size() > bucket_elements) flush();
    std::copy(g.begin(), g.end(), buffer.get() + used);
    used += g.size();
    members.push_back(g);
  }
  flush();
}

}  // namespace baton::nn
