// The oracle itself: reference_attention's gradients against central finite differences of
// its own forward, in double.
#include "catch.hpp"

#include "attention_test_util.hpp"

#include <baton/attention.hpp>

#include <cmath>
#include <string>
#include <vector>

namespace {

using attn_test::shape;

// loss = sum(out * dout) for the reference forward.
template <class Mask>
double loss(const attn_test::inputs<double>& in, const Mask& mask, const baton::attention_params& params) {
  const shape& s = in.s;
  std::vector<double> out(in.q.size()), lse(static_cast<std::size_t>(s.batch * s.heads_q * s.seq_q));
  baton::reference_attention{}.forward(attn_test::q_view(in.q, s), attn_test::kv_view(in.k, s),
                                       attn_test::kv_view(in.v, s), mask, attn_test::q_view(out, s),
                                       attn_test::lse_view(lse, s), params);
  double l = 0;
  for (std::size_t i = 0; i < out.size(); ++i) l += out[i] * in.dout[i];
  return l;
}

template <class Mask>
void check_against_finite_differences(const Mask& mask, const baton::attention_params& params, const char* name) {
  const shape s{1, 5, 7, 4, 2, 3};
  auto in = attn_test::random_inputs<double>(s, 17);
  const auto r = attn_test::run(baton::reference_attention{}, in, mask, params);
  constexpr double h = 1e-5;
  // Central differences: truncation O(h^2 f''') ~ 1e-10 and rounding ~ 1e-16 / h ~ 1e-11 for
  // values of order one, so 1e-8 (relative, floored at 1) leaves a wide margin yet catches
  // any wrong term (those are of order one).
  const auto check = [&](std::vector<double>& x, const std::vector<double>& grad, const char* tensor) {
    for (std::size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      const double up = loss(in, mask, params);
      x[i] = saved - h;
      const double down = loss(in, mask, params);
      x[i] = saved;
      const double numeric = (up - down) / (2 * h);
      INFO(name << ": d" << tensor << "[" << i << "] analytic " << grad[i] << " numeric " << numeric);
      REQUIRE(std::abs(grad[i] - numeric) <= 1e-8 * std::max(1.0, std::abs(numeric)));
    }
  };
  check(in.q, r.dq, "q");
  check(in.k, r.dk, "k");
  check(in.v, r.dv, "v");
}

}  // namespace

TEST_CASE("reference_attention: gradients match central finite differences", "[attention][reference]") {
  baton::attention_params params;
  check_against_finite_differences(baton::no_mask{}, params, "no mask");
  params.softmax_scale = 0.7;
  check_against_finite_differences(baton::no_mask{}, params, "no mask, scale 0.7");
  params = {};
  params.q_pos = baton::positions(2, 5);  // queries 2..6 over keys 0..6: 3 to 7 keys each
  check_against_finite_differences(baton::causal_mask{}, params, "causal");
  check_against_finite_differences(baton::sliding_window_mask{2, 1}, params, "sliding window");
  check_against_finite_differences(baton::prefix_lm_mask{4}, params, "prefix-LM");
  // Queries 3..7 over keys 0..6; position 7 is alone in document 9: a fully masked row.
  params.q_pos = baton::positions(3, 5);
  check_against_finite_differences(baton::document_mask(std::vector<std::int64_t>{0, 0, 0, 1, 1, 2, 2, 9}), params,
                                   "document with an empty row");
  const std::vector<std::int64_t> zigzag = {6, 0, 5, 1, 4};
  params.q_pos = baton::positions::list(zigzag);
  check_against_finite_differences(
      baton::block_mask([](std::int64_t q, std::int64_t k) { return k <= q && q - k < 3; }, 8, 8, 2), params,
      "block mask, listed positions");
}
