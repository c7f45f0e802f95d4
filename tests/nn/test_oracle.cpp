// Whole-model parity against an independent oracle (autodiff_oracle.hpp): a scalar
// reverse-mode autodiff in double running a naive, unfused decoder — explicit loops, plain
// softmax attention over the allowed keys, GQA by h / (heads / kv_heads), rotate-half RoPE,
// RMSNorm, SwiGLU, embedding, lm_head, cross-entropy. baton's modules are built from seeded
// initializers; their parameter values (by the names for_each_parameter prints) are copied
// into the oracle, which only reads them.
//
// Compared: a transformer_block's output, dx and every parameter gradient (plain causal and
// with packed documents), and a 2-block language model's loss and every parameter gradient.
// Error measure: nn_test::max_rel_error (max |a - b| / max |oracle|), per tensor. Tolerances:
// 1e-10 in double, 1e-5 in float (the float model against the double oracle of the same
// float weights). Each test also shows it can fail: deliberately wrong oracles (RoPE by -θ,
// kv head h % kv_heads, documents ignored, ignored targets counted) miss by orders of
// magnitude more than the tolerance. A last test checks the oracle's own gradients against
// central differences of its loss, so the oracle does not rest on baton at all.
#include "catch.hpp"

#include "autodiff_oracle.hpp"
#include "nn_test_util.hpp"
#include "skip.hpp"

#include <baton/attention/reference.hpp>
#include <baton/config.hpp>
#include <baton/nn.hpp>
#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using baton::host_tensor;
namespace nn = baton::nn;

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, double> ? 1e-10 : 1e-5;
}

// A wrong oracle must miss baton by at least this (errors of a real mistake are O(0.1..1)).
constexpr double must_miss_by = 1e-3;

/// Every parameter value of a module, by name, in double (what the oracle reads).
template <class T, class Module>
std::map<std::string, std::vector<double>> values_of(Module& m, std::string_view prefix = {}) {
  std::map<std::string, std::vector<double>> out;
  nn::for_each_parameter(
      m,
      [&](const std::string& name, nn::parameter<T>& p) {
        out[name] = std::vector<double>(p.value.values().begin(), p.value.values().end());
      },
      prefix);
  return out;
}

/// Norm gains start at one and biases at zero, which would hide a dropped gain or bias: move
/// every parameter without weight decay (exactly those) away from its initial value.
template <class T, class Module>
void perturb_gains_and_biases(Module& m, std::uint32_t seed) {
  nn::for_each_parameter(m, [&](const std::string&, nn::parameter<T>& p) {
    if (p.decay) return;
    const host_tensor<T> noise = nn_test::random_tensor<T>(p.value.shape(), seed++, 0.3);
    for (std::int64_t i = 0; i < p.value.size(); ++i) p.value[i] += noise[i];
  });
}

template <class T>
std::vector<double> to_double(const host_tensor<T>& t) {
  return std::vector<double>(t.values().begin(), t.values().end());
}

template <class T>
bool bitwise_equal(const host_tensor<T>& a, const host_tensor<T>& b) {
  return a.shape() == b.shape() &&
         (a.size() == 0 || std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(T)) == 0);
}

template <class T>
double error_against(const host_tensor<T>& got, const std::vector<double>& want) {
  return nn_test::max_rel_error(got.values(), std::span<const double>(want));
}

/// Compares every gradient baton computed with the oracle's; returns the largest error.
template <class T>
double check_gradients(const std::map<std::string, host_tensor<T>>& got,
                       const std::map<std::string, std::vector<double>>& want) {
  CHECK(got.size() == want.size());
  double worst = 0;
  for (const auto& [name, grad] : got) {
    INFO("parameter " << name);
    const auto it = want.find(name);
    REQUIRE(it != want.end());
    const double e = error_against(grad, it->second);
    INFO("max rel error of the gradient " << e);
    CHECK(e <= tolerance<T>());
    worst = std::max(worst, e);
  }
  return worst;
}

// ---- one block ----

struct block_case {
  oracle::dims d;
  bool qkv_bias = false;
  std::int64_t batch = 2, seq = 7;
  std::uint64_t seed = 1;
  oracle::documents docs;  // [batch][seq] document ids, empty for none
};

nn::transformer_config config_of(const block_case& c) {
  nn::transformer_config cfg;
  cfg.d_model = c.d.d_model;
  cfg.heads = c.d.heads;
  cfg.kv_heads = c.d.kv_heads;
  cfg.head_dim = c.d.head_dim;
  cfg.ffn_hidden = c.d.ffn_hidden;
  cfg.rope_base = c.d.rope_base;
  cfg.norm_eps = c.d.norm_eps;
  cfg.qkv_bias = c.qkv_bias;
  return cfg;
}

struct oracle_block {
  std::vector<double> y, dx;
  std::map<std::string, std::vector<double>> grads;
  std::vector<std::string> unused;
};

/// The oracle's block under loss = Σ y∘r: y, dL/dx = dx and every parameter gradient.
oracle_block run_oracle_block(const std::map<std::string, std::vector<double>>& values, const std::vector<double>& x,
                              const std::vector<double>& r, const block_case& c, const oracle::variant& how = {}) {
  oracle::tape t;
  oracle::weights w(t, values);
  oracle::mat in = oracle::make_mat(c.batch * c.seq, c.d.d_model);
  for (std::size_t i = 0; i < x.size(); ++i) in.v[i] = t.leaf(x[i]);
  const oracle::mat y = oracle::block(w, "", in, c.batch, c.seq, c.d, c.docs, how);
  oracle::var loss = y.v[0] * r[0];
  for (std::size_t i = 1; i < y.v.size(); ++i) loss = loss + y.v[i] * r[i];
  const std::vector<double> adj = t.backprop(loss);
  oracle_block out;
  for (const oracle::var& v : y.v) out.y.push_back(oracle::val(v));
  for (const oracle::var& v : in.v) out.dx.push_back(adj[v.id]);
  out.grads = w.gradients(adj);
  out.unused = w.unused();
  return out;
}

struct block_errors {
  double y = 0, dx = 0, grads = 0;
};

/// Builds a transformer_block<T, Strategy> from a seed, runs forward and backward under
/// loss = Σ y∘r, and compares y, dx and every gradient with the oracle; then checks that the
/// split backward gives the same bits, and that wrong oracles are caught.
template <class T, class Strategy>
block_errors check_block(const block_case& c, Strategy strategy) {
  using block_t = nn::transformer_block<T, Strategy>;
  const nn::initializer init(c.seed);
  block_t block(config_of(c), init / "layers" / 3, std::move(strategy));
  perturb_gains_and_biases<T>(block, static_cast<std::uint32_t>(c.seed) + 100);

  const std::vector<std::int64_t> shape{c.batch, c.seq, c.d.d_model};
  const host_tensor<T> x = nn_test::random_tensor<T>(shape, static_cast<std::uint32_t>(c.seed) + 1);
  const host_tensor<T> r = nn_test::random_tensor<T>(shape, static_cast<std::uint32_t>(c.seed) + 2);
  nn::sequence_info info = nn::sequence_info::whole(c.seq);
  if (!c.docs.empty()) {
    host_tensor<std::int64_t> ids({c.batch, c.seq});
    for (std::int64_t b = 0; b < c.batch; ++b)
      for (std::int64_t s = 0; s < c.seq; ++s)
        ids(b, s) = c.docs[static_cast<std::size_t>(b)][static_cast<std::size_t>(s)];
    info = info.with_documents(std::move(ids));
  }

  typename block_t::saved st;
  const host_tensor<T> y = block.forward(x, info, st);
  const host_tensor<T> dx = block.backward(st, r);
  const auto grads = nn_test::gradients_of<T>(block);

  const oracle_block want = run_oracle_block(values_of<T>(block), to_double(x), to_double(r), c);
  CHECK(want.unused.empty());
  block_errors e;
  e.y = error_against(y, want.y);
  e.dx = error_against(dx, want.dx);
  INFO("max rel error: y " << e.y << ", dx " << e.dx);
  CHECK(e.y <= tolerance<T>());
  CHECK(e.dx <= tolerance<T>());
  e.grads = check_gradients(grads, want.grads);

  // The split path (backward_input, then backward_weight) on a fresh forward of the same block:
  // the same bits (backward is the two in a row; what this catches is state a call leaves
  // behind in the block that changes the next microbatch's results).
  nn::zero_grad(nn::parameters_of<T>(block));
  typename block_t::saved split;
  const host_tensor<T> y2 = block.forward(x, info, split);
  const host_tensor<T> dx2 = block.backward_input(split, r);
  block.backward_weight(split);
  const auto grads2 = nn_test::gradients_of<T>(block);
  CHECK(bitwise_equal(y2, y));
  CHECK(bitwise_equal(dx2, dx));
  REQUIRE(grads2.size() == grads.size());
  for (const auto& [name, g] : grads) {
    INFO("split backward, parameter " << name);
    CHECK(bitwise_equal(grads2.at(name), g));
  }

  // The comparison can fail: a wrong oracle misses by far more than the tolerance.
  const auto values = values_of<T>(block);
  const auto miss = [&](oracle::variant how, const char* what) {
    const oracle_block wrong = run_oracle_block(values, to_double(x), to_double(r), c, how);
    const double ey = error_against(y, wrong.y), edx = error_against(dx, wrong.dx);
    INFO(what << ": y misses by " << ey << ", dx by " << edx);
    CHECK(ey > must_miss_by);
    CHECK(edx > must_miss_by);
  };
  miss(oracle::variant{.flip_rope_sign = true}, "RoPE by -theta");
  if (c.d.kv_heads > 1 && c.d.kv_heads < c.d.heads)
    miss(oracle::variant{.interleaved_gqa = true}, "kv head h % kv_heads");
  if (!c.docs.empty()) miss(oracle::variant{.ignore_documents = true}, "documents ignored");
  return e;
}

// Test 1's sizes: GQA 4 query heads over 2 kv heads, head_dim 4, ffn 24.
block_case gqa_case() {
  block_case c;
  c.d.d_model = 16;
  c.d.heads = 4;
  c.d.kv_heads = 2;
  c.d.head_dim = 4;
  c.d.ffn_hidden = 24;
  c.seed = 7;
  return c;
}

// Different boundaries in the two batch rows; row 1 opens with a one-token document.
oracle::documents packed_documents() { return {{0, 0, 0, 1, 1, 2, 2}, {3, 4, 4, 4, 4, 4, 7}}; }

// Multi-query, head_dim 6 != d_model / heads, q/k/v biases, another RoPE base and eps.
block_case mqa_bias_case() {
  block_case c;
  c.d.d_model = 16;
  c.d.heads = 4;
  c.d.kv_heads = 1;
  c.d.head_dim = 6;
  c.d.ffn_hidden = 20;
  c.d.rope_base = 100.0;
  c.d.norm_eps = 1e-3;
  c.qkv_bias = true;
  c.seed = 11;
  return c;
}

using reference_block_attention = nn::no_cp<baton::reference_attention>;

// ---- the language model ----

template <class T>
struct language_model {
  static constexpr std::int64_t batch = 2, seq = 7, layers = 2;
  using block_t = nn::transformer_block<T, reference_block_attention>;

  oracle::dims d;
  nn::transformer_config cfg;
  nn::embedding<T> embed;
  block_t block0, block1;
  nn::lm_head<T> head;
  host_tensor<std::int64_t> tokens, targets;

  static oracle::dims sizes() {
    oracle::dims s;
    s.d_model = 16;
    s.heads = 4;
    s.kv_heads = 2;
    s.head_dim = 4;
    s.ffn_hidden = 24;
    return s;
  }
  static nn::transformer_config config() {
    nn::transformer_config c;
    c.d_model = 16;
    c.heads = 4;
    c.kv_heads = 2;
    c.ffn_hidden = 24;
    c.vocab = 13;
    return c;
  }

  explicit language_model(std::uint64_t seed, const nn::initializer& init = nn::initializer(2024))
      : d(sizes()),
        cfg(config()),
        embed(cfg.vocab, cfg.d_model, init / "embed"),
        block0(cfg, init / "layers" / 0, {}),
        block1(cfg, init / "layers" / 1, {}),
        head(cfg, init / "head"),
        tokens(nn_test::random_tokens({batch, seq}, cfg.vocab, static_cast<std::uint32_t>(seed))),
        targets(nn_test::random_tokens({batch, seq}, cfg.vocab, static_cast<std::uint32_t>(seed) + 1)) {
    targets(0, 2) = -100;
    targets(1, 5) = -100;
    perturb_gains_and_biases<T>(block0, 300);
    perturb_gains_and_biases<T>(block1, 400);
    perturb_gains_and_biases<T>(head, 500);
  }

  std::map<std::string, std::vector<double>> values() {
    std::map<std::string, std::vector<double>> v = values_of<T>(embed, "embed");
    v.merge(values_of<T>(block0, "layers.0"));
    v.merge(values_of<T>(block1, "layers.1"));
    v.merge(values_of<T>(head, "head"));
    return v;
  }

  std::map<std::string, host_tensor<T>> gradients() {
    std::map<std::string, host_tensor<T>> g = nn_test::gradients_of<T>(embed, "embed");
    g.merge(nn_test::gradients_of<T>(block0, "layers.0"));
    g.merge(nn_test::gradients_of<T>(block1, "layers.1"));
    g.merge(nn_test::gradients_of<T>(head, "head"));
    return g;
  }

  /// Forward and backward as the pieces run them; returns the loss.
  double step() {
    const nn::sequence_info info = nn::sequence_info::whole(seq);
    typename nn::embedding<T>::saved s_embed;
    typename block_t::saved s0, s1;
    typename nn::lm_head<T>::saved s_head;
    const host_tensor<T> x0 = embed.forward(tokens, s_embed);
    const host_tensor<T> x1 = block0.forward(x0, info, s0);
    const host_tensor<T> x2 = block1.forward(x1, info, s1);
    const host_tensor<T> logits = head.forward(x2, s_head);
    const auto loss = nn::cross_entropy<T>()(logits, targets);
    const host_tensor<T> dx2 = head.backward(s_head, loss.grad);
    const host_tensor<T> dx1 = block1.backward(s1, dx2);
    const host_tensor<T> dx0 = block0.backward(s0, dx1);
    embed.backward(s_embed, dx0);
    return loss.value;
  }

  std::vector<std::int64_t> flat(const host_tensor<std::int64_t>& t) const {
    return std::vector<std::int64_t>(t.values().begin(), t.values().end());
  }
};

struct oracle_lm {
  double loss = 0;
  std::map<std::string, std::vector<double>> grads;
  std::vector<std::string> unused;
};

oracle_lm run_oracle_lm(const std::map<std::string, std::vector<double>>& values, const std::vector<std::int64_t>& tokens,
                        const std::vector<std::int64_t>& targets, const oracle::dims& d, std::int64_t vocab,
                        bool with_gradients = true) {
  oracle::tape t;
  oracle::weights w(t, values);
  const oracle::var loss = oracle::language_model(w, tokens, targets, 2, 7, d, vocab, 2);
  oracle_lm out;
  out.loss = oracle::val(loss);
  if (with_gradients) out.grads = w.gradients(t.backprop(loss));
  out.unused = w.unused();
  return out;
}

}  // namespace

TEMPLATE_TEST_CASE("transformer_block matches the autodiff oracle: y, dx and every gradient (GQA 4:2, causal)",
                   "[nn][oracle]", float, double) {
  using T = TestType;
  const block_errors e = check_block<T>(gqa_case(), reference_block_attention{});
  INFO("y " << e.y << " dx " << e.dx << " gradients " << e.grads);
  CHECK(e.y <= tolerance<T>());
}

TEMPLATE_TEST_CASE("transformer_block matches the autodiff oracle with packed documents in the side input",
                   "[nn][oracle]", float, double) {
  using T = TestType;
  SECTION("GQA 4:2, the sizes of the causal test") {
    block_case c = gqa_case();
    c.docs = packed_documents();
    const block_errors e = check_block<T>(c, reference_block_attention{});
    INFO("y " << e.y << " dx " << e.dx << " gradients " << e.grads);
    CHECK(e.grads <= tolerance<T>());
  }
  SECTION("MQA, head_dim 6, q/k/v biases, RoPE base 100, eps 1e-3") {
    block_case c = mqa_bias_case();
    c.docs = packed_documents();
    const block_errors e = check_block<T>(c, reference_block_attention{});
    INFO("y " << e.y << " dx " << e.dx << " gradients " << e.grads);
    CHECK(e.grads <= tolerance<T>());
  }
}

TEMPLATE_TEST_CASE("a 2-block language model matches the autodiff oracle: loss and every gradient", "[nn][oracle]",
                   float, double) {
  using T = TestType;
  language_model<T> lm(77);
  REQUIRE(nn::cross_entropy<T>().tokens(lm.targets) == 12);
  const double loss = lm.step();
  const auto grads = lm.gradients();
  const auto values = lm.values();
  CHECK(grads.size() == 2 + 2 * 9 + 1);  // head norm + output, 2 blocks of 9, the table

  const oracle_lm want = run_oracle_lm(values, lm.flat(lm.tokens), lm.flat(lm.targets), lm.d, lm.cfg.vocab);
  CHECK(want.unused.empty());
  const double loss_error = std::abs(loss - want.loss) / std::abs(want.loss);
  INFO("loss " << loss << " oracle " << want.loss << " rel error " << loss_error);
  CHECK(loss_error <= tolerance<T>());
  const double worst = check_gradients(grads, want.grads);
  INFO("worst gradient error " << worst);
  CHECK(worst <= tolerance<T>());

  // Ignored targets are excluded from the sum and from the count: counting them (as token 0)
  // changes the loss by far more than the tolerance.
  std::vector<std::int64_t> all = lm.flat(lm.targets);
  for (auto& t : all)
    if (t == -100) t = 0;
  const oracle_lm wrong = run_oracle_lm(values, lm.flat(lm.tokens), all, lm.d, lm.cfg.vocab, false);
  CHECK(std::abs(loss - wrong.loss) / std::abs(wrong.loss) > must_miss_by);
}

TEST_CASE("the oracle's tape gradients match central differences of its loss", "[nn][oracle]") {
  // Validates the oracle on its own: for the largest gradient entry of every parameter of the
  // language model, (L(w + h) - L(w - h)) / 2h against the tape's gradient.
  language_model<double> lm(77);
  auto values = lm.values();
  const auto tokens = lm.flat(lm.tokens), targets = lm.flat(lm.targets);
  const oracle_lm base = run_oracle_lm(values, tokens, targets, lm.d, lm.cfg.vocab);
  REQUIRE(base.grads.size() == values.size());
  const double h = 1e-5;
  for (const auto& [name, g] : base.grads) {
    std::size_t at = 0;
    for (std::size_t i = 1; i < g.size(); ++i)
      if (std::abs(g[i]) > std::abs(g[at])) at = i;
    double& w = values.at(name)[at];
    const double saved = w;
    w = saved + h;
    const double up = run_oracle_lm(values, tokens, targets, lm.d, lm.cfg.vocab, false).loss;
    w = saved - h;
    const double down = run_oracle_lm(values, tokens, targets, lm.d, lm.cfg.vocab, false).loss;
    w = saved;
    const double fd = (up - down) / (2 * h);
    INFO(name << "[" << at << "]: tape " << g[at] << ", central difference " << fd);
    CHECK(std::abs(g[at]) > 1e-4);
    CHECK(std::abs(fd - g[at]) <= 1e-6 * std::abs(g[at]));
  }
}

TEST_CASE("transformer_block on kokkos_attention matches the autodiff oracle (float)", "[nn][oracle][kokkos][can-skip]") {
#if !BATON_HAS_KOKKOS()
  BATON_SKIP("built without Kokkos (baton::kokkos): this case checks the Kokkos flash backend");
#else
  using kokkos_block_attention = nn::no_cp<baton::kokkos_attention>;
  SECTION("GQA 4:2, causal") {
    const block_errors e = check_block<float>(gqa_case(), kokkos_block_attention{});
    INFO("y " << e.y << " dx " << e.dx << " gradients " << e.grads);
    CHECK(e.grads <= tolerance<float>());
  }
  SECTION("GQA 4:2, packed documents") {
    block_case c = gqa_case();
    c.docs = packed_documents();
    const block_errors e = check_block<float>(c, kokkos_block_attention{});
    INFO("y " << e.y << " dx " << e.dx << " gradients " << e.grads);
    CHECK(e.grads <= tolerance<float>());
  }
#endif
}
