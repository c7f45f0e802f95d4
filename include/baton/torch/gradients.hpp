// baton/torch/gradients.hpp — the .grad() of a LibTorch model's parameters across ranks:
// summed over the replicas that hold the same parameters (data- and context-parallel
// groups), and clipped by the norm over the ranks that shard them (the pipeline group).
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/pipeline/clip.hpp>
#include <baton/torch/payload.hpp>

#include <torch/torch.h>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace baton {

/// How torch_all_reduce_gradients combines the replicas' gradients.
enum class torch_gradient_reduction {
  sum,   ///< context parallelism; data parallelism whose loss is normalised over the global batch
  mean,  ///< data parallelism where each replica's loss is its own batch's mean
};

namespace detail::torch_adapter {

// The .grad() of every parameter, made contiguous and zero-filled where undefined (a
// parameter this rank's microbatches never reached still takes part in the reduction, so
// every rank passes buffers of the same sizes).
inline std::vector<at::Tensor> gradient_buffers(const std::vector<at::Tensor>& params, const char* caller) {
  std::vector<at::Tensor> grads;
  grads.reserve(params.size());
  at::NoGradGuard no_grad;
  for (at::Tensor param : params) {  // a handle: its .grad() is the parameter's
    at::Tensor& g = param.mutable_grad();
    if (!g.defined()) g = at::zeros_like(param, at::MemoryFormat::Contiguous);
    if (!g.is_contiguous()) g = g.contiguous();
    if (!g.device().is_cpu()) {
      throw std::invalid_argument(std::string(caller) + ": a gradient is on " + g.device().str() +
                                  "; the LibTorch adapter reduces host gradients only");
    }
    if (g.scalar_type() != at::kFloat && g.scalar_type() != at::kDouble) {
      throw std::invalid_argument(std::string(caller) + ": a gradient of dtype " + dtype_name(g) +
                                  "; float and double gradients are supported");
    }
    grads.push_back(g);
  }
  return grads;
}

template <class V>
std::span<V> elements_of(const at::Tensor& t) {
  return {t.data_ptr<V>(), static_cast<std::size_t>(t.numel())};
}

}  // namespace detail::torch_adapter

/// All-reduces the .grad() of every parameter over `group`, in place (one all_reduce per
/// dtype, over the gradients packed in order). Every rank of the group passes the same
/// parameters in the same order and calls it together.
template <all_reduce_communicator Comm>
void torch_all_reduce_gradients(const std::vector<at::Tensor>& params, Comm& group,
                                torch_gradient_reduction reduction = torch_gradient_reduction::sum) {
  const auto grads = detail::torch_adapter::gradient_buffers(params, "baton::torch_all_reduce_gradients");
  if (group.size() == 1 && reduction == torch_gradient_reduction::sum) return;
  at::NoGradGuard no_grad;
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    std::vector<at::Tensor> members;
    for (const at::Tensor& g : grads)
      if (g.scalar_type() == dtype) members.push_back(g.view(-1));
    if (members.empty()) continue;
    at::Tensor bucket = at::cat(members);
    if (dtype == at::kFloat) {
      group.all_reduce(detail::torch_adapter::elements_of<float>(bucket), reduce_op::sum);
    } else {
      group.all_reduce(detail::torch_adapter::elements_of<double>(bucket), reduce_op::sum);
    }
    if (reduction == torch_gradient_reduction::mean) bucket.div_(group.size());
    std::int64_t offset = 0;
    for (at::Tensor& m : members) {
      m.copy_(bucket.narrow(0, offset, m.numel()));
      offset += m.numel();
    }
  }
}

/// clip_grad_norm (baton/pipeline/clip.hpp) over the .grad() of `params`: the total norm over
/// every rank of `groups` (the communicators over which parameters are sharded — the
/// pipeline group), the gradients scaled in place when it exceeds max_norm. Returns the norm.
/// All gradients must share one dtype (float or double).
template <class... Groups>
double torch_clip_grad_norm(const std::vector<at::Tensor>& params, double max_norm, double norm_type,
                            Groups&... groups) {
  const auto grads = detail::torch_adapter::gradient_buffers(params, "baton::torch_clip_grad_norm");
  const bool all_double = !grads.empty() && grads.front().scalar_type() == at::kDouble;
  for (const at::Tensor& g : grads) {
    if ((g.scalar_type() == at::kDouble) != all_double) {
      throw std::invalid_argument("baton::torch_clip_grad_norm: the gradients mix float and double; clip each dtype's "
                                  "parameters separately");
    }
  }
  const auto clip = [&]<class V>(std::type_identity<V>) {
    std::vector<std::span<V>> spans;
    spans.reserve(grads.size());
    for (const at::Tensor& g : grads) spans.push_back(detail::torch_adapter::elements_of<V>(g));
    return clip_grad_norm(spans, max_norm, norm_type, groups...);
  };
  return all_double ? clip(std::type_identity<double>{}) : clip(std::type_identity<float>{});
}

}  // namespace baton
