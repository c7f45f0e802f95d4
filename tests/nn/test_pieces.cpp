// Every piece of the model layer against central finite differences in double, and its split
// backward (backward_input, then backward_weight) against its full backward.
//
// Tolerance: the gradients of L = Σ y∘r (r fixed and random) must match the central
// differences (L(θ+h) - L(θ-h)) / 2h, h = 1e-5, to 1e-6 relative to the largest gradient
// element. For these smooth functions of O(1) inputs the truncation error is O(h²) ≈ 1e-10
// and the rounding error O(ε |L| / h) ≈ 1e-11, so 1e-6 leaves four orders of margin and still
// catches any wrong term (a missing factor or sign shows as O(1)).
#include <baton/attention/reference.hpp>
#include <baton/nn.hpp>

#include "catch.hpp"

#include "nn_test_util.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace {

using tensor = baton::host_tensor<double>;
namespace nn = baton::nn;

constexpr double fd_step = 1e-5;
constexpr double fd_tolerance = 1e-6;

double dot(const tensor& y, const tensor& r) {
  REQUIRE(y.shape() == r.shape());
  double s = 0;
  for (std::int64_t i = 0; i < y.size(); ++i) s += y[i] * r[i];
  return s;
}

// d/dv L for every element of v, by central differences; `loss` recomputes L from scratch.
tensor numeric_gradient(tensor& v, const std::function<double()>& loss) {
  tensor g(v.shape());
  for (std::int64_t i = 0; i < v.size(); ++i) {
    const double keep = v[i];
    v[i] = keep + fd_step;
    const double up = loss();
    v[i] = keep - fd_step;
    const double down = loss();
    v[i] = keep;
    g[i] = (up - down) / (2 * fd_step);
  }
  return g;
}

void require_equal_bits(const tensor& a, const tensor& b) {
  REQUIRE(a.shape() == b.shape());
  for (std::int64_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == b[i]);
}

// Checks a piece with parameters. `make()` builds a fresh piece (same weights each time);
// `forward(piece, x, saved)` runs its forward on x. Checks, with r a random output gradient:
//  1. backward(saved, r) == backward_input(saved, r) then backward_weight(saved), bit for bit
//     (input gradient and every parameter gradient);
//  2. the input gradient and every parameter gradient against central differences of Σ y∘r.
template <class Make, class Forward>
void check_piece(Make make, Forward forward, tensor x, bool input_has_gradient = true) {
  auto full = make();
  typename decltype(full)::saved st_full;
  const tensor y = forward(full, x, st_full);
  const tensor r = nn_test::random_tensor<double>(y.shape(), 99);
  const tensor dx_full = full.backward(st_full, r);

  auto split = make();
  typename decltype(split)::saved st_split;
  (void)forward(split, x, st_split);
  const tensor dx_split = split.backward_input(st_split, r);
  split.backward_weight(st_split);
  require_equal_bits(dx_full, dx_split);
  const auto grads_full = nn_test::gradients_of<double>(full);
  const auto grads_split = nn_test::gradients_of<double>(split);
  REQUIRE(grads_full.size() == grads_split.size());
  for (const auto& [name, g] : grads_full) {
    INFO("parameter " << name);
    require_equal_bits(g, grads_split.at(name));
  }

  auto probe = make();
  const auto loss = [&] {
    typename decltype(probe)::saved st;
    return dot(forward(probe, x, st), r);
  };
  if (input_has_gradient) {
    const tensor numeric = numeric_gradient(x, loss);
    INFO("input gradient");
    CHECK(nn_test::max_rel_error(dx_full, numeric) <= fd_tolerance);
  }
  nn::for_each_parameter(probe, [&](const std::string& name, nn::parameter<double>& p) {
    const tensor numeric = numeric_gradient(p.value, loss);
    INFO("parameter " << name << " relative error " << nn_test::max_rel_error(grads_full.at(name), numeric));
    CHECK(nn_test::max_rel_error(grads_full.at(name), numeric) <= fd_tolerance);
  });
}

// Weights that are not their defaults (gains of one and zero biases would hide their terms).
template <class Module>
void perturb_parameters(Module& m, std::uint32_t seed) {
  nn::for_each_parameter(m, [&](const std::string&, nn::parameter<double>& p) {
    const tensor noise = nn_test::random_tensor<double>(p.value.shape(), seed++, 0.3);
    for (std::int64_t i = 0; i < p.value.size(); ++i) p.value[i] += noise[i];
  });
}

nn::transformer_config small_config() {
  return {.d_model = 8, .heads = 4, .kv_heads = 2, .head_dim = 0, .ffn_hidden = 12, .vocab = 11};
}

using reference_cp = nn::no_cp<baton::reference_attention>;

}  // namespace

TEST_CASE("nn linear: gradients match finite differences, split equals full", "[nn][fd]") {
  for (bool bias : {false, true}) {
    INFO("bias " << bias);
    check_piece(
        [&] {
          nn::linear<double> l(5, 4, bias, nn::initializer(3) / "proj");
          perturb_parameters(l, 10);
          return l;
        },
        [](auto& l, const tensor& x, auto& st) { return l.forward(x, st); },
        nn_test::random_tensor<double>({2, 3, 5}, 1));
  }
}

TEST_CASE("nn rms_norm: gradients match finite differences, split equals full", "[nn][fd]") {
  check_piece(
      [] {
        nn::rms_norm<double> n(6, 1e-5);
        perturb_parameters(n, 20);
        return n;
      },
      [](auto& n, const tensor& x, auto& st) { return n.forward(x, st); }, nn_test::random_tensor<double>({3, 4, 6}, 2));
}

TEST_CASE("nn swiglu_mlp: gradients match finite differences, split equals full", "[nn][fd]") {
  check_piece([] { return nn::swiglu_mlp<double>(6, 10, nn::initializer(5) / "mlp"); },
              [](auto& m, const tensor& x, auto& st) { return m.forward(x, st); },
              nn_test::random_tensor<double>({2, 3, 6}, 3));
}

TEST_CASE("nn rotary_embedding: gradient matches finite differences at arbitrary global positions", "[nn][fd]") {
  const std::vector<std::int64_t> positions{7, 0, 3, 1000, 42};  // a shard need not be sorted
  const nn::rotary_embedding<double> rope(6, 10000.0);
  tensor x = nn_test::random_tensor<double>({2, 5, 3, 6}, 4);
  nn::rotary_embedding<double>::saved st;
  const tensor y = rope.forward(x, positions, st);
  const tensor r = nn_test::random_tensor<double>(y.shape(), 5);
  const tensor dx = rope.backward(st, r);
  const tensor numeric = numeric_gradient(x, [&] {
    nn::rotary_embedding<double>::saved s;
    return dot(rope.forward(x, positions, s), r);
  });
  CHECK(nn_test::max_rel_error(dx, numeric) <= fd_tolerance);

  // A rotation keeps norms, and position p's rotation does not depend on which other
  // positions share the call: rotating a single row at position 1000 gives the same values.
  tensor one = baton::payload_traits<tensor>::slice(x, 1, 3, 1);
  nn::rotary_embedding<double>::saved s1;
  const tensor y_one = rope.forward(one, std::vector<std::int64_t>{1000}, s1);
  const tensor y_row = baton::payload_traits<tensor>::slice(y, 1, 3, 1);
  CHECK(nn_test::max_rel_error(y_one, y_row) == 0.0);
  double nx = 0, ny = 0;
  for (std::int64_t i = 0; i < x.size(); ++i) {
    nx += x[i] * x[i];
    ny += y[i] * y[i];
  }
  CHECK(std::abs(nx - ny) <= 1e-12 * nx);
}

TEST_CASE("nn embedding: the scatter-add gradient matches finite differences", "[nn][fd]") {
  // Repeated tokens: their rows of dy must add up.
  const baton::host_tensor<std::int64_t> ids({2, 4}, {3, 1, 3, 0, 6, 3, 1, 1});
  const auto make = [] { return nn::embedding<double>(7, 5, nn::initializer(8) / "embed"); };
  auto full = make();
  nn::embedding<double>::saved st;
  const tensor y = full.forward(ids, st);
  REQUIRE(y.shape() == std::vector<std::int64_t>{2, 4, 5});
  const tensor r = nn_test::random_tensor<double>(y.shape(), 6);
  full.backward(st, r);
  auto split = make();
  nn::embedding<double>::saved st2;
  (void)split.forward(ids, st2);
  split.backward_input(st2, r);
  split.backward_weight(st2);
  require_equal_bits(full.weight().grad, split.weight().grad);
  auto probe = make();
  const tensor numeric = numeric_gradient(probe.weight().value, [&] {
    nn::embedding<double>::saved s;
    return dot(probe.forward(ids, s), r);
  });
  CHECK(nn_test::max_rel_error(full.weight().grad, numeric) <= fd_tolerance);
  // Rows of tokens that never occur get no gradient.
  for (std::int64_t j = 0; j < 5; ++j) CHECK(full.weight().grad(2, j) == 0.0);
}

TEST_CASE("nn self_attention: gradients match finite differences (GQA, RoPE, causal)", "[nn][fd]") {
  SECTION("whole sequence") {
    check_piece(
        [] {
          nn::causal_self_attention<double, reference_cp> a(small_config(), nn::initializer(11) / "attention", {});
          perturb_parameters(a, 30);
          return a;
        },
        [](auto& a, const tensor& x, auto& st) { return a.forward(x, nn::sequence_info::whole(5), st); },
        nn_test::random_tensor<double>({2, 5, 8}, 7));
  }
  SECTION("packed documents, q/k/v biases, sliding window") {
    nn::transformer_config c = small_config();
    c.qkv_bias = true;
    baton::host_tensor<std::int64_t> docs({2, 6}, {0, 0, 0, 1, 1, 1, 4, 4, 5, 5, 5, 5});
    const auto info = nn::sequence_info::whole(6).with_documents(docs);
    check_piece(
        [&] {
          nn::self_attention<double, reference_cp, baton::sliding_window_mask> a(c, nn::initializer(12) / "attention", {},
                                                                                 baton::sliding_window_mask{2, 0});
          perturb_parameters(a, 40);
          return a;
        },
        [&](auto& a, const tensor& x, auto& st) { return a.forward(x, info, st); },
        nn_test::random_tensor<double>({2, 6, 8}, 8));
  }
}

TEST_CASE("nn transformer_block: gradients match finite differences, split equals full", "[nn][fd]") {
  check_piece(
      [] {
        nn::transformer_block<double, reference_cp> b(small_config(), nn::initializer(13) / "layers" / 0, {});
        perturb_parameters(b, 50);
        return b;
      },
      [](auto& b, const tensor& x, auto& st) { return b.forward(x, nn::sequence_info::whole(5), st); },
      nn_test::random_tensor<double>({2, 5, 8}, 9));
}

TEST_CASE("nn lm_head: gradients match finite differences, split equals full", "[nn][fd]") {
  check_piece(
      [] {
        nn::lm_head<double> h(small_config(), nn::initializer(14) / "head");
        perturb_parameters(h, 60);
        return h;
      },
      [](auto& h, const tensor& x, auto& st) { return h.forward(x, st); }, nn_test::random_tensor<double>({2, 3, 8}, 10));
}

TEST_CASE("nn cross_entropy: stable, counts tokens, gradient matches finite differences", "[nn][fd]") {
  const nn::cross_entropy<double> ce;
  tensor logits = nn_test::random_tensor<double>({2, 3, 5}, 11, 2.0);
  const baton::host_tensor<std::int64_t> targets({2, 3}, {4, -100, 0, 2, 2, -100});
  CHECK(ce.tokens(targets) == 4);
  const auto result = ce(logits, targets);
  const tensor numeric = numeric_gradient(logits, [&] { return ce(logits, targets).value; });
  CHECK(nn_test::max_rel_error(result.grad, numeric) <= fd_tolerance);
  for (std::int64_t j = 0; j < 5; ++j) CHECK(result.grad(0, 1, j) == 0.0);  // ignored target: no gradient

  // The value, from the definition: mean over counted tokens of log Σ exp(z) - z_target.
  double expected = 0;
  for (std::int64_t r = 0; r < 6; ++r) {
    if (targets[r] < 0) continue;
    double s = 0;
    for (std::int64_t j = 0; j < 5; ++j) s += std::exp(logits[r * 5 + j]);
    expected += std::log(s) - logits[r * 5 + targets[r]];
  }
  CHECK(std::abs(result.value - expected / 4) <= 1e-14 * std::abs(expected));

  // Stable where the naive formula overflows: logits of 1e4 give exp() = inf.
  tensor big = tensor::filled({1, 3}, 1e4);
  big[1] = 1e4 + std::log(2.0);
  const auto stable = ce(big, baton::host_tensor<std::int64_t>({1}, {1}));
  CHECK(std::isfinite(stable.value));
  CHECK(std::abs(stable.value - std::log(2.0)) <= 1e-12);  // p = 2/4 for the target
  for (std::int64_t j = 0; j < 3; ++j) CHECK(std::isfinite(stable.grad[j]));

  // No counted token: loss 0 and no gradient (not a division by zero).
  const auto none = ce(logits, baton::host_tensor<std::int64_t>::filled({2, 3}, -100));
  CHECK(none.value == 0.0);
  for (double g : none.grad.values()) CHECK(g == 0.0);
}

TEST_CASE("nn initializer: values depend on seed and name only", "[nn]") {
  const nn::initializer a(42), b(42), c(43);
  const tensor w1 = (a / "layers" / 5).normal<double>("attention.wq.weight", {3, 4}, 1.0);
  const tensor w2 = (b / "layers").normal<double>("5.attention.wq.weight", {3, 4}, 1.0);
  require_equal_bits(w1, w2);  // the path is the name, however it was built
  CHECK(nn_test::max_rel_error(w1, (c / "layers" / 5).normal<double>("attention.wq.weight", {3, 4}, 1.0)) > 0.1);
  CHECK(nn_test::max_rel_error(w1, (a / "layers" / 4).normal<double>("attention.wq.weight", {3, 4}, 1.0)) > 0.1);
  // A larger tensor of the same name starts with the same values (element i depends on i only).
  const tensor big = (a / "layers" / 5).normal<double>("attention.wq.weight", {4, 4}, 1.0);
  for (std::int64_t i = 0; i < 12; ++i) CHECK(big[i] == w1[i]);
  // Standard normal moments over many draws.
  const tensor many = a.normal<double>("many", {20000}, 2.0);
  double mean = 0, sq = 0;
  for (double v : many.values()) mean += v;
  mean /= 20000;
  for (double v : many.values()) sq += (v - mean) * (v - mean);
  CHECK(std::abs(mean) < 0.05);
  CHECK(std::abs(std::sqrt(sq / 20000) - 2.0) < 0.05);
  // Blocks built from the same seed on different "ranks" hold identical weights.
  nn::transformer_block<double, reference_cp> b1(small_config(), a / "layers" / 2, {});
  nn::transformer_block<double, reference_cp> b2(small_config(), b / "layers" / 2, {});
  const auto p1 = nn::parameters_of<double>(b1), p2 = nn::parameters_of<double>(b2);
  REQUIRE(p1.size() == 9);
  for (std::size_t i = 0; i < p1.size(); ++i) require_equal_bits(p1[i].parameter->value, p2[i].parameter->value);
}
