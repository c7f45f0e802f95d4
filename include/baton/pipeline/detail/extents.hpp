// baton/pipeline/detail/extents.hpp — a tensor's extents as the executor reads them on every
// transfer and gradient: without copying them (tensor_shape returns a new vector). Their byte
// count is core::byte_count's, which builds no message unless there is an error.
#pragma once

#include <baton/payload/traits.hpp>

#include <cstdint>
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

}  // namespace baton::detail::pipeline
