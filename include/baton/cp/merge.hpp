// baton/cp/merge.hpp — merging partial attention results (out, lse) computed over disjoint
// key blocks, the step every ring iteration ends with.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <baton/attention/backend.hpp>

namespace baton {

/// The type the context-parallel layer accumulates outputs, LSE and gradients in: the
/// backends' LSE type, fp32 or better (float for float and the 16-bit storage types, double
/// for double). A storage type with an lse_type specialisation needs nothing more;
/// specialise cp_accumulator only to accumulate in another type than the LSE's.
template <class T>
struct cp_accumulator {
  using type = lse_t<T>;
};
template <class T>
using cp_accumulator_t = typename cp_accumulator<std::remove_cv_t<T>>::type;

namespace detail::cp {

// log(sigmoid(x)) without overflow for either sign: min(x, 0) - log1p(exp(-|x|)).
template <class A>
A log_sigmoid(A x) noexcept {
  return std::min(x, A(0)) - std::log1p(std::exp(-std::abs(x)));
}

template <class A>
A sigmoid(A x) noexcept {
  if (x >= A(0)) return A(1) / (A(1) + std::exp(-x));
  const A e = std::exp(x);
  return e / (A(1) + e);
}

// Merges one row: out/lse hold the result over the keys seen so far, (out_b, lse_b) the
// result over a disjoint block of keys. With the sigmoid form the update never forms
// exp(lse) (no overflow) and an empty side (lse -inf: every key masked) is an exact no-op
// or an exact copy, never a NaN from (-inf) - (-inf). A NaN side (a block whose row is NaN
// under the non-finite rule, docs/attention.md) makes the merged row NaN, out and lse: the
// sigmoid and log_sigmoid of a NaN difference are NaN, so no rank's NaN is hidden.
template <class A, class B, class L>
void merge_row(A* out, std::int64_t out_stride, A& lse, const B* out_b, std::int64_t out_b_stride, L lse_b_in,
               std::int64_t dim) noexcept {
  const A lse_b = static_cast<A>(lse_b_in);
  constexpr A neg_inf = -std::numeric_limits<A>::infinity();
  if (lse_b == neg_inf) return;  // the block saw no key for this row
  if (lse == neg_inf) {          // first block with a key for this row: take it as it is
    for (std::int64_t x = 0; x < dim; ++x) out[x * out_stride] = static_cast<A>(out_b[x * out_b_stride]);
    lse = lse_b;
    return;
  }
  const A weight_b = sigmoid(lse_b - lse);
  for (std::int64_t x = 0; x < dim; ++x) {
    A& o = out[x * out_stride];
    o -= weight_b * (o - static_cast<A>(out_b[x * out_b_stride]));
  }
  lse -= log_sigmoid(lse - lse_b);
}

}  // namespace detail::cp

/// Merges a partial attention result over a block of keys into a running result over other,
/// disjoint keys: afterwards (out, lse) is the result over both key sets.
///
///   out -= sigmoid(lse_b - lse) * (out - out_b);   lse -= log_sigmoid(lse - lse_b)
///
/// Rows are `rows` rows of `dim` values, row-major; `out`/`lse` are accumulators of type A
/// (use cp_accumulator_t<T>). A row whose lse is -inf (every key masked) contributes nothing
/// and produces no NaN; the result of merging only empty rows is out 0, lse -inf.
template <class A, class B, class L>
void merge_attention_partial(std::span<A> out, std::span<A> lse, std::span<const B> out_b, std::span<const L> lse_b,
                             std::int64_t dim) {
  static_assert(std::is_floating_point_v<A>, "merge_attention_partial: accumulate in float or double (cp_accumulator_t<T>)");
  if (dim < 1 || out.size() != lse.size() * static_cast<std::size_t>(dim) || out_b.size() != out.size() ||
      lse_b.size() != lse.size()) {
    throw std::invalid_argument("merge_attention_partial: out and out_b need rows x dim values, lse and lse_b rows values (got out " +
                                std::to_string(out.size()) + ", lse " + std::to_string(lse.size()) + ", out_b " +
                                std::to_string(out_b.size()) + ", lse_b " + std::to_string(lse_b.size()) + ", dim " +
                                std::to_string(dim) + ")");
  }
  for (std::size_t r = 0; r < lse.size(); ++r) {
    const auto off = static_cast<std::ptrdiff_t>(r) * dim;
    detail::cp::merge_row(out.data() + off, 1, lse[r], out_b.data() + off, 1, lse_b[r], dim);
  }
}

}  // namespace baton
