// baton/train/detail/xxh64.hpp — XXH64 (Yann Collet's xxHash, 64-bit, seed 0), streaming: the
// checksum of every checkpoint file. A published algorithm, so `xxhsum -H1 FILE` checks a file
// outside baton; and one that keeps up with a disk (8 bytes per multiply over four independent
// lanes), where FNV-1a's one multiply per byte would take longer than reading the file.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

namespace baton::detail::train {

class xxh64 {
 public:
  xxh64() noexcept { reset(); }

  void reset() noexcept {
    lanes_[0] = p1 + p2;
    lanes_[1] = p2;
    lanes_[2] = 0;
    lanes_[3] = 0ULL - p1;
    total_ = 0;
    buffered_ = 0;
  }

  void update(std::span<const std::byte> data) noexcept {
    const std::byte* p = data.data();
    std::size_t n = data.size();
    total_ += n;
    if (buffered_ > 0) {  // complete the stripe left from the last call first
      const std::size_t take = n < stripe - buffered_ ? n : stripe - buffered_;
      std::memcpy(buffer_ + buffered_, p, take);
      buffered_ += take;
      p += take;
      n -= take;
      if (buffered_ < stripe) return;
      consume(buffer_);
      buffered_ = 0;
    }
    // Four lanes in locals: the compiler keeps them in registers across the loop.
    std::uint64_t v0 = lanes_[0], v1 = lanes_[1], v2 = lanes_[2], v3 = lanes_[3];
    for (; n >= stripe; p += stripe, n -= stripe) {
      v0 = round(v0, read64(p));
      v1 = round(v1, read64(p + 8));
      v2 = round(v2, read64(p + 16));
      v3 = round(v3, read64(p + 24));
    }
    lanes_[0] = v0, lanes_[1] = v1, lanes_[2] = v2, lanes_[3] = v3;
    if (n > 0) {
      std::memcpy(buffer_, p, n);
      buffered_ = n;
    }
  }

  [[nodiscard]] std::uint64_t digest() const noexcept {
    std::uint64_t h;
    if (total_ >= stripe) {
      h = std::rotl(lanes_[0], 1) + std::rotl(lanes_[1], 7) + std::rotl(lanes_[2], 12) + std::rotl(lanes_[3], 18);
      for (std::uint64_t v : lanes_) h = (h ^ round(0, v)) * p1 + p4;
    } else {
      h = lanes_[2] + p5;  // lanes_[2] still holds the seed
    }
    h += total_;
    const std::byte* p = buffer_;
    std::size_t n = buffered_;
    for (; n >= 8; p += 8, n -= 8) h = std::rotl(h ^ round(0, read64(p)), 27) * p1 + p4;
    if (n >= 4) {
      h = std::rotl(h ^ (static_cast<std::uint64_t>(read32(p)) * p1), 23) * p2 + p3;
      p += 4;
      n -= 4;
    }
    for (; n > 0; ++p, --n) h = std::rotl(h ^ (static_cast<std::uint64_t>(static_cast<unsigned char>(*p)) * p5), 11) * p1;
    h ^= h >> 33;
    h *= p2;
    h ^= h >> 29;
    h *= p3;
    h ^= h >> 32;
    return h;
  }

  /// The hash of one buffer.
  [[nodiscard]] static std::uint64_t of(std::span<const std::byte> data) noexcept {
    xxh64 h;
    h.update(data);
    return h.digest();
  }

 private:
  static constexpr std::uint64_t p1 = 0x9E3779B185EBCA87ULL;
  static constexpr std::uint64_t p2 = 0xC2B2AE3D27D4EB4FULL;
  static constexpr std::uint64_t p3 = 0x165667B19E3779F9ULL;
  static constexpr std::uint64_t p4 = 0x85EBCA77C2B2AE63ULL;
  static constexpr std::uint64_t p5 = 0x27D4EB2F165667C5ULL;
  static constexpr std::size_t stripe = 32;

  static std::uint64_t round(std::uint64_t acc, std::uint64_t input) noexcept {
    return std::rotl(acc + input * p2, 31) * p1;
  }
  // XXH64 reads little-endian words; every host baton checkpoints on is little-endian (the
  // safetensors data are written as the host holds them, checked in safetensors.hpp).
  static std::uint64_t read64(const std::byte* p) noexcept {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
  }
  static std::uint32_t read32(const std::byte* p) noexcept {
    std::uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  void consume(const std::byte* p) noexcept {
    for (std::size_t i = 0; i < 4; ++i) lanes_[i] = round(lanes_[i], read64(p + 8 * i));
  }

  std::uint64_t lanes_[4];
  std::uint64_t total_ = 0;
  std::byte buffer_[stripe];
  std::size_t buffered_ = 0;
};

}  // namespace baton::detail::train
