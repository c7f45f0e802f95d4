// baton/cp/detail/agree.hpp — every collective entry point of the CP layer starts by having
// all ranks agree on their inputs. A rank whose input is wrong does not throw on its own
// (its peers would then wait for data that never comes); it reports the problem in its
// descriptor, the descriptors are all-gathered, and every rank throws the same cp_error.
#pragma once

#include <baton/cp/error.hpp>
#include <baton/cp/memory.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <vector>

namespace baton::detail::cp {

// Tags of the CP layer's point-to-point traffic. Messages of one (source, dest, tag) match
// in order, and every rank issues them in the same order, so fixed tags are enough.
inline constexpr int tag_agree = 0x4350;
inline constexpr int tag_kv = 0x4351;
inline constexpr int tag_grad = 0x4352;
inline constexpr int tag_settle = 0x4353;

// What a rank knows about its call, as plain integers so that it travels over any transport.
struct call_descriptor {
  enum field : std::size_t {
    magic, operation, failed, batch, seq_local, heads_q, heads_kv, head_dim, seq_len, layout, degree, inner_degree,
    element_size, world_size, rank, lse_element_size, mask_fingerprint, softmax_scale, sharding_fingerprint, fields
  };
  static constexpr std::size_t message_words = 48;  // 384 bytes of the failing rank's message
  static constexpr std::size_t words = fields + message_words;
  static constexpr std::int64_t magic_value = 0x626174'6f6e4350;  // "batonCP"

  std::array<std::int64_t, words> w{};

  call_descriptor() { w[magic] = magic_value; }

  std::int64_t& operator[](field f) noexcept { return w[f]; }
  std::int64_t operator[](field f) const noexcept { return w[f]; }

  void fail(const std::string& message) {
    w[failed] = 1;
    std::array<char, message_words * 8> text{};
    std::memcpy(text.data(), message.data(), std::min(message.size(), text.size() - 1));
    std::memcpy(&w[fields], text.data(), text.size());
  }
  std::string message() const {
    std::array<char, message_words * 8> text{};
    std::memcpy(text.data(), &w[fields], text.size());
    text.back() = '\0';
    return std::string(text.data());
  }
};

inline std::string shape_summary(const call_descriptor& d) {
  return "[batch " + std::to_string(d[call_descriptor::batch]) + ", seq " + std::to_string(d[call_descriptor::seq_local]) +
         ", heads " + std::to_string(d[call_descriptor::heads_q]) + "/" + std::to_string(d[call_descriptor::heads_kv]) +
         " (q/kv), dim " + std::to_string(d[call_descriptor::head_dim]) + "]";
}

// A softmax scale carried as the bits of a double.
inline std::int64_t scale_bits(double scale) noexcept {
  std::int64_t bits = 0;
  static_assert(sizeof bits == sizeof scale);
  std::memcpy(&bits, &scale, sizeof bits);
  return bits;
}
inline std::string scale_text(std::int64_t bits) {
  double scale = 0;
  std::memcpy(&scale, &bits, sizeof scale);
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", scale);
  return text;
}

// Throws the same cp_error on every rank when any descriptor failed or the descriptors
// disagree; `all` holds every rank's descriptor (any order: each carries its rank).
inline void agree_or_throw(const std::string& who, std::span<const call_descriptor> all) {
  using d = call_descriptor;
  for (const call_descriptor& c : all) {
    if (c[d::magic] != d::magic_value) {
      throw cp_error(who + ": a peer sent something that is not a CP call descriptor: the ranks are not all calling the "
                           "same context-parallel operation at the same time (check that every rank runs the same sequence "
                           "of collective calls)");
    }
  }
  std::vector<const call_descriptor*> sorted;
  for (const call_descriptor& c : all) sorted.push_back(&c);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return (*a)[d::rank] < (*b)[d::rank]; });
  for (const call_descriptor* c : sorted) {
    if ((*c)[d::failed] != 0) {
      throw cp_error(who + ": rank " + std::to_string((*c)[d::rank]) + " rejected its input, so every rank stops: " +
                     c->message());
    }
  }
  const call_descriptor& first = *sorted.front();
  for (const call_descriptor* c : sorted) {
    if ((*c)[d::operation] != first[d::operation]) {
      throw cp_error(who + ": ranks " + std::to_string(first[d::rank]) + " and " + std::to_string((*c)[d::rank]) +
                     " are in different context-parallel operations (forward vs backward, or ring vs Ulysses); every rank "
                     "must make the same collective calls in the same order");
    }
    // The sequence extent may differ: shards of an uneven sharding do, and each rank checked
    // its own against sharding.local_len(rank) before the gather.
    for (d::field f : {d::batch, d::heads_q, d::heads_kv, d::head_dim}) {
      if ((*c)[f] != first[f]) {
        throw cp_error(who + ": ranks hold shards of different shapes: rank " + std::to_string(first[d::rank]) + " has " +
                       shape_summary(first) + ", rank " + std::to_string((*c)[d::rank]) + " has " + shape_summary(*c) +
                       "; every rank must pass the same batch, heads and head dim (only the sequence extent differs, by "
                       "the sharding)");
      }
    }
    for (d::field f : {d::seq_len, d::layout, d::degree, d::inner_degree, d::world_size, d::sharding_fingerprint}) {
      if ((*c)[f] != first[f]) {
        throw cp_error(who + ": ranks " + std::to_string(first[d::rank]) + " and " + std::to_string((*c)[d::rank]) +
                       " pass different sequence shardings or communicator sizes; build the same sequence_sharding on "
                       "every rank");
      }
    }
    if ((*c)[d::softmax_scale] != first[d::softmax_scale]) {
      throw cp_error(who + ": ranks " + std::to_string(first[d::rank]) + " and " + std::to_string((*c)[d::rank]) +
                     " pass different softmax scales (" + scale_text(first[d::softmax_scale]) + " and " +
                     scale_text((*c)[d::softmax_scale]) +
                     " after 0 selects 1/sqrt(head dim)); every rank must pass the same cp_params::softmax_scale");
    }
    if ((*c)[d::mask_fingerprint] != first[d::mask_fingerprint]) {
      throw cp_error(who + ": ranks " + std::to_string(first[d::rank]) + " and " + std::to_string((*c)[d::rank]) +
                     " pass different masks (their types or parameters differ: window extents, prefix length, "
                     "document segment ids, block mask predicate, ...); every rank must pass the same mask, built "
                     "over the global sequence");
    }
    for (d::field f : {d::element_size, d::lse_element_size}) {
      if ((*c)[f] != first[f]) {
        throw cp_error(who + ": ranks " + std::to_string(first[d::rank]) + " and " + std::to_string((*c)[d::rank]) +
                       " use different element types; every rank must run the same precision");
      }
    }
  }
}

// The descriptors live on the host; `mem` (the call's memory space) stages them where the
// communicator can move them (host_memory: nowhere, they move as they are).

// All-gathers descriptors around a ring (R-1 shifts by +1). Works on any communicator with
// shift(); used where nothing else is guaranteed.
template <class Ring, class M = host_memory>
std::vector<call_descriptor> ring_all_gather(Ring& ring, M& mem, std::span<const call_descriptor> mine) {
  const int n = ring.size();
  std::vector<call_descriptor> all(mine.begin(), mine.end());
  std::vector<call_descriptor> current(mine.begin(), mine.end());
  std::vector<call_descriptor> next(mine.size());
  for (int step = 1; step < n; ++step) {
    mem.with_host_bytes(std::as_bytes(std::span<const call_descriptor>(current)),
                        std::as_writable_bytes(std::span<call_descriptor>(next)),
                        [&](std::span<const std::byte> send, std::span<std::byte> recv) {
                          auto request = ring.shift(send, recv, 1, tag_agree);
                          request.wait();
                        });
    all.insert(all.end(), next.begin(), next.end());
    std::swap(current, next);
  }
  return all;
}

// All-gathers descriptors with all_to_all (each rank sends its descriptor to everyone).
template <class Comm, class M = host_memory>
std::vector<call_descriptor> all_to_all_gather(Comm& comm, M& mem, std::span<const call_descriptor> mine) {
  const auto n = static_cast<std::size_t>(comm.size());
  std::vector<call_descriptor> send, all(mine.size() * n);
  for (std::size_t j = 0; j < n; ++j) send.insert(send.end(), mine.begin(), mine.end());
  mem.with_host_bytes(std::as_bytes(std::span<const call_descriptor>(send)),
                      std::as_writable_bytes(std::span<call_descriptor>(all)),
                      [&](std::span<const std::byte> s, std::span<std::byte> r) { comm.all_to_all(s, r); });
  return all;
}

template <class Ring>
std::vector<call_descriptor> ring_all_gather(Ring& ring, std::span<const call_descriptor> mine) {
  host_memory mem;
  return ring_all_gather(ring, mem, mine);
}
template <class Comm>
std::vector<call_descriptor> all_to_all_gather(Comm& comm, std::span<const call_descriptor> mine) {
  host_memory mem;
  return all_to_all_gather(comm, mem, mine);
}

// Settling before every rank throws the agreed cp_error. The verdict is the same on every
// rank, but the gather completes at different times on different ranks: a rank that threw
// at once could make the transport abort a peer still finishing its part of the gather
// (the local world aborts every pending operation when a rank's function throws; MPI's
// abort notice does the same), and that peer would see a comm_error instead of the cp_error.
// So, on the failure path only, each rank first makes sure every peer has finished the
// gather, with rounds whose own errors are ignored: a rank that fails in them has finished
// the gather, knows the verdict and throws it. The success path does none of this.

// floor(R/2) shifts around the ring: when a rank finishes round k, ranks up to k hops away
// on either side have finished the gather.
template <class Ring, class M = host_memory>
void settle_ring(Ring& ring, M& mem) noexcept {
  try {
    const std::int64_t token = 0;
    std::int64_t received = 0;
    for (int round = 0; round < ring.size() / 2; ++round) {
      mem.with_host_bytes(std::as_bytes(std::span<const std::int64_t>(&token, 1)),
                          std::as_writable_bytes(std::span<std::int64_t>(&received, 1)),
                          [&](std::span<const std::byte> send, std::span<std::byte> recv) {
                            auto request = ring.shift(send, recv, 1, tag_settle);
                            request.wait();
                          });
    }
  } catch (...) {  // a peer threw the verdict already: so will this rank
  }
}
template <class Ring>
void settle_ring(Ring& ring) noexcept {
  host_memory mem;
  settle_ring(ring, mem);
}

// A barrier (or, on a communicator without one, an all-to-all of a token): when it
// completes on a rank, every rank has entered it, so every rank has finished what came
// before. The barrier is preferred: it moves no buffer that a peer aborted by the verdict
// could still be reading.
template <class Comm, class M = host_memory>
void settle_all_to_all(Comm& comm, M& mem) noexcept {
  try {
    if constexpr (requires { comm.barrier(); }) {
      comm.barrier();
    } else {
      const std::vector<std::int64_t> send(static_cast<std::size_t>(comm.size()), 0);
      std::vector<std::int64_t> recv(send.size());
      mem.with_host_bytes(std::as_bytes(std::span<const std::int64_t>(send)),
                          std::as_writable_bytes(std::span<std::int64_t>(recv)),
                          [&](std::span<const std::byte> s, std::span<std::byte> r) { comm.all_to_all(s, r); });
    }
  } catch (...) {  // a peer threw the verdict already: so will this rank
  }
}
template <class Comm>
void settle_all_to_all(Comm& comm) noexcept {
  host_memory mem;
  settle_all_to_all(comm, mem);
}

// agree_or_throw, settling first when the verdict is a cp_error.
template <class Settle>
void agree_settle_or_throw(const std::string& who, std::span<const call_descriptor> all, Settle&& settle) {
  std::exception_ptr verdict;
  try {
    agree_or_throw(who, all);
  } catch (const cp_error&) {
    verdict = std::current_exception();
  }
  if (!verdict) return;
  settle();
  std::rethrow_exception(verdict);
}

}  // namespace baton::detail::cp
