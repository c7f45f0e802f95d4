// baton/comm/detail/reduce.hpp — the one elementwise reduction of every communicator, and
// how an all_reduce's buffer is cut into the chunks the ranks own.
//
// Floating-point sums depend on their order. The local world and MPI both have the owner of a
// chunk fold every rank's piece of it in rank order (0, 1, ..., n-1) with fold_in_rank_order,
// so an all_reduce gives bitwise the same result on every rank *and* on every transport: a
// program run as threads and as MPI processes computes the same bits.
#pragma once

#include <baton/comm/error.hpp>

#include <cstddef>
#include <cstring>

namespace baton::detail::comm {

/// out[j] = a[j] op b[j], for j < len. `out` may be `a` or `b`.
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

/// acc[j] = acc[j] op in[j], for j < len.
template <class T>
void combine(T* acc, const T* in, std::size_t len, reduce_op op) noexcept {
  combine_into(acc, acc, in, len, op);
}

/// out[j] = piece(0)[j] op piece(1)[j] op ... op piece(n-1)[j], folded left in rank order.
/// `out` may be piece(0) or piece(1) (each element is read before it is written), not a later one.
template <class T, class Piece>
void fold_in_rank_order(T* out, std::size_t len, int n, const Piece& piece, reduce_op op) {
  if (n == 1) {
    if (out != piece(0)) std::memcpy(out, piece(0), len * sizeof(T));
    return;
  }
  combine_into(out, piece(0), piece(1), len, op);
  for (int r = 2; r < n; ++r) combine(out, piece(r), len, op);
}

/// Where rank r's chunk of an all_reduce of `count` elements over n ranks starts (the chunk
/// ends where rank r + 1's starts): every transport cuts the buffer the same way.
[[nodiscard]] constexpr std::size_t chunk_begin(std::size_t count, int n, int r) noexcept {
  return count * static_cast<std::size_t>(r) / static_cast<std::size_t>(n);
}

}  // namespace baton::detail::comm
