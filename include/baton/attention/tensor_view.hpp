// baton/attention/tensor_view.hpp — a non-owning strided view: pointer, extents, strides.
//
// g++ 12 has no std::mdspan; attention kernels only need "where is element (i, j, k, l)", so
// this is the smallest type that says it. Strides are in elements, not bytes.
#pragma once

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
  std::array<std::int64_t, N> extents{};
  std::array<std::int64_t, N> strides{};  // in elements

  using element_type = T;
  using value_type = std::remove_cv_t<T>;
  static constexpr std::size_t rank() noexcept { return N; }

  [[nodiscard]] constexpr std::int64_t extent(std::size_t d) const noexcept { return extents[d]; }
  [[nodiscard]] constexpr std::int64_t stride(std::size_t d) const noexcept { return strides[d]; }

  /// Number of elements viewed (product of the extents).
  [[nodiscard]] constexpr std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (auto e : extents) n *= e;
    return n;
  }

  /// True when the elements are laid out row-major without gaps (the last index is fastest).
  [[nodiscard]] constexpr bool is_contiguous() const noexcept {
    std::int64_t expected = 1;
    for (std::size_t d = N; d-- > 0;) {
      if (extents[d] != 1 && strides[d] != expected) return false;
      expected *= extents[d];
    }
    return true;
  }

  template <class... I>
    requires(sizeof...(I) == N && (std::is_integral_v<I> && ...))
  [[nodiscard]] constexpr T& operator()(I... index) const noexcept {
    const std::array<std::int64_t, N> idx{static_cast<std::int64_t>(index)...};
    std::int64_t offset = 0;
    for (std::size_t d = 0; d < N; ++d) offset += idx[d] * strides[d];
    return data[offset];
  }

  /// A view of T converts to a view of const T (outputs can be passed where inputs are read).
  /// A template, so that a view of const T has no conversion to its own type, which nvcc
  /// warns about (#554) even when a constraint removes it.
  template <class U>
    requires(std::is_same_v<U, T> && !std::is_const_v<T>)
  constexpr operator tensor_view<const U, N>() const noexcept {
    return {data, extents, strides};
  }
};

/// Row-major (C order) strides for the given extents.
template <std::size_t N>
[[nodiscard]] constexpr std::array<std::int64_t, N> row_major_strides(
    const std::array<std::int64_t, N>& extents) noexcept {
  std::array<std::int64_t, N> strides{};
  std::int64_t s = 1;
  for (std::size_t d = N; d-- > 0;) {
    strides[d] = s;
    s *= extents[d];
  }
  return strides;
}

/// A contiguous row-major view of `data` with the given extents: `make_tensor_view(p, {b, s, h, d})`.
template <class T, std::size_t N>
[[nodiscard]] constexpr tensor_view<T, N> make_tensor_view(T* data, const std::int64_t (&extents)[N]) noexcept {
  std::array<std::int64_t, N> e{};
  for (std::size_t d = 0; d < N; ++d) e[d] = extents[d];
  return {data, e, row_major_strides(e)};
}

template <class T, std::size_t N>
[[nodiscard]] constexpr tensor_view<T, N> make_tensor_view(T* data, const std::array<std::int64_t, N>& extents) noexcept {
  return {data, extents, row_major_strides(extents)};
}

/// A strided view: element (i...) is at data[sum(i_d * strides[d])].
template <class T, std::size_t N>
[[nodiscard]] constexpr tensor_view<T, N> make_tensor_view(T* data, const std::array<std::int64_t, N>& extents,
                                                           const std::array<std::int64_t, N>& strides) noexcept {
  return {data, extents, strides};
}

}  // namespace baton
