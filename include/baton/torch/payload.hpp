// baton/torch/payload.hpp — torch::Tensor as a baton payload: an activation tensor whose element
// type (dtype) is a run-time value, carried across stage boundaries in the wire header.
//
// Only CPU tensors travel (the LibTorch adapter runs on the host); bytes() of a tensor that is
// not contiguous, or not on the CPU, is a payload_error that says what to call. Every
// operation here runs with autograd off, so splitting a batch or scaling a gradient never
// records a graph, and a received tensor never requires grad: the stage adapter
// (baton/torch/stage.hpp) decides which inputs are differentiated.
#pragma once

#include <baton/payload/traits.hpp>

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace baton {

namespace detail::torch_adapter {

inline std::string dtype_name(const at::Tensor& t) { return std::string(c10::toString(t.scalar_type())); }

inline std::string sizes_text(const at::Tensor& t) {
  std::string text = "[";
  for (std::size_t i = 0; i < t.sizes().size(); ++i) {
    if (i) text += ", ";
    text += std::to_string(t.sizes()[i]);
  }
  return text + "]";
}

// A tensor whose storage baton may read or write as bytes: defined, on the CPU, contiguous.
inline void require_host_storage(const at::Tensor& t, const char* what) {
  if (!t.defined()) return;  // an empty payload (a rank that does not hold the first stage)
  if (!t.device().is_cpu()) {
    throw payload_error(std::string("baton torch payload: ") + what + ": the tensor is on " + t.device().str() +
                        "; the LibTorch adapter moves host tensors only: call .cpu() before the stage boundary");
  }
  if (!t.is_contiguous()) {
    throw payload_error(std::string("baton torch payload: ") + what + ": a tensor of shape " + sizes_text(t) +
                        " is not contiguous; return t.contiguous() from the stage (torch_stage does this for "
                        "its outputs)");
  }
}

inline at::ScalarType scalar_type_of_format(std::int64_t format) {
  const std::int64_t code = format / 256 - 1;
  if (code < 0 || code >= static_cast<std::int64_t>(at::ScalarType::NumOptions)) {
    throw payload_error("baton torch payload: element format " + std::to_string(format) +
                        " names no torch dtype: the sender is not a torch::Tensor of this build");
  }
  return static_cast<at::ScalarType>(code);
}

}  // namespace detail::torch_adapter

/// torch::Tensor is an activation tensor: dim 0 is the batch, along which microbatches are cut.
/// Its dtype is a run-time element format (256 x (ScalarType + 1) + bytes per element).
template <>
struct payload_traits<at::Tensor> {
  static constexpr payload_role role = payload_role::activation;

  static std::int64_t element_format(const at::Tensor& t) {
    if (!t.defined()) return 0;
    return (static_cast<std::int64_t>(t.scalar_type()) + 1) * 256 + static_cast<std::int64_t>(t.element_size());
  }
  static at::IntArrayRef shape(const at::Tensor& t) { return t.defined() ? t.sizes() : at::IntArrayRef{}; }

  static std::span<const std::byte> bytes(const at::Tensor& t) {
    detail::torch_adapter::require_host_storage(t, "sending");
    if (!t.defined()) return {};
    return {static_cast<const std::byte*>(t.data_ptr()), t.nbytes()};
  }
  static std::span<std::byte> mutable_bytes(at::Tensor& t) {
    detail::torch_adapter::require_host_storage(t, "receiving");
    if (!t.defined()) return {};
    return {static_cast<std::byte*>(t.data_ptr()), t.nbytes()};
  }

  static at::Tensor allocate(std::span<const std::int64_t> shape, std::int64_t format) {
    at::NoGradGuard no_grad;
    return at::zeros(at::IntArrayRef(shape.data(), shape.size()),
                     at::TensorOptions().dtype(detail::torch_adapter::scalar_type_of_format(format)));
  }
  // Used where no format is known (a payload built from extents alone): float, torch's default.
  static at::Tensor allocate(std::span<const std::int64_t> shape) {
    at::NoGradGuard no_grad;
    return at::zeros(at::IntArrayRef(shape.data(), shape.size()));
  }
  static at::Tensor allocate_like(const at::Tensor& t) {
    at::NoGradGuard no_grad;
    return at::zeros(t.sizes(), t.options().requires_grad(false));
  }

  static at::Tensor slice(const at::Tensor& t, int dim, std::int64_t begin, std::int64_t count) {
    at::NoGradGuard no_grad;
    return t.detach().narrow(dim, begin, count).clone(at::MemoryFormat::Contiguous);
  }
  static at::Tensor concat(std::span<const at::Tensor> parts, int dim) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> detached;
    detached.reserve(parts.size());
    for (const at::Tensor& p : parts) detached.push_back(p.detach());
    return at::cat(detached, dim).contiguous();
  }

  /// The executor's loss scaling of a gradient, in place.
  static void scale(at::Tensor& t, double factor) {
    at::NoGradGuard no_grad;
    t.mul_(factor);
  }
};

}  // namespace baton
