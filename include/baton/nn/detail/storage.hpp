// baton/nn/detail/storage.hpp — bf16 storage of saved activations: a float tensor rounded to
// bf16 (to nearest even) and widened back (exactly), and the set of a block's tensors kept
// in bf16 between its forward and its backward_input.
#pragma once

#include <baton/core/float16.hpp>
#include <baton/core/simd.hpp>
#include <baton/payload/host_tensor.hpp>

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace baton::detail::nn {

/// dst[0..n) = src[0..n) rounded to bf16 (GCC and Clang vectorise the loop).
template <class T>
void round_to_bf16(const T* src, std::int64_t n, bfloat16* dst) noexcept {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = bfloat16(static_cast<float>(src[i]));
}

template <class T>
host_tensor<bfloat16> to_bf16(const host_tensor<T>& t) {
  auto out = host_tensor<bfloat16>::for_overwrite(t.shape());
  round_to_bf16(t.data(), t.size(), out.data());
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

/// A stored value as T: itself, or a bf16 widened (exact).
template <class T, class S>
BATON_ALWAYS_INLINE T widen_value(S x) noexcept {
  if constexpr (std::is_same_v<S, bfloat16>)
    return static_cast<T>(x.to_float());
  else
    return x;
}

#if defined(__GNUC__)
/// A vector of floats from width_v<float> stored values: floats, or bf16 widened (exact).
template <class S>
BATON_ALWAYS_INLINE core::simd::vec_t<float> load_widened(const S* p) noexcept {
  namespace simd = core::simd;
  if constexpr (std::is_same_v<S, bfloat16>) {
    typedef std::uint16_t half_bits __attribute__((vector_size(simd::vector_bytes / 2)));
    typedef std::uint32_t word_bits __attribute__((vector_size(simd::vector_bytes)));
    half_bits h;
    std::memcpy(&h, p, sizeof h);
    const word_bits w = __builtin_convertvector(h, word_bits) << 16;
    return std::bit_cast<simd::vec_t<float>>(w);
  } else {
    return simd::load(p);
  }
}
/// Stores a vector of floats rounded to bf16 as float_to_bf16_bits rounds each (to nearest
/// even; a NaN stays a quiet NaN with its sign): the bits of to_bf16 on the same values.
BATON_ALWAYS_INLINE void store_bf16(bfloat16* p, core::simd::vec_t<float> x) noexcept {
  namespace simd = core::simd;
  typedef std::uint16_t half_bits __attribute__((vector_size(simd::vector_bytes / 2)));
  typedef std::uint32_t word_bits __attribute__((vector_size(simd::vector_bytes)));
  const word_bits u = std::bit_cast<word_bits>(x);
  const word_bits rounded = (u + (0x7fffu + ((u >> 16) & 1u))) >> 16;
  const word_bits quiet_nan = (u >> 16) | 0x0040u;
  const word_bits bits = (u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
  const half_bits h = __builtin_convertvector(bits, half_bits);
  std::memcpy(static_cast<void*>(p), &h, sizeof h);
}
#endif

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
