// baton/pipeline/detail/extents.hpp — a tensor's extents and byte count as the executor reads
// them on every transfer and gradient: without copying the extents (tensor_shape returns a
// new vector) and without building an error message unless there is an error.
#pragma once

#include <baton/payload/traits.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

namespace baton::detail::pipeline {

// Calls f with the extents of a tensor leaf as a random-access range of integers, without
// copying them; a leaf that is not a tensor has none.
template <class T, class F>
decltype(auto) with_extents(const T& t, F&& f) {
  if constexpr (tensor_payload<T>) {
    const auto& shape = payload_traits<T>::shape(t);
    return f(shape);
  } else {
    return f(std::span<const std::int64_t>{});
  }
}

// The bytes a tensor of `shape` holds at `element_bytes` per element, in `bytes`; false when an
// extent is negative or the count overflows std::ptrdiff_t (the caller then asks
// payload::checked_element_count for the message that says which).
template <class Extents>
bool tensor_byte_count(const Extents& shape, std::int64_t element_bytes, std::int64_t& bytes) noexcept {
  const auto max_bytes = static_cast<std::uint64_t>(std::numeric_limits<std::ptrdiff_t>::max());
  bool empty = false;
  for (auto e : shape) {
    if (static_cast<std::int64_t>(e) < 0) return false;
    empty = empty || e == 0;
  }
  if (empty) {
    bytes = 0;
    return true;
  }
  auto n = static_cast<std::uint64_t>(element_bytes);
  for (auto e : shape) {
    const auto extent = static_cast<std::uint64_t>(e);
    if (n > max_bytes / extent) return false;
    n *= extent;
  }
  bytes = static_cast<std::int64_t>(n);
  return true;
}

}  // namespace baton::detail::pipeline
