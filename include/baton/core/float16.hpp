// baton/core/float16.hpp — the 16-bit storage types, bfloat16 and float16, that every layer
// shares: the CPU attention backends and CP on the host, the CUDA kernels on the device, the
// tests that build inputs with them.
//
// Both are plain 16-bit bit patterns (trivially copyable, the layout of __nv_bfloat16 and
// __half, so a device buffer of either is bit-castable). They convert from float with
// round-to-nearest-even (NaN stays NaN, overflow becomes inf) and to float exactly. They are
// storage only: arithmetic happens in float after the conversion.
#pragma once

#include <baton/core/cuda_annotations.hpp>

#include <cstdint>
#include <type_traits>

namespace baton {

namespace detail::core {
// float <-> bits. __builtin_bit_cast, unlike std::bit_cast, is usable in nvcc's device pass
// without --expt-relaxed-constexpr; g++ and clang have it too.
[[nodiscard]] BATON_HD inline std::uint32_t float_bits(float f) noexcept { return __builtin_bit_cast(std::uint32_t, f); }
[[nodiscard]] BATON_HD inline float bits_float(std::uint32_t u) noexcept { return __builtin_bit_cast(float, u); }

/// float -> bfloat16 bits, round to nearest even; NaN stays a (quiet) NaN with its sign.
[[nodiscard]] BATON_HD inline std::uint16_t float_to_bf16_bits(float f) noexcept {
  const std::uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}
[[nodiscard]] BATON_HD inline float bf16_bits_to_float(std::uint16_t b) noexcept {
  return bits_float(static_cast<std::uint32_t>(b) << 16);
}

/// float -> IEEE binary16 bits, round to nearest even, subnormals kept, overflow to inf.
[[nodiscard]] BATON_HD inline std::uint16_t float_to_f16_bits(float f) noexcept {
  const std::uint32_t u = float_bits(f);
  const std::uint32_t sign = (u >> 16) & 0x8000u;
  const std::uint32_t mag = u & 0x7fffffffu;
  if (mag > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u | ((mag >> 13) & 0x3ffu));  // NaN
  if (mag >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to >= 65536: inf
  if (mag < 0x38800000u) {  // below 2^-14: a subnormal half (or zero)
    if (mag < 0x33000000u) return static_cast<std::uint16_t>(sign);  // below half the smallest subnormal
    const std::uint32_t exponent = mag >> 23;
    const std::uint32_t mantissa = (mag & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126u - exponent;  // 14..24: the half subnormal is mantissa >> shift
    const std::uint32_t half_ulp = 1u << (shift - 1);
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    std::uint32_t h = mantissa >> shift;
    if (rest > half_ulp || (rest == half_ulp && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  const std::uint32_t rebased = mag - 0x38000000u;  // exponent 127 -> 15
  const std::uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rebased + rounding) >> 13));
}
[[nodiscard]] BATON_HD inline float f16_bits_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return bits_float(sign);
  // Subnormal: mantissa * 2^-24, exact in float.
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}
}  // namespace detail::core

namespace detail::core {
// The two encodings: what a 16-bit storage type stores for a float, and what it reads back.
struct bfloat16_codec {
  [[nodiscard]] BATON_HD static std::uint16_t encode(float f) noexcept { return float_to_bf16_bits(f); }
  [[nodiscard]] BATON_HD static float decode(std::uint16_t b) noexcept { return bf16_bits_to_float(b); }
};
struct float16_codec {
  [[nodiscard]] BATON_HD static std::uint16_t encode(float f) noexcept { return float_to_f16_bits(f); }
  [[nodiscard]] BATON_HD static float decode(std::uint16_t b) noexcept { return f16_bits_to_float(b); }
};
}  // namespace detail::core

/// A float stored in 16 bits by `Codec`: explicit conversions from and to float, the bits
/// themselves in `bits`. Use the two instances below.
template <class Codec>
struct basic_float16 {
  std::uint16_t bits = 0;

  basic_float16() = default;
  BATON_HD explicit basic_float16(float f) noexcept : bits(Codec::encode(f)) {}
  [[nodiscard]] BATON_HD static basic_float16 from_bits(std::uint16_t b) noexcept {
    basic_float16 x;
    x.bits = b;
    return x;
  }
  [[nodiscard]] BATON_HD explicit operator float() const noexcept { return Codec::decode(bits); }
  [[nodiscard]] BATON_HD float to_float() const noexcept { return Codec::decode(bits); }
};

/// bfloat16 storage: 1 sign, 8 exponent, 7 mantissa bits (the top half of a float).
using bfloat16 = basic_float16<detail::core::bfloat16_codec>;
/// IEEE binary16 storage: 1 sign, 5 exponent, 10 mantissa bits (max 65504).
using float16 = basic_float16<detail::core::float16_codec>;

static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);
static_assert(sizeof(float16) == 2 && std::is_trivially_copyable_v<float16>);

namespace detail::core {
/// Storage -> float and back, one spelling for float, bfloat16 and float16.
template <class S>
[[nodiscard]] BATON_HD inline float to_float(S x) noexcept {
  if constexpr (std::is_same_v<S, float>)
    return x;
  else
    return x.to_float();
}
template <class S>
[[nodiscard]] BATON_HD inline S from_float(float f) noexcept {
  if constexpr (std::is_same_v<S, float>)
    return f;
  else
    return S(f);
}
/// Whether storage x is finite (exponent bits not all ones), without converting.
template <class S>
[[nodiscard]] BATON_HD inline bool storage_finite(S x) noexcept {
  if constexpr (std::is_same_v<S, float>)
    return (float_bits(x) & 0x7f800000u) != 0x7f800000u;
  else if constexpr (std::is_same_v<S, bfloat16>)
    return (x.bits & 0x7f80u) != 0x7f80u;
  else
    return (x.bits & 0x7c00u) != 0x7c00u;
}
}  // namespace detail::core

}  // namespace baton
