// baton/detail/shape_text.hpp — a shape as every layer's error messages print it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace baton::detail {

/// "[2, 128, 8, 64]".
inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace baton::detail
