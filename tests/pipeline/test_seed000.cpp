// Seed 000: FlexAttention's BlockMask crashed torch's split-backward schedules, which asked
// every stage input for requires_grad. Here the mask is an opaque side input: split per
// microbatch by its own hook, given to every stage locally, never sent, never part of a
// gradient type. Every split-backward schedule runs and matches the sequential run.
#include "catch.hpp"
#include "parity_support.hpp"

using namespace pipeline_test;

namespace {

constexpr std::int64_t batch = 8, seq = 6, width = 4;

masked_side full_side() {
  tensor<std::int64_t> pos({batch, seq});
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < seq; ++t) pos[b * seq + t] = 3 * t + b;
  return masked_side(make_mask(batch, seq), baton::constant(std::move(pos)));
}

void check_program(const baton::program& prog, baton::pipeline_options options = {}) {
  using T = double;
  const auto side = full_side();
  const auto x = random_tensor<T>({batch, seq, width}, 41);
  const auto target = random_tensor<T>({batch, seq, width}, 42, 0.5);
  auto oracle = oracle_stages<T, masked_side>(prog.shape.num_stages(), width);
  const double oracle_loss = sequential_step(oracle, x, side, target, mse_loss<T>{});
  const auto got = run_pipeline<T>(prog, width, x, side, target, options);
  const int last_rank = baton::stage_rank(prog.shape, prog.shape.num_stages() - 1);
  const double err = parity_error(got, oracle_loss, oracle, last_rank);
  INFO("max rel err " << err);
  CHECK(err <= 1e-12);
}

template <class Policy>
void check_policy(int ranks, int m) {
  static_assert(Policy::splits_backward || std::is_same_v<Policy, baton::one_f_one_b>);
  check_program(Policy::generate(baton::shape_for<Policy>(ranks, m)));
}

}  // namespace

// The gradient type of the side record cannot exist: a backward cannot even name the mask.
static_assert(!baton::has_gradient_v<token_mask>);
static_assert(std::is_same_v<baton::grad_t<tensor<double>>, tensor<double>>);

TEST_CASE("seed 000: an opaque mask and a constant positions tensor as side inputs, split schedules",
          "[pipeline][seed000]") {
  SECTION("ZB1P") { check_policy<baton::zb1p>(2, 4); }
  SECTION("interleaved zero bubble") { check_policy<baton::interleaved_zero_bubble>(2, 4); }
  SECTION("ZBV, 2 ranks") { check_policy<baton::zbv>(2, 4); }
  SECTION("ZBV, 4 ranks") { check_policy<baton::zbv>(4, 8); }
  SECTION("DualPipeV") { check_policy<baton::dual_pipe_v>(2, 4); }
  SECTION("CSV with separate I and W") {
    const auto prog = baton::parse_csv(
        "0F0,0F1,0F2,0F3,0I0,0W0,0I1,0W1,0I2,0W2,0I3,0W3\n"
        "1F0,1I0,1F1,1I1,1W0,1F2,1I2,1W1,1F3,1I3,1W2,1W3\n");
    REQUIRE(baton::uses_split_backward(prog));
    check_program(prog);
  }
  SECTION("and a full-backward schedule, for contrast") { check_policy<baton::one_f_one_b>(2, 4); }
}

TEST_CASE("seed 000: the mask each stage sees is its microbatch's part", "[pipeline][seed000]") {
  // mlp_stage throws when the mask's batch x seq does not match the microbatch's tokens; here
  // the microbatches are unequal (8 rows into 3: 3, 3, 2), so a replicated or misrouted mask
  // would be caught. Token-count scaling makes unequal microbatches add up to the full mean.
  const auto prog = baton::zbv::generate(baton::shape_for<baton::zbv>(2, 3));
  check_program(prog, baton::pipeline_options{.scaling = baton::loss_scaling::by_token_count});
}
