// baton/attention/positions.hpp — which global token positions a tensor's sequence axis holds.
//
// Masks are functions of *global* positions. When context parallelism shards a sequence, a
// rank's query and key tensors hold some of the positions (a contiguous chunk, two chunks
// for zigzag, every P-th token for striped); the backend is told which, and the mask is
// never re-sharded.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>

#include <baton/attention/error.hpp>

namespace baton {

/// The global positions of the rows of a sequence axis: either the range
/// begin, begin+1, ..., begin+count-1, or a list of indices (not owned: keep it alive while
/// the positions are used). Default-constructed positions mean "0, 1, ..., n-1 where n is the
/// length of the tensor" — plain single-device attention.
///
/// Example:
/// ```cpp
///   baton::positions all;                          // 0..n-1, n from the tensor
///   baton::positions chunk(4096, 1024);            // positions 4096..5119
///   std::vector<std::int64_t> zigzag = {0, 1, 6, 7};  // chunks 0 and 3 of a zigzag shard
///   auto shard = baton::positions::list(zigzag);
/// ```
class positions {
 public:
  /// 0, 1, ..., n-1, with n taken from the tensor the positions describe.
  constexpr positions() noexcept = default;

  /// begin, begin+1, ..., begin+count-1.
  constexpr positions(std::int64_t begin, std::int64_t count) : first_(begin), count_(count) {
    if (count < 0) throw attention_error("baton::positions: count must be >= 0, got " + std::to_string(count));
    if (begin < 0) throw attention_error("baton::positions: begin must be >= 0, got " + std::to_string(begin));
  }

  /// An explicit list of positions (any order, no repeats required). Not owned.
  explicit constexpr positions(std::span<const std::int64_t> indices)
      : count_(static_cast<std::int64_t>(indices.size())), list_(indices.data()) {}

  [[nodiscard]] static constexpr positions range(std::int64_t begin, std::int64_t count) {
    return positions(begin, count);
  }
  [[nodiscard]] static constexpr positions list(std::span<const std::int64_t> indices) {
    return positions(indices);
  }

  /// True for default-constructed positions, whose length comes from the tensor.
  [[nodiscard]] constexpr bool is_unsized() const noexcept { return count_ < 0; }
  [[nodiscard]] constexpr bool is_range() const noexcept { return list_ == nullptr; }
  [[nodiscard]] constexpr bool is_list() const noexcept { return list_ != nullptr; }

  /// Number of positions (only meaningful when !is_unsized(); see resolved()).
  [[nodiscard]] constexpr std::int64_t size() const noexcept { return count_ < 0 ? 0 : count_; }

  /// The i-th position (0 <= i < size()).
  [[nodiscard]] constexpr std::int64_t operator[](std::int64_t i) const noexcept {
    return list_ ? list_[i] : first_ + i;
  }

  /// First position of a range (0 for a list).
  [[nodiscard]] constexpr std::int64_t range_begin() const noexcept { return list_ ? 0 : first_; }
  [[nodiscard]] constexpr std::span<const std::int64_t> indices() const noexcept {
    return list_ ? std::span<const std::int64_t>(list_, static_cast<std::size_t>(count_))
                 : std::span<const std::int64_t>();
  }

  /// These positions for a tensor of `length` rows: unsized positions become 0..length-1; a
  /// sized one must hold exactly `length` positions (else attention_error naming `what`).
  [[nodiscard]] positions resolved(std::int64_t length, const char* what) const {
    if (is_unsized()) return positions(0, length);
    if (count_ != length)
      throw attention_error(std::string("baton attention: ") + what + " lists " + std::to_string(count_) +
                            " positions but the tensor's sequence axis has " + std::to_string(length) +
                            " rows; give one global position per row");
    if (list_) {
      for (std::int64_t i = 0; i < count_; ++i)
        if (list_[i] < 0)
          throw attention_error(std::string("baton attention: ") + what + "[" + std::to_string(i) + "] = " +
                                std::to_string(list_[i]) + " is negative; positions are >= 0");
    }
    return *this;
  }

 private:
  std::int64_t first_ = 0;
  std::int64_t count_ = -1;
  const std::int64_t* list_ = nullptr;
};

/// A block of consecutive rows [offset, offset+size) of a positions object, as a kernel
/// tiles it, with the smallest and largest position in it. Masks classify pairs of blocks.
class position_block {
 public:
  constexpr position_block() noexcept = default;

  constexpr position_block(const positions& source, std::int64_t offset, std::int64_t count) noexcept
      : source_(&source), offset_(offset), count_(count) {
    if (count <= 0) return;
    if (source.is_range()) {
      min_ = source[offset];
      max_ = source[offset + count - 1];
      contiguous_ = true;
      return;
    }
    min_ = max_ = source[offset];
    bool ascending_by_one = true;
    for (std::int64_t i = 1; i < count; ++i) {
      const std::int64_t p = source[offset + i];
      min_ = std::min(min_, p);
      max_ = std::max(max_, p);
      ascending_by_one = ascending_by_one && p == source[offset + i - 1] + 1;
    }
    contiguous_ = ascending_by_one;
  }

  [[nodiscard]] constexpr std::int64_t size() const noexcept { return count_; }
  [[nodiscard]] constexpr bool empty() const noexcept { return count_ <= 0; }
  /// The i-th position of the block.
  [[nodiscard]] constexpr std::int64_t operator[](std::int64_t i) const noexcept { return (*source_)[offset_ + i]; }
  /// Smallest / largest position in the block (a mask may classify from these alone).
  [[nodiscard]] constexpr std::int64_t min() const noexcept { return min_; }
  [[nodiscard]] constexpr std::int64_t max() const noexcept { return max_; }
  /// True when the block holds min(), min()+1, ..., max() in that order.
  [[nodiscard]] constexpr bool is_contiguous() const noexcept { return contiguous_; }
  /// Row offset of the block in its positions object.
  [[nodiscard]] constexpr std::int64_t offset() const noexcept { return offset_; }

 private:
  const positions* source_ = nullptr;
  std::int64_t offset_ = 0;
  std::int64_t count_ = 0;
  std::int64_t min_ = 0;
  std::int64_t max_ = -1;
  bool contiguous_ = true;
};

}  // namespace baton
