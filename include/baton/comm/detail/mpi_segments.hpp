// baton/comm/detail/mpi_segments.hpp — how mpi_communicator's all_reduce cuts the buffer into
// the messages of its reduce-scatter, and which calls send their data with the agreement: the
// sender decides both from its own arguments, and a rank in another call decides the same from
// the sender's descriptor (mpi_agreement.hpp), so it knows which message to expect and drop;
// the descriptor's element count and type-and-op word, written and read here alike.
#pragma once

#include <baton/comm/detail/elements.hpp>
#include <baton/comm/detail/reduce.hpp>
#include <baton/comm/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace baton::detail::comm::mpi {

/// An all_reduce of at most this many bytes times (ranks - 1) sends its data with the
/// agreement descriptor to every rank, instead of a reduce-scatter and an all-gather.
inline constexpr std::size_t small_all_reduce_bytes = std::size_t{64} << 10;
/// Whether an all_reduce of `count` elements of `bytes` each over `ranks` is small (above).
inline bool small_all_reduce(std::size_t count, std::size_t bytes, int ranks) noexcept {
  return static_cast<std::size_t>(ranks - 1) * count * bytes <= small_all_reduce_bytes;
}

/// The agreement's second value for an all_reduce: the element kind and the op in one word.
inline std::int64_t type_and_op_word(element_kind kind, reduce_op op) noexcept {
  return static_cast<std::int64_t>(kind) * 16 + static_cast<std::int64_t>(op);
}
/// The bytes of an element of the kind such a word names (0 for a word that names none).
inline std::size_t element_bytes_of_word(std::int64_t word) noexcept {
  if (word < 0 || word / 16 > static_cast<std::int64_t>(element_kind::int64)) return 0;
  return element_bytes(static_cast<element_kind>(word / 16));
}

/// A large all_reduce moves each rank's pieces in segments of at most this size, folding one
/// while the next arrives. Over shared memory (Open MPI's vader with CMA) the receiving
/// process copies each message itself, so a segment overlaps nothing and costs a handshake
/// (about 9 us: 64 KiB segments made a 1 MiB all_reduce of 2 ranks 50 us slower than 256 KiB
/// ones); few, large segments are fastest there (docs/communicators.md).
inline constexpr std::size_t all_reduce_segment_bytes = std::size_t{1} << 20;
/// ... and the scratch of 2 segments per rank stays within this, so a segment shrinks with
/// many ranks (256 KiB at 16).
inline constexpr std::size_t all_reduce_scratch_bytes = std::size_t{8} << 20;

/// The elements of one segment of an all_reduce of `count` elements of `bytes` each over
/// `ranks`: the same on every rank (count is agreed), never more than a chunk.
inline std::size_t all_reduce_segment(std::size_t count, std::size_t bytes, int ranks) noexcept {
  const auto n = static_cast<std::size_t>(ranks);
  const std::size_t most = std::min(all_reduce_segment_bytes, all_reduce_scratch_bytes / (2 * n));
  return std::max<std::size_t>(1, std::min(most / bytes, (count + n - 1) / n));
}

/// Whether a large all_reduce sends its first segments with its agreement descriptor, before
/// it knows that the other ranks agree: when every chunk is one segment, so that segment is
/// all the reduce-scatter sends (2 MiB in all at 2 ranks, 4 MiB at 4 or more). A separate
/// round trip of the agreement then costs 10-20 % of the call (docs/communicators.md); above
/// it a call takes long enough that the round trip is noise, and its later segments must wait
/// for the agreement anyway.
inline bool agreement_travels_with_data(std::size_t count, std::size_t bytes, int ranks) noexcept {
  const auto n = static_cast<std::size_t>(ranks);
  return count > 0 && bytes > 0 && !small_all_reduce(count, bytes, ranks) &&
         (count + n - 1) / n <= all_reduce_segment(count, bytes, ranks);
}

}  // namespace baton::detail::comm::mpi
