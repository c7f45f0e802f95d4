// baton/core/sizes.hpp — how many elements and bytes a shape holds, checked, and a shape as
// every layer's error messages print it.
//
// A count that wrapped around would allocate too little and let in-range indices write past
// the end, so every layer that allocates or receives from a shape it was given counts
// through here: a negative extent, or an element or byte count beyond the largest object
// (std::ptrdiff_t), is an error with a message, never a small number.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>

namespace baton::detail::core {

/// "[2, 128, 8, 64]".
inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

inline constexpr std::uint64_t max_object_bytes = static_cast<std::uint64_t>(std::numeric_limits<std::ptrdiff_t>::max());

/// The bytes a tensor of `shape` holds at `element_bytes` per element, in `bytes`; false when
/// an extent is negative or the count overflows std::ptrdiff_t (count_problem then says
/// which). A shape with a zero extent holds nothing whatever its other extents. Builds no
/// text: the executor calls it on every transfer.
template <class Extents>
[[nodiscard]] constexpr bool byte_count(const Extents& shape, std::int64_t element_bytes, std::int64_t& bytes) noexcept {
  bool empty = false;
  for (auto e : shape) {
    if (static_cast<std::int64_t>(e) < 0) return false;
    empty = empty || e == 0;
  }
  if (empty) {
    bytes = 0;
    return true;
  }
  auto n = static_cast<std::uint64_t>(std::max<std::int64_t>(element_bytes, 1));
  for (auto e : shape) {
    const auto extent = static_cast<std::uint64_t>(e);
    if (n > max_object_bytes / extent) return false;
    n *= extent;
  }
  bytes = static_cast<std::int64_t>(n);
  return true;
}

/// Why `shape` cannot be allocated at `element_size` bytes per element ("" when it can):
/// `what` names the caller ("baton::host_tensor").
inline std::string count_problem(std::span<const std::int64_t> shape, std::string_view what,
                                 std::size_t element_size = 1) {
  std::int64_t bytes = 0;
  if (byte_count(shape, static_cast<std::int64_t>(element_size), bytes)) return {};
  for (auto e : shape) {
    if (e < 0) return std::string(what) + ": negative extent in shape " + shape_text(shape);
  }
  return std::string(what) + ": shape " + shape_text(shape) + " overflows: its " +
         (element_size > 1 ? "size in bytes (" + std::to_string(element_size) + " per element)"
                           : std::string("number of elements")) +
         " exceeds the largest object size, " + std::to_string(max_object_bytes) +
         "; check the extents (an uninitialised or wrapped-around value?)";
}

/// The number of elements of `shape`; throws Error (the calling layer's error type) with
/// count_problem's message when it cannot be allocated at `element_size` bytes per element.
template <class Error>
std::int64_t checked_element_count(std::span<const std::int64_t> shape, std::string_view what,
                                   std::size_t element_size = 1) {
  std::int64_t bytes = 0;
  if (!byte_count(shape, static_cast<std::int64_t>(element_size), bytes)) throw Error(count_problem(shape, what, element_size));
  return bytes / static_cast<std::int64_t>(std::max<std::size_t>(element_size, 1));
}

}  // namespace baton::detail::core
