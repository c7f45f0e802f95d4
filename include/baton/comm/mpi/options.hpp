// baton/comm/mpi/options.hpp — mpi_options: the settings of an mpi_communicator.
#pragma once

#include <chrono>

namespace baton {

/// Settings of an mpi_communicator (inherited by communicators split from it).
struct mpi_options {
  /// The longest any wait (a request's wait(), a collective) may block before it ends with
  /// comm_error. After a collective times out the communicator refuses further collectives.
  std::chrono::nanoseconds timeout = std::chrono::seconds(60);
  /// Before each collective, the ranks check that every rank called the same collective
  /// with the same sizes, element type, root and op, so a mismatch is the same comm_error on
  /// every rank instead of undefined behaviour. all_to_all_v also checks its counts against
  /// the senders'. A small all_reduce carries the check in its own messages (free); other
  /// collectives pay one small exchange (a latency); turn off once a program is known good.
  bool check_collectives = true;
  /// Up to this many ranks the check is an exchange of agreement descriptors between every
  /// pair of ranks (one round trip, and none of its own for a small all_reduce); above it,
  /// one MPI all-reduce of the descriptors' fields (log n steps) before each collective.
  int exchange_agreement_max_ranks = 16;
};

}  // namespace baton
