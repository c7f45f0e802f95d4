// Parity on MPI processes (mpiexec -n 2 and -n 4): 1F1B, interleaved 1F1B, ZBV and DualPipeV
// give the loss and weight gradients of the sequential run (1e-12 double, 1e-5 float), the
// loss reaches every rank on request, and clip_grad_norm over the pipeline group equals
// clipping the whole model on one process.
#include "catch.hpp"
#include "parity_support.hpp"

#include <baton/comm/mpi.hpp>

#include <chrono>
#include <cstdint>
#include <limits>
#include <vector>

using namespace pipeline_test;

namespace {

template <class Policy, class T>
void check_policy(baton::mpi_communicator& comm, std::int64_t width = 4, std::int64_t rows_per_microbatch = 2) {
  using S = mlp_stage<T>;
  const int m = 8;
  const auto shape = baton::shape_for<Policy>(comm.size(), m);
  const auto x = random_tensor<T>({rows_per_microbatch * m, width}, 1);
  const auto t = random_tensor<T>({rows_per_microbatch * m, width}, 2, 0.5);
  std::vector<S> oracle = oracle_stages<T, baton::no_side>(shape.num_stages(), width);
  const double oracle_loss = sequential_step(oracle, x, baton::no_side{}, t, mse_loss<T>{});

  auto exec = baton::make_pipeline<Policy, baton::uniform_stages<S>>(
      comm, shape, [&](int s) { return S(width, 100 + static_cast<std::uint64_t>(s)); }, mse_loss<T>{},
      baton::pipeline_options{.loss_on_every_rank = true});
  const auto r = exec.step(x, t);
  REQUIRE(r.loss.has_value());
  CHECK(rel_err(*r.loss, oracle_loss) <= tolerance<T>());
  exec.for_each_local_stage([&](int s, S& st) {
    INFO("stage " << s);
    CHECK(rel_err(st.dw, oracle[static_cast<std::size_t>(s)].dw) <= tolerance<T>());
    CHECK(rel_err(st.db, oracle[static_cast<std::size_t>(s)].db) <= tolerance<T>());
  });

  // Clipping over the pipeline group equals clipping every stage's gradients on one process.
  for (double p : {2.0, std::numeric_limits<double>::infinity()}) {
    std::vector<S> whole = oracle;
    std::vector<std::span<T>> all;
    for (auto& s : whole) append_grad_spans(all, s);
    const double expected = baton::clip_grad_norm(all, 1e-3, p);
    std::vector<std::span<T>> mine;
    std::vector<std::pair<int, S>> copies;
    exec.for_each_local_stage([&](int s, S& st) { copies.emplace_back(s, st); });
    for (auto& [s, st] : copies) append_grad_spans(mine, st);
    const double norm = baton::clip_grad_norm(mine, 1e-3, p, comm);
    CHECK(rel_err(norm, expected) <= tolerance<T>());
    for (auto& [s, st] : copies) CHECK(rel_err(st.dw, whole[static_cast<std::size_t>(s)].dw) <= tolerance<T>());
  }
}

// The loss of the docs example: the test's mse_loss, keeping each microbatch's value.
struct recorded_mse_loss {
  std::vector<double>* values;
  baton::loss_result<tensor<double>> operator()(const tensor<double>& y, const tensor<double>& target) const {
    auto r = mse_loss<double>{}(y, target);
    values->push_back(r.value);
    return r;
  }
};

}  // namespace

TEST_CASE("docs/communicators.md: a pipeline under run_mpi", "[pipeline][mpi][docs]") {
  using block = mlp_stage<double>;
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const auto shape = baton::shape_for<baton::one_f_one_b>(size, 4);
  const auto make = [](int s) { return block(4, 100 + static_cast<std::uint64_t>(s)); };
  std::vector<double> losses;  // filled on the rank of the last stage
  const recorded_mse_loss loss{&losses};
  const auto x = random_tensor<double>({8, 4}, 1);
  const auto t = random_tensor<double>({8, 4}, 2, 0.5);
  // [doc:run_mpi_pipeline]
  baton::mpi_communicator world(MPI_COMM_WORLD, {.timeout = std::chrono::seconds(10)});
  baton::run_mpi(world, [&](baton::mpi_communicator& comm) {
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<block>>(comm, shape, make, loss);
    exec.step(x, t);
  });  // returns when every rank's fn has returned; throws on every rank when one failed
  // [/doc:run_mpi_pipeline]
  if (world.rank() != size - 1) {
    CHECK(losses.empty());
    return;
  }
  // 4 microbatches of 2 rows: their mean is the loss of the same stages run one after another.
  REQUIRE(losses.size() == 4);
  std::vector<block> oracle;
  for (int s = 0; s < shape.num_stages(); ++s) oracle.push_back(make(s));
  const double expected = sequential_loss(oracle, x, baton::no_side{}, t, mse_loss<double>{});
  CHECK(rel_err((losses[0] + losses[1] + losses[2] + losses[3]) / 4, expected) <= 1e-12);
}

TEMPLATE_TEST_CASE("pipeline parity on MPI", "[pipeline][mpi]", double, float) {
  using T = TestType;
  baton::mpi_communicator comm;
  SECTION("1F1B") { check_policy<baton::one_f_one_b, T>(comm); }
  SECTION("1F1B, activations too large to travel inside the header") {
    check_policy<baton::one_f_one_b, T>(comm, 16, 48);  // 48 x 16 values per microbatch > 2048 bytes
  }
  SECTION("interleaved 1F1B") { check_policy<baton::interleaved_1f1b, T>(comm); }
  SECTION("ZBV") { check_policy<baton::zbv, T>(comm); }
  SECTION("DualPipeV") { check_policy<baton::dual_pipe_v, T>(comm); }
}
