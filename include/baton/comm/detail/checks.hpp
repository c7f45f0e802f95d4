// baton/comm/detail/checks.hpp — argument checks and message pieces shared by every backend,
// so that the local world, MPI and NCCL word their errors the same way.
#pragma once

#include <baton/comm/error.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <thread>

namespace baton::detail::comm {

// Every collective, for agreement checks and error messages. The values start at 1 so that
// the MPI backend can send a kind and its negation in one all-reduce (see detail/mpi_agreement.hpp).
enum class collective_kind : std::int64_t { barrier = 1, all_reduce, all_gather, all_to_all, all_to_all_v, broadcast, split };

inline const char* collective_name(collective_kind k) {
  switch (k) {
    case collective_kind::barrier: return "barrier";
    case collective_kind::all_reduce: return "all_reduce";
    case collective_kind::all_gather: return "all_gather";
    case collective_kind::all_to_all: return "all_to_all";
    case collective_kind::all_to_all_v: return "all_to_all_v";
    case collective_kind::broadcast: return "broadcast";
    case collective_kind::split: return "split";
  }
  return "collective";
}

/// "0.25 s": durations in messages, readable for both milliseconds and minutes.
inline std::string seconds_text(std::chrono::nanoseconds d) {
  const double s = std::chrono::duration<double>(d).count();
  std::string text = std::to_string(s);
  while (text.size() > 1 && text.back() == '0') text.pop_back();
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text + " s";
}

/// "isend to peer 2 (tag 7, 64 bytes)"
inline std::string p2p_text(const char* what, int peer, int tag, std::size_t bytes) {
  const bool to = std::string_view(what).find("send") != std::string_view::npos;
  return std::string(what) + (to ? " to peer " : " from peer ") + std::to_string(peer) + " (tag " +
         std::to_string(tag) + ", " + std::to_string(bytes) + " bytes)";
}

// The checks below take `rank_text`, a callable returning this rank's message prefix
// ("rank 1", "rank 1 (world rank 3)"). It is called only when a check fails, so a passing
// check formats no text.

/// Rejects a peer outside [0, size) and a tag outside [0, max_tag], naming both and the fix.
template <class RankText>
void check_peer_and_tag(const RankText& rank_text, int size, const char* what, int peer, int tag, std::size_t bytes,
                        int max_tag = std::numeric_limits<int>::max()) {
  if (peer < 0 || peer >= size) {
    throw comm_error(rank_text() + ": " + p2p_text(what, peer, tag, bytes) + ": peer " + std::to_string(peer) +
                     " is not a rank of this communicator; valid peers are 0.." + std::to_string(size - 1) +
                     " (the communicator has " + std::to_string(size) + " ranks)");
  }
  if (tag < 0 || tag > max_tag) {
    throw comm_error(rank_text() + ": " + p2p_text(what, peer, tag, bytes) + ": tag " + std::to_string(tag) +
                     " is invalid; tags must be in 0.." + std::to_string(max_tag));
  }
}

/// Why a broadcast root outside [0, size) is wrong, or "" when it is a rank.
template <class RankText>
std::string root_problem(const RankText& rank_text, int root, int size) {
  if (root >= 0 && root < size) return {};
  return rank_text() + ": broadcast: root " + std::to_string(root) +
         " is not a rank of this communicator; valid roots are 0.." + std::to_string(size - 1);
}

/// split: names every rank whose color (`color_of(r)` for r in [0, size)) is negative, or
/// "" when all are >= 0.
template <class RankText, class ColorOf>
std::string colors_problem(const RankText& rank_text, int size, const ColorOf& color_of) {
  std::string bad;
  for (int r = 0; r < size; ++r) {
    const int c = color_of(r);
    if (c < 0) bad += (bad.empty() ? "" : ", ") + ("rank " + std::to_string(r) + " passed color " + std::to_string(c));
  }
  if (bad.empty()) return {};
  return rank_text() + ": split: " + bad +
         "; colors must be >= 0 on every rank (give ranks that should stay apart different colors)";
}

/// The rank a ring shift by k sends to and receives from.
struct ring_peers {
  int dest;
  int source;
};
inline ring_peers ring_peers_of(int rank, int size, int k) {
  const int step = k % size;
  return {(rank + step + size) % size, (rank - step + size) % size};
}

/// Element counts of an all_to_all_v must be non-negative, one per rank, and add up to the
/// buffer they describe: the problem with `counts`, or "" when there is none.
template <class RankText>
std::string counts_problem(const RankText& rank_text, const char* which, std::span<const std::int64_t> counts, int size,
                           std::size_t buffer_elements) {
  if (counts.size() != static_cast<std::size_t>(size)) {
    return rank_text() + ": all_to_all_v: " + which + " has " + std::to_string(counts.size()) +
           " entries but the communicator has " + std::to_string(size) + " ranks; pass one count per rank";
  }
  std::int64_t total = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 0) {
      return rank_text() + ": all_to_all_v: " + which + "[" + std::to_string(i) + "] = " + std::to_string(counts[i]) +
             " is negative";
    }
    total += counts[i];
  }
  if (static_cast<std::size_t>(total) != buffer_elements) {
    return rank_text() + ": all_to_all_v: " + which + " add up to " + std::to_string(total) +
           " elements but the buffer holds " + std::to_string(buffer_elements) +
           "; the counts must describe the whole buffer";
  }
  return {};
}

/// Polls `done()` until it returns true or `deadline` passes; returns whether it completed.
/// MPI and NCCL only make progress while they are polled, so for the first 2 ms it polls back
/// to back, then yields the core between polls (as MPI's own waits do when cores are
/// oversubscribed) until a second has passed. A wait that lasts longer is waiting for a late
/// or lost peer: it then naps 200 us between polls to leave the cores to others until the
/// deadline. The clock is read every 64 polls only: on a virtual machine reading it can cost
/// more than a poll, and a busy wait spends its time reading it.
template <class Done>
bool poll_until(Done&& done, std::chrono::steady_clock::time_point deadline) {
  using namespace std::chrono;
  const auto start = steady_clock::now();
  const auto spin_until = start + milliseconds(2);
  const auto patient_until = start + seconds(1);
  bool spinning = true;
  for (unsigned spin = 1;; ++spin) {
    if (done()) return true;
    if (spinning && spin % 64 != 0) continue;
    const auto now = steady_clock::now();
    if (now >= deadline) return done();
    if (now < spin_until) continue;
    spinning = false;
    if (now < patient_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(microseconds(200));
    }
  }
}

/// now + timeout without overflowing for huge timeouts (nanoseconds::max() means "forever").
inline std::chrono::steady_clock::time_point deadline_after(std::chrono::nanoseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  if (timeout >= std::chrono::steady_clock::time_point::max() - now) return std::chrono::steady_clock::time_point::max();
  return now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
}

}  // namespace baton::detail::comm
