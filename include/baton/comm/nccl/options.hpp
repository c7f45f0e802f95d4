// baton/comm/nccl/options.hpp — nccl_options: the settings of an nccl_communicator.
#pragma once

#include <chrono>
#include <cstddef>

namespace baton {

/// Settings of an nccl_communicator (inherited by communicators split from it).
struct nccl_options {
  /// The longest a host wait (a request's wait(), a collective) may block before it ends
  /// with comm_error. NCCL's own initialisation and split block until every rank joins.
  std::chrono::nanoseconds timeout = std::chrono::seconds(60);

  /// Host memory given to isend, irecv, shift, all_reduce or broadcast travels through a
  /// staging slot (pinned host + device buffer). All of them are made at construction:
  /// `staging_slots` is how many host transfers may be pending at once (a pending request
  /// holds its slot until wait() or test() sees it complete, or until it is destroyed and the
  /// GPU is past it), `staging_slot_bytes` the largest host message that fits one.
  std::size_t staging_slots = 32;
  std::size_t staging_slot_bytes = 16 * 1024;

  /// When no slot fits and no transfer of this communicator is pending, a slot is added
  /// (allocating pinned memory synchronises the whole device: with several communicators on
  /// one device, size the pool and set this to false). While a transfer is pending the pool
  /// never grows — that could deadlock — and the transfer throws comm_error naming the
  /// option to raise.
  bool staging_growth = true;
};

}  // namespace baton
