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

namespace baton::detail::comm::mpi {

/// An all_reduce of at most this many bytes times (ranks - 1) sends its data with the
/// agreement descriptor to every rank, instead of a reduce-scatter and an all-gather.
inline constexpr std::size_t small_all_reduce_bytes = std::size_t{64} << 10;
/// A large all_reduce moves each rank's pieces in segments of at most this size, folding one
/// while the next arrives. Over shared memory (Open MPI's vader with CMA) the receiving
/// process copies each message itself, so a segment overlaps nothing and costs a handshake
/// (about 9 us: 64 KiB segments made a 1 MiB all_reduce of 2 ranks 50 us slower than 256 KiB
/// ones); few, large segments are fastest there (docs/communicators.md).
inline constexpr std::size_t all_reduce_segment_bytes = std::size_t{1} << 20;
/// ... and the scratch of 2 segments per rank stays within this, so a segment shrinks with
/// many ranks (256 KiB at 16).
inline constexpr std::size_t all_reduce_scratch_bytes = std::size_t{8} << 20;

/// The elements of one segment: the same on every rank (count is agreed), never more than a
/// chunk.
template <class T>
std::size_t all_reduce_segment(std::size_t count, int ranks) {
  const auto n = static_cast<std::size_t>(ranks);
  const std::size_t bytes = std::min(all_reduce_segment_bytes, all_reduce_scratch_bytes / (2 * n));
  return std::max<std::size_t>(1, std::min(bytes / sizeof(T), (count + n - 1) / n));
}

/// Reduce-scatter then all-gather, over baton's own messages. Rank r owns chunk r: every
/// rank sends r its piece of it in segments, and r folds each segment's pieces in rank order
/// (while the next arrives) into `inout`; then every rank sends its reduced chunk to every
/// other. The traffic of MPI_Allreduce's ring: 2 (n - 1) / n of the buffer per rank.
template <class T>
void all_reduce_in_chunks(comm_state& s, std::span<T> inout, reduce_op op) {
  const int n = s.size;
  const int me = s.rank;
  const auto un = static_cast<std::size_t>(n);
  const std::size_t count = inout.size();
  const MPI_Datatype type = datatype_of(element_kind_of<T>());
  const std::size_t seg = all_reduce_segment<T>(count, n);
  const auto begin = [&](int r) { return chunk_begin(count, n, r); };
  const auto length = [&](int r) { return begin(r + 1) - begin(r); };
  const auto segments = [&](int r) { return (length(r) + seg - 1) / seg; };
  const auto piece_count = [&](int r, std::size_t k) { return static_cast<int>(std::min(seg, length(r) - k * seg)); };
  T* const chunk = inout.data() + begin(me);
  const std::size_t my_segments = segments(me);
  // Two windows of receive slots, one slot per rank (this rank's stays unused).
  T* const window = reinterpret_cast<T*>(s.scratch.get(2 * un * seg * sizeof(T)));
  const auto slot = [&](std::size_t k, int r) { return window + ((k % 2) * un + static_cast<std::size_t>(r)) * seg; };
  std::size_t sends = 0;
  for (int r = 0; r < n; ++r) sends += r == me ? 0 : segments(r);
  s.requests.assign(2 * un + sends, MPI_REQUEST_NULL);  // receives of window 0, of window 1, then the sends
  const auto receive = [&](std::size_t k) {
    if (k >= my_segments) return;
    for (int r = 0; r < n; ++r) {
      if (r == me) continue;
      s.check(MPI_Irecv(slot(k, r), piece_count(me, k), type, r, tag_reduce, s.coll,
                        &s.requests[(k % 2) * un + static_cast<std::size_t>(r)]),
              "MPI_Irecv");
    }
  };
  receive(0);
  receive(1);
  std::size_t at = 2 * un;
  for (std::size_t k = 0;; ++k) {  // the sends, segment by segment, round robin over the ranks
    bool any = false;
    for (int r = 0; r < n; ++r) {
      if (r == me || k >= segments(r)) continue;
      any = true;
      s.check(MPI_Isend(inout.data() + begin(r) + k * seg, piece_count(r, k), type, r, tag_reduce, s.coll,
                        &s.requests[at++]),
              "MPI_Isend");
    }
    if (!any) break;
  }
  const auto fail_on_error = [&](std::size_t, int rc, const MPI_Status&) {
    if (rc != MPI_SUCCESS) throw comm_error(s.rank_text() + ": all_reduce: MPI error: " + error_text(rc));
  };
  for (std::size_t k = 0; k < my_segments; ++k) {
    s.await_requests(std::span(s.requests).subspan((k % 2) * un, un), "all_reduce", fail_on_error);
    T* const out = chunk + k * seg;
    const auto len = static_cast<std::size_t>(piece_count(me, k));
    // The fold may write over this rank's own piece while reading it only as piece 0 or 1;
    // a later rank's own piece goes to its (otherwise unused) slot first.
    if (me >= 2) std::memcpy(slot(k, me), out, len * sizeof(T));
    const auto piece = [&](int r) { return r == me && me < 2 ? out : slot(k, r); };
    fold_in_rank_order(out, len, n, piece, op);
    receive(k + 2);
  }
  s.await_requests(std::span(s.requests).subspan(2 * un), "all_reduce", fail_on_error);
  // All-gather: the sends above have completed, so the chunks may now be overwritten.
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
  const std::int64_t type_and_op =
      static_cast<std::int64_t>(element_kind_of<T>()) * 16 + static_cast<std::int64_t>(op);
  const descriptor mine = describe_call(s, collective_kind::all_reduce, static_cast<std::int64_t>(inout.size()), type_and_op);
  const auto n = static_cast<std::size_t>(s.size);
  if (s.size > 1 && s.exchange_agreement() && (n - 1) * inout.size_bytes() <= small_all_reduce_bytes) {
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
  agree(s, collective_kind::all_reduce, mine.values[0], "element count", mine.values[1], "element type or reduce_op");
  static_cast<void>(s.int_count(inout.size(), "all_reduce"));
  if (s.size > 1) all_reduce_in_chunks(s, inout, op);
}

}  // namespace baton::detail::comm::mpi
