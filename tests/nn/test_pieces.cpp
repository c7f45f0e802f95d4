// Every piece of the model layer against central finite differences in double, and what its
// split backward (backward_input, then backward_weight) promises: backward_input adds no weight
// gradient, backward_weight works from the saved state alone (whatever other microbatches ran
// in between), and backward_weight on a state backward_input has not processed is refused.
// (backward itself is backward_input then backward_weight, by construction: detail/piece.hpp.)
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

void require_all_zero(const std::map<std::string, tensor>& grads) {
  for (const auto& [name, g] : grads) {
    INFO("parameter " << name);
    for (std::int64_t i = 0; i < g.size(); ++i) REQUIRE(g[i] == 0.0);
  }
}

void require_same_gradients(const std::map<std::string, tensor>& got, const std::map<std::string, tensor>& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, g] : want) {
    INFO("parameter " << name);
    require_equal_bits(got.at(name), g);
  }
}

// backward_weight on a saved state backward_input has not processed (or has, and a
// backward_weight has since freed it) is an nn_error naming the piece and the call to make.
template <class Piece>
void require_weight_before_input_refused(Piece& piece, typename Piece::saved& st, const std::string& name) {
  using Catch::Contains;
  CHECK_THROWS_AS(piece.backward_weight(st), nn::nn_error);
  CHECK_THROWS_WITH(piece.backward_weight(st), Contains(name + ": backward_weight(saved) on a saved state that "
                                                                 "backward_input has not processed") &&
                                                   Contains("call backward_input(saved, dy) first"));
}

// Checks a piece with parameters. `make()` builds a fresh piece (same weights each time);
// `forward(piece, x, saved)` runs its forward on x. With r a random output gradient:
//  1. backward_input gives dx and adds no weight gradient; backward_weight then adds them;
//     a backward_weight before backward_input, or a second one, is refused;
//  2. dx and every parameter gradient against central differences of Σ y∘r;
//  3. two microbatches x and x2 in flight at once — both forwards, the backward_inputs in the
//     other order, then the backward_weights — give bit for bit the dx and the gradients of
//     running them one after the other with the full backward: backward_weight needs nothing
//     but its own saved state.
template <class Make, class Forward>
void check_piece(Make make, Forward forward, tensor x, const tensor& x2, const std::string& name,
                 bool input_has_gradient = true) {
  auto split = make();
  using piece_type = decltype(split);
  typename piece_type::saved st;
  const tensor y = forward(split, x, st);
  const tensor r = nn_test::random_tensor<double>(y.shape(), 99);
  {
    typename piece_type::saved early;
    (void)forward(split, x, early);
    require_weight_before_input_refused(split, early, name);
  }
  const tensor dx = split.backward_input(st, r);
  require_all_zero(nn_test::gradients_of<double>(split));
  split.backward_weight(st);
  require_weight_before_input_refused(split, st, name);
  const auto grads = nn_test::gradients_of<double>(split);

  auto probe = make();
  const auto loss = [&] {
    typename piece_type::saved s;
    return dot(forward(probe, x, s), r);
  };
  if (input_has_gradient) {
    const tensor numeric = numeric_gradient(x, loss);
    INFO("input gradient");
    CHECK(nn_test::max_rel_error(dx, numeric) <= fd_tolerance);
  }
  nn::for_each_parameter(probe, [&](const std::string& parameter, nn::parameter<double>& p) {
    const tensor numeric = numeric_gradient(p.value, loss);
    INFO("parameter " << parameter << " relative error " << nn_test::max_rel_error(grads.at(parameter), numeric));
    CHECK(nn_test::max_rel_error(grads.at(parameter), numeric) <= fd_tolerance);
  });

  // One microbatch after the other, each with the full backward ...
  auto serial = make();
  typename piece_type::saved s1, s2;
  (void)forward(serial, x, s1);
  const tensor dx1_serial = serial.backward(s1, r);
  const tensor r2 = nn_test::random_tensor<double>(forward(serial, x2, s2).shape(), 98);
  const tensor dx2_serial = serial.backward(s2, r2);
  // ... and both in flight.
  auto interleaved = make();
  (void)forward(interleaved, x, s1);
  (void)forward(interleaved, x2, s2);
  const tensor dx2 = interleaved.backward_input(s2, r2);
  const tensor dx1 = interleaved.backward_input(s1, r);
  interleaved.backward_weight(s1);
  interleaved.backward_weight(s2);
  require_equal_bits(dx1, dx1_serial);
  require_equal_bits(dx2, dx2_serial);
  require_same_gradients(nn_test::gradients_of<double>(interleaved), nn_test::gradients_of<double>(serial));
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

TEST_CASE("nn linear: gradients match finite differences, the split backward holds", "[nn][fd]") {
  for (bool bias : {false, true}) {
    INFO("bias " << bias);
    check_piece(
        [&] {
          nn::linear<double> l(5, 4, bias, nn::initializer(3) / "proj");
          perturb_parameters(l, 10);
          return l;
        },
        [](auto& l, const tensor& x, auto& st) { return l.forward(x, st); },
        nn_test::random_tensor<double>({2, 3, 5}, 1), nn_test::random_tensor<double>({4, 5}, 101), "baton::nn::linear");
  }
}

TEST_CASE("nn rms_norm: gradients match finite differences, the split backward holds", "[nn][fd]") {
  check_piece(
      [] {
        nn::rms_norm<double> n(6, 1e-5);
        perturb_parameters(n, 20);
        return n;
      },
      [](auto& n, const tensor& x, auto& st) { return n.forward(x, st); }, nn_test::random_tensor<double>({3, 4, 6}, 2),
      nn_test::random_tensor<double>({2, 6}, 102), "baton::nn::rms_norm");
}

TEST_CASE("nn swiglu_mlp: gradients match finite differences, the split backward holds", "[nn][fd]") {
  check_piece([] { return nn::swiglu_mlp<double>(6, 10, nn::initializer(5) / "mlp"); },
              [](auto& m, const tensor& x, auto& st) { return m.forward(x, st); },
              nn_test::random_tensor<double>({2, 3, 6}, 3), nn_test::random_tensor<double>({1, 4, 6}, 103),
              "baton::nn::swiglu_mlp");
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

  // The split backward: backward_weight only after backward_input; two microbatches at other
  // positions in flight at once each get the dx of their own positions (the table the piece
  // keeps between calls is the last positions', not the state's).
  nn::rotary_embedding<double>::saved early;
  (void)rope.forward(x, positions, early);
  require_weight_before_input_refused(rope, early, "baton::nn::rotary_embedding");
  nn::rotary_embedding<double>::saved first, second;
  (void)rope.forward(x, positions, first);
  (void)rope.forward(one, std::vector<std::int64_t>{1000}, second);
  (void)rope.backward_input(second, baton::payload_traits<tensor>::slice(r, 1, 3, 1));
  const tensor dx_first = rope.backward_input(first, r);
  rope.backward_weight(first);
  rope.backward_weight(second);
  require_equal_bits(dx_first, dx);
  require_weight_before_input_refused(rope, first, "baton::nn::rotary_embedding");
}

TEST_CASE("nn embedding: the scatter-add gradient matches finite differences, the split backward holds", "[nn][fd]") {
  // Repeated tokens: their rows of dy must add up.
  const baton::host_tensor<std::int64_t> ids({2, 4}, {3, 1, 3, 0, 6, 3, 1, 1});
  const baton::host_tensor<std::int64_t> ids2({5}, {1, 4, 4, 6, 3});
  const auto make = [] { return nn::embedding<double>(7, 5, nn::initializer(8) / "embed"); };
  auto split = make();
  nn::embedding<double>::saved st;
  const tensor y = split.forward(ids, st);
  REQUIRE(y.shape() == std::vector<std::int64_t>{2, 4, 5});
  require_weight_before_input_refused(split, st, "baton::nn::embedding");
  const tensor r = nn_test::random_tensor<double>(y.shape(), 6);
  split.backward_input(st, r);
  require_all_zero(nn_test::gradients_of<double>(split));  // tokens have no gradient: it is all in W
  split.backward_weight(st);
  require_weight_before_input_refused(split, st, "baton::nn::embedding");
  const tensor& grad = split.weight().grad;
  auto probe = make();
  const tensor numeric = numeric_gradient(probe.weight().value, [&] {
    nn::embedding<double>::saved s;
    return dot(probe.forward(ids, s), r);
  });
  CHECK(nn_test::max_rel_error(grad, numeric) <= fd_tolerance);
  // Rows of tokens that never occur get no gradient.
  for (std::int64_t j = 0; j < 5; ++j) CHECK(grad(2, j) == 0.0);

  // Two microbatches in flight at once add what the full backward adds one after the other.
  const tensor r2 = nn_test::random_tensor<double>({5, 5}, 7);
  auto serial = make();
  nn::embedding<double>::saved s1, s2;
  (void)serial.forward(ids, s1);
  serial.backward(s1, r);
  (void)serial.forward(ids2, s2);
  serial.backward(s2, r2);
  auto interleaved = make();
  (void)interleaved.forward(ids, s1);
  (void)interleaved.forward(ids2, s2);
  interleaved.backward_input(s2, r2);
  interleaved.backward_input(s1, r);
  interleaved.backward_weight(s1);
  interleaved.backward_weight(s2);
  require_equal_bits(interleaved.weight().grad, serial.weight().grad);
}

TEST_CASE("nn self_attention: gradients match finite differences (GQA, RoPE, causal), the split backward holds",
          "[nn][fd]") {
  SECTION("whole sequence") {
    check_piece(
        [] {
          nn::causal_self_attention<double, reference_cp> a(small_config(), nn::initializer(11) / "attention", {});
          perturb_parameters(a, 30);
          return a;
        },
        // the second microbatch is longer: other positions, another RoPE table between the calls
        [](auto& a, const tensor& x, auto& st) { return a.forward(x, nn::sequence_info::whole(x.shape()[1]), st); },
        nn_test::random_tensor<double>({2, 5, 8}, 7), nn_test::random_tensor<double>({1, 7, 8}, 107),
        "baton::nn::self_attention");
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
        nn_test::random_tensor<double>({2, 6, 8}, 8), nn_test::random_tensor<double>({2, 6, 8}, 108),
        "baton::nn::self_attention");
  }
}

TEST_CASE("nn transformer_block: gradients match finite differences, the split backward holds", "[nn][fd]") {
  check_piece(
      [] {
        nn::transformer_block<double, reference_cp> b(small_config(), nn::initializer(13) / "layers" / 0, {});
        perturb_parameters(b, 50);
        return b;
      },
      [](auto& b, const tensor& x, auto& st) { return b.forward(x, nn::sequence_info::whole(x.shape()[1]), st); },
      nn_test::random_tensor<double>({2, 5, 8}, 9), nn_test::random_tensor<double>({1, 3, 8}, 109),
      "baton::nn::transformer_block");
}

TEST_CASE("nn lm_head: gradients match finite differences, the split backward holds", "[nn][fd]") {
  check_piece(
      [] {
        nn::lm_head<double> h(small_config(), nn::initializer(14) / "head");
        perturb_parameters(h, 60);
        return h;
      },
      [](auto& h, const tensor& x, auto& st) { return h.forward(x, st); }, nn_test::random_tensor<double>({2, 3, 8}, 10),
      nn_test::random_tensor<double>({1, 4, 8}, 110), "baton::nn::lm_head");
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
