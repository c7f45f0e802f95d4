// The communicator suite on MPI processes (run under mpiexec -n 2 and -n 4). Every rank runs
// every test case in the same order; a failed check throws on that rank, and the MPI main
// fails the run if any rank failed.
#include "catch.hpp"
#include "docs_ring.hpp"
#include "suite.hpp"

#include <baton/comm/mpi.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace std::chrono_literals;

namespace {

baton::mpi_communicator world() { return baton::mpi_communicator(MPI_COMM_WORLD, {.timeout = 20s}); }

}  // namespace

TEST_CASE("mpi: the communicator concepts", "[comm][mpi]") {
  using C = baton::mpi_communicator;
  STATIC_REQUIRE(baton::point_to_point_communicator<C>);
  STATIC_REQUIRE(baton::collective_communicator<C>);
  STATIC_REQUIRE(baton::splittable_communicator<C>);
  STATIC_REQUIRE(baton::ring_communicator<C>);
  STATIC_REQUIRE(baton::comm_request<baton::mpi_request>);
  STATIC_REQUIRE(!std::is_copy_constructible_v<C>);
}

TEST_CASE("mpi: communicators and requests move as a whole; a moved-from one is empty", "[comm][mpi]") {
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<baton::mpi_communicator>);
  STATIC_REQUIRE(std::is_nothrow_move_assignable_v<baton::mpi_communicator>);
  STATIC_REQUIRE(std::is_nothrow_move_constructible_v<baton::mpi_request>);
  STATIC_REQUIRE(std::is_nothrow_move_assignable_v<baton::mpi_request>);
  auto a = world();
  const int rank = a.rank(), size = a.size();
  baton::mpi_communicator b = std::move(a);
  CHECK(b.rank() == rank);
  CHECK(b.size() == size);
  CHECK(a.native_handle() == MPI_COMM_NULL);  // the moved-from one holds nothing to free
  CHECK_THROWS_WITH(baton::run_mpi(a, [](baton::mpi_communicator&) {}), Catch::Contains("moved from"));
  auto c = world();
  c = std::move(b);  // frees c's own communicator, takes b's
  std::int64_t one = 1;
  c.all_reduce(std::span(&one, 1), baton::reduce_op::sum);
  CHECK(one == size);
  // A pending receive moved into another request completes there; the moved-from is done.
  const int to = (rank + 1) % size, from = (rank + size - 1) % size;
  std::int32_t out = rank, in = -1;
  auto pending = baton::irecv(c, std::span(&in, 1), from, 3);
  auto moved = std::move(pending);
  CHECK(pending.test());
  baton::isend(c, std::span(&out, 1), to, 3).wait();
  moved.wait();
  CHECK(in == from);
  c.barrier();
}

TEST_CASE("mpi: point to point", "[comm][mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::p2p_in_order(c));
  REQUIRE_NOTHROW(comm_suite::p2p_out_of_order_tags(c));
  REQUIRE_NOTHROW(comm_suite::p2p_large_and_empty(c));
  REQUIRE_NOTHROW(comm_suite::ring_shift(c));
}

TEST_CASE("mpi: all_reduce", "[comm][mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::all_reduce_all_types(c));
}

TEST_CASE("mpi: all_gather, all_to_all, all_to_all_v, broadcast, barrier", "[comm][mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::all_gather_blocks(c));
  REQUIRE_NOTHROW(comm_suite::all_to_all_blocks(c));
  REQUIRE_NOTHROW(comm_suite::all_to_all_v_blocks(c));
  REQUIRE_NOTHROW(comm_suite::broadcast_from_last(c));
}

TEST_CASE("mpi: split and device mesh", "[comm][mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::split_groups(c));
  REQUIRE_NOTHROW(comm_suite::mesh_shapes(c));
}

TEST_CASE("mpi: faults and bad input", "[comm][mpi]") {
  auto c = world();
  REQUIRE_NOTHROW(comm_suite::run_faults(c));
}

TEST_CASE("mpi: unchecked collectives still work", "[comm][mpi]") {
  baton::mpi_communicator c(MPI_COMM_WORLD, {.timeout = 20s, .check_collectives = false});
  REQUIRE_NOTHROW(comm_suite::all_reduce_all_types(c));
  REQUIRE_NOTHROW(comm_suite::all_to_all_v_blocks(c));
  REQUIRE_NOTHROW(c.barrier());
}

TEST_CASE("mpi: the agreement of large communicators (one all-reduce of the fingerprints)", "[comm][mpi]") {
  // Above exchange_agreement_max_ranks ranks the agreement is an MPI all-reduce and every
  // all_reduce takes the reduce-scatter path; 1 forces that here.
  baton::mpi_communicator c(MPI_COMM_WORLD, {.timeout = 20s, .exchange_agreement_max_ranks = 1});
  REQUIRE_NOTHROW(comm_suite::all_reduce_all_types(c));
  REQUIRE_NOTHROW(comm_suite::all_gather_blocks(c));
  REQUIRE_NOTHROW(comm_suite::all_to_all_v_blocks(c));
  REQUIRE_NOTHROW(comm_suite::broadcast_from_last(c));
  REQUIRE_NOTHROW(comm_suite::split_groups(c));
  REQUIRE_NOTHROW(comm_suite::run_faults(c));
}

TEST_CASE("mpi: an all_reduce that is small on one rank and large on another is a clean mismatch", "[comm][mpi]") {
  // The small path sends its data with the agreement header, the large one the header alone:
  // the messages differ in size, and every rank reports the same difference.
  auto c = world();
  std::vector<float> data(c.rank() == 0 ? 10 : 100000, 1.f);
  std::string what;
  try {
    c.all_reduce(std::span(data), baton::reduce_op::sum);
  } catch (const baton::comm_error& e) {
    what = e.what();
  }
  CHECK_THAT(what, Catch::Contains("all_reduce called with different element count") &&
                       Catch::Contains("from 10 to 100000"));
  std::vector<std::int64_t> big(100000, 1);
  std::string kinds;
  try {
    if (c.rank() == 0) c.barrier();
    else c.all_reduce(std::span(big), baton::reduce_op::sum);
  } catch (const baton::comm_error& e) {
    kinds = e.what();
  }
  CHECK_THAT(kinds, Catch::Contains("collective mismatch"));
  std::int64_t one = 1;  // still usable
  c.all_reduce(std::span(&one, 1), baton::reduce_op::sum);
  CHECK(one == c.size());
}

TEST_CASE("mpi: a collective some rank skips times out and the communicator refuses more", "[comm][mpi]") {
  auto c = world();
  baton::mpi_communicator victim(MPI_COMM_WORLD, {.timeout = 200ms});
  if (c.rank() == 0) {
    const auto start = std::chrono::steady_clock::now();
    REQUIRE_THROWS_WITH(victim.barrier(), Catch::Contains("rank 0") && Catch::Contains("barrier timed out after 0.2 s"));
    REQUIRE(std::chrono::steady_clock::now() - start < 5s);
    REQUIRE_THROWS_WITH(victim.barrier(), Catch::Contains("refused"));
  }
  c.barrier();
  // The others now join rank 0's pending barrier (its request is still posted), so the
  // abandoned collective completes in MPI before `victim` is freed.
  if (c.rank() != 0) {
    victim.set_timeout(20s);
    victim.barrier();
  }
}

TEST_CASE("mpi: the documentation's generic ring example", "[comm][mpi][docs]") {
  // [doc:mpi_ring]
  baton::mpi_communicator world;  // a private duplicate of MPI_COMM_WORLD
  const std::vector<float> mine{float(world.rank())};
  const std::vector<float> all = ring_all_gather(world, mine);  // the same code as on threads
  // [/doc:mpi_ring]
  std::vector<float> expected(static_cast<std::size_t>(world.size()));
  std::iota(expected.begin(), expected.end(), 0.f);
  REQUIRE(all == expected);
}

TEST_CASE("mpi: the documentation's guard that ends the job on an error", "[comm][mpi][docs]") {
  baton::mpi_communicator world;
  std::int64_t ranks_counted = 0;
  const auto train = [&](baton::mpi_communicator& comm) {
    std::int64_t one = 1;
    comm.all_reduce(std::span(&one, 1), baton::reduce_op::sum);
    ranks_counted = one;
  };
  // [doc:mpi_abort]
  try {
    baton::run_mpi(world, train);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 1);  // mpirun then kills every process, a stalled one included
  }
  // [/doc:mpi_abort]
  CHECK(ranks_counted == world.size());  // train ran on every rank; nothing threw
}

TEST_CASE("mpi: run_mpi - a rank that throws aborts every other rank's waits at once, on splits too", "[comm][mpi]") {
  baton::mpi_communicator c(MPI_COMM_WORLD, {.timeout = 20s});
  const int last = c.size() - 1;
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  try {
    baton::run_mpi(c, [&](baton::mpi_communicator& comm) {
      auto half = comm.split(comm.rank() % 2, comm.rank());
      if (comm.rank() == last) throw std::runtime_error("injected on the last rank");
      half.barrier();  // with 4 ranks, rank 1 waits here for the last rank
      std::int32_t value = 0;
      baton::irecv(comm, std::span(&value, 1), last, 5).wait();
    });
  } catch (const std::exception& e) {
    message = e.what();
  }
  const auto waited = std::chrono::steady_clock::now() - start;
  INFO(message);
  CHECK(waited < 10s);  // the notice, not the 20 s timeout
  if (c.rank() == last) {
    CHECK(message == "injected on the last rank");
  } else {
    CHECK_THAT(message, Catch::Contains("aborted because rank " + std::to_string(last) +
                                        " failed: injected on the last rank"));
  }
  // The family refuses new work with the same cause.
  std::int32_t v = 0;
  REQUIRE_THROWS_WITH(baton::isend(c, std::span(&v, 1), 0, 1), Catch::Contains("aborted because rank"));
}

TEST_CASE("mpi: mpi_session refuses a second initialisation and says so", "[comm][mpi]") {
  // The test main has initialised MPI already (as a program that calls MPI_Init itself would).
  int initialized = 0;
  MPI_Initialized(&initialized);
  REQUIRE(initialized != 0);
  try {
    baton::mpi_session session;
    FAIL("a second mpi_session was made while MPI was initialised");
  } catch (const baton::comm_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("MPI is already initialised") && Catch::Contains("exactly one mpi_session"));
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  CHECK(finalized == 0);  // the refusal left MPI running for everything after it
}
