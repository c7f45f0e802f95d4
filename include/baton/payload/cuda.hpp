// baton/payload/cuda.hpp — a device-memory tensor (baton::cuda::device_tensor<T>) and its
// payload_traits, so that the pipeline executor sends and receives it through
// nccl_communicator with receive pools in device memory.
//
//   cudaSetDevice(rank);                                   // one device per thread
//   auto x = baton::cuda::device_tensor<float>::from_host({4, 64}, host_values);
//   auto parts = baton::split_microbatches(x, 2);          // two device tensors {2, 64}
//   std::vector<float> back = parts[1].to_host();
//
// Compiled by g++ and nvcc against baton::cuda, CPU-tested through its plain C++ parts
// (detail/pitched_copies.hpp, the executor's host_accessible routing); it has NOT yet run on
// a GPU (tests/pipeline/test_pipeline_nccl_gpu.cpp is the test that will).
//
// Streams. Every operation here (allocate, zero, copy, slice, concat, scale, free) runs on
// baton::cuda::payload_stream() — the calling thread's per-thread default stream unless a
// payload_stream_scope names another — and, except the free, is complete on the device when
// it returns (the stream is synchronised). Nothing here ever synchronises the whole device:
// with NCCL kernels of this rank pending (a receive posted before its sender is ready),
// cudaDeviceSynchronize or cudaFree would wait for them and could deadlock the pipeline;
// memory therefore comes from the stream-ordered allocator (cudaMallocAsync / cudaFreeAsync).
// Do not make the communicator's stream the payload stream, for the same reason.
// The rule for stages: data a stage writes on its own stream must be complete (synchronise
// that stream) before the stage returns, since the executor hands it to NCCL on another.
//
// Element types: float, double, std::int32_t, std::int64_t (as host_tensor). A tensor lives
// on the device that was current when it was allocated; use it from threads whose current
// device is that one.
#pragma once

#include <baton/config.hpp>

#if !BATON_HAS_CUDA()
#error "baton/payload/cuda.hpp needs the CUDA runtime: link baton::cuda (find_package(baton COMPONENTS cuda)); the CUDA toolkit installs it under /usr/local/cuda"
#else

#include <baton/core/cuda_check.hpp>
#include <baton/core/sizes.hpp>
#include <baton/payload/detail/pitched_copies.hpp>
#include <baton/payload/detail/pitched_traits.hpp>
#include <baton/payload/detail/row_major.hpp>
#include <baton/payload/traits.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton::cuda {

/// A CUDA runtime call failed; the message names the call and CUDA's error.
class cuda_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace baton::cuda

namespace baton::detail::payload::cuda {

inline cudaStream_t& payload_stream_slot() noexcept {
  thread_local cudaStream_t stream = cudaStreamPerThread;
  return stream;
}

}  // namespace baton::detail::payload::cuda

namespace baton::cuda {

/// The stream device payload operations of the calling thread run on.
inline cudaStream_t payload_stream() noexcept { return detail::payload::cuda::payload_stream_slot(); }

/// Makes `stream` the calling thread's payload stream until the scope ends. Never pass the
/// stream of an nccl_communicator (see the file comment).
class payload_stream_scope {
 public:
  explicit payload_stream_scope(cudaStream_t stream) noexcept
      : previous_(detail::payload::cuda::payload_stream_slot()) {
    detail::payload::cuda::payload_stream_slot() = stream;
  }
  payload_stream_scope(const payload_stream_scope&) = delete;
  payload_stream_scope& operator=(const payload_stream_scope&) = delete;
  ~payload_stream_scope() { detail::payload::cuda::payload_stream_slot() = previous_; }

 private:
  cudaStream_t previous_;
};

/// A non-owning view of a row-major device array: what a kernel launcher takes.
template <class T>
struct device_view {
  T* data = nullptr;
  std::vector<std::int64_t> shape;

  [[nodiscard]] std::int64_t size() const noexcept {
    std::int64_t n = 1;
    for (auto e : shape) n *= e;
    return n;
  }
};

/// An owning, contiguous, row-major tensor in device memory. Move-only (copies are explicit:
/// clone()). The shape is fixed at construction; {} is a scalar, the default tensor is {0}.
template <class T>
class device_tensor {
  static_assert(baton::detail::payload::own_tensor_element_v<T>,
                "baton::cuda::device_tensor<T> holds float, double, std::int32_t, std::int64_t or "
                "baton::bfloat16 (as host_tensor); for other element types give your own device type payload_traits");

 public:
  using value_type = T;

  device_tensor() : shape_{0} {}

  /// A zero-filled tensor of `shape` on the current device.
  explicit device_tensor(std::vector<std::int64_t> shape) : device_tensor(std::move(shape), for_overwrite_tag{}) {
    if (data_ != nullptr) {
      check(cudaMemsetAsync(data_, 0, bytes_size(), payload_stream()), what(), "cudaMemsetAsync");
    }
    synchronise();
  }

  /// A tensor whose elements are indeterminate until written (about to be overwritten).
  static device_tensor for_overwrite(std::vector<std::int64_t> shape) {
    return device_tensor(std::move(shape), for_overwrite_tag{});
  }

  /// A device copy of `values` (row-major; their number must match the shape).
  static device_tensor from_host(std::vector<std::int64_t> shape, std::span<const T> values) {
    device_tensor t(std::move(shape), for_overwrite_tag{});
    t.copy_from_host(values);
    return t;
  }

  device_tensor(const device_tensor&) = delete;
  device_tensor& operator=(const device_tensor&) = delete;
  device_tensor(device_tensor&& other) noexcept
      : shape_(std::exchange(other.shape_, std::vector<std::int64_t>{0})),
        size_(std::exchange(other.size_, 0)),
        data_(std::exchange(other.data_, nullptr)) {}
  device_tensor& operator=(device_tensor&& other) noexcept {
    if (this != &other) {
      release();
      shape_ = std::exchange(other.shape_, std::vector<std::int64_t>{0});
      size_ = std::exchange(other.size_, 0);
      data_ = std::exchange(other.data_, nullptr);
    }
    return *this;
  }
  ~device_tensor() { release(); }

  /// A deep copy on the same device.
  [[nodiscard]] device_tensor clone() const {
    device_tensor out(shape_, for_overwrite_tag{});
    if (data_ != nullptr) {
      check(cudaMemcpyAsync(out.data_, data_, bytes_size(), cudaMemcpyDeviceToDevice, payload_stream()), what(),
            "cudaMemcpyAsync");
    }
    out.synchronise();
    return out;
  }

  /// Overwrites every element with `values` (size() of them), host to device.
  void copy_from_host(std::span<const T> values) {
    if (static_cast<std::int64_t>(values.size()) != size_) {
      throw payload_error(what() + ": copy_from_host got " + std::to_string(values.size()) + " values for shape " +
                          baton::detail::core::shape_text(shape_) + " (" + std::to_string(size_) + " elements)");
    }
    if (data_ != nullptr) {
      check(cudaMemcpyAsync(data_, values.data(), bytes_size(), cudaMemcpyHostToDevice, payload_stream()), what(),
            "cudaMemcpyAsync");
    }
    synchronise();
  }

  /// Copies every element into `out` (size() of them), device to host.
  void copy_to_host(std::span<T> out) const {
    if (static_cast<std::int64_t>(out.size()) != size_) {
      throw payload_error(what() + ": copy_to_host got room for " + std::to_string(out.size()) + " values; shape " +
                          baton::detail::core::shape_text(shape_) + " holds " + std::to_string(size_));
    }
    if (data_ != nullptr) {
      check(cudaMemcpyAsync(out.data(), data_, bytes_size(), cudaMemcpyDeviceToHost, payload_stream()), what(),
            "cudaMemcpyAsync");
    }
    synchronise();
  }

  /// The elements, copied to the host.
  [[nodiscard]] std::vector<T> to_host() const {
    std::vector<T> out(static_cast<std::size_t>(size_));
    copy_to_host(out);
    return out;
  }

  [[nodiscard]] const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  [[nodiscard]] int rank() const noexcept { return static_cast<int>(shape_.size()); }
  [[nodiscard]] std::int64_t size() const noexcept { return size_; }
  /// Device pointers: never dereference them on the host.
  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }
  [[nodiscard]] device_view<T> view() noexcept { return {data_, shape_}; }
  [[nodiscard]] device_view<const T> view() const noexcept { return {data_, shape_}; }
  [[nodiscard]] std::size_t bytes_size() const noexcept { return static_cast<std::size_t>(size_) * sizeof(T); }

 private:
  struct for_overwrite_tag {};
  device_tensor(std::vector<std::int64_t> shape, for_overwrite_tag)
      : shape_(std::move(shape)),
        size_(baton::detail::payload::checked_element_count(shape_, "baton::cuda::device_tensor", sizeof(T))) {
    if (size_ > 0) {
      void* p = nullptr;
      check(cudaMallocAsync(&p, bytes_size(), payload_stream()), what(), "cudaMallocAsync");
      data_ = static_cast<T*>(p);
    }
  }

  std::string what() const { return "baton::cuda::device_tensor of shape " + baton::detail::core::shape_text(shape_); }

  static void check(cudaError_t rc, const std::string& who, const char* call) {
    baton::detail::core::check_cuda<cuda_error>(rc, who, call);
  }

  void synchronise() const { check(cudaStreamSynchronize(payload_stream()), what(), "cudaStreamSynchronize"); }

  // Stream-ordered: returns at once and never waits for the device (see the file comment).
  void release() noexcept {
    if (data_ != nullptr) cudaFreeAsync(data_, payload_stream());
    data_ = nullptr;
  }

  std::vector<std::int64_t> shape_;
  std::int64_t size_ = 0;
  T* data_ = nullptr;
};

}  // namespace baton::cuda

namespace baton::detail::payload::cuda {

// Runs pitched copies device to device on the payload stream and waits for them.
struct device_copier {
  static void run(std::span<const pitched_copy> copies, std::span<const std::byte* const> sources, std::byte* dst,
                  const std::string& what) {
    using baton::cuda::cuda_error;
    using baton::cuda::payload_stream;
    for (std::size_t i = 0; i < copies.size(); ++i) {
      const auto& c = copies[i];
      if (c.empty()) continue;
      if (c.height == 1 || (c.src_pitch == c.width && c.dst_pitch == c.width)) {
        // Contiguous: one plain copy (and no limit on the pitch, which cudaMemcpy2D has).
        core::check_cuda<cuda_error>(cudaMemcpyAsync(dst + c.dst_offset, sources[i] + c.src_offset, c.width * c.height,
                                                     cudaMemcpyDeviceToDevice, payload_stream()),
                                     what, "cudaMemcpyAsync");
        continue;
      }
      core::check_cuda<cuda_error>(cudaMemcpy2DAsync(dst + c.dst_offset, c.dst_pitch, sources[i] + c.src_offset,
                                                     c.src_pitch, c.width, c.height, cudaMemcpyDeviceToDevice,
                                                     payload_stream()),
                                   what, "cudaMemcpy2DAsync");
    }
    core::check_cuda<cuda_error>(cudaStreamSynchronize(payload_stream()), what, "cudaStreamSynchronize");
  }
};

}  // namespace baton::detail::payload::cuda

namespace baton {

/// device_tensor is an activation tensor in device memory: host_accessible = false, so the
/// executor never memcpy's it and scales a loss gradient through scale(); receive and gradient
/// buffers are device_tensors, so the executor's receive pools hold device memory. The traits
/// are pitched_payload_traits, which the CPU tests run with host memory.
template <class T>
struct payload_traits<cuda::device_tensor<T>>
    : detail::payload::pitched_payload_traits<cuda::device_tensor<T>, detail::payload::cuda::device_copier> {};

}  // namespace baton

#endif  // BATON_HAS_CUDA()
