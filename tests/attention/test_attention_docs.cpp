// The examples of docs/attention.md and of the attention headers' comments, compiled and run.
// Each block between "// [doc:NAME]" and "// [/doc:NAME]" is shown verbatim in a document
// (ctest -L docs checks it); the checks after it hold expectations worked out by hand.
#include "catch.hpp"
#include "skip.hpp"

#include <baton/attention.hpp>
#include <baton/attention/cuda/emulated.hpp>
#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif

#include <cmath>
#include <cstdint>
#include <vector>

TEST_CASE("docs/attention.md examples", "[attention][docs]") {
  SECTION("tensor views") {
    // [doc:views]
    std::vector<float> q(2 * 128 * 8 * 64);
    auto view = baton::make_tensor_view(q.data(), {2, 128, 8, 64});  // [batch, seq, heads, dim]
    view(1, 5, 3, 0) = 1.0f;
    // [/doc:views]
    CHECK(q[((1 * 128 + 5) * 8 + 3) * 64] == 1.0f);
  }

  SECTION("positions (baton/attention/positions.hpp)") {
    // [doc:positions]
    baton::positions all;                          // 0..n-1, n from the tensor
    baton::positions chunk(4096, 1024);            // positions 4096..5119
    std::vector<std::int64_t> zigzag = {0, 1, 6, 7};  // chunks 0 and 3 of a zigzag shard
    auto shard = baton::positions::list(zigzag);
    // [/doc:positions]
    CHECK(all.resolved(3, "q_pos")[2] == 2);
    CHECK(chunk[1023] == 5119);
    CHECK(shard[2] == 6);
  }

  SECTION("the backend contract, written once for any backend") {
    // Uniform scores (q = k = 0): query i averages the values of keys 0..i (causal), so with
    // v = position, out = i / 2 and lse = log(i + 1); with dout = 1, dv_j = sum over i >= j of
    // 1 / (i + 1); dq = scale * sum_j dS_ij k_j = 0 since k = 0.
    const std::int64_t S = 8, D = 2;
    std::vector<double> qd(S * D, 0.0), kd(S * D, 0.0), vd(S * D), od(S * D), ld(S), dod(S * D, 1.0), dqd(S * D),
        dkd(S * D), dvd(S * D);
    for (std::int64_t i = 0; i < S * D; ++i) vd[static_cast<std::size_t>(i)] = static_cast<double>(i / D);
    const auto t = [&](std::vector<double>& x) { return baton::make_tensor_view(x.data(), {1, S, 1, D}); };
    const auto run = [](auto& backend, auto q, auto k, auto v, const auto& mask, auto out, auto lse, auto dout, auto dq,
                        auto dk, auto dv, const baton::attention_params& params) {
      // [doc:backend_contract]
      backend.forward(q, k, v, mask, out, lse, params);
      backend.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, params);
      // [/doc:backend_contract]
    };
    baton::reference_attention backend;
    run(backend, t(qd), t(kd), t(vd), baton::causal_mask{}, t(od), baton::make_tensor_view(ld.data(), {1, 1, S}), t(dod),
        t(dqd), t(dkd), t(dvd), baton::attention_params{});
    for (std::int64_t i = 0; i < S; ++i) {
      const auto row = static_cast<std::size_t>(i);
      CHECK(std::abs(od[row * D] - static_cast<double>(i) / 2) < 1e-12);
      CHECK(std::abs(ld[row] - std::log(static_cast<double>(i + 1))) < 1e-12);
      double dv_expected = 0;
      for (std::int64_t later = i; later < S; ++later) dv_expected += 1.0 / static_cast<double>(later + 1);
      CHECK(std::abs(dvd[row * D + 1] - dv_expected) < 1e-12);
      CHECK(std::abs(dqd[row * D]) < 1e-12);
    }
  }

  SECTION("causal attention, forward and backward") {
    // [doc:basic]
    const std::int64_t B = 1, S = 256, H = 8, D = 64;
    std::vector<float> q(B * S * H * D, 0.1f), k(q), v(q), out(q.size()), dout(q.size(), 1.0f);
    std::vector<float> dq(q.size()), dk(q.size()), dv(q.size()), lse(B * H * S);
    const auto t = [&](std::vector<float>& x) { return baton::make_tensor_view(x.data(), {B, S, H, D}); };
    const auto l = baton::make_tensor_view(lse.data(), {B, H, S});

    baton::reference_attention attention;  // or baton::kokkos_attention (baton/attention/kokkos.hpp)
    attention.forward(t(q), t(k), t(v), baton::causal_mask{}, t(out), l);
    // Every tensor backward needs is an argument: nothing was saved by forward.
    attention.backward(t(q), t(k), t(v), t(out), l, t(dout), baton::causal_mask{}, t(dq), t(dk), t(dv));
    // [/doc:basic]
    CHECK(std::abs(lse[0] - 0.08f) < 1e-6f);  // query 0 sees key 0 only: lse = q.k / sqrt(64)
    CHECK(std::abs(out[0] - 0.1f) < 1e-6f);
  }

  SECTION("GQA, sliding window, softmax scale") {
    // [doc:gqa]
    const std::int64_t S = 100, D = 32;
    std::vector<double> q(S * 8 * D, 0.5), k(S * 2 * D, 0.25), v(S * 2 * D, 1.0), out(q.size()), lse(8 * S);
    baton::attention_params params;
    params.softmax_scale = 0.125;  // default: 1/sqrt(D)
    baton::reference_attention{}.forward(baton::make_tensor_view(q.data(), {1, S, 8, D}),   // 8 query heads
                                         baton::make_tensor_view(k.data(), {1, S, 2, D}),   // share 2 kv heads
                                         baton::make_tensor_view(v.data(), {1, S, 2, D}),
                                         baton::sliding_window_mask{.left = 15, .right = 0},  // 16-token causal window
                                         baton::make_tensor_view(out.data(), {1, S, 8, D}),
                                         baton::make_tensor_view(lse.data(), {1, 8, S}), params);
    // [/doc:gqa]
    // Query 50 sees keys 35..50, all with score 0.5 * 0.25 * 32 * 0.125 = 0.5: lse = 0.5 + ln 16.
    CHECK(std::abs(lse[50] - (0.5 + std::log(16.0))) < 1e-12);
    CHECK(std::abs(out[0] - 1.0) < 1e-12);
  }

  SECTION("a shard: global positions and a document mask") {
    // [doc:shard]
    // Rank 1 of 4 in a zigzag layout over 8 chunks of 16 tokens holds chunks 1 and 6 of the
    // queries; the keys it attends to this step are chunks 0..3 (positions 0..63).
    std::vector<std::int64_t> mine;
    for (std::int64_t p = 16; p < 32; ++p) mine.push_back(p);
    for (std::int64_t p = 96; p < 112; ++p) mine.push_back(p);
    baton::attention_params params;
    params.q_pos = baton::positions::list(mine);
    params.k_pos = baton::positions(0, 64);

    // Documents over the *global* sequence of 128 tokens: [0, 40), [40, 100), [100, 128).
    std::vector<std::int64_t> doc_of(128);
    for (std::int64_t p = 0; p < 128; ++p) doc_of[p] = p < 40 ? 0 : p < 100 ? 1 : 2;
    const auto mask = baton::intersect(baton::document_mask(doc_of), baton::causal_mask{});

    std::vector<float> q(32 * 4 * 16, 1.0f), k(64 * 4 * 16, 1.0f), v(k.size(), 2.0f), out(q.size()), lse(4 * 32);
    baton::reference_attention{}.forward(
        baton::make_tensor_view(q.data(), {1, 32, 4, 16}), baton::make_tensor_view(k.data(), {1, 64, 4, 16}),
        baton::make_tensor_view(v.data(), {1, 64, 4, 16}), mask, baton::make_tensor_view(out.data(), {1, 32, 4, 16}),
        baton::make_tensor_view(lse.data(), {1, 4, 32}), params);
    // Queries 100..111 (document 2) see no key in 0..63: out 0, lse -inf.
    // [/doc:shard]
    CHECK(std::isinf(lse[31]));
    CHECK(out[31 * 4 * 16] == 0.0f);
    CHECK(out[0] == 2.0f);  // query 16 sees keys 0..16 of document 0
    CHECK(std::isfinite(lse[16]));  // query 96 (document 1) sees keys 40..63
    CHECK(std::isinf(lse[20]));     // query 100 (document 2) sees none
  }

  SECTION("block mask from a mask_mod") {
    // [doc:block_mask]
    // every query sees the first 4 "sink" tokens and a causal window of 256
    baton::block_mask mask([](std::int64_t q, std::int64_t k) { return k <= q && (k < 4 || q - k < 256); }, 4096,
                           4096);
    // Built once: 64 x 64 cells classified; kernels skip the empty ones.
    // [/doc:block_mask]
    CHECK(mask.count(baton::block_kind::empty) > mask.count(baton::block_kind::full));
    CHECK(mask.allowed(1000, 2));
    CHECK_FALSE(mask.allowed(1000, 500));
  }

  SECTION("block mask, as the comment of baton/attention/masks.hpp writes it") {
    // [doc:block_mask_comment]
    // every query sees the first 4 "sink" tokens and a causal window of 256
    baton::block_mask mask([](std::int64_t q, std::int64_t k) {
      return k <= q && (k < 4 || q - k < 256);
    }, 4096, 4096);
    // [/doc:block_mask_comment]
    CHECK(mask.allowed(4095, 3));      // a sink
    CHECK(mask.allowed(4095, 3840));   // the window: 4095 - 3840 = 255
    CHECK_FALSE(mask.allowed(4095, 3839));
    CHECK_FALSE(mask.allowed(10, 11));  // causal
  }

  SECTION("accumulating gradients over key blocks") {
    // [doc:accumulate]
    // Two halves of the keys, as two ring steps. out and lse come from the forward over all
    // keys (a ring merges its steps' results into the same); backward runs per half with
    // those merged out and lse, summing dq.
    const std::int64_t S = 64, D = 16;
    std::vector<double> q(S * D, 0.3), k(S * D, 0.2), v(S * D), dout(S * D, 1.0), out(S * D), lse(S);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = double(i % 7);
    baton::reference_attention attention;
    const auto qv = baton::make_tensor_view(q.data(), {1, S, 1, D});
    attention.forward(qv, baton::make_tensor_view(k.data(), {1, S, 1, D}),
                      baton::make_tensor_view(v.data(), {1, S, 1, D}), baton::no_mask{},
                      baton::make_tensor_view(out.data(), {1, S, 1, D}), baton::make_tensor_view(lse.data(), {1, 1, S}));

    std::vector<double> dq(S * D, 0.0), dk(S * D), dv(S * D);
    for (std::int64_t half = 0; half < 2; ++half) {
      const std::int64_t first = half * S / 2;
      baton::attention_params params;
      params.k_pos = baton::positions(first, S / 2);
      params.accumulate = true;  // dq += this half's contribution
      auto kv = [&](std::vector<double>& x) { return baton::make_tensor_view(x.data() + first * D, {1, S / 2, 1, D}); };
      attention.backward(qv, kv(k), kv(v), baton::make_tensor_view(out.data(), {1, S, 1, D}),
                         baton::make_tensor_view(lse.data(), {1, 1, S}), baton::make_tensor_view(dout.data(), {1, S, 1, D}),
                         baton::no_mask{}, baton::make_tensor_view(dq.data(), {1, S, 1, D}), kv(dk), kv(dv), params);
    }
    // [/doc:accumulate]
    std::vector<double> dq_whole(S * D), dk_whole(S * D), dv_whole(S * D);
    const auto w = [&](std::vector<double>& x) { return baton::make_tensor_view(x.data(), {1, S, 1, D}); };
    attention.backward(qv, w(k), w(v), w(out), baton::make_tensor_view(lse.data(), {1, 1, S}), w(dout),
                       baton::no_mask{}, w(dq_whole), w(dk_whole), w(dv_whole));
    for (std::size_t i = 0; i < dq.size(); ++i) {
      CHECK(std::abs(dq[i] - dq_whole[i]) < 1e-12);
      CHECK(std::abs(dk[i] - dk_whole[i]) < 1e-12);
      CHECK(std::abs(dv[i] - dv_whole[i]) < 1e-12);
    }
  }

  SECTION("the CUDA kernels on the CPU (baton/attention/cuda/emulated.hpp)") {
    // [doc:cuda-emulated]
    // The CUDA kernels' own source, run on the CPU (for tests: far too slow for anything else).
    const std::int64_t n = 40, heads = 2, dim = 64;
    std::vector<baton::bfloat16> q(n * heads * dim, baton::bfloat16(0.5f)), k = q, v = q, out(q.size());
    std::vector<float> lse(heads * n);
    baton::cuda_attention_emulated attention;
    attention.forward(baton::make_tensor_view<const baton::bfloat16>(q.data(), {1, n, heads, dim}),
                      baton::make_tensor_view<const baton::bfloat16>(k.data(), {1, n, heads, dim}),
                      baton::make_tensor_view<const baton::bfloat16>(v.data(), {1, n, heads, dim}),
                      baton::causal_mask{}, baton::make_tensor_view(out.data(), {1, n, heads, dim}),
                      baton::make_tensor_view(lse.data(), {1, heads, n}));
    // [/doc:cuda-emulated]
    // Every score is 0.5 * 0.5 * 64 / sqrt(64) = 2, so query i averages keys 0..i: out = 0.5
    // (exact in bf16) and lse = 2 + log(i + 1).
    CHECK(out.back().to_float() == 0.5f);
    CHECK(std::abs(lse[static_cast<std::size_t>(heads * n - 1)] - (2.0f + std::log(40.0f))) < 1e-5f);
    CHECK(std::abs(lse[0] - 2.0f) < 1e-5f);
  }

  SECTION("a user-defined mask") {
    // [doc:custom_mask]
    struct every_other_key {  // attend to even key positions only (and causally)
      bool allowed(std::int64_t q, std::int64_t k) const { return k <= q && k % 2 == 0; }
      baton::block_kind classify(const baton::position_block& qb, const baton::position_block& kb) const {
        if (kb.min() > qb.max()) return baton::block_kind::empty;  // all keys in the future
        return baton::block_kind::partial;                         // unsure: test each pair
      }
    };
    static_assert(baton::attention_mask<every_other_key>);
    // [/doc:custom_mask]
    CHECK(every_other_key{}.allowed(4, 2));
    CHECK_FALSE(every_other_key{}.allowed(4, 3));
  }
}

TEST_CASE("docs/attention.md examples: Kokkos", "[attention][docs][docs-kokkos][can-skip]") {
#if BATON_HAS_KOKKOS()
  SECTION("tensor_view of a Kokkos::View (baton/attention/kokkos.hpp)") {
    // [doc:kokkos_view]
    Kokkos::View<float****, Kokkos::LayoutRight, Kokkos::HostSpace> q("q", 2, 128, 8, 64);
    baton::tensor_view<float, 4> qv = baton::make_tensor_view(q);
    // [/doc:kokkos_view]
    CHECK(qv.stride(0) == 128 * 8 * 64);
  }

  SECTION("Kokkos views and the Kokkos backend") {
    // [doc:kokkos]
    using view4 = Kokkos::View<float****, Kokkos::LayoutRight, Kokkos::HostSpace>;
    view4 q("q", 2, 128, 8, 64), k("k", 2, 128, 2, 64), v("v", 2, 128, 2, 64), out("out", 2, 128, 8, 64);
    Kokkos::View<float***, Kokkos::LayoutRight, Kokkos::HostSpace> lse("lse", 2, 8, 128);
    Kokkos::deep_copy(q, 0.5f);
    Kokkos::deep_copy(k, 0.5f);
    Kokkos::deep_copy(v, 3.0f);
    baton::kokkos_attention attention;
    attention.forward(baton::make_tensor_view(q), baton::make_tensor_view(k), baton::make_tensor_view(v),
                      baton::causal_mask{}, baton::make_tensor_view(out), baton::make_tensor_view(lse));
    // [/doc:kokkos]
    CHECK(std::abs(out(1, 100, 7, 63) - 3.0f) < 1e-5f);
    CHECK(std::abs(lse(0, 0, 127) - (2.0f + std::log(128.0f))) < 1e-5f);
  }
#else
  BATON_SKIP("Kokkos is not linked (baton::kokkos): the Kokkos examples are not run");
#endif
}
