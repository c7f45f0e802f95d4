// Fault injection on MPI processes (mpiexec -n 4): a 4-stage 1F1B pipeline run through
// baton::run_mpi, with one fault each —
//   a stage that throws     every rank fails within 1 s (the timeout is 10 s), naming rank 2
//                           and its message;
//   a stalled rank          every rank fails naming rank 2 as the rank that made no progress,
//                           not the peer that timed out first;
//   a rank returning early  every rank fails naming rank 3 as the rank that returned.
// Rank 0 prints each rank's time-to-error. Communicators stay alive until MPI_Finalize: a
// message left in flight by an abandoned step must not reach the next case's communicator.
#include "catch.hpp"

#include <baton/comm/mpi.hpp>
#include <baton/payload.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

using tensor = baton::host_tensor<double>;

// y = 2x; the fault strikes the forward of microbatch 1 on stage `faulty`.
enum class fault { none, throws, stalls };
struct stage {
  using input = tensor;
  using output = tensor;
  using side = baton::no_side;
  struct saved {};
  int index = 0;
  int faulty = -1;
  fault kind = fault::none;
  std::chrono::milliseconds stall{};
  int forwards = 0;
  output forward(const input& x, const side&, saved&) {
    if (index == faulty && forwards++ == 1) {
      if (kind == fault::throws) throw std::runtime_error("boom in stage " + std::to_string(index));
      if (kind == fault::stalls) std::this_thread::sleep_for(stall);
    }
    tensor y(x.shape());
    for (std::int64_t i = 0; i < x.size(); ++i) y[i] = 2 * x[i];
    return y;
  }
  baton::grad_t<input> backward(saved&, const baton::grad_t<output>& dy) {
    tensor dx(dy.shape());
    for (std::int64_t i = 0; i < dy.size(); ++i) dx[i] = 2 * dy[i];
    return dx;
  }
};

struct mse {
  baton::loss_result<tensor> operator()(const tensor& y, const tensor& t) const {
    baton::loss_result<tensor> r{0.0, tensor(y.shape())};
    for (std::int64_t i = 0; i < y.size(); ++i) {
      r.value += 0.5 * (y[i] - t[i]) * (y[i] - t[i]);
      r.grad[i] = y[i] - t[i];
    }
    return r;
  }
};

// Keeps every case's communicator until the end (see the top of the file).
std::vector<baton::mpi_communicator>& kept() {
  static std::vector<baton::mpi_communicator> comms;
  return comms;
}

struct outcome {
  std::string message;       // this rank's error ("" when none)
  double seconds_to_error;   // from the fault (on the faulty rank's clock: one machine) to the error
};

// Runs one step on every rank with `skip_rank` returning at once; returns this rank's outcome.
outcome run_case(std::chrono::nanoseconds timeout, fault kind, std::chrono::milliseconds stall, int faulty, int skip_rank) {
  baton::mpi_communicator& comm = kept().emplace_back(MPI_COMM_WORLD, baton::mpi_options{.timeout = timeout});
  REQUIRE(comm.size() == 4);
  MPI_Barrier(MPI_COMM_WORLD);
  const auto start = clock_type::now();  // the fault strikes within milliseconds of this
  outcome out{};
  try {
    baton::run_mpi(comm, [&](baton::mpi_communicator& c) {
      if (c.rank() == skip_rank) return;
      auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<stage>>(
          c, baton::schedule_shape{4, 1, 4}, [&](int s) { return stage{s, faulty, kind, stall}; }, mse{});
      tensor x({8, 3}), t({8, 3});
      exec.step(x, t);
    });
  } catch (const std::exception& e) {
    out.message = e.what();
  }
  out.seconds_to_error = std::chrono::duration<double>(clock_type::now() - start).count();
  return out;
}

// Gathers every rank's time-to-error on rank 0, prints them, and returns the largest.
double report(const char* name, const outcome& mine) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::vector<double> all(4);
  MPI_Allgather(&mine.seconds_to_error, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, MPI_COMM_WORLD);
  double worst = 0;
  std::string line;
  for (std::size_t r = 0; r < all.size(); ++r) {
    worst = std::max(worst, all[r]);
    char figure[64];
    std::snprintf(figure, sizeof figure, "%s rank %zu %.1f ms", r == 0 ? "" : ",", r, 1e3 * all[r]);
    line += figure;
  }
  if (rank == 0) {
    std::printf("%s: time-to-error on every rank <= %.3f s (%s)\n  rank 0's error: %s\n", name, worst, line.c_str(),
                mine.message.c_str());
    std::fflush(stdout);
  }
  if (std::getenv("BATON_FAULTS_VERBOSE")) std::fprintf(stderr, "rank %d: %s\n", rank, mine.message.c_str());
  return worst;
}

}  // namespace

TEST_CASE("mpi faults: a throwing stage fails every rank within 1 s, naming the rank and message",
          "[reliability][mpi]") {
  const auto out = run_case(10s, fault::throws, {}, 2, -1);
  INFO(out.message);
  CHECK_THAT(out.message, Catch::Contains("rank 2") && Catch::Contains("boom in stage 2"));
  CHECK_THAT(out.message, Catch::Contains("2F1"));  // the action, from the executor's message
  const double worst = report("throwing stage (timeout 10 s)", out);
  CHECK(worst <= 1.0);
}

TEST_CASE("mpi faults: a stalled rank is named as the cause on every rank", "[reliability][mpi]") {
  // Rank 2 sleeps 5 s in a forward; the others' waits time out after 2 s and ask who is
  // waiting for what: rank 2 answers nothing.
  const auto out = run_case(2s, fault::stalls, 5000ms, 2, -1);
  INFO(out.message);
  CHECK_THAT(out.message, Catch::Contains("rank 2 made no progress for 2 s"));
  const double worst = report("stalled rank (timeout 2 s, stall 5 s)", out);
  CHECK(worst < 30.0);
}

TEST_CASE("mpi faults: a rank that returns early is named on every rank", "[reliability][mpi]") {
  const auto out = run_case(10s, fault::none, {}, -1, 3);
  INFO(out.message);
  CHECK_THAT(out.message, Catch::Contains("3 returned from its run_mpi function"));
  const double worst = report("early return (timeout 10 s)", out);
  CHECK(worst < 5.0);  // the timeout is 10 s: the notice, not the timeout, ended the waits
}
