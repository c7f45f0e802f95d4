// kokkos_attention against the reference on a grid of shapes and every mask: out, lse, dq,
// dk, dv within max |error| <= tol x (largest magnitude of the reference tensor), tol = 1e-5
// for float and 1e-12 for double. Float's bound is ~100x its rounding unit: the tiles sum in
// float over <= 256 dims and a few hundred keys; double's leaves the same headroom.
#include "catch.hpp"

#include "attention_test_util.hpp"

#include <baton/attention.hpp>
#include <baton/attention/kokkos.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

using attn_test::shape;

struct grid_case {
  shape s;
  const char* what;
};

// Hq = 8 throughout; Hkv 8, 2, 1; D 16, 64, 128, 256; odd lengths; Sq != Sk; lengths below,
// at and above one 64-row tile; batch 2 once.
const grid_case grid[] = {
    {{2, 37, 53, 8, 8, 16}, "MHA, D 16, batch 2"},
    {{1, 70, 45, 8, 2, 64}, "GQA 4:1, D 64, Sq > Sk"},
    {{1, 65, 130, 8, 1, 128}, "MQA, D 128, Sk > 2 tiles"},
    {{1, 29, 67, 8, 2, 256}, "GQA, D 256"},
};

// ---- bfloat16 storage ----------------------------------------------------------------------
// The oracle is the double reference on the bf16 values widened (exactly) to double. The
// kernels widen on load and compute in float, so before the final rounding an output y_f is
// within the float grid's bound, |y_f - y| <= 1e-5 M (M the largest |y| of the tensor), and
// rounding to bf16 (8 significant bits, to nearest even) adds at most 2^-8 |y_f|:
//   |bf16(y_f) - y| <= 2^-8 |y| + (1 + 2^-8) 1e-5 M  — per element, which a kernel that
// truncated instead of rounding (2^-7), rounded twice or kept a stale value would exceed.
// The LSE stays float: 1e-5 M. The backward of both backends runs from the same out (the
// reference's, rounded to bf16) and LSE (rounded to float), so only the backward's own error
// is measured; with params.accumulate the rounded quantity is old + contribution.

using bf16 = baton::bfloat16;

std::vector<bf16> to_bf16(const std::vector<double>& x) {
  std::vector<bf16> out;
  out.reserve(x.size());
  for (const double e : x) out.emplace_back(static_cast<float>(e));
  return out;
}
std::vector<double> widened(const std::vector<bf16>& x) {
  std::vector<double> out;
  out.reserve(x.size());
  for (const bf16 e : x) out.push_back(static_cast<double>(e.to_float()));
  return out;
}

// Elements outside |got - want| <= rel |want| + abs_factor M; NaN must meet NaN, an infinity
// the same infinity.
template <class G>
std::size_t outside_bound(const std::vector<G>& got, const std::vector<double>& want, double rel, double abs_factor) {
  const double bound_abs = abs_factor * attn_test::max_magnitude(want);
  std::size_t bad = got.size() == want.size() ? 0 : 1;
  for (std::size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    double g;
    if constexpr (std::is_same_v<G, bf16>)
      g = static_cast<double>(got[i].to_float());
    else
      g = static_cast<double>(got[i]);
    const double w = want[i];
    if (std::isnan(g) || std::isnan(w)) {
      bad += std::isnan(g) != std::isnan(w);
      continue;
    }
    if (std::isinf(g) || std::isinf(w)) {
      bad += g != w;
      continue;
    }
    bad += !(std::abs(g - w) <= rel * std::abs(w) + bound_abs);
  }
  return bad;
}

template <class Mask>
void compare_bf16(const shape& s, const Mask& mask, const baton::attention_params& params, const std::string& what,
                  unsigned seed, const std::function<void(attn_test::inputs<double>&)>& edit = {}) {
  auto in = attn_test::random_inputs<double>(s, seed);
  if (edit) edit(in);
  const auto qb = to_bf16(in.q), kb = to_bf16(in.k), vb = to_bf16(in.v), dob = to_bf16(in.dout);
  attn_test::inputs<double> w{s, widened(qb), widened(kb), widened(vb), widened(dob)};
  constexpr double u = attn_test::unit_roundoff<bf16>();
  constexpr double float_tol = 1e-5 * (1 + u);
  const baton::reference_attention reference;
  const baton::kokkos_attention kokkos;
  using attn_test::kv_view;
  using attn_test::lse_view;
  using attn_test::q_view;

  std::vector<double> out(w.q.size()), lse(static_cast<std::size_t>(s.batch * s.heads_q * s.seq_q));
  reference.forward(q_view(w.q, s), kv_view(w.k, s), kv_view(w.v, s), mask, q_view(out, s), lse_view(lse, s), params);
  std::vector<bf16> out_b(w.q.size());
  std::vector<float> lse_f(lse.size());
  kokkos.forward(q_view(qb, s), kv_view(kb, s), kv_view(vb, s), mask, q_view(out_b, s), lse_view(lse_f, s), params);

  // Both backwards from the same out and lse.
  std::vector<bf16> saved_out = to_bf16(out);
  std::vector<float> saved_lse(lse.begin(), lse.end());
  const std::vector<double> saved_out_w = widened(saved_out), saved_lse_w(saved_lse.begin(), saved_lse.end());
  std::vector<double> dq(w.q.size()), dk(w.k.size()), dv(w.v.size());
  reference.backward(q_view(w.q, s), kv_view(w.k, s), kv_view(w.v, s), q_view(saved_out_w, s), lse_view(saved_lse_w, s),
                     q_view(w.dout, s), mask, q_view(dq, s), kv_view(dk, s), kv_view(dv, s), params);
  std::vector<bf16> dq_b(dq.size()), dk_b(dk.size()), dv_b(dv.size());
  kokkos.backward(q_view(qb, s), kv_view(kb, s), kv_view(vb, s), q_view(std::as_const(saved_out), s),
                  lse_view(std::as_const(saved_lse), s), q_view(dob, s), mask, q_view(dq_b, s), kv_view(dk_b, s),
                  kv_view(dv_b, s), params);

  // Accumulating onto bf16 gradients already there (a ring's earlier steps): old + new, rounded once.
  std::vector<bf16> dq_acc = to_bf16(w.dout), dk_acc = to_bf16(w.k), dv_acc = to_bf16(w.v);
  std::vector<double> dq_sum = widened(dq_acc), dk_sum = widened(dk_acc), dv_sum = widened(dv_acc);
  for (std::size_t i = 0; i < dq.size(); ++i) dq_sum[i] += dq[i];
  for (std::size_t i = 0; i < dk.size(); ++i) dk_sum[i] += dk[i], dv_sum[i] += dv[i];
  baton::attention_params add = params;
  add.accumulate = true;
  kokkos.backward(q_view(qb, s), kv_view(kb, s), kv_view(vb, s), q_view(std::as_const(saved_out), s),
                  lse_view(std::as_const(saved_lse), s), q_view(dob, s), mask, q_view(dq_acc, s), kv_view(dk_acc, s),
                  kv_view(dv_acc, s), add);

  INFO(what << " [" << s.batch << ", " << s.seq_q << "/" << s.seq_k << ", " << s.heads_q << "/" << s.heads_kv << ", "
            << s.dim << "], bf16 storage: elements outside 2^-8 |y| + 1e-5 max|y|");
  CHECK(outside_bound(out_b, out, u, float_tol) == 0);
  CHECK(outside_bound(lse_f, lse, 0, 1e-5) == 0);
  CHECK(outside_bound(dq_b, dq, u, float_tol) == 0);
  CHECK(outside_bound(dk_b, dk, u, float_tol) == 0);
  CHECK(outside_bound(dv_b, dv, u, float_tol) == 0);
  // The float error is the new contribution's, bounded by its own magnitude.
  CHECK(outside_bound(dq_acc, dq_sum, u, float_tol * attn_test::max_magnitude(dq) / attn_test::max_magnitude(dq_sum)) == 0);
  CHECK(outside_bound(dk_acc, dk_sum, u, float_tol * attn_test::max_magnitude(dk) / attn_test::max_magnitude(dk_sum)) == 0);
  CHECK(outside_bound(dv_acc, dv_sum, u, float_tol * attn_test::max_magnitude(dv) / attn_test::max_magnitude(dv_sum)) == 0);
}

template <class T, class Mask>
  requires std::is_same_v<T, bf16>
void compare(const shape& s, const Mask& mask, const baton::attention_params& params, const std::string& what,
             unsigned seed) {
  compare_bf16(s, mask, params, what, seed);
}

template <class T, class Mask>
void compare(const shape& s, const Mask& mask, const baton::attention_params& params, const std::string& what,
             unsigned seed) {
  const auto in = attn_test::random_inputs<T>(s, seed);
  const auto expected = attn_test::run(baton::reference_attention{}, in, mask, params);
  const auto got = attn_test::run(baton::kokkos_attention{}, in, mask, params);
  const double tol = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  const auto check = [&](const auto& a, const auto& b, const char* name) {
    const double err = attn_test::max_abs_error(a, b), mag = attn_test::max_magnitude(b);
    INFO(what << " [" << s.batch << ", " << s.seq_q << "/" << s.seq_k << ", " << s.heads_q << "/" << s.heads_kv
              << ", " << s.dim << "] " << name << ": max error " << err << ", largest magnitude " << mag);
    CHECK(err <= tol * mag);
  };
  check(got.out, expected.out, "out");
  check(got.lse, expected.lse, "lse");
  check(got.dq, expected.dq, "dq");
  check(got.dk, expected.dk, "dk");
  check(got.dv, expected.dv, "dv");
}

template <class T>
void run_grid() {
  unsigned seed = 100;
  int shape_index = 0;
  for (const auto& g : grid) {
    // Under a sanitizer every other mask of each shape (alternating between shapes, so every
    // mask still meets two shapes, every shape seven masks): the sanitizers check the memory
    // and the arithmetic of each mask's and each head dim's path, which half of the grid
    // reaches; the release build compares the whole grid with the reference.
    [[maybe_unused]] int mask_index = 0;  // read only under a sanitizer
    const auto check = [&](const shape& s_, const auto& mask, const baton::attention_params& p, const std::string& what,
                             unsigned seed_) {
#if defined(BATON_TEST_SANITIZED)
      if ((mask_index++ + shape_index) % 2 != 0) return;
#endif
      compare<T>(s_, mask, p, what, seed_);
    };
    ++shape_index;
    const shape& s = g.s;
    const std::int64_t total = s.seq_q + s.seq_k;  // global positions used below stay < total
    baton::attention_params params;
    check(s, baton::no_mask{}, params, std::string(g.what) + ", no mask", ++seed);
    check(s, baton::causal_mask{}, params, std::string(g.what) + ", causal", ++seed);

    // Queries after the keys' start (decode-like offset), window of 20 back and 3 ahead.
    params.q_pos = baton::positions(s.seq_k / 3, s.seq_q);
    check(s, baton::causal_mask{}, params, std::string(g.what) + ", causal, offset queries", ++seed);
    check(s, baton::sliding_window_mask{20, 3}, params, std::string(g.what) + ", sliding window", ++seed);
    check(s, baton::prefix_lm_mask{17}, params, std::string(g.what) + ", prefix-LM", ++seed);
    check(s, baton::intersect(baton::causal_mask{}, baton::sliding_window_mask{70, 3}), params,
          std::string(g.what) + ", causal window", ++seed);

    const std::vector<std::int64_t> segments = attn_test::packed_document_ids(total);
    check(s, baton::document_mask(segments), params, std::string(g.what) + ", documents", ++seed);
    check(s, baton::intersect(baton::document_mask(segments), baton::causal_mask{}), params,
          std::string(g.what) + ", causal documents", ++seed);

    // Zigzag-like shard for the queries (two chunks, the later one first) and a block mask
    // (sinks + causal window) built over the whole global grid.
    std::vector<std::int64_t> q_list;
    for (std::int64_t i = 0; i < s.seq_q; ++i) q_list.push_back(i < s.seq_q / 2 ? total - s.seq_q / 2 + i : i);
    params.q_pos = baton::positions::list(q_list);
    const baton::block_mask sinks_and_window(
        [](std::int64_t q, std::int64_t k) { return k <= q && (k < 4 || q - k < 48); }, total, total);
    check(s, sinks_and_window, params, std::string(g.what) + ", block mask, zigzag queries", ++seed);
    check(s, baton::causal_mask{}, params, std::string(g.what) + ", causal, zigzag queries", ++seed);
    check(s, baton::sliding_window_mask{40, 0}, params, std::string(g.what) + ", window, zigzag queries", ++seed);
    // Zigzag keys too: key tiles are contiguous runs (bounded by allowed_keys) except at the seam.
    std::vector<std::int64_t> k_list;
    for (std::int64_t i = 0; i < s.seq_k; ++i) k_list.push_back(i < s.seq_k / 2 ? total - s.seq_k / 2 + i : i);
    params.k_pos = baton::positions::list(k_list);
    check(s, baton::causal_mask{}, params, std::string(g.what) + ", causal, zigzag queries and keys", ++seed);
    check(s, baton::prefix_lm_mask{30}, params, std::string(g.what) + ", prefix-LM, zigzag queries and keys",
          ++seed);
  }
}

}  // namespace

TEST_CASE("kokkos_attention matches the reference on the shape x mask grid (float)", "[attention][kokkos]") {
  run_grid<float>();
}

TEST_CASE("kokkos_attention matches the reference on the shape x mask grid (double)", "[attention][kokkos]") {
  run_grid<double>();
}

static_assert(baton::attention_backend<baton::kokkos_attention, baton::bfloat16>);

TEST_CASE("kokkos_attention with bfloat16 storage: the reference on the widened values, every mask, within the "
          "rounding of the outputs",
          "[attention][kokkos][bf16]") {
  run_grid<bf16>();
}

TEST_CASE("kokkos_attention with bfloat16 storage keeps the non-finite rule", "[attention][kokkos][bf16]") {
  // A NaN key, an infinite value and an infinite query: the same NaN rows and gradients as the
  // reference on the widened values (outside_bound counts NaN against a number as an error).
  const shape s{1, 70, 70, 4, 2, 16};
  compare_bf16(s, baton::causal_mask{}, {}, "non-finite", 9, [&](attn_test::inputs<double>& in) {
    in.k[static_cast<std::size_t>((40 * s.heads_kv + 1) * s.dim + 3)] = std::nan("");
    in.v[static_cast<std::size_t>((5 * s.heads_kv + 0) * s.dim + 7)] = INFINITY;
    in.q[static_cast<std::size_t>((66 * s.heads_q + 2) * s.dim + 1)] = -INFINITY;
  });
}

TEST_CASE("kokkos_attention: peaked softmax, custom scale, large magnitudes", "[attention][kokkos]") {
  // Scores spread over ~+-60: the online max must rescale correctly, and exp2 must flush
  // far-below-max probabilities to zero rather than to denormals or NaN.
  const shape s{1, 67, 131, 8, 2, 64};
  baton::attention_params params;
  params.softmax_scale = 0.9;
  for (unsigned seed : {1u, 2u}) {
    const auto scaled = attn_test::random_inputs<double>(s, seed, 3.0);  // q.k ~ 3 * 3 * sqrt(64)
    const auto expected = attn_test::run(baton::reference_attention{}, scaled, baton::causal_mask{}, params);
    const auto got = attn_test::run(baton::kokkos_attention{}, scaled, baton::causal_mask{}, params);
    CHECK(attn_test::max_abs_error(got.out, expected.out) <= 1e-12 * attn_test::max_magnitude(expected.out));
    CHECK(attn_test::max_abs_error(got.lse, expected.lse) <= 1e-12 * attn_test::max_magnitude(expected.lse));
    CHECK(attn_test::max_abs_error(got.dq, expected.dq) <= 1e-12 * attn_test::max_magnitude(expected.dq));
    CHECK(attn_test::max_abs_error(got.dk, expected.dk) <= 1e-12 * attn_test::max_magnitude(expected.dk));
    CHECK(attn_test::max_abs_error(got.dv, expected.dv) <= 1e-12 * attn_test::max_magnitude(expected.dv));
  }
  // float: the forward's lazy rescale. A row is exponentiated against a max that a later tile
  // may pass by more than 8 (log2 units); that row then takes the exact path again from its
  // scores and rescales O and l. Five key tiles per row (the last one partial), scores spread
  // over ~+-30: many rows do so at least once (a forward that skips the rescale is off by
  // ~1e2 here). float's bound as in the grid tests (1e-5 of the largest magnitude; measured
  // ~3e-6, larger magnitudes exceed it in the old kernels too: the scores' own rounding).
  const shape wide{1, 67, 300, 8, 2, 64};
  for (unsigned seed : {1u, 2u}) {
    const auto in = attn_test::random_inputs<float>(wide, seed, 1.0);
    const auto expected = attn_test::run(baton::reference_attention{}, in, baton::no_mask{}, params);
    const auto got = attn_test::run(baton::kokkos_attention{}, in, baton::no_mask{}, params);
    CHECK(attn_test::max_abs_error(got.out, expected.out) <= 1e-5 * attn_test::max_magnitude(expected.out));
    CHECK(attn_test::max_abs_error(got.lse, expected.lse) <= 1e-5 * attn_test::max_magnitude(expected.lse));
    CHECK(attn_test::max_abs_error(got.dq, expected.dq) <= 1e-5 * attn_test::max_magnitude(expected.dq));
    CHECK(attn_test::max_abs_error(got.dk, expected.dk) <= 1e-5 * attn_test::max_magnitude(expected.dk));
    CHECK(attn_test::max_abs_error(got.dv, expected.dv) <= 1e-5 * attn_test::max_magnitude(expected.dv));
  }
}

TEST_CASE("kokkos_attention: a later key tile past the first one's max by more than float's range",
          "[attention][kokkos]") {
  // The forward exponentiates each tile against the row's max so far and tests afterwards
  // whether a probability passed 2^8 (then it takes the exact path). Here the first key tile's
  // scores are ~0 and the later tiles' ~160 (231 in log2 units): against the old max they are
  // 2^231, +inf in float, so a forward whose test let them through gives inf / NaN rows
  // instead of the softmax over the later keys. float, every row whole (no mask) and causal
  // with the queries after the keys (partial tiles), softmax_scale 1 so that the scores are
  // q . k as written.
  const shape s{1, 9, 200, 2, 2, 64};
  baton::attention_params params;
  params.softmax_scale = 1.0;
  auto in = attn_test::random_inputs<float>(s, 5, 1.0);
  for (std::int64_t i = 0; i < s.seq_q; ++i)
    for (std::int64_t h = 0; h < s.heads_q; ++h)
      for (std::int64_t d = 0; d < s.dim; ++d) in.q[static_cast<std::size_t>((i * s.heads_q + h) * s.dim + d)] = 1.0f;
  for (std::int64_t j = 0; j < s.seq_k; ++j)
    for (std::int64_t h = 0; h < s.heads_kv; ++h)
      for (std::int64_t d = 0; d < s.dim; ++d)
        in.k[static_cast<std::size_t>((j * s.heads_kv + h) * s.dim + d)] =
            j < 64 ? 0.01f * static_cast<float>(d % 5) : 2.5f + 0.05f * static_cast<float>((j + h) % 7);
  baton::attention_params causal_params = params;
  causal_params.q_pos = baton::positions(s.seq_k - s.seq_q, s.seq_q);
  const auto check = [&](const auto& mask, const baton::attention_params& p, const char* what) {
    INFO(what);
    const auto expected = attn_test::run(baton::reference_attention{}, in, mask, p);
    const auto got = attn_test::run(baton::kokkos_attention{}, in, mask, p);
    // Scores of ~160 carry float rounding of ~1e-5 each; the outputs are averages of v
    // (|v| ~ 1) with weights e^(score - max): 1e-4 of the largest output bounds that.
    CHECK(attn_test::max_abs_error(got.out, expected.out) <= 1e-4 * attn_test::max_magnitude(expected.out));
    CHECK(attn_test::max_abs_error(got.lse, expected.lse) <= 1e-5 * attn_test::max_magnitude(expected.lse));
  };
  check(baton::no_mask{}, params, "no mask");
  check(baton::causal_mask{}, causal_params, "causal, queries after the keys");
}

TEST_CASE("kokkos_attention backward: dQ summed from several key-pass runs, as several threads make it",
          "[attention][kokkos]") {
  // The key pass adds each key block's share of dQ to its run's partial, and the query pass
  // sums the runs' partials; with one thread (Serial) there is one run, so this forces 1..5.
  // dK and dV do not depend on the runs (same bits); dQ is the same terms summed in another
  // association: within 1e-6 of its largest magnitude (a few float roundings of a sum of up
  // to 3 x 2 terms, each below that magnitude), and within the float grid's 1e-5 of the
  // reference. GQA, a causal mask with an offset (partial and empty tiles), lengths across
  // tile edges, two batch entries (several kv units per round).
  const shape s{2, 150, 190, 4, 2, 24};
  baton::attention_params params;
  params.q_pos = baton::positions(40, s.seq_q);
  const auto in = attn_test::random_inputs<float>(s, 17);
  const auto expected = attn_test::run(baton::reference_attention{}, in, baton::causal_mask{}, params);
  const auto one = attn_test::run(baton::kokkos_attention{}, in, baton::causal_mask{}, params);
  for (std::int64_t runs : {2, 3, 5}) {
    INFO("runs " << runs);
    baton::kokkos_attention several;
    baton::detail::attention::backward_runs_for_tests::set(several, runs);
    const auto got = attn_test::run(several, in, baton::causal_mask{}, params);
    CHECK(got.dk == one.dk);
    CHECK(got.dv == one.dv);
    CHECK(attn_test::max_abs_error(got.dq, one.dq) <= 1e-6 * attn_test::max_magnitude(one.dq));
    CHECK(attn_test::max_abs_error(got.dq, expected.dq) <= 1e-5 * attn_test::max_magnitude(expected.dq));
    CHECK(attn_test::max_magnitude(got.dq) > 1e-2);
  }
}

TEST_CASE("kokkos_attention runs in rounds of heads that cover every head once, across batch entries",
          "[attention][kokkos]") {
  namespace da = baton::detail::attention;
  // Rounds are contiguous runs of the flattened (batch, kv head) index, never empty, and
  // cover every kv head exactly once, whatever the thread count.
  for (const std::int64_t threads : {1, 2, 7, 64})
    for (const std::int64_t units : {1, 3, 6, 16})
      for (const std::int64_t k_blocks : {1, 3, 16}) {
        const std::int64_t per_round = da::round_units_for(units, k_blocks, threads);
        INFO("threads " << threads << ", kv heads " << units << ", key blocks " << k_blocks);
        CHECK(per_round >= 1);
        CHECK(per_round <= units);
        // Enough items for every thread when there are enough heads to give them.
        CHECK((per_round * k_blocks >= 4 * threads || per_round == units));
      }

  // Shapes whose rounds straddle batch entries and whose last round is short: the packed
  // buffers are indexed per round, so a head's rows must land where its tiles look.
  const baton::kokkos_attention backend;
  const std::int64_t threads = std::max<std::int64_t>(1, Kokkos::DefaultHostExecutionSpace().concurrency());
  bool straddled = false;
  unsigned seed = 300;
  for (const shape& s : {shape{2, 45, 150, 6, 3, 32}, shape{3, 20, 140, 2, 1, 24}, shape{3, 70, 130, 4, 1, 16}}) {
    const baton::attention_params params;
    const da::checked_call call{s.batch, s.seq_q, s.seq_k, s.heads_q, s.heads_kv, s.dim, 1.0,
                                baton::positions(0, s.seq_q), baton::positions(0, s.seq_k)};
    const da::flash_layout<float> layout(call, threads);
    for (std::int64_t r = 0; r < layout.rounds(); ++r) {
      const da::head_round round = layout.round(r);
      straddled = straddled || round.begin / s.heads_kv != (round.end - 1) / s.heads_kv;
    }
    compare<float>(s, baton::causal_mask{}, params, "rounds, causal", ++seed);
    compare<double>(s, baton::no_mask{}, params, "rounds, no mask", ++seed);
  }
  INFO("with " << threads << " threads no round spans two batch entries: the shapes above no longer test that");
  CHECK(straddled);
}

TEST_CASE("kokkos_attention is deterministic: the same inputs give bit-identical outputs", "[attention][kokkos]") {
  const shape s{1, 100, 150, 8, 2, 64};
  const auto in = attn_test::random_inputs<float>(s, 77);
  const auto a = attn_test::run(baton::kokkos_attention{}, in, baton::causal_mask{});
  const auto b = attn_test::run(baton::kokkos_attention{}, in, baton::causal_mask{});
  CHECK(a.out == b.out);
  CHECK(a.lse == b.lse);
  CHECK(a.dq == b.dq);
  CHECK(a.dk == b.dk);
  CHECK(a.dv == b.dv);
}

TEST_CASE("kokkos_attention reuses its workspace without reading stale bytes", "[attention][kokkos]") {
  // The backend keeps its packing buffers between calls and never zeroes them: every byte a
  // tile reads must be written by the call. Fill the workspace with NaN through a larger
  // problem, then run smaller ones with padding everywhere (odd lengths, a head dim that is
  // not a vector multiple) and compare with a fresh backend bit for bit.
  baton::kokkos_attention reused;
  auto poison = attn_test::random_inputs<float>(shape{2, 150, 170, 8, 2, 72}, 1);
  for (auto* t : {&poison.q, &poison.k, &poison.v, &poison.dout})
    for (auto& x : *t) x = std::numeric_limits<float>::quiet_NaN();
  (void)attn_test::run(reused, poison, baton::no_mask{});
  for (const shape& s : {shape{1, 37, 45, 8, 2, 20}, shape{2, 3, 70, 4, 4, 33}}) {
    const auto in = attn_test::random_inputs<float>(s, 2);
    const auto a = attn_test::run(reused, in, baton::causal_mask{});
    const auto b = attn_test::run(baton::kokkos_attention{}, in, baton::causal_mask{});
    CHECK(attn_test::all_finite(a.dq));
    CHECK(a.out == b.out);
    CHECK(a.lse == b.lse);
    CHECK(a.dq == b.dq);
    CHECK(a.dk == b.dk);
    CHECK(a.dv == b.dv);
  }
}

TEST_CASE("tensor_view from Kokkos::View: strides from the view, LayoutLeft refused by the kernel",
          "[attention][kokkos]") {
  const shape s{1, 9, 9, 2, 1, 8};
  const auto in = attn_test::random_inputs<float>(s, 4);
  Kokkos::View<float****, Kokkos::LayoutRight, Kokkos::HostSpace> q("q", 1, 9, 2, 8), out("out", 1, 9, 2, 8);
  Kokkos::View<float****, Kokkos::LayoutRight, Kokkos::HostSpace> k("k", 1, 9, 1, 8), v("v", 1, 9, 1, 8);
  Kokkos::View<float***, Kokkos::LayoutRight, Kokkos::HostSpace> lse("lse", 1, 2, 9);
  std::copy(in.q.begin(), in.q.end(), q.data());
  std::copy(in.k.begin(), in.k.end(), k.data());
  std::copy(in.v.begin(), in.v.end(), v.data());
  const auto qv = baton::make_tensor_view(q);
  STATIC_REQUIRE(std::is_same_v<decltype(qv), const baton::tensor_view<float, 4>>);
  CHECK(qv.strides() == std::array<std::int64_t, 4>{144, 16, 8, 1});
  baton::kokkos_attention{}.forward(qv, baton::make_tensor_view(k), baton::make_tensor_view(v), baton::no_mask{},
                                    baton::make_tensor_view(out), baton::make_tensor_view(lse));
  std::vector<float> expected(in.q.size()), expected_lse(18);
  baton::reference_attention{}.forward(attn_test::q_view(in.q, s), attn_test::kv_view(in.k, s),
                                       attn_test::kv_view(in.v, s), baton::no_mask{},
                                       attn_test::q_view(expected, s), attn_test::lse_view(expected_lse, s));
  for (std::size_t i = 0; i < expected.size(); ++i) CHECK(std::abs(out.data()[i] - expected[i]) <= 1e-5f);

  Kokkos::View<float****, Kokkos::LayoutLeft, Kokkos::HostSpace> left_storage("left", 1, 9, 2, 8);
  const Kokkos::View<const float****, Kokkos::LayoutLeft, Kokkos::HostSpace> left = left_storage;
  const auto lv = baton::make_tensor_view(left);
  STATIC_REQUIRE(std::is_same_v<decltype(lv), const baton::tensor_view<const float, 4>>);
  CHECK(lv.stride(3) == 18);
  CHECK_THROWS_WITH(baton::kokkos_attention{}.forward(lv, baton::make_tensor_view(k), baton::make_tensor_view(v),
                                                      baton::no_mask{}, baton::make_tensor_view(out),
                                                      baton::make_tensor_view(lse)),
                    Catch::Contains("tensor 'q' has stride 18 along its last axis"));
}
