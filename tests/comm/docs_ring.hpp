// The generic example of docs/communicators.md, shared by the local and MPI tests.
#pragma once

#include <baton/comm/concepts.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <vector>

// [doc:generic_ring]
// Written once against the capabilities it needs; runs on threads or MPI processes (and is
// meant for NCCL GPUs, where nothing has run yet).
// Every rank ends with every rank's block, passed around the ring with shift().
template <baton::ring_communicator C>
std::vector<float> ring_all_gather(C& comm, std::span<const float> mine) {
  const auto n = static_cast<std::size_t>(comm.size());
  const auto block = mine.size();
  std::vector<float> all(n * block);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(comm.rank()) * block);
  for (int step = 1; step < comm.size(); ++step) {
    // Send the block received last step to the next rank, receive the previous rank's.
    const auto send_from = static_cast<std::size_t>((comm.rank() - step + 1 + comm.size()) % comm.size());
    const auto recv_into = static_cast<std::size_t>((comm.rank() - step + comm.size()) % comm.size());
    auto transfer = baton::shift(comm, std::span<const float>(all.data() + send_from * block, block),
                                 std::span<float>(all.data() + recv_into * block, block), /*k=*/1, /*tag=*/step);
    // ... compute on the blocks already here while the transfer runs ...
    transfer.wait();
  }
  return all;
}
// [/doc:generic_ring]
