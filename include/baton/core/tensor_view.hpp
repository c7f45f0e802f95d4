// baton/core/tensor_view.hpp — a non-owning strided view: a pointer and a strided_layout.
//
// What attention backends, context parallelism and the CUDA kernels read and write: g++ 12
// has no std::mdspan, and these layers need only "where is element (i, j, k, l)" and slices
// of one axis.
#pragma once

#include <baton/core/cuda_annotations.hpp>
#include <baton/core/layout.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace baton {

/// A rank-N view of elements of type T (const T for read-only). Non-owning: whoever made the
/// memory keeps it alive while the view is used.
///
/// Example:
/// ```cpp
///   std::vector<float> q(2 * 128 * 8 * 64);
///   auto view = baton::make_tensor_view(q.data(), {2, 128, 8, 64});  // [batch, seq, heads, dim]
///   view(1, 5, 3, 0) = 1.0f;
/// ```
template <class T, std::size_t N>
struct tensor_view {
  static_assert(N >= 1, "baton::tensor_view needs at least one dimension");

  T* data = nullptr;
  strided_layout<N> layout{};

  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  static constexpr std::size_t rank() noexcept { return N; }

  [[nodiscard]] constexpr const std::array<std::int64_t, N>& extents() const noexcept { return layout.extents; }
  [[nodiscard]] constexpr const std::array<std::int64_t, N>& strides() const noexcept { return layout.strides; }
  [[nodiscard]] BATON_HD constexpr std::int64_t extent(std::size_t d) const noexcept { return layout.extent(d); }
  [[nodiscard]] BATON_HD constexpr std::int64_t stride(std::size_t d) const noexcept { return layout.stride(d); }

  /// Number of elements viewed (product of the extents).
  [[nodiscard]] BATON_HD constexpr std::int64_t size() const noexcept { return layout.size(); }

  /// True when the elements are laid out row-major without gaps (the last index is fastest).
  [[nodiscard]] constexpr bool is_contiguous() const noexcept { return layout.is_contiguous(); }

  template <class... I>
    requires(sizeof...(I) == N && (std::is_integral_v<I> && ...))
  [[nodiscard]] BATON_HD constexpr T& operator()(I... index) const noexcept {
    return data[layout.offset(index...)];
  }

  /// The indices [start, start + count) of `axis`.
  [[nodiscard]] constexpr tensor_view slice(std::size_t axis, std::int64_t start, std::int64_t count) const noexcept {
    return {data + start * layout.strides[axis], layout.sliced(axis, count)};
  }

  /// The same view, read-only.
  [[nodiscard]] constexpr tensor_view<const T, N> as_const() const noexcept { return {data, layout}; }

  /// A view of T converts to a view of const T (outputs can be passed where inputs are read).
  /// A template, so that a view of const T has no conversion to its own type, which nvcc
  /// warns about (#554) even when a constraint removes it.
  template <class U>
    requires(std::is_same_v<U, T> && !std::is_const_v<T>)
  constexpr operator tensor_view<const U, N>() const noexcept {
    return {data, layout};
  }
};

/// Row-major (C order) strides for the given extents.
template <std::size_t N>
[[nodiscard]] constexpr std::array<std::int64_t, N> row_major_strides(const std::array<std::int64_t, N>& extents) noexcept {
  return strided_layout<N>::row_major(extents).strides;
}

/// A contiguous row-major view of `data` with the given extents: `make_tensor_view(p, {b, s, h, d})`.
template <class T, std::size_t N>
[[nodiscard]] constexpr tensor_view<T, N> make_tensor_view(T* data, const std::int64_t (&extents)[N]) noexcept {
  std::array<std::int64_t, N> e{};
  for (std::size_t d = 0; d < N; ++d) e[d] = extents[d];
  return {data, strided_layout<N>::row_major(e)};
}

template <class T, std::size_t N>
[[nodiscard]] constexpr tensor_view<T, N> make_tensor_view(T* data, const std::array<std::int64_t, N>& extents) noexcept {
  return {data, strided_layout<N>::row_major(extents)};
}

/// A strided view: element (i...) is at data[sum(i_d * strides[d])].
template <class T, std::size_t N>
[[nodiscard]] constexpr tensor_view<T, N> make_tensor_view(T* data, const std::array<std::int64_t, N>& extents,
                                                           const std::array<std::int64_t, N>& strides) noexcept {
  return {data, {extents, strides}};
}

}  // namespace baton
