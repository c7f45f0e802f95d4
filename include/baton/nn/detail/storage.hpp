// baton/nn/detail/storage.hpp — bf16 storage of saved activations: a float tensor rounded to
// bf16 (to nearest even) and widened back (exactly), and the set of a block's tensors kept
// in bf16 between its forward and its backward_input.
#pragma once

#include <baton/core/float16.hpp>
#include <baton/payload/host_tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace baton::detail::nn {

template <class T>
host_tensor<bfloat16> to_bf16(const host_tensor<T>& t) {
  auto out = host_tensor<bfloat16>::for_overwrite(t.shape());
  const T* src = t.data();
  bfloat16* dst = out.data();
  for (std::int64_t i = 0; i < t.size(); ++i) dst[i] = bfloat16(static_cast<float>(src[i]));
  return out;
}

template <class T>
host_tensor<T> widened(const host_tensor<bfloat16>& t) {
  auto out = host_tensor<T>::for_overwrite(t.shape());
  const bfloat16* src = t.data();
  T* dst = out.data();
  for (std::int64_t i = 0; i < t.size(); ++i) dst[i] = static_cast<T>(src[i].to_float());
  return out;
}

/// Tensors of a saved state held in bf16 until they are needed: pack(tensors) rounds each
/// non-empty one to bf16 and frees it, unpack(tensors) widens them back into the same places
/// (the same list, in the same order). bytes() is what the bf16 copies hold.
template <class T>
struct bf16_pack {
  std::vector<host_tensor<bfloat16>> held;

  void pack(std::span<host_tensor<T>* const> tensors) {
    held.clear();
    held.reserve(tensors.size());
    for (host_tensor<T>* t : tensors) {
      held.push_back(t->size() > 0 ? to_bf16(*t) : host_tensor<bfloat16>());
      if (t->size() > 0) *t = host_tensor<T>();
    }
  }
  void unpack(std::span<host_tensor<T>* const> tensors) {
    if (held.empty()) return;
    std::size_t i = 0;
    for (host_tensor<T>* t : tensors) {
      if (i < held.size() && held[i].size() > 0) *t = widened<T>(held[i]);
      ++i;
    }
    held.clear();
  }
  [[nodiscard]] bool empty() const noexcept { return held.empty(); }
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& h : held) n += static_cast<std::size_t>(h.size()) * sizeof(bfloat16);
    return n;
  }
};

}  // namespace baton::detail::nn
