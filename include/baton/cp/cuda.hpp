// baton/cp/cuda.hpp — ring, Ulysses and hybrid attention on CUDA device memory.
//
// cuda_device_memory is the context-parallel layer's memory space (cp/memory.hpp) on one
// CUDA stream: buffers from cudaMallocAsync (the driver's stream-ordered pool), copies,
// fills, accumulations and merges as kernels on the stream, and transfers ordered after
// that work. Including this header maps CUDA backends
// (any backend with a `stream()` member returning a cudaStream_t, as baton::cuda_attention
// has) to it — by that member, so this header names no backend and needs none — so
//
//     baton::ring_attention ring(nccl_comm, baton::cuda_attention(...), sharding);
//
// keeps its buffers on the device and takes q, k, v, out, lse (and the gradients) as views
// of device memory. The backend must run on the memory space's stream: the stream comes from
// the backend's `stream()`. The communicator may use its own streams.
//
// Ring transfers over nccl_communicator make no host synchronisation per step: before a
// shift the communicator's streams wait for an event recorded on this stream
// (order_before -> nccl_communicator::enqueue_after), and where the ring needs a
// transfer's data this stream waits for the request's event (order_after ->
// nccl_request::wait_on). The host queues every step while the GPU orders them; the
// requests are waited for on the host once, at the end of the ring call, with the
// communicator's timeout. The host synchronisations that remain, and why:
//  - the end of every forward / backward call (front_end): the results are complete when
//    the call returns, which is every memory space's contract;
//  - the agreement (with_host_bytes): its descriptors are host bytes, read on the host;
//  - before a transfer over a communicator that takes no stream (anything but NCCL: the
//    communicator concepts take spans, not streams), and around Ulysses' all-to-alls
//    (nccl_communicator's collectives block the host until they complete anyway): once or
//    twice per call, not per ring step;
//  - in cuda_attention, a tile plan upload on a cache miss (a copy from pageable memory
//    waits for the stream) and growing its workspace (freeing waits): neither happens in a
//    ring's steady state (attention/cuda/plan_cache.hpp; the ring reserves the workspace
//    before its first step).
//
// The kernels (cp/detail/cuda_kernels.cuh) need nvcc: a translation unit that instantiates
// a copy, fill, accumulation or merge of this memory space must be CUDA (.cu). Compiled with
// g++ this header still declares everything (so that host code can name the types), and an
// instantiation that would launch a kernel is a compile error saying so.
//
// Status: compiled (g++ and nvcc, sm_80 / sm_90); passed its tests on one H200 (2026-12-04,
// ranks as threads on one device); over NCCL between GPUs, and so the event ordering above
// across devices, never run yet. On the CPU: what each kernel thread does
// (cp/detail/cuda_elementwise.hpp) against host_memory, over every index
// (tests/cp/test_cp_cuda_elementwise.cpp), and the layer's use of a memory space through a
// fake device whose memory host code cannot touch, with and without the stream-ordered
// transfer hooks (tests/cp/test_cp_memory.cpp).
// The device test is tests/cp/test_cp_nccl_gpu.cu.
#pragma once

#include <baton/config.hpp>
#include <baton/core/cuda_annotations.hpp>
#include <baton/core/cuda_check.hpp>
#include <baton/cp/detail/cuda_elementwise.hpp>
#include <baton/cp/detail/bshd.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/memory.hpp>
#include <baton/cp/merge.hpp>

#include <cuda_runtime.h>

#if BATON_CUDA_COMPILATION()
#include <baton/cp/detail/cuda_kernels.cuh>
#endif

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace baton {

namespace detail::cp::cuda_memory {

template <class>
inline constexpr bool compiled_by_nvcc = false;

}  // namespace detail::cp::cuda_memory

/// n elements of T in device memory, allocated and freed in order on a stream
/// (cudaMallocAsync / cudaFreeAsync). Move-only. Its contents start undefined.
template <class T>
class cuda_device_buffer {
 public:
  cuda_device_buffer() = default;
  cuda_device_buffer(std::size_t n, cudaStream_t stream) : size_(n), stream_(stream) {
    if (n == 0) return;
    void* p = nullptr;
    detail::core::check_cuda<cp_error>(cudaMallocAsync(&p, n * sizeof(T), stream), "baton::cuda_device_memory",
                                       "cudaMallocAsync");
    data_ = static_cast<T*>(p);
  }
  cuda_device_buffer(cuda_device_buffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)), stream_(other.stream_) {}
  cuda_device_buffer& operator=(cuda_device_buffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      stream_ = other.stream_;
    }
    return *this;
  }
  cuda_device_buffer(const cuda_device_buffer&) = delete;
  cuda_device_buffer& operator=(const cuda_device_buffer&) = delete;
  ~cuda_device_buffer() { reset(); }

  T* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }

 private:
  void reset() noexcept {
    // Stream-ordered: the memory returns to the pool once the stream has passed the work
    // already issued on it. (Transfers on another stream have been waited for by then.)
    if (data_ != nullptr) (void)cudaFreeAsync(data_, stream_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  std::size_t size_ = 0;
  cudaStream_t stream_ = nullptr;
};

/// The context-parallel layer's memory space on a CUDA stream (see the file comment).
class cuda_device_memory {
 public:
  static constexpr cp_memory_location location = cp_memory_location::cuda_device;

  template <class T>
  using buffer = cuda_device_buffer<T>;

  /// On the legacy default stream.
  cuda_device_memory() = default;
  /// On `stream`, which must be the backend's.
  explicit cuda_device_memory(cudaStream_t stream) noexcept : stream_(stream) {}

  cudaStream_t stream() const noexcept { return stream_; }

  template <class T>
  buffer<T> allocate(std::size_t n) {
    return buffer<T>(n, stream_);
  }

  template <class T>
  void fill(std::span<T> dst, T value) {
    if (dst.empty()) return;
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &value, sizeof(T));
    bool zero = true;
    for (unsigned char b : bytes) zero = zero && b == 0;
    if (zero) {  // all-zero bytes (0, +0.0, std::byte{0}): no kernel needed
      detail::core::check_cuda<cp_error>(cudaMemsetAsync(dst.data(), 0, dst.size_bytes(), stream_),
                                         "baton::cuda_device_memory", "cudaMemsetAsync");
      return;
    }
#if BATON_CUDA_COMPILATION()
    detail::cp::cuda::launch_fill<T>(dst.data(), static_cast<std::int64_t>(dst.size()), value, stream_);
#else
    static_assert(detail::cp::cuda_memory::compiled_by_nvcc<T>,
                  "baton::cuda_device_memory launches kernels: compile this translation unit with nvcc (.cu)");
#endif
  }

  template <class U, class T>
  void copy(const tensor_view<const U, 4>& src, const tensor_view<T, 4>& dst,
            cp_copy_mode mode = cp_copy_mode::exact) {
#if BATON_CUDA_COMPILATION()
    detail::cp::cuda::launch_copy<U, T, cp_accumulator_t<T>>(src, dst, mode == cp_copy_mode::through_accumulator,
                                                             stream_);
#else
    (void)src, (void)dst, (void)mode;
    static_assert(detail::cp::cuda_memory::compiled_by_nvcc<T>,
                  "baton::cuda_device_memory launches kernels: compile this translation unit with nvcc (.cu)");
#endif
  }

  template <class A, class T>
  void accumulate(const tensor_view<A, 4>& acc, const tensor_view<const T, 4>& src) {
#if BATON_CUDA_COMPILATION()
    detail::cp::cuda::launch_accumulate<A, T>(acc, src, stream_);
#else
    (void)acc, (void)src;
    static_assert(detail::cp::cuda_memory::compiled_by_nvcc<T>,
                  "baton::cuda_device_memory launches kernels: compile this translation unit with nvcc (.cu)");
#endif
  }

  template <class A, class T, class L>
  void merge(const tensor_view<A, 4>& out, const tensor_view<A, 4>& lse, const tensor_view<const T, 4>& out_b,
             const tensor_view<const L, 4>& lse_b) {
#if BATON_CUDA_COMPILATION()
    detail::cp::cuda::launch_merge<A, T, L>(out, lse, out_b, lse_b, stream_);
#else
    (void)out, (void)lse, (void)out_b, (void)lse_b;
    static_assert(detail::cp::cuda_memory::compiled_by_nvcc<T>,
                  "baton::cuda_device_memory launches kernels: compile this translation unit with nvcc (.cu)");
#endif
  }

  /// The communicator's next transfers start on the GPU after the work queued on this
  /// stream so far, and the host does not wait: for a communicator that takes a stream to
  /// order after (nccl_communicator::enqueue_after). The ring calls it before each transfer
  /// instead of synchronize() (detail::cp::before_transfer).
  template <class Ring>
    requires requires(Ring& r, cudaStream_t s) { r.enqueue_after(s); }
  void order_before(Ring& ring) {
    ring.enqueue_after(stream_);
  }
  /// Work queued on this stream from now on starts after the transfer, and the host does not
  /// wait: for a request that a stream can wait on (nccl_request::wait_on). The ring calls
  /// it where it would wait for a transfer, and waits for the requests on the host once, at
  /// the end of its call (detail::cp::transfer_settler).
  template <class Request>
    requires requires(Request& r, cudaStream_t s) { r.wait_on(s); }
  void order_after(Request& request) {
    request.wait_on(stream_);
  }

  /// Waits until the stream has done everything issued on it (kernels, and the backend's work
  /// when it shares the stream): before a transfer when the communicator cannot be ordered
  /// after the stream, around the agreement's staged bytes, and at the end of each call.
  void synchronize() {
    detail::core::check_cuda<cp_error>(cudaStreamSynchronize(stream_), "baton::cuda_device_memory",
                                       "cudaStreamSynchronize");
  }

  /// The agreement's host descriptors, staged through device buffers for the communicator.
  template <class F>
  void with_host_bytes(std::span<const std::byte> send, std::span<std::byte> recv, F&& f) {
    buffer<std::byte> device_send(send.size(), stream_), device_recv(recv.size(), stream_);
    if (!send.empty())
      detail::core::check_cuda<cp_error>(
          cudaMemcpyAsync(device_send.data(), send.data(), send.size(), cudaMemcpyHostToDevice, stream_),
          "baton::cuda_device_memory", "cudaMemcpyAsync (host to device)");
    synchronize();
    f(std::span<const std::byte>(device_send.data(), send.size()), std::span<std::byte>(device_recv.data(), recv.size()));
    if (!recv.empty())
      detail::core::check_cuda<cp_error>(
          cudaMemcpyAsync(recv.data(), device_recv.data(), recv.size(), cudaMemcpyDeviceToHost, stream_),
          "baton::cuda_device_memory", "cudaMemcpyAsync (device to host)");
    synchronize();
  }

  /// Empty when `data` is device (or managed) memory of the current device, else why not.
  std::string check_tensor(const void* data, const char* name) const {
    cudaPointerAttributes attributes{};
    if (cudaPointerGetAttributes(&attributes, data) != cudaSuccess) {
      (void)cudaGetLastError();  // older runtimes report unregistered host memory as an error
      attributes.type = cudaMemoryTypeUnregistered;
    }
    if (attributes.type == cudaMemoryTypeManaged) return {};
    if (attributes.type != cudaMemoryTypeDevice) {
      return std::string("tensor '") + name +
             "' is host memory, but this context-parallel attention runs on the CUDA device (its backend is a CUDA "
             "backend, its memory space cuda_device_memory): pass views of device memory (cudaMalloc)";
    }
    int current = 0;
    if (cudaGetDevice(&current) == cudaSuccess && attributes.device != current) {
      return std::string("tensor '") + name + "' is memory of CUDA device " + std::to_string(attributes.device) +
             " but this rank runs on device " + std::to_string(current) +
             "; pass tensors of the rank's own device (cudaSetDevice before allocating)";
    }
    return {};
  }

 private:
  cudaStream_t stream_ = nullptr;
};

static_assert(cp_memory_space<cuda_device_memory>);

namespace detail::cp {

/// A backend that says which CUDA stream it runs on.
template <class B>
concept cuda_stream_backend = requires(const B& b) {
  { b.stream() } -> std::convertible_to<cudaStream_t>;
};

}  // namespace detail::cp

/// CUDA backends keep their tensors on the device: their memory space is cuda_device_memory
/// on the backend's stream.
template <class Backend>
  requires detail::cp::cuda_stream_backend<Backend>
struct cp_memory_space_of<Backend> {
  using type = cuda_device_memory;
  static type make(const Backend& backend) { return type(static_cast<cudaStream_t>(backend.stream())); }
};

}  // namespace baton
