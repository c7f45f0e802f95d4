// baton/core/hash.hpp — the hashes baton uses: FNV-1a over bytes, splitmix64's finaliser,
// and an order-dependent hasher over words and strings for the fingerprints ranks compare
// (a program, a sharding, a mask). None is cryptographic: they tell apart honest
// differences (another schedule, another window size), not crafted ones.
#pragma once

#include <cstdint>
#include <string_view>

namespace baton::detail::core {

inline constexpr std::uint64_t fnv_offset_basis = 0xcbf29ce484222325ULL;
inline constexpr std::uint64_t fnv_prime = 0x100000001b3ULL;

/// FNV-1a over the bytes of `text`, continuing from `h`.
[[nodiscard]] constexpr std::uint64_t fnv1a(std::string_view text, std::uint64_t h = fnv_offset_basis) noexcept {
  for (char c : text) h = (h ^ static_cast<unsigned char>(c)) * fnv_prime;
  return h;
}

/// splitmix64's step and finaliser: a bijection of the 64-bit words that scrambles every bit
/// (counter-based random numbers: splitmix64(seed + i)).
[[nodiscard]] constexpr std::uint64_t splitmix64(std::uint64_t z) noexcept {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// An order-dependent hash of a sequence of words and strings: what ranks exchange to check
/// that they hold the same thing without sending the thing.
class hasher {
 public:
  constexpr explicit hasher(std::uint64_t seed = fnv_offset_basis) noexcept : h_(seed) {}

  constexpr hasher& add(std::uint64_t word) noexcept {
    h_ = splitmix64(h_ ^ word);
    return *this;
  }
  /// The text's bytes and its length (so "ab" + "c" differs from "a" + "bc").
  constexpr hasher& add(std::string_view text) noexcept {
    add(fnv1a(text));
    return add(text.size());
  }
  /// The hash as a non-negative std::int64_t, the word type of every agreement.
  [[nodiscard]] constexpr std::int64_t value() const noexcept { return static_cast<std::int64_t>(h_ >> 1); }

 private:
  std::uint64_t h_;
};

}  // namespace baton::detail::core
