// Shared by the CUDA backend's forward tests (emulated on the CPU, and on a device): random
// problems in a storage type, the reference answer with the non-finite rule applied, and
// the Kokkos backend's mask grid.
//
// Tolerances, relative to the largest |out| of the reference:
//   float storage 1e-5 emulated: 3xTF32 products are within ~1e-6 of fp32 ones
//     (test_simt_mma), the softmax and the sums are fp32, so the error is a few fp32
//     roundings per term; on a GPU more, growing with dim + seq_k, because tensor cores
//     truncate their sums (attn_test::float_tolerance);
//   16-bit storage 5.12 u, u the storage's unit roundoff (attn_test::unit_roundoff): 2e-2 for
//     bfloat16 (u = 2^-8), 2.5e-3 for float16 (u = 2^-11, 8 times finer). The reference sees
//     exactly the values the kernel sees (inputs rounded to the storage type first), so the
//     error is the kernel's alone: P rounded to S before P V (relative error <= u per
//     element, while l sums the unrounded P: <= u max|v| on out), out stored in S (<= u
//     |out|), and fp32 sums (~(seq_k + dim) 2^-24, negligible). That is at most
//     u (max|v| / max|out| + 1), a few u for these random problems; emulated, the cases of
//     test_cuda_cpu and test_cuda_gpu stay below 0.95 u for both types, so 5.12 u leaves a
//     margin above 5.
// The LSE is compared absolutely with the same tolerances (it is O(log seq_k); computed from
// the unrounded P in fp32, it errs by ~1e-7), with -inf and NaN matched exactly.
#pragma once

#include "catch.hpp"

#include "../attention_test_util.hpp"

#include <baton/attention.hpp>
#include <baton/attention/cuda/storage.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

namespace cuda_test {
using attn_test::shape;

template <class S>
double tolerance_for(attn_test::arithmetic a = attn_test::arithmetic::emulated, const shape& s = {}) {
  return std::is_same_v<S, float> ? attn_test::float_tolerance(a, s.dim, s.seq_k) : 5.12 * attn_test::unit_roundoff<S>();
}

template <class S>
const char* storage_name() {
  return std::is_same_v<S, float> ? "float" : std::is_same_v<S, baton::bfloat16> ? "bfloat16" : "float16";
}

/// One forward problem in storage S with its reference answer.
template <class S>
struct problem {
  shape s;
  std::vector<S> q, k, v;
  std::vector<double> qd, kd, vd;  // the same values, exactly, as doubles
};

template <class S>
problem<S> make_problem(const shape& s, unsigned seed, double magnitude = 1.0) {
  problem<S> p{s, {}, {}, {}, {}, {}, {}};
  std::mt19937_64 gen(seed);
  std::normal_distribution<double> normal(0.0, magnitude);
  const auto fill = [&](std::vector<S>& x, std::vector<double>& xd, std::int64_t n) {
    x.resize(static_cast<std::size_t>(n));
    xd.resize(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < x.size(); ++i) {
      x[i] = baton::detail::attention::cuda::from_float<S>(static_cast<float>(normal(gen)));
      xd[i] = static_cast<double>(baton::detail::attention::cuda::to_float(x[i]));
    }
  };
  fill(p.q, p.qd, s.batch * s.seq_q * s.heads_q * s.dim);
  fill(p.k, p.kd, s.batch * s.seq_k * s.heads_kv * s.dim);
  fill(p.v, p.vd, s.batch * s.seq_k * s.heads_kv * s.dim);
  return p;
}

/// Sets element (row, d) of a [rows][dim] array to x in both the storage and the double copy.
template <class S>
void poke(std::vector<S>& x, std::vector<double>& xd, std::int64_t row, std::int64_t dim, std::int64_t d, float value) {
  const auto i = static_cast<std::size_t>(row * dim + d);
  x[i] = baton::detail::attention::cuda::from_float<S>(value);
  xd[i] = static_cast<double>(value);
}

struct forward_result {
  std::vector<double> out, lse;
};

/// The reference's forward on the double copies, with the non-finite rule applied on top the
/// way tests/attention/nonfinite_oracle.hpp does (sanitised inputs, NaN on poisoned rows).
template <class S, class Mask>
forward_result reference_forward(const problem<S>& p, const Mask& mask, const baton::attention_params& params) {
  const shape& s = p.s;
  const auto clean = [](std::vector<double> x) {
    for (auto& e : x)
      if (!std::isfinite(e)) e = 0;
    return x;
  };
  const std::vector<double> q = clean(p.qd), k = clean(p.kd), v = clean(p.vd);
  std::vector<double> out(q.size()), lse(static_cast<std::size_t>(s.batch * s.heads_q * s.seq_q));
  baton::reference_attention{}.forward(attn_test::q_view(q, s), attn_test::kv_view(k, s), attn_test::kv_view(v, s), mask,
                                       attn_test::q_view(out, s), attn_test::lse_view(lse, s), params);
  const baton::positions qp = params.q_pos.resolved(s.seq_q, "q"), kp = params.k_pos.resolved(s.seq_k, "k");
  const auto row_ok = [&](const std::vector<double>& x, std::int64_t row) {
    for (std::int64_t d = 0; d < s.dim; ++d)
      if (!std::isfinite(x[static_cast<std::size_t>(row * s.dim + d)])) return false;
    return true;
  };
  const std::int64_t group = s.heads_q / s.heads_kv;
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads_q; ++h)
      for (std::int64_t i = 0; i < s.seq_q; ++i) {
        const std::int64_t qrow = (b * s.seq_q + i) * s.heads_q + h;
        bool poisoned = false;
        for (std::int64_t j = 0; j < s.seq_k; ++j) {
          if (!mask.allowed(qp[i], kp[j])) continue;
          const std::int64_t krow = (b * s.seq_k + j) * s.heads_kv + h / group;
          poisoned = poisoned || !row_ok(p.qd, qrow) || !row_ok(p.kd, krow) || !row_ok(p.vd, krow);
        }
        if (!poisoned) continue;
        for (std::int64_t d = 0; d < s.dim; ++d) out[static_cast<std::size_t>(qrow * s.dim + d)] = NAN;
        lse[static_cast<std::size_t>((b * s.heads_q + h) * s.seq_q + i)] = NAN;
      }
  return {out, lse};
}

/// max |a - b| where NaN must meet NaN and infinities must be equal (else +inf).
double max_error_nan_aware(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double e = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) || std::isnan(b[i])) {
      if (!(std::isnan(a[i]) && std::isnan(b[i]))) return INFINITY;
      continue;
    }
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    e = std::max(e, std::abs(a[i] - b[i]));
  }
  return e;
}

/// Runs `run(p, mask, params, out, lse)` (a backend's forward on p into out, lse) and
/// compares with reference_forward.
template <class S, class Run, class Mask>
void check_forward_with(const Run& run, const problem<S>& p, const Mask& mask, const baton::attention_params& params,
                        const std::string& what) {
  const shape& s = p.s;
  std::vector<S> out(p.q.size(), baton::detail::attention::cuda::from_float<S>(-7.0f));  // stale values must be overwritten
  std::vector<float> lse(static_cast<std::size_t>(s.batch * s.heads_q * s.seq_q), -7.0f);
  run(p, mask, params, out, lse);
  const forward_result want = reference_forward(p, mask, params);
  std::vector<double> got_out(out.size()), got_lse(lse.begin(), lse.end());
  for (std::size_t i = 0; i < out.size(); ++i) got_out[i] = static_cast<double>(baton::detail::attention::cuda::to_float(out[i]));
  const double tol = tolerance_for<S>(attn_test::arithmetic_of<Run>(), s);
  const double scale = attn_test::max_magnitude(want.out);
  const double out_err = max_error_nan_aware(got_out, want.out);
  const double lse_err = max_error_nan_aware(got_lse, want.lse);
  INFO(storage_name<S>() << " " << what << ": batch " << s.batch << ", seq_q " << s.seq_q << ", seq_k " << s.seq_k
                         << ", heads " << s.heads_q << "/" << s.heads_kv << ", dim " << s.dim << "; out error "
                         << out_err << " (largest |out| " << scale << "), lse error " << lse_err);
  CHECK(out_err <= tol * scale);
  CHECK(lse_err <= tol * std::max(1.0, attn_test::max_magnitude(want.lse)));
}

std::vector<std::int64_t> document_ids(std::int64_t n) {
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (std::int64_t p = 0; p < n; ++p) ids[static_cast<std::size_t>(p)] = p < n / 3 ? 0 : p < n / 3 + 1 ? 1 : p < 2 * n / 3 ? 2 : 3;
  return ids;
}

/// The Kokkos backend's mask grid (tests/attention/test_kokkos.cpp) on one shape: no mask,
/// causal (plain and with offset queries), window, prefix-LM, causal window, documents,
/// causal documents, a block mask with zigzag queries, zigzag queries and keys.
template <class S, class Run>
void check_mask_grid(const Run& run, const shape& s, unsigned seed, const std::string& what) {
  const problem<S> p = make_problem<S>(s, seed);
  const auto check = [&](const auto& mask, const baton::attention_params& params, const std::string& name) {
    check_forward_with(run, p, mask, params, what + ", " + name);
  };
  const std::int64_t total = s.seq_q + s.seq_k;
  baton::attention_params params;
  check(baton::no_mask{}, params, "no mask");
  check(baton::causal_mask{}, params, "causal");
  params.q_pos = baton::positions(s.seq_k / 3, s.seq_q);
  check(baton::causal_mask{}, params, "causal, offset queries");
  check(baton::sliding_window_mask{20, 3}, params, "sliding window");
  check(baton::prefix_lm_mask{17}, params, "prefix-LM");
  check(baton::intersect(baton::causal_mask{}, baton::sliding_window_mask{70, 3}), params, "causal window");
  const std::vector<std::int64_t> segments = attn_test::packed_document_ids(total);
  check(baton::document_mask(segments), params, "documents");
  check(baton::intersect(baton::document_mask(segments), baton::causal_mask{}), params, "causal documents");
  std::vector<std::int64_t> q_list;
  for (std::int64_t i = 0; i < s.seq_q; ++i) q_list.push_back(i < s.seq_q / 2 ? total - s.seq_q / 2 + i : i);
  params.q_pos = baton::positions::list(q_list);
  const baton::block_mask sinks_and_window([](std::int64_t q, std::int64_t k) { return k <= q && (k < 4 || q - k < 48); },
                                           total, total);
  check(sinks_and_window, params, "block mask, zigzag queries");
  check(baton::causal_mask{}, params, "causal, zigzag queries");
  std::vector<std::int64_t> k_list;
  for (std::int64_t i = 0; i < s.seq_k; ++i) k_list.push_back(i < s.seq_k / 2 ? total - s.seq_k / 2 + i : i);
  params.k_pos = baton::positions::list(k_list);
  check(baton::causal_mask{}, params, "causal, zigzag queries and keys");
  check(baton::padding_mask(baton::prefix_lm_mask{30}, total - 5), params, "padded prefix-LM, zigzag queries and keys");
}

}  // namespace cuda_test
