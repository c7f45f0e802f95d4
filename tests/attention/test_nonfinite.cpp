// The non-finite rule (docs/attention.md, "Non-finite values"): a NaN or an infinity in q, k
// or v makes NaN every row that attends to it — out and lse — and the gradients of every pair
// it touches, identically in the reference and the Kokkos backend; masked pairs never read
// their values, and a row with no allowed key keeps out 0, lse -inf. Before the rule, a NaN
// silently became "attends to nothing" (out 0, lse -inf) and the backends disagreed.
#include "catch.hpp"
#include "skip.hpp"

#include "attention_test_util.hpp"
#include "nonfinite_oracle.hpp"

#include <baton/attention.hpp>
#include <baton/config.hpp>
#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace {

using attn_test::shape;

template <class T>
constexpr double tol() {
  return sizeof(T) >= sizeof(double) ? 1e-12 : 1e-5;
}

// Where a bad value goes: which tensor, and (batch, seq, head, dim).
struct poke {
  char tensor;  // 'q', 'k', 'v' or 'o' (dout)
  std::int64_t b, s, h, d;
  double value;
};

template <class T>
void apply(attn_test::inputs<T>& in, const poke& p) {
  const shape& s = in.s;
  std::vector<T>& x = p.tensor == 'q' ? in.q : p.tensor == 'k' ? in.k : p.tensor == 'v' ? in.v : in.dout;
  const std::int64_t seq = p.tensor == 'q' || p.tensor == 'o' ? s.seq_q : s.seq_k;
  const std::int64_t heads = p.tensor == 'q' || p.tensor == 'o' ? s.heads_q : s.heads_kv;
  x[static_cast<std::size_t>(((p.b * seq + p.s) * heads + p.h) * s.dim + p.d)] = static_cast<T>(p.value);
}

template <class T, class Backend, class Mask>
void check_rule(const Backend& backend, const shape& s, const Mask& mask, const std::vector<poke>& pokes,
                const std::string& what) {
  auto in = attn_test::random_inputs<T>(s, 7);
  for (const poke& p : pokes) apply(in, p);
  const auto want = attn_test::nonfinite_oracle(in, mask);
  const auto got = attn_test::run(backend, in, mask);
  INFO(what);
  CHECK(attn_test::nan_pattern_mismatch(got.out, want.out, tol<T>()) == "");
  CHECK(attn_test::nan_pattern_mismatch(got.lse, want.lse, tol<T>()) == "");
  CHECK(attn_test::nan_pattern_mismatch(got.dq, want.dq, tol<T>()) == "");
  CHECK(attn_test::nan_pattern_mismatch(got.dk, want.dk, tol<T>()) == "");
  CHECK(attn_test::nan_pattern_mismatch(got.dv, want.dv, tol<T>()) == "");
}

const double nan_value = std::numeric_limits<double>::quiet_NaN();
const double inf_value = std::numeric_limits<double>::infinity();

// Every case on one backend and element type, over masks whose tiles are full, partial and
// empty, and lengths across 64-row tiles.
template <class T, class Backend>
void all_cases(const Backend& backend, const char* name) {
  const shape big{1, 70, 130, 4, 2, 16}, small{2, 5, 7, 2, 1, 3};
  std::vector<std::int64_t> ids(130);
  for (std::int64_t i = 0; i < 130; ++i) ids[static_cast<std::size_t>(i)] = i < 20 ? 0 : i < 90 ? 1 : 2;
  // rows q % 7 == 3 attend to nothing: they keep out 0, lse -inf even with a NaN q
  const auto holes = baton::block_mask([](std::int64_t q, std::int64_t k) { return k <= q && q % 7 != 3; }, 130, 130, 8);

  const std::vector<std::pair<std::vector<poke>, const char*>> cases{
      {{}, "all finite"},
      {{{'q', 0, 3, 1, 0, nan_value}}, "NaN in one query"},
      {{{'q', 0, 66, 3, 2, inf_value}}, "+inf in one query"},
      {{{'k', 0, 40, 0, 2, inf_value}}, "+inf in one key"},
      {{{'k', 0, 41, 1, 1, -inf_value}}, "-inf in one key"},
      {{{'v', 0, 5, 1, 0, -inf_value}}, "-inf in one value"},
      {{{'k', 0, 68, 1, 0, nan_value}}, "NaN in a key most causal rows mask"},
      {{{'v', 0, 129, 0, 15, nan_value}}, "NaN in the last value (no causal row reaches it)"},
      {{{'o', 0, 10, 2, 4, nan_value}}, "NaN in dout"},
      {{{'q', 0, 3, 1, 0, nan_value}, {'q', 0, 10, 0, 1, nan_value}, {'k', 0, 12, 0, 0, inf_value}}, "NaN in rows that attend to nothing"},
  };
  for (const auto& [pokes, what] : cases) {
    const std::string label = std::string(name) + ": " + what;
    check_rule<T>(backend, big, baton::no_mask{}, pokes, label + " (no mask)");
    check_rule<T>(backend, big, baton::causal_mask{}, pokes, label + " (causal)");
    check_rule<T>(backend, big, baton::document_mask(ids), pokes, label + " (document)");
    check_rule<T>(backend, big, baton::sliding_window_mask{6, 3}, pokes, label + " (window)");
    check_rule<T>(backend, big, holes, pokes, label + " (rows without keys)");
  }
  // batch 2, MQA, a tile smaller than the vector width
  check_rule<T>(backend, small, baton::causal_mask{}, {{'q', 1, 2, 1, 2, nan_value}}, std::string(name) + ": small, NaN q");
  check_rule<T>(backend, small, baton::causal_mask{}, {{'k', 1, 0, 0, 1, inf_value}}, std::string(name) + ": small, inf k");
}

}  // namespace

TEST_CASE("non-finite rule: the oracle itself (a NaN query row is NaN, a fully masked one is 0 / -inf)",
          "[attention][nonfinite][reliability]") {
  const shape s{1, 4, 4, 1, 1, 2};
  auto in = attn_test::random_inputs<double>(s, 3);
  in.q[2] = nan_value;  // row 1
  in.k[6] = inf_value;  // key 3: only row 3 sees it under the causal mask
  const auto want = attn_test::nonfinite_oracle(in, baton::causal_mask{});
  CHECK(std::isfinite(want.lse[0]));
  CHECK(std::isnan(want.lse[1]));
  CHECK(std::isfinite(want.lse[2]));
  CHECK(std::isnan(want.lse[3]));
  CHECK(attn_test::count_nan(want.dk) == want.dk.size());  // every key is allowed by the poisoned row 3
  const auto doc = attn_test::nonfinite_oracle(in, baton::document_mask(std::vector<std::int64_t>{0, 1, 2, 3}));
  CHECK(std::isfinite(doc.lse[0]));
  CHECK(std::isnan(doc.lse[1]));
  CHECK(std::isfinite(doc.lse[2]));
  CHECK(std::isnan(doc.lse[3]));
  CHECK(std::isfinite(doc.dk[0]));
  CHECK(std::isnan(doc.dk[2]));
  CHECK(std::isfinite(doc.dk[4]));
  CHECK(std::isnan(doc.dk[6]));
}

TEST_CASE("non-finite rule: reference backend, float and double", "[attention][nonfinite][reliability]") {
  all_cases<double>(baton::reference_attention{}, "reference double");
  all_cases<float>(baton::reference_attention{}, "reference float");
}

TEST_CASE("non-finite rule: a NaN lse handed to backward poisons the row's pairs", "[attention][nonfinite][reliability]") {
  const shape s{1, 6, 6, 1, 1, 4};
  const auto in = attn_test::random_inputs<double>(s, 5);
  auto r = attn_test::run(baton::reference_attention{}, in, baton::causal_mask{});
  r.lse[2] = nan_value;  // row 2 attends keys 0..2
  std::vector<double> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
  baton::reference_attention{}.backward(attn_test::q_view(in.q, s), attn_test::kv_view(in.k, s),
                                        attn_test::kv_view(in.v, s), attn_test::q_view(std::as_const(r.out), s),
                                        attn_test::lse_view(std::as_const(r.lse), s), attn_test::q_view(in.dout, s),
                                        baton::causal_mask{}, attn_test::q_view(dq, s), attn_test::kv_view(dk, s),
                                        attn_test::kv_view(dv, s));
  for (std::int64_t j = 0; j < 6; ++j) {
    INFO("key " << j);
    CHECK(std::isnan(dk[static_cast<std::size_t>(j * 4)]) == (j <= 2));
    CHECK(std::isnan(dv[static_cast<std::size_t>(j * 4)]) == (j <= 2));
  }
  CHECK(attn_test::count_nan(dq) == 4);  // row 2 only
}

TEST_CASE("non-finite rule: Kokkos backend, float and double", "[attention][nonfinite][kokkos][reliability][kokkos-nonfinite][can-skip]") {
#if BATON_HAS_KOKKOS()
  all_cases<double>(baton::kokkos_attention{}, "kokkos double");
  all_cases<float>(baton::kokkos_attention{}, "kokkos float");
#else
  BATON_SKIP("Kokkos is not linked (baton::kokkos): the Kokkos backend's non-finite rule is not tested");
#endif
}

TEST_CASE("non-finite rule: the Kokkos NaN lse path matches the reference", "[attention][nonfinite][kokkos][reliability][kokkos-nan-lse][can-skip]") {
#if BATON_HAS_KOKKOS()
  const shape s{1, 70, 70, 2, 1, 8};
  const auto in = attn_test::random_inputs<float>(s, 5);
  auto r = attn_test::run(baton::reference_attention{}, in, baton::causal_mask{});
  r.lse[5] = static_cast<float>(nan_value);
  r.lse[70 + 66] = std::numeric_limits<float>::infinity();
  const auto grads = [&](const auto& backend) {
    std::vector<float> dq(in.q.size()), dk(in.k.size()), dv(in.v.size());
    backend.backward(attn_test::q_view(in.q, s), attn_test::kv_view(in.k, s), attn_test::kv_view(in.v, s),
                     attn_test::q_view(std::as_const(r.out), s), attn_test::lse_view(std::as_const(r.lse), s),
                     attn_test::q_view(in.dout, s), baton::causal_mask{}, attn_test::q_view(dq, s),
                     attn_test::kv_view(dk, s), attn_test::kv_view(dv, s));
    return std::vector<std::vector<float>>{dq, dk, dv};
  };
  const auto want = grads(baton::reference_attention{});
  const auto got = grads(baton::kokkos_attention{});
  CHECK(attn_test::count_nan(want[1]) > 0);
  for (std::size_t t = 0; t < 3; ++t) CHECK(attn_test::nan_pattern_mismatch(got[t], want[t], tol<float>()) == "");
#else
  BATON_SKIP("Kokkos is not linked (baton::kokkos): the Kokkos backend's NaN lse path is not tested");
#endif
}
