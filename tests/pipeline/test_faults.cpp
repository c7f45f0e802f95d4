// Faults and bad input: each ends the call on every rank with a message that names the rank
// and what to change — never a hang, never a crash.
#include "catch.hpp"
#include "parity_support.hpp"

#include <chrono>
#include <mutex>

using namespace pipeline_test;
using Catch::Matchers::Contains;

namespace {

using S = mlp_stage<double>;

// Throws from forward when its stage index and microbatch (= forward call number, for
// schedules that run a stage's forwards in microbatch order) match.
struct faulty_stage : S {
  int index;
  int fail_on_forward;
  faulty_stage(int index_, int fail) : S(4, 100 + static_cast<std::uint64_t>(index_)), index(index_), fail_on_forward(fail) {}
  output forward(const input& x, const side& c, saved& st) {
    if (forward_calls == fail_on_forward) throw std::runtime_error("boom in stage " + std::to_string(index));
    return S::forward(x, c, st);
  }
};

// A stage with only a full backward.
struct full_only_stage {
  using input = tensor<double>;
  using output = tensor<double>;
  using side = baton::no_side;
  struct saved {};
  output forward(const input& x, const side&, saved&) { return x; }
  baton::grad_t<input> backward(saved&, const baton::grad_t<output>& dy) { return dy; }
};

}  // namespace

TEST_CASE("a stage that throws ends the step on every rank, naming rank and action", "[pipeline][faults]") {
  const auto start = std::chrono::steady_clock::now();
  bool rethrow_checked = false;
  const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<faulty_stage>>(
        comm, baton::schedule_shape{2, 1, 4}, [](int s) { return faulty_stage(s, s == 1 ? 2 : -1); },
        mse_loss<double>{});
    const auto x = random_tensor<double>({8, 4}, 1);
    try {
      exec.step(x, x);
    } catch (const baton::pipeline_error&) {
      if (comm.rank() == 1) {
        // The executor refuses further calls instead of running on inconsistent state.
        // (Recorded, not asserted here: Catch assertions are not thread-safe.)
        try {
          exec.step(x, x);
        } catch (const baton::pipeline_error& again) {
          rethrow_checked = std::string(again.what()).find("unusable after a failed call") != std::string::npos;
        }
      }
      throw;
    }
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 10);  // well below the 20 s timeout: the failure propagated, nobody waited it out
  INFO(messages[0] << "\n" << messages[1]);
  CHECK_THAT(messages[1], Contains("rank 1") && Contains("1F2") && Contains("boom in stage 1") &&
                              Contains("forward threw"));
  CHECK_THAT(messages[0], Contains("rank 0") && Contains("action 0"));
  CHECK(rethrow_checked);
}

TEST_CASE("too few microbatches for a schedule is reported before anything runs", "[pipeline][faults]") {
  // DualPipeV needs 2 x ranks microbatches.
  const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
    try {
      auto exec = baton::make_pipeline<baton::dual_pipe_v, baton::uniform_stages<S>>(
          comm, baton::shape_for<baton::dual_pipe_v>(2, 3), [](int s) { return S(4, static_cast<std::uint64_t>(s)); },
          mse_loss<double>{});
    } catch (const baton::schedule_error& e) {
      throw baton::pipeline_error(e.what());
    }
  });
  for (const auto& m : messages) CHECK_THAT(m, Contains("dual_pipe_v") && Contains("microbatches"));
}

TEST_CASE("a forward-only schedule evaluates like a training schedule and refuses step()", "[pipeline][faults]") {
  const auto x = random_tensor<double>({8, 4}, 1);
  const auto t = random_tensor<double>({8, 4}, 2);
  const auto make = [](int s) { return S(4, static_cast<std::uint64_t>(s)); };
  std::vector<double> losses(2, -1.0);
  const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
    auto trained = baton::make_pipeline<baton::gpipe, baton::uniform_stages<S>>(comm, baton::schedule_shape{2, 1, 4},
                                                                               make, mse_loss<double>{});
    auto forward = baton::make_pipeline<baton::forward_only, baton::uniform_stages<S>>(
        comm, baton::schedule_shape{2, 1, 4}, make, mse_loss<double>{});
    const auto expected = trained.eval(x, t).loss;
    const auto got = forward.eval(x, t).loss;
    if (comm.rank() == 1) {  // the last stage's rank holds the loss
      losses[0] = expected.value_or(-2.0);
      losses[1] = got.value_or(-3.0);
    }
    forward.step(x, t);
  });
  CHECK(losses[1] == losses[0]);  // the same stages, forwards and loss: the same bits
  CHECK(losses[0] >= 0.0);
  for (const auto& m : messages) CHECK_THAT(m, Contains("forward-only") && Contains("call eval()"));
}

TEST_CASE("a batch with fewer rows than microbatches fails on every rank", "[pipeline][faults]") {
  const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<S>>(
        comm, baton::schedule_shape{2, 1, 4}, [](int s) { return S(4, static_cast<std::uint64_t>(s)); },
        mse_loss<double>{});
    const auto x = random_tensor<double>({3, 4}, 1);       // too few rows on rank 0 (first stage)
    const auto t = random_tensor<double>({8, 4}, 2);       // fine on rank 1 (last stage)
    exec.step(x, t);
  });
  CHECK_THAT(messages[0], Contains("rank 0") && Contains("cannot split") && Contains("4 microbatches"));
  CHECK_THAT(messages[1], Contains("rank 1") && Contains("rank 0 could not split"));
}

TEST_CASE("ranks that disagree on the schedule fail at the start of step()", "[pipeline][faults]") {
  const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
    const int m = comm.rank() == 0 ? 4 : 8;
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<S>>(
        comm, baton::schedule_shape{2, 1, m}, [](int s) { return S(4, static_cast<std::uint64_t>(s)); },
        mse_loss<double>{});
    const auto x = random_tensor<double>({8, 4}, 1);
    exec.step(x, x);
  });
  for (const auto& m : messages) CHECK_THAT(m, Contains("disagree on the schedule"));
}

TEST_CASE("ranks that disagree on the side-input shapes fail at the start of step()", "[pipeline][faults]") {
  using SM = mlp_stage<double, masked_side>;
  const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<SM>>(
        comm, baton::schedule_shape{2, 1, 2}, [](int s) { return SM(4, static_cast<std::uint64_t>(s)); },
        mse_loss<double>{});
    const std::int64_t seq = comm.rank() == 0 ? 8 : 12;
    const auto x = random_tensor<double>({2, seq, 4}, 1);
    exec.step(x, masked_side(make_mask(2, seq), baton::constant(tensor<std::int64_t>({2, seq}))), x);
  });
  for (const auto& m : messages) CHECK_THAT(m, Contains("disagree on the shape of the side inputs"));
}

TEST_CASE("one rank calling eval() while another calls step() is an error on both", "[pipeline][faults]") {
  const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::gpipe, baton::uniform_stages<S>>(
        comm, baton::schedule_shape{2, 1, 2}, [](int s) { return S(4, static_cast<std::uint64_t>(s)); },
        mse_loss<double>{});
    const auto x = random_tensor<double>({4, 4}, 1);
    if (comm.rank() == 0) exec.eval(x, x);
    else exec.step(x, x);
  });
  CHECK_THAT(messages[0], Contains("this rank called eval() but rank 1 called step()"));
  CHECK_THAT(messages[1], Contains("this rank called step() but rank 0 called eval()"));
}

TEST_CASE("a program with I/W for a stage without split backward is rejected at construction", "[pipeline][faults]") {
  // The compile-time check covers policies; a program (CSV) is checked when the executor is built.
  const auto prog = baton::zb1p::generate({2, 1, 2});
  const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::uniform_stages<full_only_stage>>(
        comm, prog, [](int) { return full_only_stage{}; }, [](const tensor<double>& y, const tensor<double>&) {
          return baton::loss_result<tensor<double>>{0.0, y};
        });
  });
  for (const auto& m : messages) CHECK_THAT(m, Contains("backward_input/backward_weight") && Contains("full-backward"));
}

TEST_CASE("a schedule for another number of ranks is rejected", "[pipeline][faults]") {
  const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<S>>(
        comm, baton::schedule_shape{4, 1, 4}, [](int s) { return S(4, static_cast<std::uint64_t>(s)); },
        mse_loss<double>{});
  });
  for (const auto& m : messages) CHECK_THAT(m, Contains("for 4 ranks but the communicator has 2"));
}

TEST_CASE("a stage_list whose length differs from the schedule's stage count is rejected", "[pipeline][faults]") {
  const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::stage_list<S, S, S>>(
        comm, baton::schedule_shape{2, 1, 4}, [](auto i) { return S(4, i); }, mse_loss<double>{});
  });
  for (const auto& m : messages) CHECK_THAT(m, Contains("3 stage types but the schedule has 2 stages"));
}

TEST_CASE("asking a rank for a stage it does not hold names the rank that does", "[pipeline][faults]") {
  const auto messages = errors_of(2, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::stage_list<S, S>>(
        comm, baton::schedule_shape{2, 1, 2}, [](auto i) { return S(4, i); }, mse_loss<double>{});
    if (comm.rank() == 0) {
      (void)exec.stage<0>();  // held here: fine
      (void)exec.stage<1>();
    } else {
      (void)exec.stage<0>();
    }
  });
  CHECK_THAT(messages[0], Contains("rank 0 does not hold stage 1 (it runs on rank 1)"));
  CHECK_THAT(messages[1], Contains("rank 1 does not hold stage 0 (it runs on rank 0)"));
}
