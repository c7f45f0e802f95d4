// baton/comm/detail/nccl_staging.hpp — how an nccl_communicator moves host memory: NCCL
// takes device buffers only, so a host send is copied into a pinned buffer and on to a device
// buffer before the transfer, and a host receive lands in a device buffer and is copied back
// to the pinned one; the slots are made in advance and reused once their transfer has passed.
#pragma once

#include <baton/comm/detail/nccl_support.hpp>
#include <baton/comm/error.hpp>
#include <baton/core/cuda_check.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace baton::detail::comm::nccl {

/// Pinned host memory and device memory of one staged host transfer. Owned by the
/// communicator; a request marks it busy while it refers to it, and `done` (recorded after the
/// transfer) must have passed before it is reused.
struct staging_slot {
  std::byte* device = nullptr;
  std::byte* pinned = nullptr;
  std::size_t capacity = 0;
  cudaEvent_t done = nullptr;
  bool busy = false;
};

/// Staging slots are made in advance, at construction: allocating pinned memory while NCCL
/// kernels of this rank wait for a peer may synchronise with them and deadlock.
inline constexpr std::size_t staging_slots_in_advance = 32;
inline constexpr std::size_t staging_slot_bytes = 16 * 1024;

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

/// The staging slots of one communicator. The slots are heap-allocated, so requests may
/// point at them while the pool moves with its communicator.
class staging_pool {
 public:
  /// Makes the slots of staging_slots_in_advance, on the communicator's own `stream` (every
  /// slot is allocated on it); `where` names the rank in errors.
  void make_in_advance(cudaStream_t stream, std::string where) {
    stream_ = stream;
    where_ = std::move(where);
    slots_.reserve(staging_slots_in_advance);
    for (std::size_t i = 0; i < staging_slots_in_advance; ++i) add(staging_slot_bytes);
  }

  /// Host data to send: copied into a slot and on to its device buffer (on `on`, before the
  /// transfer). nullptr when `data` is device memory (or empty): NCCL reads it directly.
  staging_slot* stage_send(std::span<const std::byte> data, cudaStream_t on) {
    if (data.empty() || !host_memory(data.data())) return nullptr;
    staging_slot* slot = acquire(data.size());
    std::memcpy(slot->pinned, data.data(), data.size());
    cuda(cudaMemcpyAsync(slot->device, slot->pinned, data.size(), cudaMemcpyHostToDevice, on), "cudaMemcpyAsync (staging)");
    return slot;
  }

  /// A host buffer to receive into: a slot whose device buffer NCCL fills (copy_back then
  /// brings it to the pinned buffer). nullptr for device memory.
  staging_slot* stage_recv(std::span<std::byte> data) {
    if (data.empty() || !host_memory(data.data())) return nullptr;
    return acquire(data.size());
  }

  /// A staged receive's device buffer back to its pinned one (on `on`, after the transfer).
  void copy_back(staging_slot* slot, std::size_t bytes, cudaStream_t on) const {
    if (slot == nullptr) return;
    cuda(cudaMemcpyAsync(slot->pinned, slot->device, bytes, cudaMemcpyDeviceToHost, on), "cudaMemcpyAsync (staging)");
  }

  /// After a collective's host wait: the staged result back into the host buffer.
  static void finish_blocking(staging_slot* slot, std::span<std::byte> host) noexcept {
    if (slot == nullptr) return;
    std::memcpy(host.data(), slot->pinned, host.size());
    slot->busy = false;
  }

  /// Frees every slot (the device buffers in the stream's order).
  void release() noexcept {
    for (auto& slot : slots_) {
      if (slot->done != nullptr) cudaEventDestroy(slot->done);
      if (slot->device != nullptr) cudaFreeAsync(slot->device, stream_);
      if (slot->pinned != nullptr) cudaFreeHost(slot->pinned);
    }
    slots_.clear();
  }

 private:
  void cuda(cudaError_t rc, const char* call) const { detail::core::check_cuda<comm_error>(rc, where_, call); }

  void add(std::size_t capacity) {
    auto slot = std::make_unique<staging_slot>();
    slot->capacity = capacity;
    slots_.push_back(std::move(slot));  // owned before anything is allocated: release() frees it on a throw
    auto& s = *slots_.back();
    void* device = nullptr;
    void* pinned = nullptr;
    // Stream-ordered (cudaMalloc may synchronise the device, see staging_slots_in_advance);
    // the lanes use it too, so the allocation is waited for here.
    cuda(cudaMallocAsync(&device, capacity, stream_), "cudaMallocAsync (staging)");
    s.device = static_cast<std::byte*>(device);
    cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (staging)");
    cuda(cudaMallocHost(&pinned, capacity), "cudaMallocHost (staging)");
    s.pinned = static_cast<std::byte*>(pinned);
    cuda(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate (staging)");
  }

  // A free slot of at least `bytes`, made when none is (see staging_slots_in_advance).
  staging_slot* acquire(std::size_t bytes) {
    for (auto& slot : slots_) {
      if (!slot->busy && slot->capacity >= bytes && cudaEventQuery(slot->done) == cudaSuccess) {
        slot->busy = true;
        return slot.get();
      }
    }
    add(std::max(bytes, staging_slot_bytes));
    slots_.back()->busy = true;
    return slots_.back().get();
  }

  std::vector<std::unique_ptr<staging_slot>> slots_;
  cudaStream_t stream_ = nullptr;
  std::string where_;
};

}  // namespace baton::detail::comm::nccl
