// Shared by test_cuda_backward_cpu.cpp (the emulated kernels) and test_cuda_backward_gpu.cu
// (the device kernels): one backward problem on the host — inputs rounded to the storage
// type, the reference's out and lse from them, the reference's gradients, the tile plan and
// the backward_args over host memory — and the comparison of gradients against the reference.
#pragma once

#include "catch.hpp"

#include "../attention_test_util.hpp"
#include "../nonfinite_oracle.hpp"

#include <baton/attention.hpp>
#include <baton/attention/cuda/detail/backward_args.hpp>
#include <baton/attention/cuda/plan.hpp>
#include <baton/attention/cuda/storage.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

namespace cuda_bwd_test {

namespace bc = baton::detail::attention::cuda;
using attn_test::shape;

using bc::from_float;
using bc::to_float;

template <class S>
std::vector<S> to_storage(const std::vector<float>& x) {
  std::vector<S> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = bc::from_float<S>(x[i]);
  return y;
}
template <class S>
std::vector<float> to_floats(const std::vector<S>& x) {
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = bc::to_float(x[i]);
  return y;
}
/// x rounded to S and back: the values the kernels see, so the reference sees them too.
template <class S>
std::vector<float> rounded(const std::vector<float>& x) {
  return to_floats(to_storage<S>(x));
}

template <class S>
constexpr const char* storage_name() {
  if constexpr (std::is_same_v<S, float>) return "float";
  else if constexpr (std::is_same_v<S, baton::bfloat16>) return "bf16";
  else return "fp16";
}

/// Relative tolerance (of the gradient's largest magnitude). float: 3xTF32 products carry
/// ~fp32 accuracy (each split product errs by ~2^-22 relative), sums in fp32 over <= 256
/// dims and <= 2 x 70 x group keys or queries: ~sqrt(n) * 2^-24 ~ 1e-6 typical, 1e-5 is
/// ~10x headroom emulated; on a GPU's tensor cores, which truncate their sums, more by up to
/// 3 (dim + length) / 8 x 2^-23 (attn_test::float_tolerance; measured on an H200: 1.2e-5
/// at dim 256). 16-bit storage: 5.12 u, u the storage's unit roundoff
/// (attn_test::unit_roundoff): 2e-2 for bf16 (u = 2^-8), 2.5e-3 for fp16 (u = 2^-11, 8 times
/// finer). The reference sees the rounded inputs and the stored out and lse, so the error is
/// the kernels' alone: P and dS rounded to S before their products (as in FlashAttention-2;
/// <= u relative per term, so <= u sum|term| on a gradient, e.g. dV_j = sum_i P_ij dO_i),
/// the gradient stored in S (<= u |g|), and fp32 sums (~n 2^-24, negligible). That is at
/// most u (sum|term| / max|g| + 1); the roundings of different terms have independent signs,
/// and, emulated, the cases of the CPU and the GPU test stay below 1.25 u for both types, so
/// 5.12 u leaves a margin of ~4.
template <class S>
double tolerance(attn_test::arithmetic a = attn_test::arithmetic::emulated, const shape& s = {}) {
  // The longest sum of a gradient: dQ over the keys, dK and dV over the queries of a group.
  const std::int64_t length = std::max(s.seq_k, s.seq_q * (s.heads_kv > 0 ? s.heads_q / s.heads_kv : 1));
  return std::is_same_v<S, float> ? attn_test::float_tolerance(a, s.dim, length) : 5.12 * attn_test::unit_roundoff<S>();
}

/// A value written into one input before the run: tensor 'q', 'k', 'v' or 'o' (dout) at
/// (batch, seq, head, dim).
struct poke {
  char tensor;
  std::int64_t b, s, h, d;
  float value;
};

inline void apply_poke(attn_test::inputs<float>& in, const poke& p) {
  const shape& s = in.s;
  std::vector<float>& x = p.tensor == 'q' ? in.q : p.tensor == 'k' ? in.k : p.tensor == 'v' ? in.v : in.dout;
  const std::int64_t seq = p.tensor == 'q' || p.tensor == 'o' ? s.seq_q : s.seq_k;
  const std::int64_t heads = p.tensor == 'q' || p.tensor == 'o' ? s.heads_q : s.heads_kv;
  x[static_cast<std::size_t>(((p.b * seq + p.s) * heads + p.h) * s.dim + p.d)] = p.value;
}

/// One backward problem: inputs (float copies of the storage values), the reference's out,
/// lse and gradients, and the storage arrays the kernels read and write.
template <class S>
struct problem {
  shape s;
  std::vector<float> q, k, v, dout, out;  // exactly the storage values
  std::vector<float> lse;
  std::vector<float> dq0, dk0, dv0;  // gradients' previous content (accumulate mode)
  attn_test::results<float> want;   // reference gradients (plus dq0.. when accumulating)
  std::vector<S> sq, sk, sv, sout, sdout, sdq, sdk, sdv;
  bc::tile_plan plan;
  std::vector<std::uint8_t> workspace;
  baton::attention_params params;
  double scale = 1;
};

/// Random inputs, the reference forward for out and lse (rounded to S as a forward would
/// store them), the reference backward from those, and the kernels' storage arrays.
template <class S, class Mask>
problem<S> make_problem(const shape& s, const Mask& mask, const baton::attention_params& params, unsigned seed,
                        bool accumulate = false, const std::vector<poke>& pokes = {}) {
  problem<S> p;
  p.s = s;
  p.params = params;
  p.params.accumulate = accumulate;
  auto in = attn_test::random_inputs<float>(s, seed);
  in.q = rounded<S>(in.q);
  in.k = rounded<S>(in.k);
  in.v = rounded<S>(in.v);
  in.dout = rounded<S>(in.dout);
  for (const auto& site : pokes) apply_poke(in, site);
  p.q = in.q;
  p.k = in.k;
  p.v = in.v;
  p.dout = in.dout;
  baton::reference_attention ref;
  p.out.assign(in.q.size(), 0.f);
  p.lse.assign(static_cast<std::size_t>(s.batch * s.heads_q * s.seq_q), 0.f);
  ref.forward(attn_test::q_view(std::as_const(p.q), s), attn_test::kv_view(std::as_const(p.k), s),
              attn_test::kv_view(std::as_const(p.v), s), mask, attn_test::q_view(p.out, s), attn_test::lse_view(p.lse, s),
              params);
  p.out = rounded<S>(p.out);
  // Previous content for accumulate mode: small random values, themselves in storage.
  const auto previous = attn_test::random_inputs<float>(s, seed + 1000, 0.5);
  p.dq0 = accumulate ? rounded<S>(previous.q) : std::vector<float>(in.q.size(), 0.f);
  p.dk0 = accumulate ? rounded<S>(previous.k) : std::vector<float>(in.k.size(), 0.f);
  p.dv0 = accumulate ? rounded<S>(previous.v) : std::vector<float>(in.v.size(), 0.f);
  p.want.dq = p.dq0;
  p.want.dk = p.dk0;
  p.want.dv = p.dv0;
  ref.backward(attn_test::q_view(std::as_const(p.q), s), attn_test::kv_view(std::as_const(p.k), s),
               attn_test::kv_view(std::as_const(p.v), s), attn_test::q_view(std::as_const(p.out), s),
               attn_test::lse_view(std::as_const(p.lse), s), attn_test::q_view(std::as_const(p.dout), s), mask,
               attn_test::q_view(p.want.dq, s), attn_test::kv_view(p.want.dk, s), attn_test::kv_view(p.want.dv, s),
               p.params);
  p.sq = to_storage<S>(p.q);
  p.sk = to_storage<S>(p.k);
  p.sv = to_storage<S>(p.v);
  p.sout = to_storage<S>(p.out);
  p.sdout = to_storage<S>(p.dout);
  p.sdq = to_storage<S>(p.dq0);
  p.sdk = to_storage<S>(p.dk0);
  p.sdv = to_storage<S>(p.dv0);
  const bc::backward_shape shape_ = bc::backward_shape_for<S>(static_cast<int>(s.dim));
  const baton::positions qp = params.q_pos.resolved(s.seq_q, "q_pos"), kp = params.k_pos.resolved(s.seq_k, "k_pos");
  p.plan = bc::make_tile_plan(mask, qp, kp, s.seq_q, s.seq_k, shape_.tile_q, shape_.tile_k);
  p.scale = params.softmax_scale == 0 ? 1.0 / std::sqrt(static_cast<double>(s.dim)) : params.softmax_scale;
  p.workspace.assign(bc::backward_workspace_bytes(s.batch, s.heads_q, s.seq_q, s.heads_kv, s.seq_k) +
                         bc::workspace_alignment,
                     0);
  return p;
}


/// backward_args over the given pointers (host arrays for the emulation, device copies for a
/// launch), with the problem's sizes and strides.
template <class S>
bc::backward_args<S> make_args(const problem<S>& p, const S* q, const S* k, const S* v, const S* out, const S* dout,
                               const float* lse, S* dq, S* dk, S* dv, void* workspace,
                               const bc::tile_plan_view& plan) {
  const shape& s = p.s;
  bc::backward_args<S> a;
  const std::array<std::int64_t, 4> qs{s.batch, s.seq_q, s.heads_q, s.dim}, ks{s.batch, s.seq_k, s.heads_kv, s.dim};
  a.q = baton::make_tensor_view(q, qs);
  a.k = baton::make_tensor_view(k, ks);
  a.v = baton::make_tensor_view(v, ks);
  a.out = baton::make_tensor_view(out, qs);
  a.dout = baton::make_tensor_view(dout, qs);
  a.lse = baton::make_tensor_view(lse, std::array<std::int64_t, 3>{s.batch, s.heads_q, s.seq_q});
  a.dq = baton::make_tensor_view(dq, qs);
  a.dk = baton::make_tensor_view(dk, ks);
  a.dv = baton::make_tensor_view(dv, ks);
  a.batch = static_cast<std::int32_t>(s.batch);
  a.heads_q = static_cast<std::int32_t>(s.heads_q);
  a.heads_kv = static_cast<std::int32_t>(s.heads_kv);
  a.dim = static_cast<std::int32_t>(s.dim);
  a.scale = static_cast<float>(p.scale);
  a.accumulate = p.params.accumulate;
  a.plan = plan;
  a.workspace = bc::carve_backward_workspace(workspace, s.batch, s.heads_q, s.seq_q);
  return a;
}

/// Host arrays: the problem's own storage vectors (aligned by the allocator to >= 16 bytes).
template <class S>
bc::backward_args<S> host_args(problem<S>& p) {
  auto* ws = p.workspace.data();
  auto addr = reinterpret_cast<std::uintptr_t>(ws);
  ws += (bc::workspace_alignment - addr % bc::workspace_alignment) % bc::workspace_alignment;
  return make_args(p, p.sq.data(), p.sk.data(), p.sv.data(), p.sout.data(), p.sdout.data(), p.lse.data(), p.sdq.data(),
                   p.sdk.data(), p.sdv.data(), ws, p.plan.view());
}

/// "" when got matches the reference within tolerance<S>() x its largest magnitude, with
/// NaN exactly where the reference has NaN; else what differs.
template <class S>
std::string compare(const std::vector<S>& got_storage, const std::vector<float>& want, const char* name,
                    double tol = tolerance<S>()) {
  const std::vector<float> got = to_floats(got_storage);
  const std::string nan = attn_test::nan_pattern_mismatch(got, want, tol);
  if (!nan.empty()) return std::string(name) + ": " + nan;
  return "";
}


/// The reference's gradients against the kernels' (p.sdq, p.sdk, p.sdv), with the shape.
template <class S>
void check_gradients(const problem<S>& p, const std::string& what,
                     attn_test::arithmetic a = attn_test::arithmetic::emulated) {
  const double tol = tolerance<S>(a, p.s);
  INFO(what << " [" << storage_name<S>() << ", batch " << p.s.batch << ", " << p.s.seq_q << "/" << p.s.seq_k
            << ", heads " << p.s.heads_q << "/" << p.s.heads_kv << ", dim " << p.s.dim << "; tolerance " << tol << "]");
  CHECK(compare(p.sdq, p.want.dq, "dq", tol) == "");
  CHECK(compare(p.sdk, p.want.dk, "dk", tol) == "");
  CHECK(compare(p.sdv, p.want.dv, "dv", tol) == "");
}

/// One problem through the kernels under test: `run(p)` is the host emulation in the CPU
/// test and the device launch in the GPU test, so both check the same cases.
template <class S, class Run, class Mask>
void compare_case(Run&& run, const shape& s, const Mask& mask, const baton::attention_params& params,
                  const std::string& what, unsigned seed, bool accumulate = false) {
  auto p = make_problem<S>(s, mask, params, seed, accumulate);
  run(p);
  check_gradients(p, what, attn_test::arithmetic_of<Run>());
}

using attn_test::packed_document_ids;

/// Every mask type of masks.hpp, with positions as context-parallel shards have them
/// (offset queries, zigzag lists), on one shape.
template <class S, class Run>
void mask_grid(Run&& run, const shape& s, unsigned seed, const std::string& what) {
  const std::int64_t total = s.seq_q + s.seq_k;
  const std::vector<std::int64_t> ids = packed_document_ids(total);
  baton::attention_params params;
  compare_case<S>(run, s, baton::no_mask{}, params, what + ", no mask", ++seed);
  compare_case<S>(run, s, baton::causal_mask{}, params, what + ", causal", ++seed);
  params.q_pos = baton::positions(s.seq_k / 3, s.seq_q);
  compare_case<S>(run, s, baton::causal_mask{}, params, what + ", causal, offset queries", ++seed);
  compare_case<S>(run, s, baton::sliding_window_mask{20, 3}, params, what + ", sliding window", ++seed);
  compare_case<S>(run, s, baton::prefix_lm_mask{17}, params, what + ", prefix-LM", ++seed);
  compare_case<S>(run, s, baton::document_mask(ids), params, what + ", documents", ++seed);
  compare_case<S>(run, s, baton::intersect(baton::document_mask(ids), baton::causal_mask{}), params,
                  what + ", causal documents", ++seed);
  compare_case<S>(run, s, baton::padding_mask(baton::causal_mask{}, total - 5), params, what + ", padding", ++seed);
  std::vector<std::int64_t> q_list, k_list;
  for (std::int64_t i = 0; i < s.seq_q; ++i) q_list.push_back(i < s.seq_q / 2 ? total - s.seq_q / 2 + i : i);
  for (std::int64_t i = 0; i < s.seq_k; ++i) k_list.push_back(i < s.seq_k / 2 ? total - s.seq_k / 2 + i : i);
  params.q_pos = baton::positions::list(q_list);
  const baton::block_mask sinks_and_window(
      [](std::int64_t q, std::int64_t k) { return k <= q && (k < 4 || q - k < 48); }, total, total);
  compare_case<S>(run, s, sinks_and_window, params, what + ", block mask, zigzag queries", ++seed);
  params.k_pos = baton::positions::list(k_list);
  compare_case<S>(run, s, baton::causal_mask{}, params, what + ", causal, zigzag queries and keys", ++seed);
}

}  // namespace cuda_bwd_test
