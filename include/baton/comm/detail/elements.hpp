// baton/comm/detail/elements.hpp — the element types all_reduce reduces, named once for every
// backend: the local world compares and prints them, MPI and NCCL index a table of their own
// type names in element_kind's order (as they index their ops in reduce_op's order).
#pragma once

#include <baton/comm/concepts.hpp>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace baton::detail::comm {

/// The reducible element types, in the order of every backend's table.
enum class element_kind : std::int64_t { float32, float64, int32, int64 };

/// T's kind; rejects, with the message every backend's all_reduce gives, a T no backend reduces.
template <class T>
constexpr element_kind element_kind_of() noexcept {
  static_assert(reducible_element<T>,
                "baton: all_reduce supports float, double, std::int32_t and std::int64_t; convert the data "
                "to one of them (or all_gather it and reduce it yourself)");
  if constexpr (std::is_same_v<T, float>) return element_kind::float32;
  else if constexpr (std::is_same_v<T, double>) return element_kind::float64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return element_kind::int32;
  else return element_kind::int64;
}

/// The bytes of one element of `kind` (0 for a value that names no kind).
constexpr std::size_t element_bytes(element_kind kind) noexcept {
  switch (kind) {
    case element_kind::float32:
    case element_kind::int32: return 4;
    case element_kind::float64:
    case element_kind::int64: return 8;
  }
  return 0;
}

/// "float", "double", "std::int32_t", "std::int64_t": for messages.
inline const char* element_name(element_kind kind) noexcept {
  constexpr const char* names[] = {"float", "double", "std::int32_t", "std::int64_t"};
  return names[static_cast<std::size_t>(kind)];
}

}  // namespace baton::detail::comm
