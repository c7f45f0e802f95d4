// Shapes that change between steps: consecutive steps with sequence lengths 32, 48, 32 run on
// one executor with no re-setup (the wire header carries the shapes), with an opaque mask and
// a positions tensor as side inputs whose shapes change too.
#include "catch.hpp"
#include "parity_support.hpp"

using namespace pipeline_test;

namespace {

masked_side make_side(std::int64_t batch, std::int64_t seq) {
  tensor<std::int64_t> pos({batch, seq});
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < seq; ++t) pos[b * seq + t] = t;
  return masked_side(make_mask(batch, seq), baton::constant(std::move(pos)));
}

template <class Policy>
void check_variable_lengths() {
  using T = double;
  using S = mlp_stage<T, masked_side>;
  // width 8: a microbatch of 32 tokens is 2048 bytes and travels inside the header message,
  // one of 48 tokens (3072 bytes) in messages of its own — consecutive steps switch paths.
  constexpr std::int64_t batch = 4, width = 8;
  const std::vector<std::int64_t> lengths{32, 48, 32};
  const auto shape = baton::shape_for<Policy>(2, 4);
  const int stages = shape.num_stages();

  // Oracle, step by step (gradients zeroed between steps, weights unchanged).
  auto oracle = oracle_stages<T, masked_side>(stages, width);
  std::vector<double> oracle_loss;
  std::vector<std::vector<stage_grads<T>>> oracle_grads;
  for (std::size_t k = 0; k < lengths.size(); ++k) {
    for (auto& s : oracle) s.zero_grad();
    const auto x = random_tensor<T>({batch, lengths[k], width}, 20 + k);
    const auto t = random_tensor<T>({batch, lengths[k], width}, 30 + k, 0.5);
    oracle_loss.push_back(sequential_step(oracle, x, make_side(batch, lengths[k]), t, mse_loss<T>{}));
    std::vector<stage_grads<T>> g;
    for (auto& s : oracle) g.push_back({s.dw, s.db});
    oracle_grads.push_back(std::move(g));
  }

  std::vector<std::vector<double>> errors(2);
  std::vector<std::vector<std::size_t>> peak_bytes(2);
  baton::run_local(2, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<Policy, baton::uniform_stages<S>>(
        comm, shape, [&](int s) { return S(width, 100 + static_cast<std::uint64_t>(s)); }, mse_loss<T>{},
        baton::pipeline_options{.loss_on_every_rank = true});
    auto& err = errors[static_cast<std::size_t>(comm.rank())];
    for (std::size_t k = 0; k < lengths.size(); ++k) {
      exec.for_each_local_stage([](int, S& s) { s.zero_grad(); });
      const auto x = random_tensor<T>({batch, lengths[k], width}, 20 + k);
      const auto t = random_tensor<T>({batch, lengths[k], width}, 30 + k, 0.5);
      const auto r = exec.step(x, make_side(batch, lengths[k]), t);
      err.push_back(r.loss ? rel_err(*r.loss, oracle_loss[k]) : 1e300);
      exec.for_each_local_stage([&](int s, S& st) {
        err.push_back(rel_err(st.dw, oracle_grads[k][static_cast<std::size_t>(s)].dw));
        err.push_back(rel_err(st.db, oracle_grads[k][static_cast<std::size_t>(s)].db));
      });
      peak_bytes[static_cast<std::size_t>(comm.rank())].push_back(r.peak_saved_bytes);
    }
  });
  for (const auto& per_rank : errors)
    for (double e : per_rank) CHECK(e <= 1e-12);
  // The saved-state bytes follow the sequence length: the 48-token step holds more.
  for (const auto& b : peak_bytes) {
    REQUIRE(b.size() == 3);
    CHECK(b[1] > b[0]);
    CHECK(b[2] == b[0]);
  }
}

}  // namespace

TEST_CASE("sequence lengths 32, 48, 32 in consecutive steps need no re-setup", "[pipeline][variable]") {
  SECTION("1F1B") { check_variable_lengths<baton::one_f_one_b>(); }
  SECTION("ZBV") { check_variable_lengths<baton::zbv>(); }
}
