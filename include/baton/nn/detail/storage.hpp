// baton/nn/detail/storage.hpp — bf16 storage of saved activations: a float tensor rounded to
// bf16 (to nearest even) and widened back (exactly), and the set of a block's tensors kept
// in bf16 between its forward and its backward_input.
#pragma once

#include <baton/core/float16.hpp>
#include <baton/payload/host_tensor.hpp>

#include <array>
#include <cstddef>
#include <cstdint>

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

/// Tensors of a saved state held in bf16 until they are needed, in N numbered slots:
/// pack(i, t) rounds t to bf16 into slot i and frees t, unpack(i, t) widens slot i back into t
/// and frees the slot (each a no-op when there is nothing to move). A block packs each tensor
/// right after the last forward step that reads it and unpacks it right before the first
/// backward step that does, so that both conversions meet the float values in cache instead
/// of in one pass over every tensor at the end of the forward (and at the start of the
/// backward). bytes() is what the bf16 copies hold.
template <class T, std::size_t N>
struct bf16_pack {
  std::array<host_tensor<bfloat16>, N> held;

  void pack(std::size_t slot, host_tensor<T>& t) {
    if (t.size() == 0) return;
    held[slot] = to_bf16(t);
    t = host_tensor<T>();
  }
  void unpack(std::size_t slot, host_tensor<T>& t) {
    if (held[slot].size() == 0) return;
    t = widened<T>(held[slot]);
    held[slot] = host_tensor<bfloat16>();
  }
  [[nodiscard]] bool empty() const noexcept {
    for (const auto& h : held)
      if (h.size() > 0) return false;
    return true;
  }
  [[nodiscard]] std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& h : held) n += static_cast<std::size_t>(h.size()) * sizeof(bfloat16);
    return n;
  }
};

}  // namespace baton::detail::nn
