// baton/comm/detail/mpi_agreement.hpp — how the ranks of an mpi_communicator agree before a
// collective (core/agreement.hpp's protocol, on MPI's own transport), and the tags of baton's
// own messages on the collectives' communicator.
//
// Before a collective each rank sends every other rank an agreement descriptor: the
// collective's kind as its operation, its two arguments that must match (sizes, element type
// and op, root) as its values, and as its failure the problem the rank found in its own
// arguments, if any. The descriptors travel as point to point messages on a duplicate
// communicator of baton's own, one message and one receive per pair of ranks whatever the
// collective, so two ranks in different collectives still match each other's message: a size
// that differs shows as a short or a truncated message, which MPI reports (unlike a collective
// called with different counts, which is undefined). If every descriptor is the same call as
// this rank's, every rank's is the same as every other's, so either all ranks go on or all see
// a mismatch; on a mismatch one more all-reduce of the fields gives every rank the same error
// text. A small all_reduce sends its data in the descriptor's message: the agreement then
// costs no round trip of its own, and a large one sends its first segment to every rank with
// its descriptor, before it knows the others agree (mpi_all_reduce.hpp): a rank that then finds
// a different call receives that segment and drops it, so no message outlives its collective.
// Above mpi_options::exchange_agreement_max_ranks ranks the all-pairs exchange would grow with
// the world, and that all-reduce is the agreement itself.
#pragma once

#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/mpi_state.hpp>
#include <baton/comm/detail/mpi_support.hpp>
#include <baton/comm/detail/mpi_segments.hpp>
#include <baton/comm/detail/reduce.hpp>
#include <baton/comm/error.hpp>
#include <baton/core/agreement.hpp>
#include <baton/core/tags.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace baton::detail::comm::mpi {

/// What a rank sends before a collective (see the file comment).
using descriptor = agreement_descriptor<2>;
inline constexpr std::size_t descriptor_bytes = sizeof(descriptor);

// Tags of baton's own messages on the collectives' communicator; a rank's messages of one
// tag arrive in the order sent, and a rank starts the next collective's messages only after
// every other rank's message of this one has arrived, so messages never cross collectives.
inline constexpr int tag_agreement = tags::comm_mpi::tag<0>;  // the descriptors (and a small all_reduce's data)
inline constexpr int tag_reduce = tags::comm_mpi::tag<1>;     // all_reduce: a rank's piece of another rank's chunk
inline constexpr int tag_gather = tags::comm_mpi::tag<2>;     // all_reduce: a reduced chunk, to every other rank

/// Problems a rank finds in its own arguments, reported to all ranks by the agreement.
enum class problem : std::int64_t {
  none = 0,
  gather_recv_size,
  to_all_not_divisible,
  to_all_recv_size,
  counts_invalid,
  counts_disagree,
};

inline const char* text_of(problem p) {
  switch (p) {
    case problem::none: return "";
    case problem::gather_recv_size: return "the receive buffer does not hold size() x the send elements";
    case problem::to_all_not_divisible: return "the send buffer is not a multiple of size() elements";
    case problem::to_all_recv_size: return "the receive and send buffers differ in size";
    case problem::counts_invalid:
      return "send_counts or recv_counts do not have one non-negative count per rank adding up to the buffer";
    case problem::counts_disagree:
      return "recv_counts disagree with what the other ranks send (recv_counts[i] on rank j must equal "
             "send_counts[j] on rank i)";
  }
  return "invalid arguments";
}

/// This rank's descriptor of a call of `kind` with arguments a and b.
inline descriptor describe_call(const comm_state& s, collective_kind kind, std::int64_t a, std::int64_t b,
                                problem p = problem::none) {
  descriptor d;
  d.protocol = tags::comm_mpi::first;
  d.operation = static_cast<std::int64_t>(kind);
  d.rank = s.rank;
  d.failure = static_cast<std::int64_t>(p);
  d.values = {a, b};
  return d;
}

/// Of the ranks that found a problem, the highest one's, as one word that MPI_MAX reduces to
/// the same choice: (rank + 1) x 64 + problem, or 0 when the rank found none.
inline std::int64_t failure_word(const descriptor& d) noexcept { return d.failure == 0 ? 0 : (d.rank + 1) * 64 + d.failure; }

/// Every rank throws the same error for the failure word of all ranks (or none does).
inline void throw_if_failed(const comm_state& s, const char* what, std::int64_t word) {
  if (word != 0) {
    throw comm_error(s.rank_text() + ": " + what + ": on rank " + std::to_string(word / 64 - 1) + ", " +
                     text_of(static_cast<problem>(word % 64)));
  }
}

/// Whether a descriptor that arrived as a message of `received` bytes comes from a large
/// all_reduce that sent rank `to` its first segment with it (mpi_segments.hpp): a small
/// all_reduce's message carries its data, any other collective's has no element count.
inline bool sent_early_segment(const descriptor& d, int received, int ranks, int to) noexcept {
  if (received != static_cast<int>(descriptor_bytes) || d.magic != descriptor::magic_value ||
      d.protocol != tags::comm_mpi::first || d.operation != static_cast<std::int64_t>(collective_kind::all_reduce) ||
      d.values[0] <= 0) {
    return false;
  }
  const auto count = static_cast<std::size_t>(d.values[0]);
  const std::size_t bytes = element_bytes_of_word(d.values[1]);
  return agreement_travels_with_data(count, bytes, ranks) && chunk_begin(count, ranks, to + 1) > chunk_begin(count, ranks, to);
}

/// Receives the early segment rank `from` sent this rank, and drops it: the calls differed.
inline void drop_early_segment(comm_state& s, int from, const char* what) {
  MPI_Message message = MPI_MESSAGE_NULL;
  MPI_Status status{};
  s.await(
      [&] {
        int found = 0;
        s.check(MPI_Improbe(from, tag_reduce, s.coll, &found, &message, &status), "MPI_Improbe");
        return found != 0;
      },
      what, [] {});
  int bytes = 0;
  MPI_Get_count(&status, MPI_BYTE, &bytes);
  std::vector<std::byte> sink(static_cast<std::size_t>(std::max(bytes, 1)));
  s.check(MPI_Mrecv(sink.data(), bytes, MPI_BYTE, &message, MPI_STATUS_IGNORE), "MPI_Mrecv");
}

/// Sends `mine` followed by `payload` to every other rank, and receives every other rank's
/// message of the same size. Returns where they are — rank r's at r x (descriptor_bytes +
/// payload bytes), this rank's own copy in its own slot — when every message had this size and
/// described the same call; otherwise null, and then on every rank (see the file comment),
/// after dropping the early segments of ranks in a large all_reduce.
inline const std::byte* exchange(comm_state& s, const descriptor& mine, std::span<const std::byte> payload,
                                 const char* what) {
  const auto n = static_cast<std::size_t>(s.size);
  const std::size_t slot = descriptor_bytes + payload.size();
  const int slot_count = s.int_count(slot, what);
  std::byte* base = s.scratch.get(slot * n);
  std::byte* own = base + slot * static_cast<std::size_t>(s.rank);
  std::memcpy(own, &mine, descriptor_bytes);
  if (!payload.empty()) std::memcpy(own + descriptor_bytes, payload.data(), payload.size());
  s.requests.assign(2 * (n - 1), MPI_REQUEST_NULL);
  std::size_t i = 0;
  for (int r = 0; r < s.size; ++r) {
    if (r == s.rank) continue;
    s.check(MPI_Irecv(base + slot * static_cast<std::size_t>(r), slot_count, MPI_BYTE, r, tag_agreement, s.coll,
                      &s.requests[i++]),
            "MPI_Irecv");
  }
  for (int r = 0; r < s.size; ++r) {
    if (r == s.rank) continue;
    s.check(MPI_Isend(own, slot_count, MPI_BYTE, r, tag_agreement, s.coll, &s.requests[i++]), "MPI_Isend");
  }
  bool same = true;
  std::vector<int> early;  // the ranks whose early segment must be dropped (allocates only then)
  s.await_requests(std::span(s.requests), what, [&](std::size_t index, int rc, const MPI_Status& status) {
    const bool receive = index < n - 1;
    if (rc != MPI_SUCCESS) {
      if (receive && error_class(rc) == MPI_ERR_TRUNCATE) {  // a longer message: another call
        same = false;
        return;
      }
      throw comm_error(s.rank_text() + ": " + what + ": MPI error: " + error_text(rc));
    }
    if (!receive) return;
    const int from = static_cast<int>(index) < s.rank ? static_cast<int>(index) : static_cast<int>(index) + 1;
    int received = 0;
    MPI_Get_count(&status, MPI_BYTE, &received);
    descriptor theirs;
    std::memcpy(&theirs, base + slot * static_cast<std::size_t>(from), descriptor_bytes);
    if (received == slot_count && theirs.same_call(mine)) return;
    same = false;
    if (sent_early_segment(theirs, received, s.size, s.rank)) early.push_back(from);
  });
  for (const int from : early) drop_early_segment(s, from, what);
  return same ? base : nullptr;
}

/// One all-reduce (MAX over v and -v) of every rank's descriptor fields: every rank learns the
/// same range of each field, and throws the same error (or none does). The agreement of large
/// communicators, and what an exchange that found a mismatch falls back on for the text.
inline void agree_by_reduction(comm_state& s, const descriptor& mine, const char* a_name, const char* b_name) {
  const char* what = collective_name(static_cast<collective_kind>(mine.operation));
  const auto [a, b] = mine.values;
  auto scratch = std::make_unique<std::array<std::int64_t, 7>>(
      std::array<std::int64_t, 7>{mine.operation, -mine.operation, a, -a, b, -b, failure_word(mine)});
  MPI_Request request = MPI_REQUEST_NULL;
  s.check(MPI_Iallreduce(MPI_IN_PLACE, scratch->data(), 7, MPI_INT64_T, MPI_MAX, s.comm, &request), "MPI_Iallreduce");
  s.finish(request, what, scratch);
  const auto& v = *scratch;
  if (v[0] != -v[1]) {
    throw comm_error(s.rank_text() + ": collective mismatch: some ranks called " +
                     collective_name(static_cast<collective_kind>(v[0])) + " while others called " +
                     collective_name(static_cast<collective_kind>(-v[1])) +
                     "; every rank of a communicator must call the same collectives in the same order");
  }
  if (v[2] != -v[3]) {
    throw comm_error(s.rank_text() + ": " + what + " called with different " + a_name + " on different ranks (from " +
                     std::to_string(-v[3]) + " to " + std::to_string(v[2]) + "); every rank must pass the same " + a_name);
  }
  if (v[4] != -v[5]) {
    throw comm_error(s.rank_text() + ": " + what + " called with different " + b_name +
                     " on different ranks; every rank must pass the same " + b_name);
  }
  throw_if_failed(s, what, v[6]);
}

/// The exchange found ranks in different calls: tells every rank which difference, with
/// the same text everywhere.
[[noreturn]] inline void disagreed(comm_state& s, const descriptor& mine, const char* a_name, const char* b_name) {
  agree_by_reduction(s, mine, a_name, b_name);
  throw comm_error(s.rank_text() + ": " + collective_name(static_cast<collective_kind>(mine.operation)) +
                   ": the ranks' agreement messages differ in size; every rank must call the same collectives "
                   "with the same arguments");
}

/// Refuses a collective once a failure was announced or an earlier collective broke the
/// communicator.
inline void refuse_collective(comm_state& s, const char* what) {
  s.refuse_if_aborted([what] { return std::string(what); });
  s.refuse_if_broken(what);
}

/// With check_collectives: tells every rank whether all called `kind` with the same `a`
/// and `b`, and which rank (if any) found `p` in its own arguments; every rank then throws
/// the same error or none does.
inline void agree(comm_state& s, collective_kind kind, std::int64_t a, const char* a_name, std::int64_t b,
                  const char* b_name, problem p = problem::none) {
  const char* what = collective_name(kind);
  refuse_collective(s, what);
  if (!s.options.check_collectives || s.size == 1) {
    if (p != problem::none) throw comm_error(s.rank_text() + ": " + what + ": " + text_of(p));
    return;
  }
  const descriptor mine = describe_call(s, kind, a, b, p);
  if (!s.exchange_agreement()) {
    agree_by_reduction(s, mine, a_name, b_name);
    return;
  }
  const std::byte* base = exchange(s, mine, {}, what);
  if (base == nullptr) disagreed(s, mine, a_name, b_name);
  // Every rank called the same collective: the same failures reach every rank.
  std::int64_t worst = 0;
  for (int r = 0; r < s.size; ++r) {
    descriptor d;
    std::memcpy(&d, base + descriptor_bytes * static_cast<std::size_t>(r), descriptor_bytes);
    worst = std::max(worst, failure_word(d));
  }
  throw_if_failed(s, what, worst);
}

}  // namespace baton::detail::comm::mpi
