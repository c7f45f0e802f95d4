// baton/comm/detail/reduce.hpp — the one elementwise reduction of every communicator.
//
// Floating-point sums depend on their order. The local world and MPI both have the owner of a
// chunk combine every rank's piece of it in rank order (0, 1, ..., n-1) with this function, so
// an all_reduce gives bitwise the same result on every rank *and* on every transport: a
// program run as threads and as MPI processes computes the same bits.
#pragma once

#include <baton/comm/error.hpp>

#include <cstddef>

namespace baton::detail::comm {

// acc[j] = acc[j] op in[j], for j < len.
template <class T>
void combine(T* acc, const T* in, std::size_t len, reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum:
      for (std::size_t j = 0; j < len; ++j) acc[j] += in[j];
      break;
    case reduce_op::max:
      for (std::size_t j = 0; j < len; ++j) acc[j] = acc[j] < in[j] ? in[j] : acc[j];
      break;
    case reduce_op::min:
      for (std::size_t j = 0; j < len; ++j) acc[j] = in[j] < acc[j] ? in[j] : acc[j];
      break;
  }
}

}  // namespace baton::detail::comm
