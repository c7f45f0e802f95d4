// baton/nn/detail/checks.hpp — the shape checks every piece of the model layer makes, with
// one wording: "<piece>: <tensor> has shape [..] but expected [..] (<why>)".
#pragma once

#include <baton/core/sizes.hpp>
#include <baton/nn/error.hpp>
#include <baton/payload/host_tensor.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace baton::detail::nn {

[[noreturn]] inline void shape_mismatch(std::string_view piece, std::string_view tensor,
                                        std::span<const std::int64_t> got, std::string_view expected,
                                        std::string_view why) {
  std::string msg(piece);
  msg += ": ";
  msg += tensor;
  msg += " has shape " + core::shape_text(got) + " but expected ";
  msg += expected;
  if (!why.empty()) {
    msg += " (";
    msg += why;
    msg += ")";
  }
  throw baton::nn::nn_error(msg);
}

/// Rows of a tensor [..., features] (the product of its leading extents); throws when its last
/// extent is not `features`.
template <class T>
std::int64_t rows_of(const host_tensor<T>& x, std::int64_t features, std::string_view piece, std::string_view tensor,
                     std::string_view why) {
  if (x.rank() < 1 || x.shape().back() != features)
    shape_mismatch(piece, tensor, x.shape(), "[..., " + std::to_string(features) + "]", why);
  return features == 0 ? 0 : x.size() / features;
}

/// Throws unless `x` has exactly `expected`'s shape.
template <class T>
void expect_shape(const host_tensor<T>& x, const std::vector<std::int64_t>& expected, std::string_view piece,
                  std::string_view tensor, std::string_view why) {
  if (x.shape() != expected) shape_mismatch(piece, tensor, x.shape(), core::shape_text(expected), why);
}

/// `shape` with its last extent replaced.
inline std::vector<std::int64_t> with_last(std::vector<std::int64_t> shape, std::int64_t last) {
  shape.back() = last;
  return shape;
}

}  // namespace baton::detail::nn
