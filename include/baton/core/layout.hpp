// baton/core/layout.hpp — where element (i0, ..., iN-1) of a strided N-dimensional tensor
// lives: the one layout of every view in baton (tensor_view, context parallelism's shards and
// buffers, the CUDA kernels' operands).
//
// A layout is extents and strides in elements, like std::mdspan's layout_stride::mapping
// (which g++ 12 lacks) without its compile-time extents: baton's shapes are all known at run
// time. Unlike CuTe's Layout it is not hierarchical; attention's [batch, seq, heads, dim]
// needs no nesting. The operations are the ones baton's code does: the offset of an index,
// of a linear (row-major) element number, slicing one axis, and reordering the axes (the
// LSE, stored [batch, heads, seq], is walked as [batch, seq, heads]).
//
// The members are usable in CUDA device code: they are BATON_HD and constexpr; their
// std::array accesses need nvcc's --expt-relaxed-constexpr, which baton::cuda adds for CUDA
// sources.
#pragma once

#include <baton/core/cuda_annotations.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace baton {

/// Extents and strides (in elements) of an N-dimensional strided tensor.
///
/// Example:
/// ```cpp
///   auto l = baton::strided_layout<3>::row_major({2, 3, 4});  // strides {12, 4, 1}
///   // l.offset(1, 2, 3) == 23; l.sliced(1, 2).extents == {2, 2, 4}
/// ```
template <std::size_t N>
struct strided_layout {
  static_assert(N >= 1, "baton::strided_layout needs at least one dimension");

  std::array<std::int64_t, N> extents{};
  std::array<std::int64_t, N> strides{};

  static constexpr std::size_t rank() noexcept { return N; }

  /// Row-major (C order) strides for `extents`: the last index is fastest.
  [[nodiscard]] static constexpr strided_layout row_major(const std::array<std::int64_t, N>& extents) noexcept {
    strided_layout l{extents, {}};
    std::int64_t s = 1;
    for (std::size_t d = N; d-- > 0;) {
      l.strides[d] = s;
      s *= extents[d];
    }
    return l;
  }

  [[nodiscard]] BATON_HD constexpr std::int64_t extent(std::size_t d) const noexcept { return extents[d]; }
  [[nodiscard]] BATON_HD constexpr std::int64_t stride(std::size_t d) const noexcept { return strides[d]; }

  /// Number of elements (the product of the extents).
  [[nodiscard]] BATON_HD constexpr std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (std::size_t d = 0; d < N; ++d) n *= extents[d];
    return n;
  }

  /// True when the elements are row-major without gaps (an axis of extent 1 has any stride).
  [[nodiscard]] constexpr bool is_contiguous() const noexcept {
    std::int64_t expected = 1;
    for (std::size_t d = N; d-- > 0;) {
      if (extents[d] != 1 && strides[d] != expected) return false;
      expected *= extents[d];
    }
    return true;
  }

  /// Where element (index...) is, in elements from the first.
  template <class... I>
    requires(sizeof...(I) == N && (std::is_integral_v<I> && ...))
  [[nodiscard]] BATON_HD constexpr std::int64_t offset(I... index) const noexcept {
    const std::int64_t idx[N] = {static_cast<std::int64_t>(index)...};
    std::int64_t at = 0;
    for (std::size_t d = 0; d < N; ++d) at += idx[d] * strides[d];
    return at;
  }

  /// Where the element numbered `i` in row-major order over the extents is: how an
  /// element-wise kernel walks a strided tensor with one index per thread.
  [[nodiscard]] BATON_HD constexpr std::int64_t offset_of_element(std::int64_t i) const noexcept {
    std::int64_t at = 0;
    for (std::size_t d = N; d-- > 1;) {
      at += (i % extents[d]) * strides[d];
      i /= extents[d];
    }
    return at + i * strides[0];
  }

  /// The layout of `count` consecutive indices of `axis` (the first one's offset is
  /// start * stride(axis): tensor_view::slice adds it to the pointer).
  [[nodiscard]] constexpr strided_layout sliced(std::size_t axis, std::int64_t count) const noexcept {
    strided_layout l = *this;
    l.extents[axis] = count;
    return l;
  }

  /// The axes reordered: axis d of the result is axis `order[d]` of this layout.
  [[nodiscard]] constexpr strided_layout permuted(const std::array<std::size_t, N>& order) const noexcept {
    strided_layout l;
    for (std::size_t d = 0; d < N; ++d) {
      l.extents[d] = extents[order[d]];
      l.strides[d] = strides[order[d]];
    }
    return l;
  }

  friend constexpr bool operator==(const strided_layout&, const strided_layout&) = default;
};

}  // namespace baton
