// baton/comm/detail/nccl_support.hpp — the small pieces of the NCCL backend that need no
// communicator: NCCL's error report, NCCL's names of an element kind and a reduce_op, the
// completion test of a recorded event, the point-to-point lanes, and the current device.
#pragma once

#include <baton/config.hpp>

#if !BATON_HAS_NCCL()
#error "baton/comm/nccl.hpp needs NCCL and CUDA: link baton::nccl (find_package(baton COMPONENTS nccl)); NCCL ships with the CUDA toolkit under /usr/local/cuda, or install libnccl-dev"
#endif

#include <baton/comm/detail/elements.hpp>
#include <baton/comm/error.hpp>
#include <baton/core/cuda_check.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "baton/comm/nccl.hpp needs NCCL 2.18 or newer (for ncclCommSplit); install a newer NCCL"
#endif

#include <cstddef>
#include <string>

namespace baton::detail::comm::nccl {

/// "<where>: <call> failed: <NCCL's text> (<the communicator's last error>)".
inline void check_nccl(ncclResult_t rc, ncclComm_t comm, const std::string& where, const char* call) {
  if (rc != ncclSuccess) {
    const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
    throw comm_error(where + ": " + call + " failed: " + ncclGetErrorString(rc) +
                     (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string()));
  }
}

inline ncclDataType_t datatype_of(element_kind kind) noexcept {
  constexpr ncclDataType_t types[] = {ncclFloat32, ncclFloat64, ncclInt32, ncclInt64};  // element_kind's order
  return types[static_cast<std::size_t>(kind)];
}

inline ncclRedOp_t op_of(reduce_op op) noexcept {
  constexpr ncclRedOp_t ops[] = {ncclSum, ncclMax, ncclMin};  // reduce_op's order
  return ops[static_cast<std::size_t>(op)];
}

/// True once `event` has passed; throws on a CUDA error or an asynchronous NCCL error.
inline bool event_done(cudaEvent_t event, ncclComm_t comm, const std::string& where) {
  const cudaError_t rc = cudaEventQuery(event);
  if (rc == cudaSuccess) return true;
  if (rc != cudaErrorNotReady) detail::core::check_cuda<comm_error>(rc, where, "cudaEventQuery");
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
    check_nccl(async, comm, where, "NCCL (asynchronous error)");
  }
  return false;
}

/// The point-to-point lane a message travels on: to a higher rank (up), to a lower rank
/// (down), or to oneself (the main communicator). The sender classifies a message by its
/// destination and the receiver by its source; both must get the same lane.
enum class p2p_lane { main, up, down };

constexpr p2p_lane lane_of_send(int rank, int dest) noexcept {
  return dest > rank ? p2p_lane::up : dest < rank ? p2p_lane::down : p2p_lane::main;
}
constexpr p2p_lane lane_of_recv(int rank, int source) noexcept {
  return source < rank ? p2p_lane::up : source > rank ? p2p_lane::down : p2p_lane::main;
}

/// Empty, or why `what` (isend or irecv) with `peer` == `rank` is refused: NCCL pairs a send
/// to oneself only with the receive of the same group, so a standalone send to oneself blocks
/// its stream before the receive is enqueued behind it, and the rank hangs. shift puts both in
/// one group, so a shift onto oneself (one rank, or k a multiple of size()) works.
inline std::string self_transfer_problem(const std::string& where, const char* what, int rank, int peer) {
  if (peer != rank) return {};
  return where + ": " + what + " with peer " + std::to_string(peer) +
         " (this rank) is refused on NCCL: a send to oneself only completes with its receive in the same group, so "
         "a standalone one would hang; use shift() (one group), or copy the data on the device (cudaMemcpyAsync)";
}

/// A point-to-point lane: the communicator and stream transfers with one peer travel on.
struct lane {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
};

/// Makes `device` current for the calling thread and restores the previous one on exit.
class device_scope {
 public:
  device_scope(int device, const std::string& where) {
    detail::core::check_cuda<comm_error>(cudaGetDevice(&previous_), where, "cudaGetDevice");
    if (previous_ != device) detail::core::check_cuda<comm_error>(cudaSetDevice(device), where, "cudaSetDevice");
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace baton::detail::comm::nccl
