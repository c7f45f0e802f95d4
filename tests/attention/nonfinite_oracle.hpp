// The non-finite rule of docs/attention.md, written out on its own: what every backend and
// every context-parallel mode must give when q, k, v (or dout, or the lse handed to backward)
// hold a NaN or an infinity. Shared by tests/attention and tests/cp.
//
// The expected values are the reference backend's on a sanitised copy of the inputs
// (non-finite entries replaced by 0) with NaN written over exactly what the rule poisons:
//   forward: row i (of a batch entry and head) is NaN — out and lse — when some key j the
//     mask allows has a non-finite q_i, k_j or v_j; a row with no allowed key stays out 0,
//     lse -inf whatever its values.
//   backward (from the forward's own out and lse): a pair (i, j) the mask allows, of a row
//     with lse != -inf, is poisoned when the row is (lse NaN, or q_i or dout_i non-finite)
//     or the key is (k_j or v_j non-finite); it makes dq_i, dk_j and dv_j NaN.
// Rows and keys the rule leaves alone never read a poisoned value, so the sanitised run gives
// exactly their values.
#pragma once

#include "attention_test_util.hpp"

#include <baton/attention.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace attn_test {

template <class T>
bool row_finite(const std::vector<T>& x, std::int64_t row, std::int64_t dim) {
  for (std::int64_t d = 0; d < dim; ++d)
    if (!std::isfinite(static_cast<double>(x[static_cast<std::size_t>(row * dim + d)]))) return false;
  return true;
}

template <class T>
std::vector<T> sanitised(std::vector<T> x) {
  for (auto& e : x)
    if (!std::isfinite(static_cast<double>(e))) e = T(0);
  return x;
}

/// out, lse, dq, dk, dv as the rule says (positions 0..n-1 for queries and keys).
template <class T, class Mask>
results<T> nonfinite_oracle(const inputs<T>& in, const Mask& mask, const baton::attention_params& params = {}) {
  const shape& s = in.s;
  inputs<T> clean{s, sanitised(in.q), sanitised(in.k), sanitised(in.v), sanitised(in.dout)};
  results<T> r = run(baton::reference_attention{}, clean, mask, params);
  const auto nan_row = [&](auto& x, std::int64_t row) {
    using E = typename std::decay_t<decltype(x)>::value_type;
    for (std::int64_t d = 0; d < s.dim; ++d) x[static_cast<std::size_t>(row * s.dim + d)] = std::numeric_limits<E>::quiet_NaN();
  };
  const std::int64_t group = s.heads_q / s.heads_kv;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      const std::int64_t hk = h / group;
      for (std::int64_t i = 0; i < s.seq_q; ++i) {
        const std::int64_t qrow = (b * s.seq_q + i) * s.heads_q + h;
        const bool q_bad = !row_finite(in.q, qrow, s.dim);
        bool live = false, poisoned = false;
        for (std::int64_t j = 0; j < s.seq_k; ++j) {
          if (!mask.allowed(i, j)) continue;
          live = true;
          const std::int64_t krow = (b * s.seq_k + j) * s.heads_kv + hk;
          if (q_bad || !row_finite(in.k, krow, s.dim) || !row_finite(in.v, krow, s.dim)) poisoned = true;
        }
        if (!live) continue;
        if (poisoned) {
          nan_row(r.out, qrow);
          r.lse[static_cast<std::size_t>((b * s.heads_q + h) * s.seq_q + i)] =
              std::numeric_limits<baton::lse_t<T>>::quiet_NaN();
        }
        const bool row_bad = poisoned || q_bad || !row_finite(in.dout, qrow, s.dim);
        for (std::int64_t j = 0; j < s.seq_k; ++j) {
          if (!mask.allowed(i, j)) continue;
          const std::int64_t krow = (b * s.seq_k + j) * s.heads_kv + hk;
          if (row_bad || !row_finite(in.k, krow, s.dim) || !row_finite(in.v, krow, s.dim)) {
            nan_row(r.dq, qrow);
            nan_row(r.dk, krow);
            nan_row(r.dv, krow);
          }
        }
      }
    }
  return r;
}

/// "" when got matches want: NaN exactly where want is NaN, equal infinities, and finite
/// values within tol x (largest finite |want|); otherwise what differs first.
template <class A, class B>
std::string nan_pattern_mismatch(const std::vector<A>& got, const std::vector<B>& want, double tol) {
  if (got.size() != want.size()) return "sizes differ";
  double scale = 1e-30;
  for (const auto& w : want)
    if (std::isfinite(static_cast<double>(w))) scale = std::max(scale, std::abs(static_cast<double>(w)));
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    if (std::isnan(w) != std::isnan(g))
      return "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
    if (std::isnan(w)) continue;
    if (std::isinf(w) || std::isinf(g)) {
      if (g != w) return "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
      continue;
    }
    if (std::abs(g - w) > tol * scale)
      return "element " + std::to_string(i) + ": got " + std::to_string(g) + ", want " + std::to_string(w);
  }
  return {};
}

template <class T>
std::size_t count_nan(const std::vector<T>& x) {
  std::size_t n = 0;
  for (const auto& e : x) n += std::isnan(static_cast<double>(e)) ? 1 : 0;
  return n;
}

}  // namespace attn_test
