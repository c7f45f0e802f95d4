// The timing loops bench_comm (local world) and bench_comm_mpi (MPI, and raw MPI calls as
// the roof) share, so the same code measures every transport. Bandwidths follow nccl-tests:
// algbw = bytes / time; busbw = algbw for send/recv and algbw x 2(n-1)/n for all-reduce.
#pragma once

#include "bench_common.hpp"

#include <baton/comm/concepts.hpp>

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace bench_comm {

struct message_size {
  const char* name;
  std::size_t bytes;
  int iterations;  // per trial: each trial lasts about 10-100 ms on a 2-core machine
};

inline const message_size sizes[] = {{"4KiB", std::size_t{4} << 10, 2000},
                                     {"1MiB", std::size_t{1} << 20, 200},
                                     {"64MiB", std::size_t{64} << 20, 8}};

/// Seconds per `op()` on the calling rank, from a barrier before the first to a barrier after
/// the last (so the last message has arrived everywhere); one untimed op first warms up.
template <class Barrier, class Op>
double seconds_per_op(Barrier&& barrier, Op&& op, int iterations) {
  op();
  barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) op();
  barrier();
  return bench::seconds_since(start) / iterations;
}

/// One message of `buffer` from rank 0 to rank 1 (other ranks idle), through baton's
/// isend / irecv and wait.
template <class C>
void baton_p2p(C& c, std::vector<std::byte>& buffer) {
  if (c.rank() == 0) c.isend(std::span<const std::byte>(buffer), 1, 0).wait();
  if (c.rank() == 1) c.irecv(std::span(buffer), 0, 0).wait();
}

/// bytes / seconds in GB/s; busbw of an all-reduce over n ranks.
inline double gbps(std::size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }
inline double all_reduce_busbw(std::size_t bytes, double seconds, int n) {
  return gbps(bytes, seconds) * 2 * (n - 1) / n;
}

}  // namespace bench_comm
