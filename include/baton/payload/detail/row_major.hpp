// baton/payload/detail/row_major.hpp — slice and concatenate contiguous row-major buffers.
//
// Shared by host_tensor, row_major_payload_traits and the Kokkos adapter. A row-major tensor sliced along dim d is
// `outer` blocks (the product of the extents before d) of `count * inner` contiguous elements,
// so slicing along dim 0 is a single memcpy and any other dim is one memcpy per outer block.
#pragma once

#include <baton/core/float16.hpp>
#include <baton/core/sizes.hpp>
#include <baton/payload/traits.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton::detail::payload {

// The element types baton's own tensors hold (host_tensor, cuda::device_tensor): bfloat16 is
// storage (saved activations and messages of the model layer's bf16 storage), no arithmetic.
template <class T>
inline constexpr bool own_tensor_element_v = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                             std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> ||
                                             std::is_same_v<T, bfloat16>;

// Number of elements of a shape, or a payload_error naming the problem (core/sizes.hpp).
inline std::int64_t checked_element_count(std::span<const std::int64_t> shape, std::string_view what,
                                          std::size_t element_size = 1) {
  return core::checked_element_count<payload_error>(shape, what, element_size);
}

struct row_major_split {
  std::int64_t outer;  // product of extents before dim
  std::int64_t inner;  // product of extents after dim
};

// Only called with the shape of a tensor that exists (its element count was checked), so the
// partial products cannot overflow; an empty tensor is {0, 0}: nothing to copy, and the
// partial products of its other extents may not even fit in std::int64_t.
inline row_major_split split_at(std::span<const std::int64_t> shape, int dim) {
  if (std::find(shape.begin(), shape.end(), std::int64_t{0}) != shape.end()) return {0, 0};
  const auto product = [](std::span<const std::int64_t> extents) {
    std::int64_t p = 1;
    for (auto e : extents) p *= e;
    return p;
  };
  const auto d = static_cast<std::size_t>(dim);
  return {product(shape.first(d)), product(shape.subspan(d + 1))};
}

// A result shape with the dim it was computed along, normalised (0 <= dim < rank).
struct shape_along {
  int dim;
  std::vector<std::int64_t> shape;
};

// Checks that rows [begin, begin + count) along dim lie inside `shape` and returns the
// normalised dim with the sliced shape; throws a payload_error naming `what`.
inline shape_along checked_slice_shape(std::span<const std::int64_t> shape, int dim,
                                                 std::int64_t begin, std::int64_t count,
                                                 std::string_view what) {
  const int d = normalise_dim(dim, shape.size(), what);
  const auto extent = shape[static_cast<std::size_t>(d)];
  if (begin < 0 || count < 0 || begin > extent || count > extent - begin) {
    throw payload_error(std::string(what) + ": rows " + row_range_text(begin, count) + " along dim " +
                        std::to_string(d) + " are outside shape " + core::shape_text(shape));
  }
  std::vector<std::int64_t> out(shape.begin(), shape.end());
  out[static_cast<std::size_t>(d)] = count;
  return {d, std::move(out)};
}

// Copies rows [begin, begin + count) along dim of `src` (shape `shape`) into `dst`, which
// holds exactly the sliced tensor. Sizes are in elements of `element_size` bytes.
inline void row_major_slice(const std::byte* src, std::span<const std::int64_t> shape, int dim,
                            std::int64_t begin, std::int64_t count, std::size_t element_size,
                            std::byte* dst) {
  const auto [outer, inner] = split_at(shape, dim);
  const std::int64_t extent = shape[static_cast<std::size_t>(dim)];
  const auto block = static_cast<std::size_t>(count * inner) * element_size;
  if (block == 0) return;
  for (std::int64_t o = 0; o < outer; ++o) {
    const auto from = static_cast<std::size_t>((o * extent + begin) * inner) * element_size;
    std::memcpy(dst + static_cast<std::size_t>(o) * block, src + from, block);
  }
}

// The shape of concatenating `parts` along dim (with dim normalised), or a payload_error
// naming the first part whose rank or other extents disagree with part 0.
inline shape_along concat_shape(std::span<const std::vector<std::int64_t>> shapes, int dim,
                                           std::string_view what) {
  if (shapes.empty()) {
    throw payload_error(std::string(what) + ": nothing to concatenate (no parts)");
  }
  std::vector<std::int64_t> out = shapes[0];
  const int d = normalise_dim(dim, out.size(), what);
  out[static_cast<std::size_t>(d)] = 0;
  for (std::size_t p = 0; p < shapes.size(); ++p) {
    const auto& s = shapes[p];
    bool ok = s.size() == shapes[0].size();
    for (std::size_t i = 0; ok && i < s.size(); ++i) {
      ok = static_cast<int>(i) == d || s[i] == shapes[0][i];
    }
    if (!ok) {
      throw payload_error(std::string(what) + ": part " + std::to_string(p) + " has shape " +
                          core::shape_text(s) + " but part 0 has " + core::shape_text(shapes[0]) +
                          "; parts must agree on every extent except along dim " + std::to_string(d));
    }
    const auto rows = s[static_cast<std::size_t>(d)];
    auto& total = out[static_cast<std::size_t>(d)];
    if (rows > std::numeric_limits<std::int64_t>::max() - total) {
      throw payload_error(std::string(what) + ": concatenating part " + std::to_string(p) + " of shape " +
                          core::shape_text(s) + " overflows the extent along dim " + std::to_string(d) +
                          " (the parts' extents sum past " + std::to_string(std::numeric_limits<std::int64_t>::max()) +
                          "); check the parts' shapes");
    }
    total += rows;
  }
  return {d, std::move(out)};
}

// The parts of a concatenation as row_major_concat and concat_copies take them: each part's
// extents and its first byte, read through the tensor type's traits (shape and bytes).
struct concat_sources {
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<const std::byte*> data;
};

template <class Traits, class T>
concat_sources sources_of(std::span<const T* const> parts) {
  concat_sources out;
  out.shapes.reserve(parts.size());
  out.data.reserve(parts.size());
  for (const T* part : parts) {
    const auto& extents = Traits::shape(*part);
    out.shapes.emplace_back(extents.begin(), extents.end());
    out.data.push_back(Traits::bytes(*part).data());
  }
  return out;
}

// Concatenates row-major buffers along dim into dst (shape `result_shape`).
inline void row_major_concat(std::span<const std::byte* const> parts,
                             std::span<const std::vector<std::int64_t>> shapes, int dim,
                             std::span<const std::int64_t> result_shape, std::size_t element_size,
                             std::byte* dst) {
  const auto [outer, inner] = split_at(result_shape, dim);
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::size_t p = 0; p < parts.size(); ++p) {
      const auto block =
          static_cast<std::size_t>(shapes[p][static_cast<std::size_t>(dim)] * inner) * element_size;
      if (block == 0) continue;
      std::memcpy(dst, parts[p] + static_cast<std::size_t>(o) * block, block);
      dst += block;
    }
  }
}

// Concatenates contiguous row-major host tensors of type T along dim, through their traits
// (shape, bytes, mutable_bytes, value_type), into allocate(shape), whose elements need not be
// initialised. Throws a payload_error naming `what` when the parts do not fit together.
template <class Traits, class T, class Allocate>
T concat_through_traits(std::span<const T* const> parts, int dim, std::string_view what, Allocate&& allocate) {
  const concat_sources in = sources_of<Traits>(parts);
  const auto [d, shape] = concat_shape(in.shapes, dim, what);
  T out = allocate(shape);
  row_major_concat(in.data, in.shapes, d, shape, sizeof(typename Traits::value_type),
                   Traits::mutable_bytes(out).data());
  return out;
}

}  // namespace baton::detail::payload
