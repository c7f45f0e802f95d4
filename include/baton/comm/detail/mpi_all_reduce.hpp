// baton/comm/detail/mpi_all_reduce.hpp — mpi_communicator's all_reduce, over baton's own
// point-to-point messages so that every rank folds the contributions in rank order (the local
// world's order and code, detail/reduce.hpp): every rank holds bitwise the same result, and the
// same bits as a run on threads. A small all_reduce sends its data with its agreement
// descriptor (one exchange in all); a large one is a reduce-scatter in segments (each folded
// while the next arrives) and an all-gather, the traffic of MPI_Allreduce's ring.
#pragma once

#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/elements.hpp>
#include <baton/comm/detail/mpi_agreement.hpp>
#include <baton/comm/detail/mpi_segments.hpp>
#include <baton/comm/detail/mpi_state.hpp>
#include <baton/comm/detail/mpi_support.hpp>
#include <baton/comm/detail/reduce.hpp>
#include <baton/comm/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace baton::detail::comm::mpi {

/// Reduce-scatter then all-gather, over baton's own messages. Rank r owns chunk r: every
/// rank sends r its piece of it in segments, and r folds each segment's pieces in rank order
/// (while the next arrives) into `inout`; then every rank sends its reduced chunk to every
/// other. The traffic of MPI_Allreduce's ring: 2 (n - 1) / n of the buffer per rank.
///
/// With `agreeing` (this call's descriptor; mpi_segments.hpp says when), the agreement
/// travels with the data: the descriptors and the first segment to every rank are sent at
/// once, and anything later waits for every rank's descriptor. A round trip of its own before
/// the data cost a 1 MiB all_reduce of 2 processes 20-50 us of its 100-330 (docs/communicators.md).
/// Where the calls differ, every early segment is still received (into the receive posted
/// for it, or dropped by a rank in another collective: mpi_agreement.hpp), so no message of
/// this call is left to match a later one; the segments travel as bytes, so a segment of
/// another size or type is a short or truncated message, not undefined behaviour.
template <class T>
void all_reduce_in_chunks(comm_state& s, std::span<T> inout, reduce_op op, const descriptor* agreeing = nullptr) {
  const int n = s.size;
  const int me = s.rank;
  const auto un = static_cast<std::size_t>(n);
  const std::size_t count = inout.size();
  const std::size_t seg = all_reduce_segment(count, sizeof(T), n);
  const auto begin = [&](int r) { return chunk_begin(count, n, r); };
  const auto length = [&](int r) { return begin(r + 1) - begin(r); };
  const auto segments = [&](int r) { return (length(r) + seg - 1) / seg; };
  const auto piece_count = [&](int r, std::size_t k) { return std::min(seg, length(r) - k * seg); };
  const auto piece_bytes = [&](int r, std::size_t k) { return static_cast<int>(piece_count(r, k) * sizeof(T)); };
  T* const chunk = inout.data() + begin(me);
  const std::size_t my_segments = segments(me);
  // Two windows of receive slots, one slot per rank (this rank's stays unused), then the
  // descriptors, one per rank (this rank's own is the one it sends).
  const std::size_t window_bytes = 2 * un * seg * sizeof(T);
  std::byte* const scratch = s.scratch.get(window_bytes + (agreeing ? un * descriptor_bytes : 0));
  T* const window = reinterpret_cast<T*>(scratch);
  std::byte* const descriptors = scratch + window_bytes;
  const auto slot = [&](std::size_t k, int r) { return window + ((k % 2) * un + static_cast<std::size_t>(r)) * seg; };
  std::size_t sends = 0;
  for (int r = 0; r < n; ++r) sends += r == me ? 0 : segments(r);
  // Receives of window 0, of window 1, the descriptors' receives and sends, then the data sends.
  const std::size_t agreement_at = 2 * un;
  std::size_t at = 4 * un;
  s.requests.assign(at + sends, MPI_REQUEST_NULL);
  const auto receive = [&](std::size_t k) {
    if (k >= my_segments) return;
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      s.check(MPI_Irecv(slot(k, r), piece_bytes(me, k), MPI_BYTE, r, tag_reduce, s.coll,
                        &s.requests[(k % 2) * un + static_cast<std::size_t>(r)]),
              "MPI_Irecv");
    }
  };
  const auto send = [&](std::size_t k) {  // segment k to every rank; false when none has one
    bool any = false;
    for (int r = 0; r < n; ++r) {
      if (r == me || k >= segments(r)) continue;
      any = true;
      s.check(MPI_Isend(inout.data() + begin(r) + k * seg, piece_bytes(r, k), MPI_BYTE, r, tag_reduce, s.coll,
                        &s.requests[at++]),
              "MPI_Isend");
    }
    return any;
  };
  const auto fail_on_error = [&](std::size_t, int rc, const MPI_Status&) {
    if (rc != MPI_SUCCESS) throw comm_error(s.rank_text() + ": all_reduce: MPI error: " + error_text(rc));
  };
  if (agreeing) {
    // Sent from the scratch (this rank's own slot), which a timed-out wait leaks with the
    // requests, not from the caller's frame.
    std::byte* const own = descriptors + descriptor_bytes * static_cast<std::size_t>(me);
    std::memcpy(own, agreeing, descriptor_bytes);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      s.check(MPI_Irecv(descriptors + descriptor_bytes * static_cast<std::size_t>(r), static_cast<int>(descriptor_bytes),
                        MPI_BYTE, r, tag_agreement, s.coll, &s.requests[agreement_at + static_cast<std::size_t>(r)]),
              "MPI_Irecv");
    }
    receive(0);
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      s.check(MPI_Isend(own, static_cast<int>(descriptor_bytes), MPI_BYTE, r, tag_agreement, s.coll,
                        &s.requests[agreement_at + un + static_cast<std::size_t>(r)]),
              "MPI_Isend");
    }
    send(0);
    bool same = true;
    std::vector<int>& received = s.agreement_bytes;  // of each rank's descriptor; -1: a longer one
    received.assign(un, -1);
    s.await_requests(std::span(s.requests).subspan(agreement_at, 2 * un), "all_reduce",
                     [&](std::size_t index, int rc, const MPI_Status& status) {
                       if (index >= un) {
                         fail_on_error(index, rc, status);
                         return;
                       }
                       if (rc != MPI_SUCCESS && error_class(rc) != MPI_ERR_TRUNCATE) fail_on_error(index, rc, status);
                       if (rc == MPI_SUCCESS) MPI_Get_count(&status, MPI_BYTE, &received[index]);
                       descriptor theirs;
                       std::memcpy(&theirs, descriptors + descriptor_bytes * index, descriptor_bytes);
                       if (received[index] != static_cast<int>(descriptor_bytes) || !theirs.same_call(*agreeing)) same = false;
                     });
    if (!same) {
      // Settle the early segments: wait for those the other ranks sent into the receives
      // posted for them, cancel the receives no segment will come to, drop the segments no
      // receive was posted for, and wait until the other ranks have this rank's.
      std::vector<int> drop;
      for (int r = 0; r < n; ++r) {
        if (r == me) continue;
        descriptor theirs;
        std::memcpy(&theirs, descriptors + descriptor_bytes * static_cast<std::size_t>(r), descriptor_bytes);
        const bool early = sent_early_segment(theirs, received[static_cast<std::size_t>(r)], n, me);
        MPI_Request& segment = s.requests[static_cast<std::size_t>(r)];
        if (segment != MPI_REQUEST_NULL && !early) s.check(MPI_Cancel(&segment), "MPI_Cancel");
        if (segment == MPI_REQUEST_NULL && early) drop.push_back(r);
      }
      const auto settled = [&](std::size_t index, int rc, const MPI_Status& status) {
        if (rc != MPI_SUCCESS && error_class(rc) != MPI_ERR_TRUNCATE) fail_on_error(index, rc, status);
      };
      s.await_requests(std::span(s.requests).subspan(0, un), "all_reduce", settled);
      for (const int r : drop) drop_early_segment(s, r, "all_reduce");
      s.await_requests(std::span(s.requests).subspan(4 * un), "all_reduce", settled);
      disagreed(s, *agreeing, "element count", "element type or reduce_op");
    }
  } else {
    receive(0);
    send(0);
  }
  receive(1);
  for (std::size_t k = 1; send(k); ++k) {
  }
  for (std::size_t k = 0; k < my_segments; ++k) {
    s.await_requests(std::span(s.requests).subspan((k % 2) * un, un), "all_reduce", fail_on_error);
    T* const out = chunk + k * seg;
    const std::size_t len = piece_count(me, k);
    // The fold may write over this rank's own piece while reading it only as piece 0 or 1;
    // a later rank's own piece goes to its (otherwise unused) slot first.
    if (me >= 2) std::memcpy(slot(k, me), out, len * sizeof(T));
    const auto piece = [&](int r) { return r == me && me < 2 ? out : slot(k, r); };
    fold_in_rank_order(out, len, n, piece, op);
    receive(k + 2);
  }
  s.await_requests(std::span(s.requests).subspan(4 * un), "all_reduce", fail_on_error);
  // All-gather: the sends above have completed, so the chunks may now be overwritten.
  const MPI_Datatype type = datatype_of(element_kind_of<T>());
  s.requests.assign(2 * (un - 1), MPI_REQUEST_NULL);
  std::size_t i = 0;
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    s.check(MPI_Irecv(inout.data() + begin(r), static_cast<int>(length(r)), type, r, tag_gather, s.coll, &s.requests[i++]),
            "MPI_Irecv");
  }
  for (int r = 0; r < n; ++r) {
    if (r == me) continue;
    s.check(MPI_Isend(chunk, static_cast<int>(length(me)), type, r, tag_gather, s.coll, &s.requests[i++]), "MPI_Isend");
  }
  s.await_requests(std::span(s.requests), "all_reduce", fail_on_error);
}

/// The whole all_reduce: agreed (or, when small, agreed and reduced in one exchange), then
/// reduced in chunks.
template <class T>
void all_reduce(comm_state& s, std::span<T> inout, reduce_op op) {
  const descriptor mine = describe_call(s, collective_kind::all_reduce, static_cast<std::int64_t>(inout.size()),
                                        type_and_op_word(element_kind_of<T>(), op));
  if (s.size > 1 && s.exchange_agreement() && small_all_reduce(inout.size(), sizeof(T), s.size)) {
    // Small: the data travels with the descriptor to every other rank, and every rank folds
    // all contributions itself — one exchange in all.
    refuse_collective(s, "all_reduce");
    const std::byte* base = exchange(s, mine, std::as_bytes(inout), "all_reduce");
    if (base == nullptr) disagreed(s, mine, "element count", "element type or reduce_op");
    const std::size_t slot = descriptor_bytes + inout.size_bytes();
    const auto piece = [&](int r) {
      return reinterpret_cast<const T*>(base + slot * static_cast<std::size_t>(r) + descriptor_bytes);
    };
    fold_in_rank_order(inout.data(), inout.size(), s.size, piece, op);
    return;
  }
  if (s.size > 1 && s.options.check_collectives && s.exchange_agreement() &&
      agreement_travels_with_data(inout.size(), sizeof(T), s.size)) {
    refuse_collective(s, "all_reduce");
    all_reduce_in_chunks(s, inout, op, &mine);  // agreed as the first segments travel
    return;
  }
  agree(s, collective_kind::all_reduce, mine.values[0], "element count", mine.values[1], "element type or reduce_op");
  static_cast<void>(s.int_count(inout.size(), "all_reduce"));
  if (s.size > 1) all_reduce_in_chunks(s, inout, op);
}

}  // namespace baton::detail::comm::mpi
