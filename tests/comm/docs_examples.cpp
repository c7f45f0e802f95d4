// The examples of docs/communicators.md that run on the local world, compiled and run. Each
// block between "// [doc:NAME]" and "// [/doc:NAME]" is shown verbatim in the document, and
// what it prints between "// [doc-output:NAME]" markers (ctest -L docs checks both).
#include "catch.hpp"
#include "doc_output.hpp"
#include "docs_ring.hpp"

#include <baton/comm.hpp>

#include <chrono>
#include <cstdint>
#include <iostream>
#include <numeric>
#include <span>
#include <string>
#include <vector>

TEST_CASE("docs: quick start", "[comm][docs]") {
  baton_test::capture_cout capture;
  // [doc:quick_start]
  // Four ranks as threads of this process; each holds its own gradient.
  const auto sums = baton::run_local(4, [](baton::local_communicator& comm) {
    std::vector<float> grad(8, float(comm.rank() + 1));  // rank r holds r+1 everywhere
    comm.all_reduce(std::span(grad), baton::reduce_op::sum);
    return grad[0];  // 1 + 2 + 3 + 4, bitwise the same on every rank
  });
  // run_local returns each rank's result, by rank.
  for (std::size_t rank = 0; rank < sums.size(); ++rank) std::cout << "rank " << rank << ": " << sums[rank] << "\n";
  // [/doc:quick_start]
  const std::string printed = capture.finish();
  // [doc-output:quick_start]
  const std::string expected = baton_test::doc_output(R"(
rank 0: 10
rank 1: 10
rank 2: 10
rank 3: 10
)");
  // [/doc-output:quick_start]
  REQUIRE(sums == std::vector<float>{10, 10, 10, 10});
  CHECK(printed == expected);
}

TEST_CASE("docs: generic code over a ring", "[comm][docs]") {
  const auto gathered = baton::run_local(3, [](baton::local_communicator& comm) {
    const std::vector<float> mine{float(comm.rank()), float(comm.rank()) + 0.5f};
    return ring_all_gather(comm, mine);
  });
  for (const auto& all : gathered) REQUIRE(all == std::vector<float>{0, 0.5f, 1, 1.5f, 2, 2.5f});
}

TEST_CASE("docs: point to point between pipeline stages", "[comm][docs]") {
  const auto received = baton::run_local(2, [](baton::local_communicator& comm) {
    // [doc:p2p]
    // Stage 0 sends two microbatches' activations to stage 1; tags tell them apart, so
    // stage 1 may receive them in any order.
    std::vector<double> act0(4, 1.0), act1(4, 2.0), in0(4), in1(4);
    if (comm.rank() == 0) {
      auto s0 = baton::isend(comm, std::span<const double>(act0), /*dest=*/1, /*tag=*/0);
      auto s1 = baton::isend(comm, std::span<const double>(act1), /*dest=*/1, /*tag=*/1);
      s0.wait();  // act0 may be reused only now: it is copied straight from it
      s1.wait();
    } else {
      auto r1 = baton::irecv(comm, std::span(in1), /*source=*/0, /*tag=*/1);
      auto r0 = baton::irecv(comm, std::span(in0), /*source=*/0, /*tag=*/0);
      r1.wait();
      r0.wait();
    }
    // [/doc:p2p]
    return in0[0] + in1[0];
  });
  REQUIRE(received[1] == 3.0);
}

TEST_CASE("docs: device mesh", "[comm][docs]") {
  struct seen {
    int stage, ring_rank, ring_size, pp_size;
    std::int64_t ring_sum;
  };
  const auto all = baton::run_local(4, [](baton::local_communicator& world) {
    // [doc:mesh]
    // Four ranks as 2 pipeline stages x a context-parallel ring of 2.
    baton::device_mesh mesh(world, {.pp = 2, .cp_ring = 2});
    const int stage = mesh.coord(baton::mesh_dim::pp);       // which stage this rank runs
    auto& ring = mesh.along(baton::mesh_dim::cp_ring);       // the ranks sharing my stage
    auto& pipe = mesh.along(baton::mesh_dim::pp);            // my peers in the other stages
    std::int64_t x = world.rank();
    ring.all_reduce(std::span(&x, 1), baton::reduce_op::sum);  // within my ring only
    // [/doc:mesh]
    return seen{stage, ring.rank(), ring.size(), pipe.size(), x};
  });
  // Ranks 0, 1 are stage 0 (ring 0+1), ranks 2, 3 are stage 1 (ring 2+3).
  REQUIRE(all[1].stage == 0);
  REQUIRE(all[1].ring_rank == 1);
  REQUIRE(all[2].stage == 1);
  REQUIRE(all[3].ring_sum == 5);
  REQUIRE(all[0].ring_sum == 1);
  REQUIRE(all[0].pp_size == 2);
}

TEST_CASE("docs: errors instead of hangs", "[comm][docs]") {
  // [doc:errors]
  // Both ranks wait to receive first: a schedule bug. Instead of hanging, each wait ends
  // after the timeout with a comm_error naming rank, peer and tag, and run_local rethrows
  // the first one.
  std::string message;
  try {
    baton::run_local(2, [](baton::local_communicator& comm) {
      int value = 0;
      baton::irecv(comm, std::span(&value, 1), 1 - comm.rank(), /*tag=*/7).wait();
    }, baton::local_options{.timeout = std::chrono::milliseconds(100)});
  } catch (const baton::comm_error& e) {
    message = e.what();  // "rank 0: irecv from peer 1 (tag 7, 4 bytes) timed out after 0.1 s: ..."
  }
  // [/doc:errors]
  REQUIRE_THAT(message, Catch::Contains("irecv from peer") && Catch::Contains("(tag 7, 4 bytes) timed out after 0.1 s"));
}
