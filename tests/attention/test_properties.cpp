// Properties every backend must have, checked for the reference and the Kokkos backend, float
// and double: the softmax identity backward relies on, fully masked rows, accumulation,
// splitting the keys the way a ring does, and bad input. The Kokkos backend's case skips
// where Kokkos is not linked.
#include "catch.hpp"
#include "skip.hpp"

#include "attention_test_util.hpp"

#include <baton/attention.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace {

using attn_test::shape;

template <class Backend, class T>
struct config {
  using backend = Backend;
  using value = T;
};

template <class T>
double tolerance() {
  return std::is_same_v<T, float> ? 1e-5 : 1e-12;
}

}  // namespace

// The reference backend's configurations; the Kokkos backend's run in one case of their own
// (at the end), which skips where Kokkos is not linked.
#define BATON_REFERENCE_CONFIGS (config<baton::reference_attention, float>), (config<baton::reference_attention, double>)

TEMPLATE_TEST_CASE("attention backends model attention_backend", "[attention][concept]", BATON_REFERENCE_CONFIGS) {
  STATIC_REQUIRE(baton::attention_backend<typename TestType::backend, typename TestType::value>);
}

// Near misses of attention_backend: each differs from `fake_backend` (which models it) in one
// requirement, so each negative check fails if the concept stopped asking for that requirement.
namespace concept_probe {

using in_view = baton::tensor_view<const float, 4>;
using out_view = baton::tensor_view<float, 4>;
using lse_view = baton::tensor_view<float, 3>;
using saved_lse = baton::tensor_view<const float, 3>;

struct fake_backend {  // the shape of the contract, float only
  template <class Mask>
  void forward(in_view, in_view, in_view, const Mask&, out_view, lse_view, const baton::attention_params&) const;
  template <class Mask>
  void backward(in_view, in_view, in_view, in_view, saved_lse, in_view, const Mask&, out_view, out_view, out_view,
                const baton::attention_params&) const;
};
struct forward_only {  // no backward
  template <class Mask>
  void forward(in_view, in_view, in_view, const Mask&, out_view, lse_view, const baton::attention_params&) const;
};
struct backward_only {  // no forward
  template <class Mask>
  void backward(in_view, in_view, in_view, in_view, saved_lse, in_view, const Mask&, out_view, out_view, out_view,
                const baton::attention_params&) const;
};
struct mutable_inputs {  // forward wants mutable q, k, v: callers hold const views
  template <class Mask>
  void forward(out_view, out_view, out_view, const Mask&, out_view, lse_view, const baton::attention_params&) const;
  template <class Mask>
  void backward(in_view, in_view, in_view, in_view, saved_lse, in_view, const Mask&, out_view, out_view, out_view,
                const baton::attention_params&) const;
};
struct no_params {  // forward without the attention_params argument
  template <class Mask>
  void forward(in_view, in_view, in_view, const Mask&, out_view, lse_view) const;
  template <class Mask>
  void backward(in_view, in_view, in_view, in_view, saved_lse, in_view, const Mask&, out_view, out_view, out_view,
                const baton::attention_params&) const;
};

}  // namespace concept_probe

TEST_CASE("attention_backend rejects near misses", "[attention][concept]") {
  using namespace concept_probe;
  STATIC_REQUIRE(baton::attention_backend<fake_backend, float>);
  STATIC_REQUIRE_FALSE(baton::attention_backend<fake_backend, double>);  // float-only views
  STATIC_REQUIRE_FALSE(baton::attention_backend<forward_only, float>);
  STATIC_REQUIRE_FALSE(baton::attention_backend<backward_only, float>);
  STATIC_REQUIRE_FALSE(baton::attention_backend<mutable_inputs, float>);
  STATIC_REQUIRE_FALSE(baton::attention_backend<no_params, float>);
  STATIC_REQUIRE_FALSE(baton::attention_backend<int, float>);
  // A mask argument is checked by the mask concept, not by overload failure: passing a
  // non-mask is a static_assert (compile_fail/not_a_mask*.cpp), and the concept is unchanged.
  STATIC_REQUIRE_FALSE(baton::attention_mask<int>);
}

// Each property once, for any (backend, element type) config; the test cases below run them.
namespace property_checks {

/// Rowsum(dO * O) = rowsum(P * dP), and P sums to one.
template <class TestType>
void check_softmax_identity() {
  // Backward computes dS = P * (dP - D) with D = rowsum(dO * O) instead of rowsum(P * dP):
  // equal because O = P V, so rowsum(dO * O) = sum_j P_ij (dO_i . v_j) = rowsum(P * dP).
  // Here both sides are formed in double from the backend's own out and lse.
  using T = typename TestType::value;
  const shape s{2, 37, 29, 4, 2, 16};
  const auto in = attn_test::random_inputs<T>(s, 3);
  baton::attention_params params;
  params.q_pos = baton::positions(10, s.seq_q);
  const baton::causal_mask mask;
  attn_test::results<T> r;
  r.out.resize(in.q.size());
  r.lse.resize(static_cast<std::size_t>(s.batch * s.heads_q * s.seq_q));
  typename TestType::backend backend;
  backend.forward(attn_test::q_view(in.q, s), attn_test::kv_view(in.k, s), attn_test::kv_view(in.v, s), mask,
                  attn_test::q_view(r.out, s), attn_test::lse_view(r.lse, s), params);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.dim));
  const auto at = [&](const std::vector<T>& x, std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t heads,
                      std::int64_t seq, std::int64_t d) {
    return static_cast<double>(x[static_cast<std::size_t>(((b * seq + i) * heads + h) * s.dim + d)]);
  };
  for (std::int64_t b = 0; b < s.batch; ++b)
    for (std::int64_t h = 0; h < s.heads_q; ++h)
      for (std::int64_t i = 0; i < s.seq_q; ++i) {
        const double lse = static_cast<double>(r.lse[static_cast<std::size_t>((b * s.heads_q + h) * s.seq_q + i)]);
        double d_out = 0, d_p = 0, p_sum = 0, magnitude = 0;
        for (std::int64_t d = 0; d < s.dim; ++d)
          d_out += at(in.dout, b, i, h, s.heads_q, s.seq_q, d) * at(r.out, b, i, h, s.heads_q, s.seq_q, d);
        for (std::int64_t j = 0; j < s.seq_k; ++j) {
          if (!mask.allowed(10 + i, j)) continue;
          double qk = 0, dov = 0;
          for (std::int64_t d = 0; d < s.dim; ++d) {
            qk += at(in.q, b, i, h, s.heads_q, s.seq_q, d) * at(in.k, b, j, h / 2, s.heads_kv, s.seq_k, d);
            dov += at(in.dout, b, i, h, s.heads_q, s.seq_q, d) * at(in.v, b, j, h / 2, s.heads_kv, s.seq_k, d);
          }
          const double p = std::exp(qk * scale - lse);
          p_sum += p;
          d_p += p * dov;
          magnitude = std::max(magnitude, std::abs(dov));
        }
        INFO("b " << b << " h " << h << " i " << i << ": rowsum(dO*O) " << d_out << ", rowsum(P*dP) " << d_p);
        REQUIRE(std::abs(p_sum - 1.0) <= 10 * tolerance<T>());
        REQUIRE(std::abs(d_out - d_p) <= 10 * tolerance<T>() * std::max(1.0, magnitude));
      }
}

/// A fully masked query row: out 0, lse -inf, no NaN in any gradient.
template <class TestType>
void check_fully_masked_row() {
  using T = typename TestType::value;
  const shape s{1, 70, 75, 8, 2, 32};
  const auto in = attn_test::random_inputs<T>(s, 5);
  baton::attention_params params;
  params.k_pos = baton::positions(5, s.seq_k);  // keys 5..79: queries 0..4 see none (causal)
  const auto r = attn_test::run(typename TestType::backend{}, in, baton::causal_mask{}, params);
  for (std::int64_t h = 0; h < s.heads_q; ++h)
    for (std::int64_t i = 0; i < s.seq_q; ++i) {
      const double lse = static_cast<double>(r.lse[static_cast<std::size_t>(h * s.seq_q + i)]);
      if (i < 5) {
        REQUIRE(std::isinf(lse));
        REQUIRE(lse < 0);
        for (std::int64_t d = 0; d < s.dim; ++d) {
          const auto at = static_cast<std::size_t>((i * s.heads_q + h) * s.dim + d);
          REQUIRE(r.out[at] == T(0));
          REQUIRE(r.dq[at] == T(0));
        }
      } else {
        REQUIRE(std::isfinite(lse));
      }
    }
  CHECK(attn_test::all_finite(r.out));
  CHECK(attn_test::all_finite(r.dq));
  CHECK(attn_test::all_finite(r.dk));
  CHECK(attn_test::all_finite(r.dv));
  CHECK(attn_test::max_magnitude(r.dk) > 1e-3);  // the other rows still produce gradients

  // Every query masked (no key at all, and keys all in the future).
  const shape none{1, 3, 0, 2, 1, 8};
  const auto empty_in = attn_test::random_inputs<T>(none, 6);
  const auto r0 = attn_test::run(typename TestType::backend{}, empty_in, baton::no_mask{});
  for (auto l : r0.lse) CHECK((std::isinf(static_cast<double>(l)) && l < 0));
  for (auto o : r0.out) CHECK(o == T(0));
  for (auto g : r0.dq) CHECK(g == T(0));
}

/// Accumulate adds into dq, dk, dv.
template <class TestType>
void check_accumulate() {
  using T = typename TestType::value;
  const shape s{1, 19, 23, 4, 1, 8};
  const auto in = attn_test::random_inputs<T>(s, 7);
  typename TestType::backend backend;
  const auto r = attn_test::run(backend, in, baton::sliding_window_mask{4, 4});
  std::vector<T> dq(in.q.size(), T(1.5)), dk(in.k.size(), T(-2)), dv(in.v.size(), T(0.25));
  baton::attention_params params;
  params.accumulate = true;
  backend.backward(attn_test::q_view(in.q, s), attn_test::kv_view(in.k, s), attn_test::kv_view(in.v, s),
                   attn_test::q_view(r.out, s), attn_test::lse_view(r.lse, s), attn_test::q_view(in.dout, s),
                   baton::sliding_window_mask{4, 4}, attn_test::q_view(dq, s), attn_test::kv_view(dk, s),
                   attn_test::kv_view(dv, s), params);
  const auto shifted = [](const std::vector<T>& g, T by) {
    std::vector<T> x(g);
    for (auto& e : x) e += by;
    return x;
  };
  CHECK(attn_test::max_abs_error(dq, shifted(r.dq, T(1.5))) <= 4 * tolerance<T>());
  CHECK(attn_test::max_abs_error(dk, shifted(r.dk, T(-2))) <= 4 * tolerance<T>());
  CHECK(attn_test::max_abs_error(dv, shifted(r.dv, T(0.25))) <= 4 * tolerance<T>());
}

/// Keys split in two, as a ring does: merged forward and summed backward equal the whole.
template <class TestType>
void check_split_keys() {
  // What context parallelism relies on: attention over keys [0, m) and [m, Sk) separately,
  // merged by lse, equals attention over all keys; and backward over each part, given the
  // merged out and lse and accumulating into dq, equals the whole backward. Causal with
  // global positions, so some rows see nothing of the second part (lse -inf there).
  using T = typename TestType::value;
  using L = baton::lse_t<T>;
  const shape s{1, 45, 45, 4, 2, 16};
  const std::int64_t m = 20;
  const auto in = attn_test::random_inputs<T>(s, 9);
  typename TestType::backend backend;
  const baton::causal_mask mask;
  const auto whole = attn_test::run(backend, in, mask);

  shape part_shape[2] = {s, s};
  part_shape[0].seq_k = m;
  part_shape[1].seq_k = s.seq_k - m;
  std::vector<T> k_part[2], v_part[2];
  for (int p = 0; p < 2; ++p) {
    const std::int64_t begin = p == 0 ? 0 : m, count = part_shape[p].seq_k;
    const std::int64_t row = s.heads_kv * s.dim;
    k_part[p].assign(in.k.begin() + begin * row, in.k.begin() + (begin + count) * row);
    v_part[p].assign(in.v.begin() + begin * row, in.v.begin() + (begin + count) * row);
  }
  std::vector<T> out_part[2];
  std::vector<L> lse_part[2];
  baton::attention_params params[2];
  for (int p = 0; p < 2; ++p) {
    params[p].k_pos = baton::positions(p == 0 ? 0 : m, part_shape[p].seq_k);
    out_part[p].resize(in.q.size());
    lse_part[p].resize(whole.lse.size());
    backend.forward(attn_test::q_view(in.q, s), attn_test::kv_view(k_part[p], part_shape[p]),
                    attn_test::kv_view(v_part[p], part_shape[p]), mask, attn_test::q_view(out_part[p], s),
                    attn_test::lse_view(lse_part[p], s), params[p]);
  }
  std::vector<T> out(in.q.size());
  std::vector<L> lse(whole.lse.size());
  for (std::int64_t i = 0; i < s.seq_q; ++i)
    for (std::int64_t h = 0; h < s.heads_q; ++h) {
      const auto li = static_cast<std::size_t>(h * s.seq_q + i);
      const double a = lse_part[0][li], b = lse_part[1][li];
      const double hi = std::max(a, b);
      const double merged = std::isinf(hi) ? hi : hi + std::log(std::exp(a - hi) + std::exp(b - hi));
      lse[li] = static_cast<L>(merged);
      for (std::int64_t d = 0; d < s.dim; ++d) {
        const auto oi = static_cast<std::size_t>((i * s.heads_q + h) * s.dim + d);
        out[oi] = static_cast<T>(std::exp(a - merged) * out_part[0][oi] + std::exp(b - merged) * out_part[1][oi]);
      }
    }
  CHECK(attn_test::max_abs_error(out, whole.out) <= 10 * tolerance<T>() * attn_test::max_magnitude(whole.out));
  CHECK(attn_test::max_abs_error(lse, whole.lse) <= 10 * tolerance<T>() * attn_test::max_magnitude(whole.lse));

  std::vector<T> dq(in.q.size(), T(0)), dk(in.k.size()), dv(in.v.size());
  for (int p = 0; p < 2; ++p) {
    std::vector<T> dk_part(k_part[p].size()), dv_part(v_part[p].size());
    params[p].accumulate = true;  // dq sums over the parts
    backend.backward(attn_test::q_view(in.q, s), attn_test::kv_view(k_part[p], part_shape[p]),
                     attn_test::kv_view(v_part[p], part_shape[p]), attn_test::q_view(whole.out, s),
                     attn_test::lse_view(whole.lse, s), attn_test::q_view(in.dout, s), mask, attn_test::q_view(dq, s),
                     attn_test::kv_view(dk_part, part_shape[p]), attn_test::kv_view(dv_part, part_shape[p]), params[p]);
    const std::size_t offset = static_cast<std::size_t>((p == 0 ? 0 : m) * s.heads_kv * s.dim);
    std::copy(dk_part.begin(), dk_part.end(), dk.begin() + static_cast<std::ptrdiff_t>(offset));
    std::copy(dv_part.begin(), dv_part.end(), dv.begin() + static_cast<std::ptrdiff_t>(offset));
  }
  CHECK(attn_test::max_abs_error(dq, whole.dq) <= 10 * tolerance<T>() * attn_test::max_magnitude(whole.dq));
  CHECK(attn_test::max_abs_error(dk, whole.dk) <= 10 * tolerance<T>() * attn_test::max_magnitude(whole.dk));
  CHECK(attn_test::max_abs_error(dv, whole.dv) <= 10 * tolerance<T>() * attn_test::max_magnitude(whole.dv));
}

/// Bad input raises attention_error naming the tensor and the expected shape.
template <class TestType>
void check_bad_input() {
  using T = typename TestType::value;
  using L = baton::lse_t<T>;
  typename TestType::backend backend;
  std::vector<T> q(1 * 5 * 4 * 8), k(1 * 7 * 2 * 8), v(k.size()), out(q.size()), dq(q.size()), dk(k.size()),
      dv(k.size()), big(4096);
  std::vector<L> lse(1 * 4 * 5), big_lse(256);
  const auto Q = baton::make_tensor_view(q.data(), {1, 5, 4, 8});
  const auto K = baton::make_tensor_view(k.data(), {1, 7, 2, 8});
  const auto V = baton::make_tensor_view(v.data(), {1, 7, 2, 8});
  const auto O = baton::make_tensor_view(out.data(), {1, 5, 4, 8});
  const auto LSE = baton::make_tensor_view(lse.data(), {1, 4, 5});
  const baton::no_mask none;
  const auto forward_throws = [&](auto q_, auto k_, auto v_, auto o_, auto l_, const std::string& text,
                                  const baton::attention_params& params = {}) {
    INFO("expected message containing: " << text);
    CHECK_THROWS_AS(backend.forward(q_, k_, v_, none, o_, l_, params), baton::attention_error);
    CHECK_THROWS_WITH(backend.forward(q_, k_, v_, none, o_, l_, params), Catch::Contains(text));
  };
  forward_throws(Q, baton::make_tensor_view(big.data(), {2, 7, 2, 8}), V, O, LSE,
                 "tensor 'k' has shape [2, 7, 2, 8] but expected [1, 7, 2, 8]");
  forward_throws(Q, K, baton::make_tensor_view(big.data(), {1, 6, 2, 8}), O, LSE,
                 "tensor 'v' has shape [1, 6, 2, 8] but expected [1, 7, 2, 8]");
  forward_throws(Q, baton::make_tensor_view(big.data(), {1, 7, 2, 4}), V, O, LSE,
                 "tensor 'k' has shape [1, 7, 2, 4] but expected [1, 7, 2, 8]");
  forward_throws(Q, baton::make_tensor_view(big.data(), {1, 7, 3, 8}), baton::make_tensor_view(big.data(), {1, 7, 3, 8}),
                 O, LSE, "q has 4 heads and k/v have 3; the query heads must be a multiple of the key/value heads");
  forward_throws(Q, K, V, O, baton::make_tensor_view(big_lse.data(), {1, 5, 4}),
                 "tensor 'lse' has shape [1, 5, 4] but expected [1, 4, 5]");
  forward_throws(Q, K, V, baton::make_tensor_view(big.data(), {1, 5, 4, 7}), LSE,
                 "tensor 'out' has shape [1, 5, 4, 7] but expected [1, 5, 4, 8]");
  baton::attention_params params;
  params.q_pos = baton::positions(0, 6);
  forward_throws(Q, K, V, O, LSE, "q_pos lists 6 positions but the tensor's sequence axis has 5 rows", params);
  params = {};
  params.softmax_scale = -1;
  forward_throws(Q, K, V, O, LSE, "softmax_scale is -1", params);
  CHECK_THROWS_WITH(backend.forward(Q, K, V, baton::document_mask(std::vector<std::int64_t>{0, 0, 0}), O, LSE),
                    Catch::Contains("baton::document_mask: query position 3 has no segment id"));

  const auto backward_throws = [&](auto dq_, auto dk_, auto dv_, auto l_, const std::string& text) {
    INFO("expected message containing: " << text);
    CHECK_THROWS_WITH(backend.backward(Q, K, V, O, l_, Q, none, dq_, dk_, dv_), Catch::Contains(text));
  };
  const auto DQ = baton::make_tensor_view(dq.data(), {1, 5, 4, 8});
  const auto DK = baton::make_tensor_view(dk.data(), {1, 7, 2, 8});
  const auto DV = baton::make_tensor_view(dv.data(), {1, 7, 2, 8});
  const baton::tensor_view<const L, 3> CLSE = LSE;
  backward_throws(baton::make_tensor_view(big.data(), {1, 4, 4, 8}), DK, DV, CLSE,
                  "tensor 'dq' has shape [1, 4, 4, 8] but expected [1, 5, 4, 8]");
  backward_throws(DQ, baton::make_tensor_view(big.data(), {1, 7, 4, 8}), DV, CLSE,
                  "tensor 'dk' has shape [1, 7, 4, 8] but expected [1, 7, 2, 8]");
  backward_throws(DQ, DK, baton::make_tensor_view(big.data(), {1, 8, 2, 8}), CLSE,
                  "tensor 'dv' has shape [1, 8, 2, 8] but expected [1, 7, 2, 8]");
  backward_throws(DQ, DK, DV, baton::tensor_view<const L, 3>(baton::make_tensor_view(big_lse.data(), {1, 4, 6})),
                  "tensor 'lse' has shape [1, 4, 6] but expected [1, 4, 5]");
}

/// Strided views: a head-dim stride other than 1.
template <class TestType>
void check_strided_views() {
  // q laid out [batch, seq, heads, dim] with every element followed by a gap (stride 2 along
  // dim). The reference reads any strides; the Kokkos backend refuses, naming the tensor.
  using T = typename TestType::value;
  using L = baton::lse_t<T>;
  const shape s{1, 6, 2, 2, 1, 4};
  const auto in = attn_test::random_inputs<T>(s, 13);
  std::vector<T> gapped(in.q.size() * 2);
  for (std::size_t i = 0; i < in.q.size(); ++i) gapped[2 * i] = in.q[i];
  const auto strided_q = baton::make_tensor_view(static_cast<const T*>(gapped.data()),
                                                 std::array<std::int64_t, 4>{1, 6, 2, 4},
                                                 std::array<std::int64_t, 4>{96, 16, 8, 2});
  std::vector<T> out(in.q.size()), expected_out(in.q.size());
  std::vector<L> lse(12), expected_lse(12);
  typename TestType::backend backend;
  if constexpr (std::is_same_v<typename TestType::backend, baton::reference_attention>) {
    backend.forward(strided_q, attn_test::kv_view(in.k, s), attn_test::kv_view(in.v, s), baton::no_mask{},
                    attn_test::q_view(out, s), attn_test::lse_view(lse, s));
    backend.forward(attn_test::q_view(in.q, s), attn_test::kv_view(in.k, s), attn_test::kv_view(in.v, s),
                    baton::no_mask{}, attn_test::q_view(expected_out, s), attn_test::lse_view(expected_lse, s));
    CHECK(out == expected_out);
    CHECK(lse == expected_lse);
  } else {
    CHECK_THROWS_WITH(backend.forward(strided_q, attn_test::kv_view(in.k, s), attn_test::kv_view(in.v, s),
                                      baton::no_mask{}, attn_test::q_view(out, s), attn_test::lse_view(lse, s)),
                      Catch::Contains("tensor 'q' has stride 2 along its last axis") &&
                          Catch::Contains("needs the head dim contiguous (stride 1)"));
  }
}

}  // namespace property_checks

TEMPLATE_TEST_CASE("rowsum(dO * O) = rowsum(P * dP), and P sums to one", "[attention][identity]",
                   BATON_REFERENCE_CONFIGS) {
  property_checks::check_softmax_identity<TestType>();
}

TEMPLATE_TEST_CASE("a fully masked query row: out 0, lse -inf, no NaN in any gradient", "[attention][masked]",
                   BATON_REFERENCE_CONFIGS) {
  property_checks::check_fully_masked_row<TestType>();
}

TEMPLATE_TEST_CASE("accumulate adds into dq, dk, dv", "[attention][accumulate]", BATON_REFERENCE_CONFIGS) {
  property_checks::check_accumulate<TestType>();
}

TEMPLATE_TEST_CASE("keys split in two, as a ring does: merged forward and summed backward equal the whole",
                   "[attention][ring]", BATON_REFERENCE_CONFIGS) {
  property_checks::check_split_keys<TestType>();
}

TEMPLATE_TEST_CASE("bad input raises attention_error naming the tensor and the expected shape", "[attention][errors]",
                   BATON_REFERENCE_CONFIGS) {
  property_checks::check_bad_input<TestType>();
}

TEMPLATE_TEST_CASE("strided views: a head-dim stride other than 1", "[attention][errors]", BATON_REFERENCE_CONFIGS) {
  property_checks::check_strided_views<TestType>();
}

// (The tags stay on the TEST_CASE line: that is where baton_add_test finds [can-skip].)
TEST_CASE("kokkos_attention: every property above, float and double", "[attention][kokkos][kokkos-properties][can-skip]") {
#if BATON_HAS_KOKKOS()
  using F = config<baton::kokkos_attention, float>;
  using D = config<baton::kokkos_attention, double>;
  STATIC_REQUIRE(baton::attention_backend<baton::kokkos_attention, float>);
  STATIC_REQUIRE(baton::attention_backend<baton::kokkos_attention, double>);
  SECTION("rowsum(dO * O) = rowsum(P * dP) (float)") { property_checks::check_softmax_identity<F>(); }
  SECTION("rowsum(dO * O) = rowsum(P * dP) (double)") { property_checks::check_softmax_identity<D>(); }
  SECTION("a fully masked query row (float)") { property_checks::check_fully_masked_row<F>(); }
  SECTION("a fully masked query row (double)") { property_checks::check_fully_masked_row<D>(); }
  SECTION("accumulate adds into dq, dk, dv (float)") { property_checks::check_accumulate<F>(); }
  SECTION("accumulate adds into dq, dk, dv (double)") { property_checks::check_accumulate<D>(); }
  SECTION("keys split in two, as a ring does (float)") { property_checks::check_split_keys<F>(); }
  SECTION("keys split in two, as a ring does (double)") { property_checks::check_split_keys<D>(); }
  SECTION("bad input raises attention_error (float)") { property_checks::check_bad_input<F>(); }
  SECTION("bad input raises attention_error (double)") { property_checks::check_bad_input<D>(); }
  SECTION("strided views: a head-dim stride other than 1 (float)") { property_checks::check_strided_views<F>(); }
  SECTION("strided views: a head-dim stride other than 1 (double)") { property_checks::check_strided_views<D>(); }
#else
  BATON_SKIP("Kokkos is not linked (baton::kokkos): the Kokkos backend's properties are not tested");
#endif
}
