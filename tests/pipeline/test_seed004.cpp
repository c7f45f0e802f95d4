// Seed 004: what a trainer needs around the pipeline — eval before the first step, structured
// (named-field) payloads between stages, gradient clipping over every stage, and the loss on
// every rank — each checked against running the same stages on one rank.
#include "catch.hpp"
#include "parity_support.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>

using namespace pipeline_test;

namespace {

using S = mlp_stage<double>;
constexpr std::int64_t layer_width = 4;

// The loss of `stages` on (x, t), written out here rather than through the stages' forward or
// the oracle: y = tanh(x W + b) per row and stage, then 0.5 * sum (y - t)^2 / rows.
double mlp_loss_by_hand(const std::vector<S>& stages, const tensor<double>& x, const tensor<double>& t) {
  const std::int64_t rows = x.size() / layer_width;
  std::vector<double> h(x.data(), x.data() + x.size());
  for (const S& s : stages) {
    std::vector<double> y(h.size());
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < layer_width; ++j) {
        double z = s.b.data()[j];
        for (std::int64_t i = 0; i < layer_width; ++i) z += h[static_cast<std::size_t>(r * layer_width + i)] * s.w.data()[i * layer_width + j];
        y[static_cast<std::size_t>(r * layer_width + j)] = std::tanh(z);
      }
    h = std::move(y);
  }
  double loss = 0;
  for (std::size_t i = 0; i < h.size(); ++i) {
    const double d = h[i] - t.data()[i];
    loss += 0.5 * d * d;
  }
  return loss / static_cast<double>(rows);
}

}  // namespace

TEST_CASE("seed 004: eval() before the first step equals the sequential forward loss", "[pipeline][seed004]") {
  const auto shape = baton::shape_for<baton::interleaved_1f1b>(2, 4, 2);
  const auto x = random_tensor<double>({8, layer_width}, 61);
  const auto t = random_tensor<double>({8, layer_width}, 62, 0.5);
  auto oracle = oracle_stages<double, baton::no_side>(shape.num_stages(), layer_width);
  const double eval_oracle = sequential_loss(oracle, x, baton::no_side{}, t, mse_loss<double>{});
  const double step_oracle = sequential_step(oracle, x, baton::no_side{}, t, mse_loss<double>{});

  std::vector<double> errors;
  std::mutex m;
  baton::run_local(2, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::interleaved_1f1b, baton::uniform_stages<S>>(
        comm, shape, [](int s) { return S(layer_width, 100 + static_cast<std::uint64_t>(s)); }, mse_loss<double>{},
        baton::pipeline_options{.loss_on_every_rank = true});
    const auto first = exec.eval(x, t);
    const auto trained = exec.step(x, t);
    const auto again = exec.eval(x, t);  // weights are not updated: the same loss, gradients untouched
    std::lock_guard lock(m);
    // eval keeps no saved state beyond the running forward
    errors.push_back(first.peak_live_saved == 1 ? 0.0 : 1.0);
    errors.push_back(rel_err(*first.loss, eval_oracle));
    errors.push_back(rel_err(*trained.loss, step_oracle));
    errors.push_back(rel_err(*again.loss, eval_oracle));
    exec.for_each_local_stage([&](int s, S& st) {
      errors.push_back(rel_err(st.dw, oracle[static_cast<std::size_t>(s)].dw));
      errors.push_back(rel_err(st.db, oracle[static_cast<std::size_t>(s)].db));
    });
  });
  REQUIRE(errors.size() == 2 * 4 + 4 * 2);
  for (double e : errors) CHECK(e <= 1e-12);
  // Both oracles against the forward written out by hand (same weights: no optimizer runs), so
  // the executor's losses above are anchored to an expectation that shares no code with them.
  const double by_hand = mlp_loss_by_hand(oracle, x, t);
  CHECK(rel_err(eval_oracle, by_hand) <= 1e-12);
  CHECK(rel_err(step_oracle, by_hand) <= 1e-12);
}

// ---- structured payloads ---------------------------------------------------------------------

namespace {

// [doc:record_payload]
using hidden = baton::record<baton::field<"a", tensor<double>>, baton::field<"b", tensor<double>>,
                             baton::field<"pos", baton::constant<tensor<double>>>>;
// [/doc:record_payload]
using hidden_grad = baton::grad_t<hidden>;
static_assert(std::is_same_v<hidden_grad, baton::record<baton::field<"a", tensor<double>>, baton::field<"b", tensor<double>>>>);

// y[r, j] = tanh(sum_i x[r, i] w[i, j]) for row-major [rows, layer_width] tensors, and its pieces.
tensor<double> matmul(const tensor<double>& x, const tensor<double>& w) {
  const std::int64_t rows = x.shape()[0];
  tensor<double> y({rows, layer_width});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t j = 0; j < layer_width; ++j)
      for (std::int64_t i = 0; i < layer_width; ++i) y[r * layer_width + j] += x[r * layer_width + i] * w[i * layer_width + j];
  return y;
}
tensor<double> matmul_t(const tensor<double>& dz, const tensor<double>& w) {  // dz w^T
  const std::int64_t rows = dz.shape()[0];
  tensor<double> dx({rows, layer_width});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < layer_width; ++i)
      for (std::int64_t j = 0; j < layer_width; ++j) dx[r * layer_width + i] += dz[r * layer_width + j] * w[i * layer_width + j];
  return dx;
}
void add_outer(tensor<double>& dw, const tensor<double>& x, const tensor<double>& dz) {  // dw += x^T dz
  const std::int64_t rows = x.shape()[0];
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < layer_width; ++i)
      for (std::int64_t j = 0; j < layer_width; ++j) dw[i * layer_width + j] += x[r * layer_width + i] * dz[r * layer_width + j];
}
tensor<double> tanh_of(tensor<double> z) {
  for (std::int64_t i = 0; i < z.size(); ++i) z[i] = std::tanh(z[i]);
  return z;
}
tensor<double> tanh_grad(const tensor<double>& dy, const tensor<double>& y) {
  tensor<double> dz(y.shape());
  for (std::int64_t i = 0; i < y.size(); ++i) dz[i] = dy[i] * (1 - y[i] * y[i]);
  return dz;
}

// tensor -> {a = tanh(x wa), b = tanh(x wb), pos = x[:, 0] (a constant)}
struct entry_stage {
  using input = tensor<double>;
  using output = hidden;
  using side = baton::no_side;
  struct saved {
    tensor<double> x, a, b;
  };
  tensor<double> wa = random_tensor<double>({layer_width, layer_width}, 71, 0.6), wb = random_tensor<double>({layer_width, layer_width}, 72, 0.6);
  tensor<double> dwa{{layer_width, layer_width}}, dwb{{layer_width, layer_width}};

  output forward(const input& x, const side&, saved& st) {
    st.x = x;
    st.a = tanh_of(matmul(x, wa));
    st.b = tanh_of(matmul(x, wb));
    const std::int64_t rows = x.shape()[0];
    tensor<double> pos({rows, 1});
    for (std::int64_t r = 0; r < rows; ++r) pos[r] = x[r * layer_width];
    return hidden(st.a, st.b, baton::constant(std::move(pos)));
  }
  tensor<double> backward(saved& st, const hidden_grad& g) {
    const auto dza = tanh_grad(baton::get<"a">(g), st.a);
    const auto dzb = tanh_grad(baton::get<"b">(g), st.b);
    add_outer(dwa, st.x, dza);
    add_outer(dwb, st.x, dzb);
    auto dx = matmul_t(dza, wa);
    const auto dxb = matmul_t(dzb, wb);
    for (std::int64_t i = 0; i < dx.size(); ++i) dx[i] += dxb[i];
    return dx;
  }
};

// {a, b, pos} -> {tanh(a w1 + b w2 + 0.1 pos), b, pos}
struct mix_stage {
  using input = hidden;
  using output = hidden;
  using side = baton::no_side;
  struct saved {
    hidden in;
    tensor<double> out;
  };
  tensor<double> w1, w2, dw1{{layer_width, layer_width}}, dw2{{layer_width, layer_width}};
  explicit mix_stage(std::uint64_t seed)
      : w1(random_tensor<double>({layer_width, layer_width}, seed, 0.6)), w2(random_tensor<double>({layer_width, layer_width}, seed + 1, 0.6)) {}

  output forward(const input& h, const side&, saved& st) {
    st.in = h;
    auto z = matmul(baton::get<"a">(h), w1);
    const auto zb = matmul(baton::get<"b">(h), w2);
    const auto& pos = *baton::get<"pos">(h);
    for (std::int64_t i = 0; i < z.size(); ++i) z[i] += zb[i] + 0.1 * pos[i / layer_width];
    st.out = tanh_of(std::move(z));
    return hidden(st.out, baton::get<"b">(h), baton::get<"pos">(h));
  }
  hidden_grad backward(saved& st, const hidden_grad& g) {
    const auto dz = tanh_grad(baton::get<"a">(g), st.out);
    add_outer(dw1, baton::get<"a">(st.in), dz);
    add_outer(dw2, baton::get<"b">(st.in), dz);
    auto db = matmul_t(dz, w2);
    const auto& db_through = baton::get<"b">(g);
    for (std::int64_t i = 0; i < db.size(); ++i) db[i] += db_through[i];
    return hidden_grad(matmul_t(dz, w1), std::move(db));
  }
};

// {a, b, pos} -> a + b
struct exit_stage {
  using input = hidden;
  using output = tensor<double>;
  using side = baton::no_side;
  struct saved {};
  output forward(const input& h, const side&, saved&) {
    auto y = baton::get<"a">(h);
    const auto& b = baton::get<"b">(h);
    for (std::int64_t i = 0; i < y.size(); ++i) y[i] += b[i];
    return y;
  }
  hidden_grad backward(saved&, const tensor<double>& dy) { return hidden_grad(dy, dy); }
};

// [doc:record_pipeline]
using record_pipeline = baton::stage_list<entry_stage, mix_stage, mix_stage, exit_stage>;

auto make_record_stage = [](auto i) {
  if constexpr (i == 0) return entry_stage{};
  else if constexpr (i == 3) return exit_stage{};
  else return mix_stage(80 + 10 * i);
};
// [/doc:record_pipeline]

template <class Policy>
void check_records(int ranks, int m) {
  const auto shape = baton::shape_for<Policy>(ranks, m, 4 / ranks);
  const auto x = random_tensor<double>({2 * m, layer_width}, 91);
  const auto t = random_tensor<double>({2 * m, layer_width}, 92, 0.5);
  // Sequential oracle.
  entry_stage e = make_record_stage(std::integral_constant<std::size_t, 0>{});
  mix_stage m1 = make_record_stage(std::integral_constant<std::size_t, 1>{});
  mix_stage m2 = make_record_stage(std::integral_constant<std::size_t, 2>{});
  exit_stage o;
  entry_stage::saved se;
  mix_stage::saved s1, s2;
  exit_stage::saved so;
  const auto y = o.forward(m2.forward(m1.forward(e.forward(x, {}, se), {}, s1), {}, s2), {}, so);
  const auto l = mse_loss<double>{}(y, t);
  e.backward(se, m1.backward(s1, m2.backward(s2, o.backward(so, l.grad))));

  std::vector<double> errors;
  std::mutex mu;
  baton::run_local(ranks, [&](baton::local_communicator& comm) {
    // [doc:record_pipeline]
    auto exec = baton::make_pipeline<Policy, record_pipeline>(comm, shape, make_record_stage, mse_loss<double>{},
                                                              baton::pipeline_options{.loss_on_every_rank = true});
    // [/doc:record_pipeline]
    const auto r = exec.step(x, t);
    std::lock_guard lock(mu);
    errors.push_back(rel_err(*r.loss, l.value));
    exec.for_each_local_stage([&](int s, auto& st) {
      using stage_type = std::remove_cvref_t<decltype(st)>;
      if constexpr (std::is_same_v<stage_type, entry_stage>) {
        errors.push_back(rel_err(st.dwa, e.dwa));
        errors.push_back(rel_err(st.dwb, e.dwb));
      } else if constexpr (std::is_same_v<stage_type, mix_stage>) {
        const auto& ref = s == 1 ? m1 : m2;
        errors.push_back(rel_err(st.dw1, ref.dw1));
        errors.push_back(rel_err(st.dw2, ref.dw2));
      }
    });
  });
  REQUIRE(errors.size() == static_cast<std::size_t>(ranks) + 6);
  for (double err : errors) CHECK(err <= 1e-12);
}

}  // namespace

TEST_CASE("seed 004: a record with two activations and a constant crosses stages", "[pipeline][seed004]") {
  SECTION("1F1B, 4 ranks") { check_records<baton::one_f_one_b>(4, 4); }
  SECTION("interleaved 1F1B, 2 ranks x 2 stages") { check_records<baton::interleaved_1f1b>(2, 4); }
}

TEST_CASE("seed 004: clip_grad_norm across pipeline ranks equals clipping the whole model on one rank",
          "[pipeline][seed004]") {
  const double p = GENERATE(2.0, std::numeric_limits<double>::infinity());
  const auto shape = baton::shape_for<baton::zbv>(2, 4);
  const auto x = random_tensor<double>({8, layer_width}, 51);
  const auto t = random_tensor<double>({8, layer_width}, 52, 0.5);
  auto oracle = oracle_stages<double, baton::no_side>(shape.num_stages(), layer_width);
  sequential_step(oracle, x, baton::no_side{}, t, mse_loss<double>{});
  // The expected norm and clipped gradients, written out here rather than by clip_grad_norm
  // (torch.nn.utils.clip_grad_norm_): the p-norm over every stage's dw and db, then every
  // gradient times max_norm / (norm + 1e-6).
  const double max_norm = 1e-3;  // far below the norm: clipping happens
  double reduced = 0;  // sum of squares (p = 2) or largest magnitude (p = inf)
  for (const S& s : oracle)
    for (const tensor<double>* g : {&s.dw, &s.db})
      for (std::int64_t i = 0; i < g->size(); ++i) {
        const double a = std::abs(g->data()[i]);
        reduced = p == 2.0 ? reduced + a * a : std::max(reduced, a);
      }
  const double oracle_norm = p == 2.0 ? std::sqrt(reduced) : reduced;
  REQUIRE(oracle_norm > max_norm);
  const double scale = max_norm / (oracle_norm + 1e-6);
  for (S& s : oracle)
    for (tensor<double>* g : {&s.dw, &s.db})
      for (std::int64_t i = 0; i < g->size(); ++i) g->data()[i] *= scale;

  std::vector<double> errors;
  std::mutex m;
  baton::run_local(2, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::zbv, baton::uniform_stages<S>>(
        comm, shape, [](int s) { return S(layer_width, 100 + static_cast<std::uint64_t>(s)); }, mse_loss<double>{});
    exec.step(x, t);
    std::vector<std::span<double>> grads;
    exec.for_each_local_stage([&](int, S& st) { append_grad_spans(grads, st); });
    const double norm = baton::clip_grad_norm(grads, max_norm, p, comm);
    std::lock_guard lock(m);
    errors.push_back(rel_err(norm, oracle_norm));
    exec.for_each_local_stage([&](int s, S& st) {
      errors.push_back(rel_err(st.dw, oracle[static_cast<std::size_t>(s)].dw));
      errors.push_back(rel_err(st.db, oracle[static_cast<std::size_t>(s)].db));
    });
  });
  REQUIRE(errors.size() == 2 + 8);
  for (double e : errors) CHECK(e <= 1e-12);
}

TEST_CASE("seed 004: the loss reported on every rank equals the sequential loss", "[pipeline][seed004]") {
  auto check = [](const baton::program& prog) {
    const auto x = random_tensor<double>({16, layer_width}, 31);
    const auto t = random_tensor<double>({16, layer_width}, 32, 0.5);
    auto oracle = oracle_stages<double, baton::no_side>(prog.shape.num_stages(), layer_width);
    const double oracle_loss = sequential_step(oracle, x, baton::no_side{}, t, mse_loss<double>{});
    const auto got = run_pipeline<double>(prog, layer_width, x, baton::no_side{}, t,
                                          baton::pipeline_options{.loss_on_every_rank = true});
    for (const auto& l : got.loss_by_rank) {
      REQUIRE(l.has_value());
      CHECK(rel_err(*l, oracle_loss) <= 1e-12);
    }
  };
  SECTION("1F1B, 4 ranks (the loss comes from rank 3)") { check(baton::one_f_one_b::generate({4, 1, 8})); }
  SECTION("ZBV, 4 ranks (the last stage is on rank 0)") {
    check(baton::zbv::generate(baton::shape_for<baton::zbv>(4, 8)));
  }
}

// ---- the stage concepts reject near misses ---------------------------------------------------
// Each probe differs from `full` (a stage) or `split` (a split-backward stage) in one
// requirement, so each negative check fails if the concept stopped asking for it.

namespace stage_probe {

using T = tensor<double>;
struct saved_state {};
struct no_default_saved {
  explicit no_default_saved(int) {}
};

struct full {
  using input = T;
  using output = T;
  using side = baton::no_side;
  using saved = saved_state;
  output forward(const input&, const side&, saved&);
  baton::grad_t<input> backward(saved&, const baton::grad_t<output>&);
};
struct split : full {
  baton::grad_t<input> backward_input(saved&, const baton::grad_t<output>&);
  void backward_weight(saved&);
};
struct no_side_type {  // `side` missing
  using input = T;
  using output = T;
  using saved = saved_state;
  output forward(const input&, const baton::no_side&, saved&);
  baton::grad_t<input> backward(saved&, const baton::grad_t<output>&);
};
struct saved_not_default_constructible : full {
  using saved = no_default_saved;
  output forward(const input&, const side&, saved&);
  baton::grad_t<input> backward(saved&, const baton::grad_t<output>&);
};
struct forward_returns_other_type {
  using input = T;
  using output = T;
  using side = baton::no_side;
  using saved = saved_state;
  tensor<float> forward(const input&, const side&, saved&);
  baton::grad_t<input> backward(saved&, const baton::grad_t<output>&);
};
struct no_backward {
  using input = T;
  using output = T;
  using side = baton::no_side;
  using saved = saved_state;
  output forward(const input&, const side&, saved&);
};
struct split_without_full_backward {  // backward_input/backward_weight but no backward
  using input = T;
  using output = T;
  using side = baton::no_side;
  using saved = saved_state;
  output forward(const input&, const side&, saved&);
  baton::grad_t<input> backward_input(saved&, const baton::grad_t<output>&);
  void backward_weight(saved&);
};
struct no_backward_weight : full {
  baton::grad_t<input> backward_input(saved&, const baton::grad_t<output>&);
};
struct backward_input_returns_other_type : full {
  tensor<float> backward_input(saved&, const baton::grad_t<output>&);
  void backward_weight(saved&);
};

}  // namespace stage_probe

TEST_CASE("stage and split_backward_stage reject near misses", "[pipeline][concept]") {
  using namespace stage_probe;
  STATIC_REQUIRE(baton::stage<full>);
  STATIC_REQUIRE_FALSE(baton::split_backward_stage<full>);  // no backward_input / backward_weight
  STATIC_REQUIRE(baton::split_backward_stage<split>);
  STATIC_REQUIRE(baton::split_backward_stage<S>);  // the stage the tests above run
  STATIC_REQUIRE_FALSE(baton::stage<no_side_type>);
  STATIC_REQUIRE_FALSE(baton::stage<saved_not_default_constructible>);
  STATIC_REQUIRE_FALSE(baton::stage<forward_returns_other_type>);
  STATIC_REQUIRE_FALSE(baton::stage<no_backward>);
  STATIC_REQUIRE_FALSE(baton::stage<int>);
  STATIC_REQUIRE_FALSE(baton::split_backward_stage<split_without_full_backward>);  // a stage needs backward
  STATIC_REQUIRE_FALSE(baton::split_backward_stage<no_backward_weight>);
  STATIC_REQUIRE_FALSE(baton::split_backward_stage<backward_input_returns_other_type>);
}
