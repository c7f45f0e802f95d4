// baton/cp/detail/cuda_elementwise.hpp — what one thread of cuda_device_memory's kernels does
// (cp/detail/cuda_kernels.cuh): decode a linear index into a strided 4-D view, convert an
// element, merge one row of partial attention results. Host-and-device functions with no
// CUDA dependency, so that the CPU tests run exactly the code the kernels run, over every
// index, against host_memory (tests/cp/test_cp_cuda_elementwise.cpp).
#pragma once

#include <baton/attention/cuda/storage.hpp>
#include <baton/cp/detail/view4.hpp>
#include <baton/cp/merge.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__CUDACC__)
#define BATON_CP_HD __host__ __device__
#else
#define BATON_CP_HD
#endif

namespace baton::detail::cp::cuda {

// A view's shape and strides, passed to a kernel by value.
struct dims4 {
  std::int64_t ext[4];
  std::int64_t str[4];
};

template <class T>
dims4 dims_of(const view4<T>& v) noexcept {
  return {{v.ext[0], v.ext[1], v.ext[2], v.ext[3]}, {v.str[0], v.str[1], v.str[2], v.str[3]}};
}

inline constexpr std::int64_t dims_size(const dims4& d) noexcept { return d.ext[0] * d.ext[1] * d.ext[2] * d.ext[3]; }

// The offset of linear element i (row-major over ext) in a view with strides str.
BATON_CP_HD inline std::int64_t offset_of(std::int64_t i, const std::int64_t (&ext)[4], const std::int64_t (&str)[4]) {
  const std::int64_t x = i % ext[3];
  i /= ext[3];
  const std::int64_t h = i % ext[2];
  i /= ext[2];
  const std::int64_t s = i % ext[1];
  const std::int64_t b = i / ext[1];
  return b * str[0] + s * str[1] + h * str[2] + x * str[3];
}

// The offset of row r (the [b, s, h] row grid of ext, the inner axis ignored).
BATON_CP_HD inline std::int64_t row_offset(std::int64_t r, const std::int64_t (&grid)[4], const std::int64_t (&str)[4]) {
  const std::int64_t row_ext[4] = {grid[0], grid[1], grid[2], 1};
  return offset_of(r, row_ext, str);
}

// Element conversions: arithmetic types by static_cast; a 16-bit storage struct (baton::
// bfloat16 / float16: explicit conversions from and to float) through float.
template <class To, class From>
BATON_CP_HD inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>)
    return v;
  else if constexpr (std::is_arithmetic_v<To> && std::is_arithmetic_v<From>)
    return static_cast<To>(v);
  else if constexpr (std::is_arithmetic_v<From>)
    return To(static_cast<float>(v));
  else if constexpr (std::is_arithmetic_v<To>)
    return static_cast<To>(static_cast<float>(v));
  else
    return To(static_cast<float>(v));
}

// dst[i] = T(src[i]), or T(A(0) + A(src[i])) (cp_copy_mode::through_accumulator).
template <class U, class T, class A>
BATON_CP_HD inline void copy_element(const U* src, const dims4& s, T* dst, const dims4& d, std::int64_t i,
                                     bool through_accumulator) {
  const U v = src[offset_of(i, s.ext, s.str)];
  T& out = dst[offset_of(i, d.ext, d.str)];
  if (through_accumulator)
    out = convert<T>(A(0) + convert<A>(v));
  else
    out = convert<T>(v);
}

// acc[i] += A(src[i]).
template <class A, class T>
BATON_CP_HD inline void accumulate_element(A* acc, const dims4& a, const T* src, const dims4& s, std::int64_t i) {
  acc[offset_of(i, a.ext, a.str)] += convert<A>(src[offset_of(i, s.ext, s.str)]);
}

template <class A>
BATON_CP_HD inline A exp_of(A x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>)
    return expf(x);
  else
    return exp(x);
#else
  return std::exp(x);
#endif
}
template <class A>
BATON_CP_HD inline A log1p_of(A x) {
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same_v<A, float>)
    return log1pf(x);
  else
    return log1p(x);
#else
  return std::log1p(x);
#endif
}

// Row r of merge_row (cp/merge.hpp) in the sigmoid form: out -= sigmoid(lse_b - lse) (out -
// out_b); lse -= log_sigmoid(lse - lse_b). An empty side (lse -inf) is an exact no-op or
// copy, a NaN side makes the row NaN — the host's rule, the host's formula.
template <class A, class T, class L>
BATON_CP_HD inline void merge_row_element(A* out, const dims4& o, A* lse, const dims4& l, const T* out_b,
                                          const dims4& ob, const L* lse_b, const dims4& lb, std::int64_t r) {
  const std::int64_t dim = o.ext[3];
  A* o_row = out + row_offset(r, o.ext, o.str);
  A& lse_a = lse[row_offset(r, o.ext, l.str)];
  const T* b_row = out_b + row_offset(r, o.ext, ob.str);
  const A lse_bv = convert<A>(lse_b[row_offset(r, o.ext, lb.str)]);
  const A neg_inf = -static_cast<A>(INFINITY);
  if (lse_bv == neg_inf) return;  // the block saw no key for this row
  if (lse_a == neg_inf) {         // first block with a key for this row: take it as it is
    for (std::int64_t x = 0; x < dim; ++x) o_row[x * o.str[3]] = convert<A>(b_row[x * ob.str[3]]);
    lse_a = lse_bv;
    return;
  }
  const A diff = lse_bv - lse_a;  // sigmoid(diff), both signs without overflow
  A weight_b;
  if (diff >= A(0)) {
    weight_b = A(1) / (A(1) + exp_of(-diff));
  } else {
    const A e = exp_of(diff);
    weight_b = e / (A(1) + e);
  }
  for (std::int64_t x = 0; x < dim; ++x) {
    A& v = o_row[x * o.str[3]];
    v -= weight_b * (v - convert<A>(b_row[x * ob.str[3]]));
  }
  const A y = lse_a - lse_bv;  // log_sigmoid(y) = min(y, 0) - log1p(exp(-|y|))
  const A log_sigmoid = (y < A(0) ? y : A(0)) - log1p_of(exp_of(y < A(0) ? y : -y));
  lse_a -= log_sigmoid;
}

}  // namespace baton::detail::cp::cuda
