// baton/comm/detail/mpi_agreement.hpp — the pieces of mpi_communicator's collectives that
// need no communicator: the fingerprint every rank sends before (or with) a collective, the
// buffers baton's own messages use, and the rank-ordered fold of an all_reduce.
//
// The agreement. Before a collective each rank sends every other rank a 32-byte header: the
// collective's kind, its two arguments that must match (sizes, element type and op, root)
// and the problem the rank found in its own arguments, if any. The headers travel as point
// to point messages on a duplicate communicator of baton's own, one message and one receive
// per pair of ranks whatever the collective, so two ranks in different collectives still
// match each other's message: a size that differs shows as a short or a truncated message,
// which MPI reports (unlike a collective called with different counts, which is undefined).
// If every header equals this rank's, every rank's equals every other's, so either all ranks
// go on or all see a mismatch; on a mismatch one more all-reduce of the fingerprints gives
// every rank the same error text. A small all_reduce sends its data in the header's message:
// the agreement then costs no round trip of its own.
#pragma once

#include <baton/comm/detail/reduce.hpp>
#include <baton/comm/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

namespace baton::detail::comm::mpi {

/// What a rank sends before a collective. `flag` is (rank + 1) * 64 + problem, or 0: the
/// problem this rank found in its own arguments (a wrong receive size, ...).
struct header {
  std::int64_t kind = 0;
  std::int64_t a = 0;
  std::int64_t b = 0;
  std::int64_t flag = 0;

  /// The same collective with the same arguments (flags may differ: each rank finds its own).
  [[nodiscard]] bool same_call(const header& other) const noexcept {
    return kind == other.kind && a == other.a && b == other.b;
  }
};
static_assert(sizeof(header) == 32, "the header travels as 32 raw bytes");

inline constexpr std::size_t header_bytes = sizeof(header);

// Tags of baton's own messages on the collectives' communicator; a rank's messages of one
// tag arrive in the order sent, and a rank starts the next collective's messages only after
// every other rank's message of this one has arrived, so messages never cross collectives.
inline constexpr int tag_header = 1;  // the agreement (and a small all_reduce's data)
inline constexpr int tag_reduce = 2;  // all_reduce: a rank's piece of another rank's chunk
inline constexpr int tag_gather = 3;  // all_reduce: a reduced chunk, to every other rank

/// A buffer that grows and is kept between calls, so a repeated collective neither
/// allocates nor page-faults. `leak()` abandons it (MPI may still write into it after a
/// collective timed out) and starts a new one.
class scratch_buffer {
 public:
  [[nodiscard]] std::byte* get(std::size_t bytes) {
    if (bytes > size_) {
      data_.reset();  // freed before the larger one is taken: the peak stays one buffer
      data_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
      size_ = bytes;
    }
    return data_.get();
  }
  void leak() noexcept {
    static_cast<void>(data_.release());
    size_ = 0;
  }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t size_ = 0;
};

/// out[j] = a[j] op b[j]: detail::comm::combine(a, b) written to `out`, with combine's very
/// expressions (so the same bits, NaNs and signed zeros included). `out` may be `a` or `b`.
template <class T>
void combine_into(T* out, const T* a, const T* b, std::size_t len, reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      for (std::size_t j = 0; j < len; ++j) out[j] = a[j] + b[j];
      break;
    case reduce_op::max:
      for (std::size_t j = 0; j < len; ++j) out[j] = a[j] < b[j] ? b[j] : a[j];
      break;
    case reduce_op::min:
      for (std::size_t j = 0; j < len; ++j) out[j] = b[j] < a[j] ? b[j] : a[j];
      break;
  }
}

/// out[j] = piece(0)[j] op piece(1)[j] op ... op piece(n-1)[j], folded left in rank order —
/// the order of the local world's all_reduce, so the bits are the same on threads and over MPI.
/// `out` may be piece(0) or piece(1) (each element is read before it is written), not a later one.
template <class T, class Piece>
void fold_in_rank_order(T* out, std::size_t len, int n, const Piece& piece, reduce_op op) {
  if (n == 1) {
    if (out != piece(0)) std::memcpy(out, piece(0), len * sizeof(T));
    return;
  }
  combine_into(out, piece(0), piece(1), len, op);
  for (int r = 2; r < n; ++r) detail::comm::combine(out, piece(r), len, op);
}

/// Where rank r's chunk of an all_reduce of `count` elements over n ranks starts.
[[nodiscard]] constexpr std::size_t chunk_begin(std::size_t count, int n, int r) noexcept {
  return count * static_cast<std::size_t>(r) / static_cast<std::size_t>(n);
}

}  // namespace baton::detail::comm::mpi
