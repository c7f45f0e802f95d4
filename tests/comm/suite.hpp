// The communicator test suite, written once over any communicator and run on the local world
// (2, 3, 4 ranks: local_test.cpp) and on MPI (np 2 and 4: mpi_test.cpp).
//
// Rank bodies run on several threads in the local world, where Catch's assertions are not
// thread-safe, so a failed check throws; run_local rethrows the first failure and the Catch
// test case (on the main thread) reports it.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/comm/mesh.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace comm_suite {

inline void check(bool ok, const char* expr, int line, int rank, const std::string& detail = {}) {
  if (!ok) {
    throw std::runtime_error("rank " + std::to_string(rank) + ": check failed at suite.hpp:" + std::to_string(line) +
                             ": " + expr + (detail.empty() ? "" : " (" + detail + ")"));
  }
}
#define SUITE_CHECK(c, cond) ::comm_suite::check((cond), #cond, __LINE__, (c).rank())
#define SUITE_CHECK_MSG(c, cond, detail) ::comm_suite::check((cond), #cond, __LINE__, (c).rank(), (detail))

/// Runs `f`, which must throw baton::comm_error; returns its message.
template <class C, class F>
std::string expect_comm_error(C& c, int line, F&& f) {
  try {
    f();
  } catch (const baton::comm_error& e) {
    return e.what();
  }
  check(false, "expected baton::comm_error", line, c.rank());
  return {};
}
#define SUITE_EXPECT_ERROR(c, ...) ::comm_suite::expect_comm_error((c), __LINE__, [&] { __VA_ARGS__; })

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }
#define SUITE_CHECK_HAS(c, text, part) \
  ::comm_suite::check(::comm_suite::contains((text), (part)), "message contains " #part, __LINE__, (c).rank(), (text))

inline int mod(int a, int n) { return ((a % n) + n) % n; }

// ---- point to point --------------------------------------------------------------------

/// Three messages with one tag to the next rank (and one to self) arrive in order.
template <class C>
void p2p_in_order(C& c) {
  const int n = c.size(), r = c.rank();
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  std::vector<std::int64_t> out{r * 100 + 0, r * 100 + 1, r * 100 + 2}, in(3, -1);
  std::int64_t self_out = 7000 + r, self_in = -1;
  std::vector<baton::comm_request_t<C>> sends;
  for (int i = 0; i < 3; ++i) sends.push_back(baton::isend(c, std::span(&out[static_cast<std::size_t>(i)], 1), next, 11));
  sends.push_back(baton::isend(c, std::span(&self_out, 1), r, 12));
  auto self_recv = baton::irecv(c, std::span(&self_in, 1), r, 12);
  std::vector<baton::comm_request_t<C>> recvs;
  for (int i = 0; i < 3; ++i) recvs.push_back(baton::irecv(c, std::span(&in[static_cast<std::size_t>(i)], 1), prev, 11));
  baton::wait_all(recvs);
  baton::wait_all(sends);
  self_recv.wait();
  for (int i = 0; i < 3; ++i) SUITE_CHECK(c, in[static_cast<std::size_t>(i)] == prev * 100 + i);
  SUITE_CHECK(c, self_in == 7000 + r);
}

/// Tags are matched independently: receives posted and waited in the opposite order.
template <class C>
void p2p_out_of_order_tags(C& c) {
  const int n = c.size(), r = c.rank();
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  const double a = 1.5 + r, b = -2.25 - r;
  double got_a = 0, got_b = 0;
  auto s1 = baton::isend(c, std::span(&a, 1), next, 1);
  auto s2 = baton::isend(c, std::span(&b, 1), next, 2);
  auto r2 = baton::irecv(c, std::span(&got_b, 1), prev, 2);
  r2.wait();  // tag 2 first, although tag 1 was sent first
  auto r1 = baton::irecv(c, std::span(&got_a, 1), prev, 1);
  r1.wait();
  s2.wait();
  s1.wait();
  SUITE_CHECK(c, got_a == 1.5 + prev);
  SUITE_CHECK(c, got_b == -2.25 - prev);
  SUITE_CHECK(c, s1.test() && r1.test());  // completed requests stay complete
}

/// A multi-megabyte message arrives intact; an empty message is a valid message.
template <class C>
void p2p_large_and_empty(C& c) {
  const int n = c.size(), r = c.rank();
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  const std::size_t count = (std::size_t{4} << 20) / sizeof(std::uint32_t) + 3;  // 4 MiB + 12 bytes
  std::vector<std::uint32_t> out(count), in(count, 0);
  for (std::size_t i = 0; i < count; ++i) out[i] = static_cast<std::uint32_t>(i * 2654435761u) ^ static_cast<std::uint32_t>(r);
  auto recv = baton::irecv(c, std::span(in), prev, 3);
  auto send = baton::isend(c, std::span(out), next, 3);
  auto empty_recv = c.irecv(std::span<std::byte>{}, prev, 4);
  auto empty_send = c.isend(std::span<const std::byte>{}, next, 4);
  while (!recv.test()) std::this_thread::yield();  // test() polls without blocking
  send.wait();
  empty_recv.wait();
  empty_send.wait();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    wrong += in[i] != (static_cast<std::uint32_t>(i * 2654435761u) ^ static_cast<std::uint32_t>(prev));
  }
  SUITE_CHECK_MSG(c, wrong == 0, std::to_string(wrong) + " wrong elements");
}

/// shift(k) sends to rank+k and receives from rank-k, for k = 1, -1 and k > size().
template <class C>
void ring_shift(C& c) {
  const int n = c.size(), r = c.rank();
  for (int k : {1, -1, n + 1, 0}) {
    std::vector<std::int32_t> out(1000), in(1000, -1);
    std::iota(out.begin(), out.end(), r * 1000);
    auto req = baton::shift(c, std::span<const std::int32_t>(out), std::span(in), k, 20);
    req.wait();
    const int from = mod(r - k, n);
    SUITE_CHECK_MSG(c, in.front() == from * 1000 && in.back() == from * 1000 + 999, "k = " + std::to_string(k));
  }
}

// ---- collectives -----------------------------------------------------------------------

template <class T>
T reduce_oracle(baton::reduce_op op, const std::vector<T>& values) {
  T acc = values.front();
  for (std::size_t i = 1; i < values.size(); ++i) {
    if (op == baton::reduce_op::sum) acc = static_cast<T>(acc + values[i]);
    if (op == baton::reduce_op::max) acc = std::max(acc, values[i]);
    if (op == baton::reduce_op::min) acc = std::min(acc, values[i]);
  }
  return acc;
}

/// What rank r contributes at index i: rounding-sensitive for floats (0.1 steps), large and
/// negative for integers, and a different rank holds the maximum at different indices.
template <class T>
T contribution(int r, std::size_t i) {
  const auto k = static_cast<double>((static_cast<std::size_t>(r) * 7 + i * 3) % 11);
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(0.1 * (k + 1) * (i % 2 == 0 ? 1 : -1) + 1e-3 * static_cast<double>(i));
  } else if constexpr (sizeof(T) == 8) {
    return static_cast<T>((std::int64_t{1} << 40) * static_cast<std::int64_t>(k) - static_cast<std::int64_t>(i) * 1000003);
  } else {
    return static_cast<T>(static_cast<std::int32_t>(k) * 100000 - static_cast<std::int32_t>(i));
  }
}

/// all_reduce for every element type and op: integers exact; floats within n ulp-scale of a
/// double oracle and bitwise identical on every rank (compared through all_gather).
template <class C, class T>
void all_reduce_one(C& c, baton::reduce_op op, std::size_t count) {
  const int n = c.size(), r = c.rank();
  std::vector<T> data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = contribution<T>(r, i);
  c.all_reduce(std::span(data), op);
  std::size_t wrong = 0;
  std::vector<double> values;  // both reused: the large case checks a million elements
  std::vector<T> exact;
  for (std::size_t i = 0; i < count; ++i) {
    if constexpr (std::is_floating_point_v<T>) {
      values.clear();
      double magnitude = 0;
      for (int s = 0; s < n; ++s) {
        values.push_back(static_cast<double>(contribution<T>(s, i)));
        magnitude += std::abs(values.back());
      }
      const double expected = reduce_oracle(op, values);
      // n-1 roundings of partial sums, each within eps/2 of a value bounded by magnitude.
      const double tolerance = static_cast<double>(n) * std::numeric_limits<T>::epsilon() * magnitude;
      wrong += std::abs(static_cast<double>(data[i]) - expected) > tolerance;
    } else {
      exact.clear();
      for (int s = 0; s < n; ++s) exact.push_back(contribution<T>(s, i));
      wrong += data[i] != reduce_oracle(op, exact);
    }
  }
  SUITE_CHECK_MSG(c, wrong == 0, std::to_string(wrong) + " of " + std::to_string(count) + " wrong, op " +
                                     std::string(baton::to_string(op)));
  // Every rank must hold the very same bits.
  std::vector<std::byte> everyone(count * sizeof(T) * static_cast<std::size_t>(n));
  c.all_gather(std::as_bytes(std::span(data)), std::span(everyone));
  for (int s = 1; s < n; ++s) {
    SUITE_CHECK_MSG(c, std::memcmp(everyone.data(), everyone.data() + static_cast<std::size_t>(s) * count * sizeof(T),
                                   count * sizeof(T)) == 0,
                    "rank " + std::to_string(s) + " differs from rank 0");
  }
}

template <class C>
void all_reduce_all_types(C& c) {
  for (auto op : {baton::reduce_op::sum, baton::reduce_op::max, baton::reduce_op::min}) {
    for (std::size_t count : {std::size_t{1}, std::size_t{1003}}) {  // 1003: chunks of unequal size
      all_reduce_one<C, float>(c, op, count);
      all_reduce_one<C, double>(c, op, count);
      all_reduce_one<C, std::int32_t>(c, op, count);
      all_reduce_one<C, std::int64_t>(c, op, count);
    }
  }
  // Several reduction blocks per rank, and on MPI several segments (1 MiB) per rank: 3 at 2
  // ranks, so the second window of receive slots is reused.
  all_reduce_one<C, float>(c, baton::reduce_op::sum, 1100000);
  std::span<double> nothing;
  c.all_reduce(nothing, baton::reduce_op::sum);  // empty: allowed, a no-op
}

template <class C>
void all_gather_blocks(C& c) {
  const int n = c.size(), r = c.rank();
  std::vector<std::int64_t> send{r, r * r, -r}, recv(3 * static_cast<std::size_t>(n), -99);
  c.all_gather(std::span(send), std::span(recv));
  for (int s = 0; s < n; ++s) {
    const auto at = 3 * static_cast<std::size_t>(s);
    SUITE_CHECK(c, recv[at] == s && recv[at + 1] == s * s && recv[at + 2] == -s);
  }
}

template <class C>
void all_to_all_blocks(C& c) {
  const int n = c.size(), r = c.rank();
  const std::size_t block = 5;
  std::vector<float> send(block * static_cast<std::size_t>(n)), recv(send.size(), -1.f);
  for (int j = 0; j < n; ++j) {
    for (std::size_t k = 0; k < block; ++k) send[static_cast<std::size_t>(j) * block + k] = static_cast<float>(r * 1000 + j * 10) + static_cast<float>(k);
  }
  c.all_to_all(std::span(send), std::span(recv));
  for (int i = 0; i < n; ++i) {  // block i came from rank i, which addressed it to me
    for (std::size_t k = 0; k < block; ++k) {
      SUITE_CHECK(c, recv[static_cast<std::size_t>(i) * block + k] == static_cast<float>(i * 1000 + r * 10) + static_cast<float>(k));
    }
  }
}

/// Rank r sends (r + j) % 3 elements to rank j, so some blocks are empty.
template <class C>
void all_to_all_v_blocks(C& c) {
  const int n = c.size(), r = c.rank();
  auto count = [](int from, int to) { return static_cast<std::int64_t>((from + to) % 3); };
  std::vector<std::int64_t> send_counts, recv_counts;
  std::vector<std::int32_t> send;
  for (int j = 0; j < n; ++j) {
    send_counts.push_back(count(r, j));
    recv_counts.push_back(count(j, r));
    for (std::int64_t k = 0; k < count(r, j); ++k) send.push_back(r * 100 + j * 10 + static_cast<std::int32_t>(k));
  }
  std::vector<std::int32_t> recv(static_cast<std::size_t>(std::accumulate(recv_counts.begin(), recv_counts.end(), std::int64_t{0})), -1);
  c.all_to_all_v(std::span(send), std::span<const std::int64_t>(send_counts), std::span(recv),
                 std::span<const std::int64_t>(recv_counts));
  std::size_t at = 0;
  for (int i = 0; i < n; ++i) {
    for (std::int64_t k = 0; k < count(i, r); ++k) SUITE_CHECK(c, recv[at++] == i * 100 + r * 10 + static_cast<std::int32_t>(k));
  }
}

template <class C>
void broadcast_from_last(C& c) {
  const int n = c.size(), r = c.rank();
  std::vector<double> data(17, static_cast<double>(r));
  if (r == n - 1) std::iota(data.begin(), data.end(), 0.5);
  c.broadcast(std::span(data), n - 1);
  for (std::size_t i = 0; i < data.size(); ++i) SUITE_CHECK(c, data[i] == 0.5 + static_cast<double>(i));
  c.barrier();
  c.barrier();
}

/// split by parity with reversed keys: sizes, ranks and a collective and p2p inside the group.
template <class C>
void split_groups(C& c) {
  const int n = c.size(), r = c.rank();
  C sub = c.split(r % 2, -r);
  std::vector<int> members;  // old ranks of my color, ordered by key = -rank: descending
  for (int s = n - 1; s >= 0; --s) {
    if (s % 2 == r % 2) members.push_back(s);
  }
  SUITE_CHECK(c, sub.size() == static_cast<int>(members.size()));
  SUITE_CHECK(c, sub.rank() == static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin()));
  std::int64_t sum = r;
  sub.all_reduce(std::span(&sum, 1), baton::reduce_op::sum);
  SUITE_CHECK(c, sum == std::accumulate(members.begin(), members.end(), std::int64_t{0}));
  // p2p within the group uses group ranks.
  std::int32_t out = r, in = -1;
  auto recv = baton::irecv(sub, std::span(&in, 1), mod(sub.rank() - 1, sub.size()), 0);
  auto send = baton::isend(sub, std::span(&out, 1), mod(sub.rank() + 1, sub.size()), 0);
  recv.wait();
  send.wait();
  SUITE_CHECK(c, in == members[static_cast<std::size_t>(mod(sub.rank() - 1, sub.size()))]);
  // The parent keeps working while the child exists.
  c.barrier();
  C single = sub.split(0, 0);
  SUITE_CHECK(c, single.size() == sub.size());
}

// ---- device mesh -----------------------------------------------------------------------

template <class C>
void mesh_layout(C& c, baton::mesh_shape shape) {
  baton::device_mesh<C> mesh(c, shape);
  const auto coords = mesh.coords();
  SUITE_CHECK(c, mesh.rank_of(coords) == c.rank());
  SUITE_CHECK(c, mesh.coords_of(c.rank()) == coords);
  for (baton::mesh_dim d : baton::mesh_dims) {
    auto& g = mesh.along(d);
    SUITE_CHECK(c, g.size() == shape.extent(d));
    SUITE_CHECK(c, g.rank() == coords[d]);
    // Every member of the group shares my other coordinates: gather their world ranks.
    std::vector<std::int32_t> ranks(static_cast<std::size_t>(g.size()));
    const std::int32_t mine = c.rank();
    g.all_gather(std::span(&mine, 1), std::span(ranks));
    for (int i = 0; i < g.size(); ++i) {
      auto expected = coords;
      expected[d] = i;
      SUITE_CHECK(c, ranks[static_cast<std::size_t>(i)] == mesh.rank_of(expected));
    }
  }
  auto& cp = mesh.context_parallel();
  SUITE_CHECK(c, cp.size() == shape.cp_ring * shape.cp_ulysses);
  SUITE_CHECK(c, cp.rank() == coords.cp_ring * shape.cp_ulysses + coords.cp_ulysses);
  SUITE_CHECK(c, mesh.world().size() == c.size() && mesh.world().rank() == c.rank());
}

template <class C>
void mesh_shapes(C& c) {
  const int n = c.size();
  mesh_layout(c, {.pp = n});
  mesh_layout(c, {.cp_ulysses = n});
  if (n == 4) {
    mesh_layout(c, {.pp = 2, .cp_ring = 2});
    mesh_layout(c, {.dp = 2, .cp_ulysses = 2});
  }
  if (n == 3) mesh_layout(c, {.dp = 3});
  const std::string wrong = SUITE_EXPECT_ERROR(c, baton::device_mesh<C>(c, {.pp = 2, .dp = n}));
  SUITE_CHECK_HAS(c, wrong, "has " + std::to_string(2 * n) + " ranks");
  SUITE_CHECK_HAS(c, wrong, "the world has " + std::to_string(n));
  SUITE_CHECK_HAS(c, wrong, "pp=2 x dp=" + std::to_string(n));
  const std::string zero = SUITE_EXPECT_ERROR(c, baton::device_mesh<C>(c, {.pp = 0}));
  SUITE_CHECK_HAS(c, zero, "pp = 0");
}

// ---- faults and bad input ---------------------------------------------------------------

/// A receive nobody sends to ends, after the timeout, with an error naming rank, peer, tag.
template <class C>
void fault_receive_timeout(C& c) {
  using namespace std::chrono;
  const auto saved = c.timeout();
  c.set_timeout(milliseconds(150));
  const int peer = mod(c.rank() + 1, c.size());
  std::int32_t value = 0;
  const auto start = steady_clock::now();
  const std::string what = SUITE_EXPECT_ERROR(c, baton::irecv(c, std::span(&value, 1), peer, 99).wait());
  const auto waited = steady_clock::now() - start;
  SUITE_CHECK_HAS(c, what, "rank " + std::to_string(c.rank()));
  SUITE_CHECK_HAS(c, what, "peer " + std::to_string(peer));
  SUITE_CHECK_HAS(c, what, "tag 99");
  SUITE_CHECK_HAS(c, what, "timed out");
  SUITE_CHECK(c, waited >= milliseconds(140) && waited < seconds(5));
  c.set_timeout(saved);
  c.barrier();
}

/// A message must exactly fill its receive buffer: too large and too small both fail at the
/// receiver, naming both sizes; the sender completes.
template <class C>
void fault_size_mismatch(C& c) {
  const int r = c.rank();
  std::int64_t eight = 1;
  std::int32_t four = 2;
  if (r == 0) {
    baton::isend(c, std::span(&eight, 1), 1, 5).wait();
    baton::isend(c, std::span(&four, 1), 1, 6).wait();
  } else if (r == 1) {
    const std::string larger = SUITE_EXPECT_ERROR(c, baton::irecv(c, std::span(&four, 1), 0, 5).wait());
    SUITE_CHECK_HAS(c, larger, "rank 1");
    SUITE_CHECK_HAS(c, larger, "peer 0");
    SUITE_CHECK_HAS(c, larger, "tag 5");
    SUITE_CHECK_HAS(c, larger, "receive buffer");
    const std::string smaller = SUITE_EXPECT_ERROR(c, baton::irecv(c, std::span(&eight, 1), 0, 6).wait());
    SUITE_CHECK_HAS(c, smaller, "tag 6");
    SUITE_CHECK_HAS(c, smaller, "4 bytes");
    SUITE_CHECK_HAS(c, smaller, "8");
  }
  c.barrier();
}

/// Peers outside [0, size) and negative tags are rejected when the operation starts.
template <class C>
void fault_invalid_peer_and_tag(C& c) {
  std::int32_t v = 0;
  const int n = c.size();
  const std::string to_far = SUITE_EXPECT_ERROR(c, (void)baton::isend(c, std::span(&v, 1), n, 1));
  SUITE_CHECK_HAS(c, to_far, "peer " + std::to_string(n));
  SUITE_CHECK_HAS(c, to_far, "0.." + std::to_string(n - 1));
  const std::string negative = SUITE_EXPECT_ERROR(c, (void)baton::irecv(c, std::span(&v, 1), -1, 1));
  SUITE_CHECK_HAS(c, negative, "peer -1");
  const std::string bad_tag = SUITE_EXPECT_ERROR(c, (void)baton::isend(c, std::span(&v, 1), 0, -3));
  SUITE_CHECK_HAS(c, bad_tag, "tag -3");
  const std::string bad_root = SUITE_EXPECT_ERROR(c, c.broadcast(std::span(&v, 1), n));
  SUITE_CHECK_HAS(c, bad_root, "root " + std::to_string(n));
  c.barrier();
}

/// Ranks that disagree about a collective all get the same error instead of a hang or a
/// corrupted buffer, and the communicator stays usable.
template <class C>
void fault_collective_mismatch(C& c) {
  const int r = c.rank(), n = c.size();
  std::vector<float> data(r == 0 ? 4 : 5, 1.f);
  const std::string counts = SUITE_EXPECT_ERROR(c, c.all_reduce(std::span(data), baton::reduce_op::sum));
  SUITE_CHECK_HAS(c, counts, "all_reduce");
  SUITE_CHECK_HAS(c, counts, "different");

  std::vector<std::int32_t> send(static_cast<std::size_t>(n), r), recv(static_cast<std::size_t>(n), 0);
  const std::string root = SUITE_EXPECT_ERROR(c, c.broadcast(std::span(send), r == 0 ? 1 : 0));
  SUITE_CHECK_HAS(c, root, "root");

  // all_to_all_v where rank 0 expects one element too many from rank 1.
  std::vector<std::int64_t> ones(static_cast<std::size_t>(n), 1), expect = ones;
  if (r == 0) expect[1] = 2;
  std::vector<std::int32_t> recv_v(static_cast<std::size_t>(std::accumulate(expect.begin(), expect.end(), std::int64_t{0})));
  const std::string v = SUITE_EXPECT_ERROR(c, c.all_to_all_v(std::span(send), std::span<const std::int64_t>(ones),
                                                             std::span(recv_v), std::span<const std::int64_t>(expect)));
  SUITE_CHECK_HAS(c, v, "all_to_all_v");

  // split: a negative color is inconsistent with the rest of the world; everyone hears of it.
  const std::string split = SUITE_EXPECT_ERROR(c, (void)c.split(r == n - 1 ? -5 : 0, 0));
  SUITE_CHECK_HAS(c, split, "rank " + std::to_string(n - 1) + " passed color -5");

  // Different collectives at the same point of the program.
  std::int64_t x = 1;
  const std::string kinds = SUITE_EXPECT_ERROR(c, r == 0 ? c.barrier() : c.all_reduce(std::span(&x, 1), baton::reduce_op::max));
  SUITE_CHECK_HAS(c, kinds, "collective mismatch");

  // Still usable.
  std::int64_t one = 1;
  c.all_reduce(std::span(&one, 1), baton::reduce_op::sum);
  SUITE_CHECK(c, one == n);
}

/// Large all_reduces that disagree — in count, in element type, with a small one, with another
/// collective, with one large enough to agree before its data — end in the same kind of error
/// on every rank and leave no message behind (on MPI a large all_reduce of up to a few MiB
/// sends its first data with its agreement): the all_reduces after each one sum right, both
/// one whose agreement travels with its data and one whose agreement comes first.
template <class C>
void fault_large_all_reduce_mismatch(C& c) {
  const int r = c.rank(), n = c.size();
  const auto sums_right = [&](std::size_t count) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) v[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7 + 1));
    c.all_reduce(std::span(v), baton::reduce_op::sum);
    bool right = true;
    for (std::size_t i = 0; i < count; ++i) right = right && v[i] == static_cast<float>(n * (n + 1) / 2 * static_cast<int>(i % 7 + 1));
    SUITE_CHECK_MSG(c, right, std::to_string(count) + " elements");
  };
  const auto sums_right_after = [&](const std::string& error, const char* part) {
    SUITE_CHECK_HAS(c, error, part);
    sums_right(120000);     // 480 KB: on MPI, its agreement travels with its data
    sums_right(std::size_t{1} << 21);  // 8 MiB: on MPI, agreed first
  };
  std::vector<float> counts(r == 0 ? 100000 : 150000, 1.f);
  sums_right_after(SUITE_EXPECT_ERROR(c, c.all_reduce(std::span(counts), baton::reduce_op::sum)), "different element count");
  std::vector<float> floats(100000, 1.f);
  std::vector<double> doubles(100000, 1.);
  sums_right_after(SUITE_EXPECT_ERROR(c, r == n - 1 ? c.all_reduce(std::span(doubles), baton::reduce_op::sum)
                                                    : c.all_reduce(std::span(floats), baton::reduce_op::sum)),
                   "element type");
  std::vector<float> small_or_large(r == 1 ? 10 : 100000, 1.f);
  sums_right_after(SUITE_EXPECT_ERROR(c, c.all_reduce(std::span(small_or_large), baton::reduce_op::sum)),
                   "different element count");
  std::vector<float> broadcast(100000, 1.f);
  sums_right_after(SUITE_EXPECT_ERROR(c, r == 0 ? c.broadcast(std::span(broadcast), 0)
                                                : c.all_reduce(std::span(floats), baton::reduce_op::sum)),
                   "collective mismatch");
  std::vector<float> early_or_agreed_first(r == 0 ? std::size_t{1} << 21 : 100000, 1.f);
  sums_right_after(SUITE_EXPECT_ERROR(c, c.all_reduce(std::span(early_or_agreed_first), baton::reduce_op::sum)),
                   "different element count");
}

template <class C>
void run_faults(C& c) {
  fault_receive_timeout(c);
  fault_size_mismatch(c);
  fault_invalid_peer_and_tag(c);
  fault_collective_mismatch(c);
  fault_large_all_reduce_mismatch(c);
}

}  // namespace comm_suite
