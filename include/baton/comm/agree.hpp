// baton/comm/agree.hpp — how agreement descriptors (core/agreement.hpp) travel between the
// ranks of a group, over whichever capability the group's communicator has, and how ranks
// that reached an agreed error make sure every peer has finished the exchange first.
//
// These are public: a program that adds its own collective step can agree with the same
// descriptors and exchanges, on tags of its own (core/tags.hpp). Every exchange gives each
// rank the descriptors of all ranks, so each compares the same
// table and reaches the same verdict. A memory space that keeps its transfers in another
// memory (context parallelism over CUDA device memory) passes `stage`: stage(send, recv, f)
// calls f with where the communicator must read and write, and copies the host bytes there
// and back; by default the bytes travel as they are.
#pragma once

#include <baton/comm/concepts.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// The default `stage`: the communicator reads and writes the host bytes themselves.
struct bytes_as_they_are {
  template <class F>
  void operator()(std::span<const std::byte> send, std::span<std::byte> recv, F&& f) const {
    f(send, recv);
  }
};

/// Rank 0 gathers the descriptors and sends the table back: 2 (n - 1) messages, where an
/// exchange between every pair of ranks takes n (n - 1). `all[r]` is rank r's; `all` is
/// reused from call to call. Throws what the communicator throws.
template <class D, point_to_point_communicator Comm>
void gather_descriptors(Comm& comm, int tag, const D& mine, std::vector<D>& all) {
  static_assert(std::is_trivially_copyable_v<D>, "baton agreement: a descriptor travels as raw bytes");
  using request = comm_request_t<Comm>;
  const int n = comm.size();
  const int me = comm.rank();
  all.resize(static_cast<std::size_t>(n));
  all[static_cast<std::size_t>(me)] = mine;
  if (n == 1) return;
  const auto table = std::as_writable_bytes(std::span(all));
  if (me == 0) {
    std::vector<request> requests;
    requests.reserve(static_cast<std::size_t>(n - 1));
    for (int r = 1; r < n; ++r) {
      requests.push_back(comm.irecv(std::as_writable_bytes(std::span(&all[static_cast<std::size_t>(r)], 1)), r, tag));
    }
    wait_all(requests);
    requests.clear();
    for (int r = 1; r < n; ++r) requests.push_back(comm.isend(std::as_bytes(table), r, tag));
    wait_all(requests);
  } else {
    auto sent = comm.isend(std::as_bytes(std::span(&mine, 1)), 0, tag);
    auto received = comm.irecv(table, 0, tag);
    // The table comes only after rank 0 has received this rank's descriptor, so once it is
    // here the send is done too: one wait that can block, not two.
    received.wait();
    sent.wait();
  }
}

/// Around a ring, size() - 1 shifts by +1: every rank ends with every rank's `mine` (any
/// order: each descriptor carries its rank). For groups whose communicator has only shift().
template <class D, ring_communicator Ring, class Stage = bytes_as_they_are>
std::vector<D> ring_gather_descriptors(Ring& ring, int tag, std::span<const D> mine, Stage&& stage = {}) {
  static_assert(std::is_trivially_copyable_v<D>, "baton agreement: a descriptor travels as raw bytes");
  const int n = ring.size();
  std::vector<D> all(mine.begin(), mine.end());
  std::vector<D> current(mine.begin(), mine.end());
  std::vector<D> next(mine.size());
  for (int step = 1; step < n; ++step) {
    stage(std::as_bytes(std::span<const D>(current)), std::as_writable_bytes(std::span<D>(next)),
          [&](std::span<const std::byte> send, std::span<std::byte> recv) {
            auto request = ring.shift(send, recv, 1, tag);
            request.wait();
          });
    all.insert(all.end(), next.begin(), next.end());
    std::swap(current, next);
  }
  return all;
}

/// With one all_to_all (every rank sends its `mine` to every rank).
template <class D, class Comm, class Stage = bytes_as_they_are>
std::vector<D> all_to_all_gather_descriptors(Comm& comm, std::span<const D> mine, Stage&& stage = {}) {
  static_assert(std::is_trivially_copyable_v<D>, "baton agreement: a descriptor travels as raw bytes");
  const auto n = static_cast<std::size_t>(comm.size());
  std::vector<D> send, all(mine.size() * n);
  for (std::size_t j = 0; j < n; ++j) send.insert(send.end(), mine.begin(), mine.end());
  stage(std::as_bytes(std::span<const D>(send)), std::as_writable_bytes(std::span<D>(all)),
        [&](std::span<const std::byte> s, std::span<std::byte> r) { comm.all_to_all(s, r); });
  return all;
}

// Settling before every rank throws an agreed error. The verdict is the same on every rank,
// but the exchange completes at different times on different ranks: a rank that threw at
// once could make the transport abort a peer still finishing its part of the exchange (the
// local world aborts every pending operation when a rank's function throws; MPI's abort
// notice does the same), and that peer would see a comm_error instead of the verdict. So, on
// the failure path only, each rank first makes sure every peer has finished the exchange,
// with rounds whose own errors are ignored: a rank that fails in them has finished the
// exchange, knows the verdict and throws it. The success path does none of this.

/// floor(R/2) shifts around the ring: when a rank finishes round k, ranks up to k hops away
/// on either side have finished the exchange.
template <ring_communicator Ring, class Stage = bytes_as_they_are>
void settle_ring(Ring& ring, int tag, Stage&& stage = {}) noexcept {
  try {
    const std::int64_t token = 0;
    std::int64_t received = 0;
    for (int round = 0; round < ring.size() / 2; ++round) {
      stage(std::as_bytes(std::span<const std::int64_t>(&token, 1)), std::as_writable_bytes(std::span<std::int64_t>(&received, 1)),
            [&](std::span<const std::byte> send, std::span<std::byte> recv) {
              auto request = ring.shift(send, recv, 1, tag);
              request.wait();
            });
    }
  } catch (...) {  // a peer threw the verdict already: so will this rank
  }
}

/// A barrier (or, on a communicator without one, an all-to-all of a token): when it
/// completes on a rank, every rank has entered it, so every rank has finished what came
/// before. The barrier is preferred: it moves no buffer that a peer aborted by the verdict
/// could still be reading.
template <class Comm, class Stage = bytes_as_they_are>
void settle_all_to_all(Comm& comm, Stage&& stage = {}) noexcept {
  try {
    if constexpr (barrier_communicator<Comm>) {
      comm.barrier();
    } else {
      const std::vector<std::int64_t> send(static_cast<std::size_t>(comm.size()), 0);
      std::vector<std::int64_t> recv(send.size());
      stage(std::as_bytes(std::span<const std::int64_t>(send)), std::as_writable_bytes(std::span<std::int64_t>(recv)),
            [&](std::span<const std::byte> s, std::span<std::byte> r) { comm.all_to_all(s, r); });
    }
  } catch (...) {  // a peer threw the verdict already: so will this rank
  }
}

}  // namespace baton
