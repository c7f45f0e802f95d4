// baton/cp/detail/cuda_elementwise.hpp — what one thread of cuda_device_memory's kernels does
// (cp/detail/cuda_kernels.cuh): decode a linear index into a strided 4-D view, convert an
// element, merge one row of partial attention results. Host-and-device functions with no
// CUDA dependency, so that the CPU tests run exactly the code the kernels run, over every
// index, against host_memory (tests/cp/test_cp_cuda_elementwise.cpp).
#pragma once

#include <baton/core/cuda_annotations.hpp>
#include <baton/core/float16.hpp>
#include <baton/core/layout.hpp>
#include <baton/cp/detail/bshd.hpp>
#include <baton/cp/merge.hpp>

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace baton::detail::cp::cuda {

// The offset of row r of the [b, s, h] row grid of `grid` (its inner axis ignored) in a view
// whose strides are `at`'s: the merge walks an output and its LSE by the output's rows.
BATON_HD inline std::int64_t row_offset(std::int64_t r, const strided_layout<4>& grid, const strided_layout<4>& at) {
  const strided_layout<4> rows{{grid.extents[0], grid.extents[1], grid.extents[2], 1}, at.strides};
  return rows.offset_of_element(r);
}

// Element conversions: arithmetic types by static_cast; a 16-bit storage struct (baton::
// bfloat16 / float16: explicit conversions from and to float) through float.
template <class To, class From>
BATON_HD inline To convert(From v) {
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
BATON_HD inline void copy_element(const U* src, const strided_layout<4>& s, T* dst, const strided_layout<4>& d, std::int64_t i,
                                     bool through_accumulator) {
  const U v = src[s.offset_of_element(i)];
  T& out = dst[d.offset_of_element(i)];
  if (through_accumulator)
    out = convert<T>(A(0) + convert<A>(v));
  else
    out = convert<T>(v);
}

// acc[i] += A(src[i]).
template <class A, class T>
BATON_HD inline void accumulate_element(A* acc, const strided_layout<4>& a, const T* src, const strided_layout<4>& s, std::int64_t i) {
  acc[a.offset_of_element(i)] += convert<A>(src[s.offset_of_element(i)]);
}

template <class A>
BATON_HD inline A exp_of(A x) {
#if BATON_CUDA_DEVICE_PASS()
  if constexpr (std::is_same_v<A, float>)
    return expf(x);
  else
    return exp(x);
#else
  return std::exp(x);
#endif
}
template <class A>
BATON_HD inline A log1p_of(A x) {
#if BATON_CUDA_DEVICE_PASS()
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
BATON_HD inline void merge_row_element(A* out, const strided_layout<4>& o, A* lse, const strided_layout<4>& l, const T* out_b,
                                          const strided_layout<4>& ob, const L* lse_b, const strided_layout<4>& lb, std::int64_t r) {
  const std::int64_t dim = o.extents[3];
  A* o_row = out + row_offset(r, o, o);
  A& lse_a = lse[row_offset(r, o, l)];
  const T* b_row = out_b + row_offset(r, o, ob);
  const A lse_bv = convert<A>(lse_b[row_offset(r, o, lb)]);
  const A neg_inf = -static_cast<A>(INFINITY);
  if (lse_bv == neg_inf) return;  // the block saw no key for this row
  if (lse_a == neg_inf) {         // first block with a key for this row: take it as it is
    for (std::int64_t x = 0; x < dim; ++x) o_row[x * o.strides[3]] = convert<A>(b_row[x * ob.strides[3]]);
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
    A& v = o_row[x * o.strides[3]];
    v -= weight_b * (v - convert<A>(b_row[x * ob.strides[3]]));
  }
  const A y = lse_a - lse_bv;  // log_sigmoid(y) = min(y, 0) - log1p(exp(-|y|))
  const A log_sigmoid = (y < A(0) ? y : A(0)) - log1p_of(exp_of(y < A(0) ? y : -y));
  lse_a -= log_sigmoid;
}

}  // namespace baton::detail::cp::cuda
