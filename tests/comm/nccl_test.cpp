// The NCCL backend: concept checks always; transfers on every visible GPU (one rank per GPU,
// ranks as threads of the local world, NCCL bootstrapped over it). Without a CUDA device the
// GPU case skips: BATON_SKIP, in its own ctest entry (baton_comm_nccl.comm_nccl_gpu).
#include "catch.hpp"
#include "cuda_devices.hpp"
#include "skip.hpp"
#include "suite.hpp"

#include <baton/comm/local.hpp>
#include <baton/comm/nccl.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <numeric>
#include <span>
#include <vector>

namespace {

/// Managed memory, so that the host can fill and check what NCCL moves.
template <class T>
struct managed {
  explicit managed(std::size_t n) : size(n) {
    if (cudaMallocManaged(&data, std::max<std::size_t>(n, 1) * sizeof(T)) != cudaSuccess) {
      throw std::runtime_error("cudaMallocManaged failed");
    }
  }
  managed(const managed&) = delete;
  managed& operator=(const managed&) = delete;
  ~managed() { cudaFree(data); }
  std::span<T> span() { return {data, size}; }
  T& operator[](std::size_t i) { return data[i]; }
  T* data = nullptr;
  std::size_t size;
};

void nccl_rank_body(baton::local_communicator& host) {
  // Staging slots big enough for the largest host message below (40000 bytes), made up front;
  // no growth, so the oversized message below is refused whatever the peers' timing.
  auto c = baton::nccl_communicator::bootstrap(
      host, host.rank(), nullptr,
      baton::nccl_options{.staging_slots = 8, .staging_slot_bytes = 48 * 1024, .staging_growth = false});
  const int n = c.size(), r = c.rank();
  SUITE_CHECK(c, n == host.size() && r == host.rank());

  // Ring shift by one.
  managed<std::int32_t> out(256), in(256);
  for (std::size_t i = 0; i < 256; ++i) out[i] = r * 1000 + static_cast<std::int32_t>(i);
  auto req = baton::shift(c, std::span<const std::int32_t>(out.span()), in.span(), 1, 0);
  req.wait();
  const int prev = comm_suite::mod(r - 1, n);
  SUITE_CHECK(c, in[0] == prev * 1000 && in[255] == prev * 1000 + 255);

  // all_reduce: integers exact, floats identical on every rank.
  managed<std::int64_t> ints(1000);
  for (std::size_t i = 0; i < 1000; ++i) ints[i] = comm_suite::contribution<std::int64_t>(r, i);
  c.all_reduce(ints.span(), baton::reduce_op::sum);
  for (std::size_t i = 0; i < 1000; ++i) {
    std::int64_t expected = 0;
    for (int s = 0; s < n; ++s) expected += comm_suite::contribution<std::int64_t>(s, i);
    SUITE_CHECK(c, ints[i] == expected);
  }
  managed<float> floats(1000), gathered(1000 * static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < 1000; ++i) floats[i] = comm_suite::contribution<float>(r, i);
  c.all_reduce(floats.span(), baton::reduce_op::sum);
  c.all_gather(std::span<const float>(floats.span()), gathered.span());
  for (int s = 1; s < n; ++s) {
    SUITE_CHECK(c, std::equal(gathered.data, gathered.data + 1000, gathered.data + 1000 * static_cast<std::size_t>(s),
                              [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }));
  }

  // all_to_all and broadcast.
  managed<std::int32_t> a2a_out(static_cast<std::size_t>(n) * 4), a2a_in(static_cast<std::size_t>(n) * 4);
  for (int j = 0; j < n; ++j) {
    for (int k = 0; k < 4; ++k) a2a_out[static_cast<std::size_t>(j * 4 + k)] = r * 100 + j * 10 + k;
  }
  c.all_to_all(std::span<const std::int32_t>(a2a_out.span()), a2a_in.span());
  for (int i = 0; i < n; ++i) SUITE_CHECK(c, a2a_in[static_cast<std::size_t>(i * 4 + 3)] == i * 100 + r * 10 + 3);
  managed<double> root_data(8);
  for (std::size_t i = 0; i < 8; ++i) root_data[i] = r == 0 ? 0.25 * static_cast<double>(i) : -1.0;
  c.broadcast(root_data.span(), 0);
  SUITE_CHECK(c, root_data[7] == 1.75);
  c.barrier();

  // split by parity; a negative color is refused on every rank.
  auto sub = c.split(r % 2, r);
  SUITE_CHECK(c, sub.size() == (n - r % 2 + 1) / 2);
  const std::string bad = SUITE_EXPECT_ERROR(c, (void)c.split(-3, 0));
  SUITE_CHECK_HAS(c, bad, "passed color -3");

  // Host memory is staged through the communicator's device buffers (the pipeline executor
  // sends its headers, agreement tables and loss values from the host): a shift (with one
  // rank, a send to itself inside one group), host all_reduce and broadcast, and - with two
  // ranks or more - isend/irecv between neighbours completed by test() polling.
  std::vector<std::int64_t> host_out(300), host_in(300, -1);
  for (std::size_t i = 0; i < host_out.size(); ++i) host_out[i] = r * 100000 + static_cast<std::int64_t>(i);
  auto host_shift = baton::shift(c, std::span<const std::int64_t>(host_out), std::span<std::int64_t>(host_in), 1, 2);
  host_shift.wait();
  SUITE_CHECK(c, host_in[0] == prev * 100000 && host_in[299] == prev * 100000 + 299);
  double host_sum = r + 1.0;
  c.all_reduce(std::span<double>(&host_sum, 1), baton::reduce_op::sum);
  SUITE_CHECK(c, host_sum == n * (n + 1) / 2.0);
  std::vector<std::int32_t> host_root(3, r == 0 ? 7 : -1);
  c.broadcast(std::span<std::int32_t>(host_root), 0);
  SUITE_CHECK(c, host_root[0] == 7 && host_root[2] == 7);
  if (n >= 2) {
    std::vector<float> big_out(10000, static_cast<float>(r) + 0.5f), big_in(10000, -1.0f);
    auto recv = baton::irecv(c, std::span<float>(big_in), prev, 3);
    // A host message larger than every slot: refused before anything reaches NCCL (the
    // fake-runtime test in baton_comm_test covers growth at quiescent points).
    std::vector<std::byte> huge(100000);
    const std::string exhausted = SUITE_EXPECT_ERROR(c, (void)c.isend(huge, comm_suite::mod(r + 1, n), 3));
    SUITE_CHECK_HAS(c, exhausted, "needs a host staging slot of 100000 bytes");
    SUITE_CHECK_HAS(c, exhausted, "staging_slot_bytes");
    auto send = baton::isend(c, std::span<const float>(big_out), comm_suite::mod(r + 1, n), 3);
    while (!recv.test()) {
    }
    send.wait();
    SUITE_CHECK(c, big_in[0] == static_cast<float>(prev) + 0.5f && big_in[9999] == static_cast<float>(prev) + 0.5f);
  }

  // A standalone send or receive to oneself would hang on NCCL: refused (shift above works).
  const std::string self = SUITE_EXPECT_ERROR(c, (void)baton::isend(c, std::span<const std::int32_t>(out.span()), r, 0));
  SUITE_CHECK_HAS(c, self, "refused on NCCL");

  // Bad peers are rejected before NCCL sees them.
  const std::string peer = SUITE_EXPECT_ERROR(c, (void)baton::isend(c, std::span<const std::int32_t>(out.span()), n, 0));
  SUITE_CHECK_HAS(c, peer, "peer " + std::to_string(n));
}

}  // namespace

TEST_CASE("nccl: the communicator concepts", "[comm][nccl]") {
  using C = baton::nccl_communicator;
  STATIC_REQUIRE(baton::point_to_point_communicator<C>);
  STATIC_REQUIRE(baton::collective_communicator<C>);
  STATIC_REQUIRE(baton::splittable_communicator<C>);
  STATIC_REQUIRE(baton::ring_communicator<C>);
  STATIC_REQUIRE(baton::comm_request<baton::nccl_request>);
}

TEST_CASE("nccl: a standalone send or receive to oneself is refused with the way out", "[comm][nccl]") {
  // Runs without a GPU: NCCL pairs a send to oneself only with a receive in the same group.
  using baton::detail::comm::nccl::self_transfer_problem;
  CHECK(self_transfer_problem("rank 2", "isend", 2, 1).empty());
  CHECK(self_transfer_problem("rank 2", "irecv", 2, 3).empty());
  const std::string e = self_transfer_problem("rank 2", "irecv", 2, 2);
  CHECK_THAT(e, Catch::Contains("rank 2: irecv with peer 2 (this rank) is refused on NCCL"));
  CHECK_THAT(e, Catch::Contains("use shift()"));
}

TEST_CASE("nccl: both ends of every message pick the same point-to-point lane", "[comm][nccl]") {
  // Runs without a GPU: the lane of a message decides which NCCL communicator and stream it
  // uses, so a sender and its receiver disagreeing would hang on a GPU.
  using baton::detail::comm::nccl::lane_of_recv;
  using baton::detail::comm::nccl::lane_of_send;
  using baton::detail::comm::nccl::p2p_lane;
  for (int n = 1; n <= 8; ++n) {
    for (int a = 0; a < n; ++a) {
      CHECK(lane_of_send(a, a) == p2p_lane::main);
      CHECK(lane_of_recv(a, a) == p2p_lane::main);
      for (int b = 0; b < n; ++b) {
        INFO("from rank " << a << " to rank " << b);
        CHECK(lane_of_send(a, b) == lane_of_recv(b, a));
        if (a != b) CHECK(lane_of_send(a, b) == (b > a ? p2p_lane::up : p2p_lane::down));
      }
    }
  }
}

TEST_CASE("nccl: transfers on every visible GPU", "[comm][nccl][gpu][can-skip]") {
  const int devices = baton_test::visible_cuda_devices();
  if (devices == 0) BATON_SKIP("no CUDA device");
  const int n = std::min(devices, 4);  // NCCL needs one GPU per rank
  REQUIRE_NOTHROW(baton::run_local(n, [](baton::local_communicator& host) { nccl_rank_body(host); },
                                   baton::local_options{.timeout = std::chrono::seconds(60)}));
}
