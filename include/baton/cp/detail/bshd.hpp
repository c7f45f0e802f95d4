// baton/cp/detail/bshd.hpp — the views the CP layer's data movement works on: dense
// [batch, seq, heads, dim] buffers, and the LSE [batch, heads, seq] seen as [batch, seq,
// heads, 1] with swapped strides, so that one set of copies, accumulations and merges serves
// the outputs and the LSE alike.
#pragma once

#include <baton/core/layout.hpp>
#include <baton/core/tensor_view.hpp>

#include <array>
#include <cstdint>

namespace baton::detail::cp {

// A dense [b, s, h, d] tensor at p.
template <class T>
tensor_view<T, 4> bshd(T* p, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) noexcept {
  return make_tensor_view(p, std::array<std::int64_t, 4>{b, s, h, d});
}

// A [b, s, h, d] view of a buffer stored head-major, [b][h][s][d]: each head's rows one
// after another (Ulysses' gathered tensors on the host: the kernels read a head's rows
// without striding over the other heads).
template <class T>
tensor_view<T, 4> bshd_head_major(T* p, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) noexcept {
  return {p, {{b, s, h, d}, {h * s * d, d, s * d, 1}}};
}

// A [b, s, h, d] buffer at p in either layout: head-major or dense.
template <class T>
tensor_view<T, 4> bshd_stored(bool head_major, T* p, std::int64_t b, std::int64_t s, std::int64_t h,
                              std::int64_t d) noexcept {
  return head_major ? bshd_head_major<T>(p, b, s, h, d) : bshd<T>(p, b, s, h, d);
}

// The same elements with the sequence and head axes swapped ([b, h, s, d]): a copy between
// two head-major views walks each head's rows in storage order.
template <class T>
tensor_view<T, 4> heads_outer(const tensor_view<T, 4>& v) noexcept {
  return {v.data, v.layout.permuted({0, 2, 1, 3})};
}

// A dense LSE [b, h, s] at p.
template <class T>
tensor_view<T, 3> lse_view(T* p, std::int64_t b, std::int64_t h, std::int64_t s) noexcept {
  return make_tensor_view(p, std::array<std::int64_t, 3>{b, h, s});
}

// The LSE [b, h, s] seen as [b, s, h, 1].
template <class T>
tensor_view<T, 4> lse_as_bshd(const tensor_view<T, 3>& v) noexcept {
  const strided_layout<3> bsh = v.layout.permuted({0, 2, 1});
  return {v.data, {{bsh.extents[0], bsh.extents[1], bsh.extents[2], 1}, {bsh.strides[0], bsh.strides[1], bsh.strides[2], 1}}};
}

// A dense LSE [b, h, s] at p, seen as [b, s, h, 1].
template <class T>
tensor_view<T, 4> lse_as_bshd(T* p, std::int64_t b, std::int64_t h, std::int64_t s) noexcept {
  return lse_as_bshd(lse_view(p, b, h, s));
}

// The inverse: a [b, s, h, 1] view of an LSE as the tensor [b, h, s].
template <class T>
tensor_view<T, 3> lse_of_bshd(const tensor_view<T, 4>& v) noexcept {
  const strided_layout<3> bsh{{v.extent(0), v.extent(1), v.extent(2)}, {v.stride(0), v.stride(1), v.stride(2)}};
  return {v.data, bsh.permuted({0, 2, 1})};
}

// A contiguous run of n elements as [1, 1, 1, n].
template <class T>
tensor_view<T, 4> flat_view(T* p, std::int64_t n) noexcept {
  return {p, {{1, 1, 1, n}, {n, n, n, 1}}};
}

}  // namespace baton::detail::cp
