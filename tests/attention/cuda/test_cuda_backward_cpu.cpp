// The CUDA backward kernels, run on the CPU: emulate_backward runs the same kernel bodies as
// the device (the SIMT layer runs a whole thread block in lockstep, the mma emulation
// reproduces the PTX fragment layouts), block by block, on host memory. Checked against the
// reference backend (double) fed with the reference's own out and lse, so nothing here
// depends on the forward kernel: dq, dk, dv within tolerance<S>() x the largest magnitude of
// each (see backward_test_util.hpp for why 1e-5 for float, 2e-2 for bf16, 2.5e-3 for fp16),
// NaN exactly where the non-finite rule puts it.
#include "catch.hpp"

#include "backward_test_util.hpp"

#include <baton/attention/cuda/detail/emulate.hpp>
#include <baton/attention/cuda/emulated.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace {

using cuda_bwd_test::shape;
namespace bc = baton::detail::attention::cuda;

template <class S>
void run_emulated(cuda_bwd_test::problem<S>& p) {
  bc::emulate_backward(cuda_bwd_test::host_args(p));
}

using cuda_bwd_test::check_gradients;
using cuda_bwd_test::packed_document_ids;

template <class S, class Mask>
void compare_case(const shape& s, const Mask& mask, const baton::attention_params& params, const std::string& what,
                  unsigned seed, bool accumulate = false) {
  cuda_bwd_test::compare_case<S>(run_emulated<S>, s, mask, params, what, seed, accumulate);
}

template <class S>
void mask_grid(const shape& s, unsigned seed, const std::string& what) {
  cuda_bwd_test::mask_grid<S>(run_emulated<S>, s, seed, what);
}

}  // namespace

TEST_CASE("cuda backward (emulated): every mask, tile edges, GQA, float", "[attention][cuda][backward]") {
  // Lengths below, at and across a tile (32 and 64 rows), Sq != Sk both ways, MHA/GQA/MQA.
  mask_grid<float>({1, 70, 45, 4, 2, 64}, 10, "GQA 2:1, Sq > Sk");
  mask_grid<float>({2, 33, 65, 2, 2, 64}, 30, "MHA, batch 2, Sk > a tile");
  // (One key alone gives dq = dk = 0 exactly, which a relative bound cannot judge.)
  compare_case<float>({1, 1, 3, 1, 1, 64}, baton::no_mask{}, {}, "one query, three keys", 50);
  compare_case<float>({1, 40, 70, 4, 1, 128}, baton::causal_mask{}, {}, "MQA, dim 128, causal", 51);
  compare_case<float>({1, 37, 41, 2, 1, 256}, baton::sliding_window_mask{9, 2}, {}, "MQA, dim 256, window", 52);
}

TEST_CASE("cuda backward (emulated): bf16 and fp16 storage", "[attention][cuda][backward]") {
  mask_grid<baton::bfloat16>({1, 70, 45, 4, 2, 64}, 60, "GQA 2:1");
  compare_case<baton::bfloat16>({1, 65, 66, 2, 1, 128}, baton::causal_mask{}, {}, "MQA, dim 128, causal", 80);
  compare_case<baton::bfloat16>({1, 30, 67, 2, 2, 256}, baton::no_mask{}, {}, "dim 256", 81);
  compare_case<baton::float16>({1, 70, 45, 4, 2, 64}, baton::causal_mask{}, {}, "GQA, causal", 82);
  compare_case<baton::float16>({1, 33, 70, 2, 1, 128}, baton::sliding_window_mask{30, 0}, {}, "dim 128, window", 83);
  compare_case<baton::float16>({1, 20, 20, 2, 2, 256}, baton::prefix_lm_mask{7}, {}, "dim 256, prefix-LM", 84);
}

TEST_CASE("cuda backward (emulated): accumulate adds to the previous gradients", "[attention][cuda][backward]") {
  // make_problem fills dq, dk, dv with random values and the reference adds to the same.
  compare_case<float>({1, 50, 70, 4, 2, 64}, baton::causal_mask{}, {}, "accumulate, float", 90, true);
  compare_case<baton::bfloat16>({1, 50, 70, 2, 1, 128}, baton::no_mask{}, {}, "accumulate, bf16", 91, true);
  // A key no query may see keeps its previous dk, dv exactly; without accumulate it is 0.
  const shape s{1, 10, 70, 1, 1, 64};
  baton::attention_params params;  // causal: queries 0..9 see keys 0..9 only
  for (const bool accumulate : {true, false}) {
    auto p = cuda_bwd_test::make_problem<float>(s, baton::causal_mask{}, params, 92, accumulate);
    run_emulated(p);
    bool untouched = true;
    for (std::size_t e = 10 * 64; e < p.sdk.size(); ++e)
      untouched = untouched && p.sdk[e] == (accumulate ? p.dk0[e] : 0.f) && p.sdv[e] == (accumulate ? p.dv0[e] : 0.f);
    INFO("accumulate " << accumulate);
    CHECK(untouched);
    check_gradients(p, "keys no query sees");
  }
}

TEST_CASE("cuda backward (emulated): rows with no allowed key get zero gradients", "[attention][cuda][backward]") {
  // Rows q % 7 == 3 attend to nothing (lse -inf): dq 0; the other rows as the reference.
  const shape s{1, 70, 70, 2, 1, 64};
  const baton::block_mask holes([](std::int64_t q, std::int64_t k) { return k <= q && q % 7 != 3; }, 70, 70, 8);
  auto p = cuda_bwd_test::make_problem<float>(s, holes, {}, 100);
  run_emulated(p);
  check_gradients(p, "holes");
  bool zero = true;
  for (std::int64_t i = 3; i < 70; i += 7)
    for (std::int64_t h = 0; h < 2; ++h)
      for (std::int64_t d = 0; d < 64; ++d) zero = zero && p.sdq[static_cast<std::size_t>((i * 2 + h) * 64 + d)] == 0.f;
  CHECK(zero);
}

TEST_CASE("cuda backward (emulated): the non-finite rule", "[attention][cuda][backward][nonfinite]") {
  // The reference implements the rule (tests/attention/test_nonfinite.cpp checks it against
  // the oracle); its forward gives NaN out and lse for poisoned rows, its backward NaN
  // gradients for every pair they touch. Masked NaNs must not leak.
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const shape s{1, 70, 66, 4, 2, 64};
  const std::vector<std::int64_t> ids = packed_document_ids(140);
  const std::vector<std::pair<std::vector<cuda_bwd_test::poke>, const char*>> cases{
      {{{'q', 0, 3, 1, 0, nan}}, "NaN in one query"},
      {{{'q', 0, 66, 3, 2, inf}}, "+inf in one query"},
      {{{'k', 0, 40, 0, 2, inf}}, "+inf in one key"},
      {{{'v', 0, 5, 1, 0, -inf}}, "-inf in one value"},
      {{{'k', 0, 65, 1, 0, nan}}, "NaN in the last key (no causal row but the last ones reach it)"},
      {{{'o', 0, 10, 2, 4, nan}}, "NaN in dout"},
  };
  unsigned seed = 200;
  for (const auto& [pokes, what] : cases) {
    // Causal and documents: both hide some pokes from some rows (and keys from some queries).
    for (int m = 0; m < 2; ++m) {
      cuda_bwd_test::problem<float> p =
          m == 0 ? cuda_bwd_test::make_problem<float>(s, baton::causal_mask{}, {}, ++seed, false, pokes)
                 : cuda_bwd_test::make_problem<float>(s, baton::document_mask(ids), {}, ++seed, false, pokes);
      run_emulated(p);
      check_gradients(p, std::string(what) + (m == 0 ? " (causal)" : " (documents)"));
    }
  }
  // A NaN lse handed to backward poisons the row's pairs (bf16 too).
  auto p = cuda_bwd_test::make_problem<baton::bfloat16>({1, 6, 6, 1, 1, 64}, baton::causal_mask{}, {}, 300);
  p.lse[2] = nan;  // row 2 attends keys 0..2
  baton::reference_attention{}.backward(
      attn_test::q_view(std::as_const(p.q), p.s), attn_test::kv_view(std::as_const(p.k), p.s),
      attn_test::kv_view(std::as_const(p.v), p.s), attn_test::q_view(std::as_const(p.out), p.s),
      attn_test::lse_view(std::as_const(p.lse), p.s), attn_test::q_view(std::as_const(p.dout), p.s),
      baton::causal_mask{}, attn_test::q_view(p.want.dq, p.s), attn_test::kv_view(p.want.dk, p.s),
      attn_test::kv_view(p.want.dv, p.s), p.params);
  run_emulated(p);
  check_gradients(p, "NaN lse");
  CHECK(std::isnan(cuda_bwd_test::to_float(p.sdk[0])));
  CHECK(std::isnan(cuda_bwd_test::to_float(p.sdq[2 * 64])));
  CHECK(!std::isnan(cuda_bwd_test::to_float(p.sdk[3 * 64])));
}

TEST_CASE("cuda backward (emulated): strided views (rows padded, as in a packed qkv tensor)", "[attention][cuda][backward]") {
  // Every tensor's rows are `pitch` = dim + 24 elements apart (a head stride that is not the
  // dim, 16-byte aligned as the kernels require); the padding must stay untouched.
  const shape s{2, 40, 70, 4, 2, 64};
  const std::int64_t pitch = s.dim + 24;
  auto p = cuda_bwd_test::make_problem<float>(s, baton::causal_mask{}, {}, 450, true);
  const auto padded = [&](const std::vector<float>& x) {
    std::vector<float> y(x.size() / static_cast<std::size_t>(s.dim) * static_cast<std::size_t>(pitch), -7.f);
    for (std::size_t r = 0; r < x.size() / static_cast<std::size_t>(s.dim); ++r)
      std::copy_n(x.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(s.dim)), s.dim,
                  y.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(pitch)));
    return y;
  };
  const auto unpadded = [&](const std::vector<float>& y, bool& padding_kept) {
    std::vector<float> x(y.size() / static_cast<std::size_t>(pitch) * static_cast<std::size_t>(s.dim));
    for (std::size_t r = 0; r < x.size() / static_cast<std::size_t>(s.dim); ++r)
      for (std::int64_t d = 0; d < pitch; ++d) {
        const float e = y[r * static_cast<std::size_t>(pitch) + static_cast<std::size_t>(d)];
        if (d < s.dim)
          x[r * static_cast<std::size_t>(s.dim) + static_cast<std::size_t>(d)] = e;
        else
          padding_kept = padding_kept && e == -7.f;
      }
    return x;
  };
  const auto q = padded(p.q), k = padded(p.k), v = padded(p.v), out = padded(p.out), dout = padded(p.dout);
  auto dq = padded(p.dq0), dk = padded(p.dk0), dv = padded(p.dv0);
  std::vector<std::uint8_t> workspace(bc::backward_workspace_bytes(s.batch, s.heads_q, s.seq_q, s.heads_kv, s.seq_k));
  auto args = cuda_bwd_test::make_args(p, q.data(), k.data(), v.data(), out.data(), dout.data(), p.lse.data(), dq.data(),
                                       dk.data(), dv.data(), workspace.data(), p.plan.view());
  const std::array<std::int64_t, 4> q_strides{s.seq_q * s.heads_q * pitch, s.heads_q * pitch, pitch, 1},
      k_strides{s.seq_k * s.heads_kv * pitch, s.heads_kv * pitch, pitch, 1};
  args.q.layout.strides = args.out.layout.strides = args.dout.layout.strides = args.dq.layout.strides = q_strides;
  args.k.layout.strides = args.v.layout.strides = args.dk.layout.strides = args.dv.layout.strides = k_strides;
  bc::emulate_backward(args);
  bool padding_kept = true;
  p.sdq = unpadded(dq, padding_kept);
  p.sdk = unpadded(dk, padding_kept);
  p.sdv = unpadded(dv, padding_kept);
  CHECK(padding_kept);
  check_gradients(p, "padded rows, accumulate");
}

TEST_CASE("cuda backward (emulated): two runs are bitwise equal", "[attention][cuda][backward]") {
  const shape s{1, 70, 70, 4, 1, 64};  // MQA: the kv head sums over 4 query heads
  auto a = cuda_bwd_test::make_problem<float>(s, baton::causal_mask{}, {}, 400);
  auto b = cuda_bwd_test::make_problem<float>(s, baton::causal_mask{}, {}, 400);
  run_emulated(a);
  run_emulated(b);
  CHECK(std::memcmp(a.sdq.data(), b.sdq.data(), a.sdq.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.sdk.data(), b.sdk.data(), a.sdk.size() * sizeof(float)) == 0);
  CHECK(std::memcmp(a.sdv.data(), b.sdv.data(), a.sdv.size() * sizeof(float)) == 0);
}

TEST_CASE("cuda backward: arguments the kernels cannot run are rejected", "[attention][cuda][backward]") {
  auto p = cuda_bwd_test::make_problem<float>({1, 8, 8, 1, 1, 64}, baton::no_mask{}, {}, 500);
  auto args = cuda_bwd_test::host_args(p);
  CHECK_NOTHROW(bc::check_backward_args(args));
  auto bad_dim = args;
  bad_dim.dim = 96;
  CHECK_THROWS_WITH(bc::check_backward_args(bad_dim), Catch::Contains("head dim 96 is not supported"));
  auto bad_plan = args;
  bad_plan.plan.tile_q = 64;
  CHECK_THROWS_WITH(bc::check_backward_args(bad_plan), Catch::Contains("backward_shape_for"));
  auto bad_stride = args;
  bad_stride.k.layout.strides[1] += 1;
  CHECK_THROWS_WITH(bc::check_backward_args(bad_stride), Catch::Contains("tensor 'k'"));
  auto bad_heads = args;
  bad_heads.heads_kv = 3;
  CHECK_THROWS_WITH(bc::check_backward_args(bad_heads), Catch::Contains("multiple of heads_kv"));
}

TEST_CASE("cuda backward: shapes, shared memory and workspace", "[attention][cuda][backward]") {
  // Every configuration fits an A100 block (163 KiB of dynamic shared memory), and its warps
  // split each visited tile into whole 8-column mma tiles.
  for (const int dim : {64, 128, 256}) {
    const auto f = bc::backward_shape_for<float>(dim);
    const auto h = bc::backward_shape_for<baton::bfloat16>(dim);
    INFO("dim " << dim);
    CHECK(bc::backward_smem_bytes<float>(dim) <= 163 * 1024);
    CHECK(bc::backward_smem_bytes<baton::bfloat16>(dim) <= 163 * 1024);
    for (const auto& sh : {f, h}) {
      CHECK(sh.tile_q % (8 * sh.splits) == 0);
      CHECK(sh.tile_k % (8 * sh.splits) == 0);
      CHECK(sh.dim / sh.splits == 64);
      CHECK(sh.key_pass_warps() * 32 <= 1024);
      CHECK(sh.query_pass_warps() * 32 <= 1024);
    }
  }
  // D, row states and key flags, each 256-byte aligned.
  CHECK(bc::backward_workspace_bytes(2, 4, 100, 2, 70) == 3328 + 1024 + 512);
  std::vector<std::uint8_t> ws(bc::backward_workspace_bytes(2, 4, 100, 2, 70));
  const auto w = bc::carve_backward_workspace(ws.data(), 2, 4, 100);
  CHECK(reinterpret_cast<std::uint8_t*>(w.row) - ws.data() == 3328);
  CHECK(w.key_bad - ws.data() == 3328 + 1024);
}

TEST_CASE("cuda backend (emulated): forward then backward from its own out and lse", "[attention][cuda][backward]") {
  // End to end through cuda_attention_emulated (the backend's argument building, plans and
  // both kernels), float storage, a custom scale, against the reference run the same way.
  const shape s{1, 70, 66, 4, 2, 64};
  baton::attention_params params;
  params.softmax_scale = 0.3;
  const auto in = attn_test::random_inputs<float>(s, 600);
  const auto check = [&](const auto& mask, const char* what) {
    const auto want = attn_test::run(baton::reference_attention{}, in, mask, params);
    const auto got = attn_test::run(baton::cuda_attention_emulated{}, in, mask, params);
    INFO(what);
    CHECK(attn_test::nan_pattern_mismatch(got.out, want.out, 1e-5) == "");
    CHECK(attn_test::nan_pattern_mismatch(got.lse, want.lse, 1e-5) == "");
    CHECK(attn_test::nan_pattern_mismatch(got.dq, want.dq, 1e-5) == "");
    CHECK(attn_test::nan_pattern_mismatch(got.dk, want.dk, 1e-5) == "");
    CHECK(attn_test::nan_pattern_mismatch(got.dv, want.dv, 1e-5) == "");
  };
  check(baton::causal_mask{}, "causal");
  check(baton::document_mask(packed_document_ids(140)), "documents");
  check(baton::sliding_window_mask{10, 10}, "symmetric window");
}
