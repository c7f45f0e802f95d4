// baton/comm/nccl/options.hpp — nccl_options: the settings of an nccl_communicator.
#pragma once

#include <chrono>

namespace baton {

/// Settings of an nccl_communicator (inherited by communicators split from it).
struct nccl_options {
  /// The longest a host wait (a request's wait(), a collective) may block before it ends
  /// with comm_error. NCCL's own initialisation and split block until every rank joins.
  std::chrono::nanoseconds timeout = std::chrono::seconds(60);
};

}  // namespace baton
