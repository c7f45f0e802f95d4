// baton/comm/detail/nccl_staging.hpp — how an nccl_communicator moves host memory: NCCL
// takes device buffers only, so a host send is copied into a pinned buffer and on to a device
// buffer before the transfer, and a host receive lands in a device buffer and is copied back
// to the pinned one. The bookkeeping (which slot, when the pool may grow) is
// detail/staging_pool.hpp; this header is its CUDA runtime.
#pragma once

#include <baton/comm/detail/nccl_support.hpp>
#include <baton/comm/detail/staging_pool.hpp>
#include <baton/comm/error.hpp>
#include <baton/core/cuda_check.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstring>
#include <span>
#include <string>

namespace baton::detail::comm::nccl {

/// Whether `p` is host memory NCCL must not be given directly (pageable, or pinned host
/// memory: the device buffers NCCL documents are cudaMalloc'd or managed).
inline bool host_memory(const void* p) noexcept {
  if (p == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();  // older runtimes report plain host memory as an error
    return true;
  }
  return attributes.type == cudaMemoryTypeUnregistered || attributes.type == cudaMemoryTypeHost;
}

/// The CUDA calls of a communicator's staging pool. Allocation happens only where the pool
/// allows it (in advance, or at a quiescent point); it is stream-ordered on the
/// communicator's main stream and waited for there, since the lanes use the memory too.
struct cuda_staging_runtime {
  struct memory {
    std::byte* device = nullptr;
    std::byte* pinned = nullptr;
  };
  using event = cudaEvent_t;
  using stream = cudaStream_t;

  cudaStream_t allocate_on = nullptr;
  std::string where;

  memory allocate(std::size_t bytes) {
    memory m;
    void* device = nullptr;
    cuda(cudaMallocAsync(&device, bytes, allocate_on), "cudaMallocAsync (staging)");
    m.device = static_cast<std::byte*>(device);
    void* pinned = nullptr;
    const cudaError_t synced = cudaStreamSynchronize(allocate_on);
    const cudaError_t made = synced == cudaSuccess ? cudaMallocHost(&pinned, bytes) : synced;
    if (made != cudaSuccess) {
      cudaFreeAsync(device, allocate_on);
      cuda(made, synced != cudaSuccess ? "cudaStreamSynchronize (staging)" : "cudaMallocHost (staging)");
    }
    m.pinned = static_cast<std::byte*>(pinned);
    return m;
  }
  void free(memory m) noexcept {
    if (m.device != nullptr) cudaFreeAsync(m.device, allocate_on);
    if (m.pinned != nullptr) cudaFreeHost(m.pinned);
  }
  event make_event() {
    cudaEvent_t e = nullptr;
    cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate (staging)");
    return e;
  }
  void destroy_event(event e) noexcept {
    if (e != nullptr) cudaEventDestroy(e);
  }
  void record(event e, stream s) { cuda(cudaEventRecord(e, s), "cudaEventRecord (staging)"); }
  bool try_record(event e, stream s) noexcept { return cudaEventRecord(e, s) == cudaSuccess; }
  bool passed(event e) const {
    const cudaError_t rc = cudaEventQuery(e);
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) cuda(rc, "cudaEventQuery (staging)");
    return false;
  }
  void to_device(const memory& m, std::span<const std::byte> bytes, stream s) {
    std::memcpy(m.pinned, bytes.data(), bytes.size());  // the slot's last transfer has passed
    cuda(cudaMemcpyAsync(m.device, m.pinned, bytes.size(), cudaMemcpyHostToDevice, s), "cudaMemcpyAsync (staging)");
  }
  void to_pinned(const memory& m, std::size_t bytes, stream s) {
    cuda(cudaMemcpyAsync(m.pinned, m.device, bytes, cudaMemcpyDeviceToHost, s), "cudaMemcpyAsync (staging)");
  }
  std::byte* pinned(const memory& m) const { return m.pinned; }
  std::byte* device(const memory& m) const { return m.device; }

 private:
  void cuda(cudaError_t rc, const char* call) const { detail::core::check_cuda<comm_error>(rc, where, call); }
};

using staging_pool = detail::comm::staging_pool<cuda_staging_runtime>;
using staging_lease = detail::comm::staging_lease<cuda_staging_runtime>;

/// One staging marker per point-to-point lane (p2p_lane: main, up, down).
inline constexpr std::size_t staging_lanes = 3;

}  // namespace baton::detail::comm::nccl
