// Shared helpers of the attention tests: random problems, running a backend end to end, and
// error measures that treat -inf (a fully masked row's LSE) as a value to match exactly.
#pragma once

#include <baton/attention.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <utility>
#include <vector>

namespace attn_test {

/// The unit roundoff of storage type S (half the spacing of its values just above 1): the
/// largest relative error of rounding a float to S. bfloat16 stores 7 mantissa bits, so
/// 2^-8 ~ 3.9e-3; float16 stores 10, so 2^-11 ~ 4.9e-4; float 23, so 2^-24.
template <class S>
constexpr double unit_roundoff() {
  if constexpr (std::is_same_v<S, baton::bfloat16>)
    return 0x1p-8;
  else if constexpr (std::is_same_v<S, baton::float16>)
    return 0x1p-11;
  else
    return 0x1p-24;
}

struct shape {
  std::int64_t batch = 1, seq_q = 1, seq_k = 1, heads_q = 1, heads_kv = 1, dim = 1;
};

/// Where a CUDA kernel's arithmetic ran. The CPU emulation rounds each tensor-core sum to
/// nearest, as IEEE fp32 does. A GPU's tensor cores keep the products exact but truncate the
/// aligned sum of every MMA step (Fasi, Higham, Mikaitis and Pranesh, "Numerical behavior of
/// NVIDIA tensor cores", PeerJ Computer Science, 2021): up to 2^-23 of the step's largest
/// term, with a sign that does not alternate, so the error grows with the number of steps
/// rather than its square root.
enum class arithmetic { emulated, tensor_cores };

/// A run functor's arithmetic: its static member `arithmetic` where it declares one (the
/// device runs), else emulated.
template <class Run>
constexpr arithmetic arithmetic_of() {
  if constexpr (requires { std::remove_cvref_t<Run>::arithmetic; })
    return std::remove_cvref_t<Run>::arithmetic;
  else
    return arithmetic::emulated;
}

/// Relative tolerance (of the result's largest magnitude) of the CUDA kernels' float storage,
/// which multiplies as 3xTF32 (three m16n8k8 products per 8 terms, each ~2^-22 relative).
/// Emulated: fp32 sums rounded to nearest over <= a few hundred terms, ~sqrt(n) 2^-24 ~ 1e-6
/// typical; 1e-5 is ~10x headroom. On tensor cores each result is a chain of two sums, over
/// the head dim (scores, dP) and then over `length` keys or queries (P V, dS K, dS^T Q): 3
/// steps per 8 terms, each truncating by up to 2^-23, so at most 3 (dim + length) / 8 x 2^-23
/// more. Measured on an H200 (2026-12-04): 1.05e-5 at dim 64 and 128, 1.81e-5 at dim 256
/// (900 keys), against 1e-5; the bound there is 5.3e-5 to 6.2e-5.
inline double float_tolerance(arithmetic a, std::int64_t dim, std::int64_t length) {
  const double emulated = 1e-5;
  if (a == arithmetic::emulated) return emulated;
  return emulated + 3.0 * static_cast<double>(dim + length) / 8.0 * 0x1p-23;
}

template <class T>
struct inputs {
  shape s;
  std::vector<T> q, k, v, dout;
};

template <class T>
struct results {
  std::vector<T> out, dq, dk, dv;
  std::vector<baton::lse_t<T>> lse;
};

template <class T>
inputs<T> random_inputs(const shape& s, unsigned seed, double magnitude = 1.0) {
  inputs<T> in{s, {}, {}, {}, {}};
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, magnitude);
  const auto fill = [&](std::vector<T>& x, std::int64_t n) {
    x.resize(static_cast<std::size_t>(n));
    for (auto& e : x) e = static_cast<T>(normal(gen));
  };
  fill(in.q, s.batch * s.seq_q * s.heads_q * s.dim);
  fill(in.k, s.batch * s.seq_k * s.heads_kv * s.dim);
  fill(in.v, s.batch * s.seq_k * s.heads_kv * s.dim);
  std::normal_distribution<double> unit(0.0, 1.0);
  in.dout.resize(in.q.size());
  for (auto& e : in.dout) e = static_cast<T>(unit(gen));
  return in;
}

template <class T>
baton::tensor_view<T, 4> q_view(std::vector<T>& x, const shape& s) {
  return baton::make_tensor_view(x.data(), {s.batch, s.seq_q, s.heads_q, s.dim});
}
template <class T>
baton::tensor_view<const T, 4> q_view(const std::vector<T>& x, const shape& s) {
  return baton::make_tensor_view(x.data(), {s.batch, s.seq_q, s.heads_q, s.dim});
}
template <class T>
baton::tensor_view<T, 4> kv_view(std::vector<T>& x, const shape& s) {
  return baton::make_tensor_view(x.data(), {s.batch, s.seq_k, s.heads_kv, s.dim});
}
template <class T>
baton::tensor_view<const T, 4> kv_view(const std::vector<T>& x, const shape& s) {
  return baton::make_tensor_view(x.data(), {s.batch, s.seq_k, s.heads_kv, s.dim});
}
template <class L>
baton::tensor_view<L, 3> lse_view(std::vector<L>& x, const shape& s) {
  return baton::make_tensor_view(x.data(), {s.batch, s.heads_q, s.seq_q});
}
template <class L>
baton::tensor_view<const L, 3> lse_view(const std::vector<L>& x, const shape& s) {
  return baton::make_tensor_view(x.data(), {s.batch, s.heads_q, s.seq_q});
}

/// Forward, then backward from the forward's own out and lse.
template <class T, class Backend, class Mask>
results<T> run(const Backend& backend, const inputs<T>& in, const Mask& mask, const baton::attention_params& params = {}) {
  const shape& s = in.s;
  results<T> r;
  r.out.assign(in.q.size(), T(0));
  r.dq.assign(in.q.size(), T(0));
  r.dk.assign(in.k.size(), T(0));
  r.dv.assign(in.v.size(), T(0));
  r.lse.assign(static_cast<std::size_t>(s.batch * s.heads_q * s.seq_q), 0);
  backend.forward(q_view(in.q, s), kv_view(in.k, s), kv_view(in.v, s), mask, q_view(r.out, s), lse_view(r.lse, s),
                  params);
  backend.backward(q_view(in.q, s), kv_view(in.k, s), kv_view(in.v, s), q_view(std::as_const(r.out), s),
                   lse_view(std::as_const(r.lse), s), q_view(in.dout, s), mask, q_view(r.dq, s), kv_view(r.dk, s),
                   kv_view(r.dv, s), params);
  return r;
}

/// max |a - b|, with equal infinities counting as 0 and an infinity against a finite value
/// (or any NaN) as +inf.
template <class A, class B>
double max_abs_error(const std::vector<A>& a, const std::vector<B>& b) {
  if (a.size() != b.size()) return INFINITY;
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double x = static_cast<double>(a[i]), y = static_cast<double>(b[i]);
    if (std::isnan(x) || std::isnan(y)) return INFINITY;
    if (std::isinf(x) || std::isinf(y)) {
      if (x != y) return INFINITY;
      continue;
    }
    e = std::max(e, std::abs(x - y));
  }
  return e;
}

/// Largest finite |x| (at least tiny, so a tolerance relative to it is never 0).
template <class A>
double max_magnitude(const std::vector<A>& a) {
  double m = 0;
  for (const auto& x : a)
    if (std::isfinite(static_cast<double>(x))) m = std::max(m, std::abs(static_cast<double>(x)));
  return std::max(m, 1e-30);
}

template <class A>
bool all_finite(const std::vector<A>& a) {
  return std::all_of(a.begin(), a.end(), [](const A& x) { return std::isfinite(static_cast<double>(x)); });
}

/// Packed documents of lengths 13, 1, 40, 9, ... over `total` global positions (the segment
/// id of each position), for document_mask.
inline std::vector<std::int64_t> packed_document_ids(std::int64_t total) {
  std::vector<std::int64_t> segments(static_cast<std::size_t>(total));
  for (std::int64_t pos = 0, doc = 0, left = 13; pos < total; ++pos, --left) {
    if (left == 0) {
      ++doc;
      left = std::int64_t{1} + (doc * 29) % 41;
    }
    segments[static_cast<std::size_t>(pos)] = doc;
  }
  return segments;
}

}  // namespace attn_test
