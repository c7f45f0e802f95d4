// baton/comm/nccl/request.hpp — nccl_request: a pending isend, irecv or shift on NCCL, a CUDA
// event recorded after the transfer that the host can wait for or another stream can wait on.
#pragma once

#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/nccl_staging.hpp>
#include <baton/comm/detail/nccl_support.hpp>
#include <baton/comm/detail/unique_state.hpp>
#include <baton/comm/error.hpp>
#include <baton/core/cuda_check.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstring>
#include <string>

namespace baton {

class nccl_communicator;

/// A pending isend, irecv or shift: a CUDA event recorded on the communicator's stream after
/// the transfer. Move-only. Destroying it does not cancel the transfer (NCCL cannot); the
/// caller's buffers must stay valid until the stream has passed it (a host transfer's
/// staging slot is kept from reuse until then by the pool).
class nccl_request {
 public:
  /// Blocks the host until the transfer is complete on the GPU, or throws comm_error
  /// (timeout, CUDA or NCCL error) naming rank, peer and tag.
  void wait() {
    if (s_->event == nullptr) return;
    const auto deadline = detail::comm::deadline_after(s_->timeout);
    orphan_check();
    if (!detail::comm::poll_until([&] { return detail::comm::nccl::event_done(s_->event, s_->comm, s_->what); }, deadline)) {
      throw comm_error(s_->what + " timed out after " + detail::comm::seconds_text(s_->timeout) + ": " + s_->peer_text +
                       " has not completed the matching transfer (NCCL matches transfers between two ranks in issue "
                       "order; check both ranks issue them alike), or raise nccl_options::timeout; NCCL cannot cancel "
                       "it: call nccl_communicator::abort()");
    }
    finish();
  }

  /// True once the transfer is complete; never blocks.
  bool test() {
    if (s_->event == nullptr) return true;
    orphan_check();
    if (!detail::comm::nccl::event_done(s_->event, s_->comm, s_->what)) return false;
    finish();
    return true;
  }

  /// Makes `stream` wait for the transfer on the GPU, without blocking the host. The
  /// request stays pending (wait() or test() still apply).
  void wait_on(cudaStream_t stream) const {
    if (s_->event != nullptr) {
      detail::core::check_cuda<comm_error>(cudaStreamWaitEvent(stream, s_->event, 0), s_->what, "cudaStreamWaitEvent");
    }
  }

 private:
  friend class nccl_communicator;

  // Everything a request holds, moved as a whole (a moved-from request is an empty one) and
  // released when the request is destroyed.
  struct state {
    cudaEvent_t event = nullptr;
    // A host transfer's staging slot, owned until the request ends: its `done` event was
    // recorded after the transfer, so whenever the request ends (complete, dropped, or on an
    // exception path) the pool hands the slot out again only once the GPU got past it.
    detail::comm::nccl::staging_lease staging;
    std::byte* host_destination = nullptr;  // a host irecv: copied here when complete
    std::size_t host_bytes = 0;
    ncclComm_t comm = nullptr;
    std::string what;       // "rank 1: irecv from peer 0 (tag 3, 64 bytes)"
    std::string peer_text;  // "peer 0"
    std::chrono::nanoseconds timeout{};

    void destroy() noexcept {
      if (event != nullptr) cudaEventDestroy(event);  // released once the event has passed
      event = nullptr;
      staging.reset();
      host_destination = nullptr;
      host_bytes = 0;
    }
  };

  // A host transfer's communicator (with its staging memory and NCCL handles) is gone.
  void orphan_check() const {
    if (s_->staging.orphaned()) {
      throw comm_error(s_->what + ": its nccl_communicator was destroyed before the request completed; wait for "
                                  "every request before destroying (or moving onto) the communicator");
    }
  }

  // The transfer is complete: a staged host receive is copied into place.
  void finish() noexcept {
    if (s_->host_destination != nullptr && s_->staging && s_->host_bytes != 0) {
      std::memcpy(s_->host_destination, s_->staging.pinned(), s_->host_bytes);
    }
    s_->destroy();
  }

  detail::comm::unique_state<state, &state::destroy> s_;
};

}  // namespace baton
