// baton/payload/detail/pitched_copies.hpp — slice and concat of row-major tensors as 2-D
// pitched copies (rows of `width` bytes, `height` of them, each side with its own pitch).
//
// A device tensor cannot be sliced with the host loops of row_major.hpp; one pitched copy
// per slice (and one per part of a concat) is what cudaMemcpy2DAsync executes. The plan is
// plain C++ so that the CPU tests run it with run_on_host against row_major_slice/concat.
#pragma once

#include <baton/payload/detail/row_major.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

namespace baton::detail::payload {

// Copy `height` rows of `width` bytes from src + src_offset (rows src_pitch apart) to
// dst + dst_offset (rows dst_pitch apart). Pitches are at least `width` whenever width > 0.
struct pitched_copy {
  std::size_t dst_offset = 0;
  std::size_t dst_pitch = 0;
  std::size_t src_offset = 0;
  std::size_t src_pitch = 0;
  std::size_t width = 0;
  std::size_t height = 0;

  [[nodiscard]] bool empty() const noexcept { return width == 0 || height == 0; }
};

// `rows` rows along dim (of `inner` elements each, in each of `outer` blocks) from row
// src_row of a tensor with src_extent rows along dim to row dst_row of one with dst_extent.
inline pitched_copy rows_copy(row_major_split blocks, std::int64_t rows, std::int64_t src_row, std::int64_t src_extent,
                              std::int64_t dst_row, std::int64_t dst_extent, std::size_t element_size) {
  const auto bytes = [&](std::int64_t r) { return static_cast<std::size_t>(r * blocks.inner) * element_size; };
  pitched_copy c;
  c.width = bytes(rows);
  c.height = static_cast<std::size_t>(blocks.outer);
  c.src_offset = bytes(src_row);
  c.src_pitch = bytes(src_extent);
  c.dst_offset = bytes(dst_row);
  c.dst_pitch = bytes(dst_extent);
  return c;
}

// Rows [begin, begin + count) along dim of a tensor of `shape` (dim normalised, range checked
// by checked_slice_shape), into a tensor holding exactly the slice.
inline pitched_copy slice_copy(std::span<const std::int64_t> shape, int dim, std::int64_t begin,
                               std::int64_t count, std::size_t element_size) {
  const std::int64_t extent = shape[static_cast<std::size_t>(dim)];
  return rows_copy(split_at(shape, dim), count, begin, extent, 0, count, element_size);
}

// One copy per part: part p lands at its running offset along dim of the result (shape
// `result_shape`, from concat_shape; dim normalised).
inline std::vector<pitched_copy> concat_copies(std::span<const std::vector<std::int64_t>> shapes, int dim,
                                               std::span<const std::int64_t> result_shape, std::size_t element_size) {
  const row_major_split blocks = split_at(result_shape, dim);
  const std::int64_t total = result_shape[static_cast<std::size_t>(dim)];
  std::vector<pitched_copy> copies;
  copies.reserve(shapes.size());
  std::int64_t at = 0;
  for (const auto& s : shapes) {
    const std::int64_t rows = s[static_cast<std::size_t>(dim)];
    copies.push_back(rows_copy(blocks, rows, 0, rows, at, total, element_size));
    at += rows;
  }
  return copies;
}

// Executes a copy with host memcpy: what cudaMemcpy2DAsync does on the device, for tests.
inline void run_on_host(const pitched_copy& c, const std::byte* src, std::byte* dst) {
  if (c.empty()) return;
  for (std::size_t row = 0; row < c.height; ++row) {
    std::memcpy(dst + c.dst_offset + row * c.dst_pitch, src + c.src_offset + row * c.src_pitch, c.width);
  }
}

}  // namespace baton::detail::payload
