// baton/cp/memory.hpp — where the context-parallel layer keeps its buffers and how it moves
// data in them: the memory-space policy.
//
// Ring, Ulysses and hybrid attention are written once. Every buffer they own (the K/V block
// travelling the ring, the accumulators, the Ulysses exchange and gathered tensors) comes
// from the memory space, and every operation that touches memory — a copy between strided
// views (with a change of element type), a fill, an accumulation, the online-softmax merge
// of two partial results — is a call on it. The algorithms themselves only compute sizes,
// offsets and strides on the host. `host_memory` (the default) does this with the loops the
// layer always used; `cuda_device_memory` (<baton/cp/cuda.hpp>) does it with kernels on a
// CUDA stream, so the same code runs with device buffers over nccl_communicator.
//
// The memory space is chosen from the backend: cp_memory_space_of<Backend> (host_memory
// unless specialised; <baton/cp/cuda.hpp> maps CUDA backends to cuda_device_memory). The
// ring / Ulysses / hybrid classes take an explicit one as a last constructor argument, and
// check at compile time that its location is the backend's and the communicator's.
#pragma once

#include <baton/core/workspace.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/cp/detail/bshd.hpp>
#include <baton/cp/merge.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>

namespace baton {

/// Where a memory space's buffers live, and therefore which tensors, backends and
/// communicators it can work with.
enum class cp_memory_location : unsigned char { host, cuda_device };

/// How a copy converts its elements. `through_accumulator` computes T(A(0) + A(v)) with A =
/// cp_accumulator_t<T>: the Ulysses unpack copies this way so that a copied head and a head
/// summed over replicas give the same bits (-0 becomes +0 either way).
enum class cp_copy_mode : unsigned char { exact, through_accumulator };

namespace detail::cp {

// The buffers host_memory hands out on this thread, kept for the next call: a ring call
// asks for about a dozen buffers of up to tens of MB, and fresh ones cost a page fault per
// 4 KiB on first touch (docs/context-parallel.md measures what that did to the document-mask
// ring when glibc returned them to the kernel between calls). One pool per thread,
// not per attention object: the layers of a model run one call at a time on a rank's thread,
// so the pool holds one call's worth, however many layers there are. A buffer keeps its pool
// alive, so it may outlive the thread or be freed on another one.
inline const std::shared_ptr<core::workspace_pool>& thread_buffer_pool() {
  thread_local const std::shared_ptr<core::workspace_pool> pool = std::make_shared<core::workspace_pool>();
  return pool;
}

// host_memory's buffer: n elements, uninitialised (the layer writes every element before
// reading it), leased from the thread's pool and given back when the buffer is destroyed.
template <class T>
class host_buffer {
  static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= 64, "host_memory buffers hold plain numbers");

 public:
  host_buffer() = default;
  explicit host_buffer(std::size_t n) : size_(n) {
    if (n == 0) return;
    pool_ = thread_buffer_pool();
    lease_.reset(new core::workspace_pool::lease(pool_->acquire(n * sizeof(T))));
  }
  host_buffer(host_buffer&& other) noexcept
      : pool_(std::move(other.pool_)), lease_(std::move(other.lease_)), size_(std::exchange(other.size_, 0)) {}
  // Through a temporary: the lease must go back before the pool it came from can be dropped.
  host_buffer& operator=(host_buffer&& other) noexcept {
    host_buffer taken(std::move(other));
    std::swap(pool_, taken.pool_);
    std::swap(lease_, taken.lease_);
    std::swap(size_, taken.size_);
    return *this;
  }
  host_buffer(const host_buffer&) = delete;
  host_buffer& operator=(const host_buffer&) = delete;
  ~host_buffer() { lease_.reset(); }

  [[nodiscard]] T* data() noexcept { return lease_ ? reinterpret_cast<T*>(lease_->data()) : nullptr; }
  [[nodiscard]] const T* data() const noexcept { return lease_ ? reinterpret_cast<const T*>(lease_->data()) : nullptr; }
  [[nodiscard]] std::size_t size() const noexcept { return size_; }

 private:
  std::shared_ptr<core::workspace_pool> pool_;  // declared first: destroyed after the lease
  std::unique_ptr<core::workspace_pool::lease> lease_;
  std::size_t size_ = 0;
};

// Calls f(b, s, h) for every row along the last axis of `ext`: host_memory's loops run along
// a row through pointers, over unit strides when the views have them (so they vectorise).
template <class F>
void for_each_row(const std::array<std::int64_t, 4>& ext, F&& f) {
  for (std::int64_t b = 0; b < ext[0]; ++b)
    for (std::int64_t s = 0; s < ext[1]; ++s)
      for (std::int64_t h = 0; h < ext[2]; ++h) f(b, s, h);
}

}  // namespace detail::cp

/// The context-parallel layer's memory, on the host: heap buffers and plain loops.
/// Every call completes before it returns, so synchronize() has nothing to do. The objects
/// are stateless; the buffers come from a pool per thread that keeps them for the next call
/// (one call's worth, shared by every attention object on the thread): release_cached()
/// frees what the calling thread keeps.
struct host_memory {
  static constexpr cp_memory_location location = cp_memory_location::host;

  template <class T>
  using buffer = detail::cp::host_buffer<T>;

  /// n elements, uninitialised: the layer never reads one before writing it.
  template <class T>
  buffer<T> allocate(std::size_t n) {
    return buffer<T>(n);
  }

  /// Frees the buffers this thread keeps between calls (not those in use); the next call
  /// allocates again.
  static void release_cached() noexcept { detail::cp::thread_buffer_pool()->release(); }

  template <class T>
  void fill(std::span<T> dst, T value) {
    std::fill(dst.begin(), dst.end(), value);
  }

  /// dst = T(src) elementwise; the two views have the same extents.
  template <class U, class T>
  void copy(const tensor_view<const U, 4>& src, const tensor_view<T, 4>& dst,
            cp_copy_mode mode = cp_copy_mode::exact) {
    using A = cp_accumulator_t<T>;
    const std::int64_t n = dst.extent(3), si = src.stride(3), di = dst.stride(3);
    detail::cp::for_each_row(dst.extents(), [&](std::int64_t b, std::int64_t s, std::int64_t h) {
      const U* in = &src(b, s, h, 0);
      T* out = &dst(b, s, h, 0);
      if (mode == cp_copy_mode::exact) {
        if (si == 1 && di == 1)
          for (std::int64_t x = 0; x < n; ++x) out[x] = static_cast<T>(in[x]);
        else
          for (std::int64_t x = 0; x < n; ++x) out[x * di] = static_cast<T>(in[x * si]);
      } else {
        for (std::int64_t x = 0; x < n; ++x) out[x * di] = static_cast<T>(A(0) + static_cast<A>(in[x * si]));
      }
    });
  }

  /// acc += A(src) elementwise (gradient accumulation in fp32 or better).
  template <class A, class T>
  void accumulate(const tensor_view<A, 4>& acc, const tensor_view<const T, 4>& src) {
    const std::int64_t n = acc.extent(3), si = src.stride(3), ai = acc.stride(3);
    detail::cp::for_each_row(acc.extents(), [&](std::int64_t b, std::int64_t s, std::int64_t h) {
      const T* in = &src(b, s, h, 0);
      A* out = &acc(b, s, h, 0);
      if (si == 1 && ai == 1)
        for (std::int64_t x = 0; x < n; ++x) out[x] += static_cast<A>(in[x]);
      else
        for (std::int64_t x = 0; x < n; ++x) out[x * ai] += static_cast<A>(in[x * si]);
    });
  }

  /// Merges the partial result (out_b [b, s, h, d], lse_b [b, s, h, 1]) into the running
  /// (out, lse) of the same shapes, row by row (detail::cp::merge_row, the sigmoid form).
  template <class A, class T, class L>
  void merge(const tensor_view<A, 4>& out, const tensor_view<A, 4>& lse, const tensor_view<const T, 4>& out_b,
             const tensor_view<const L, 4>& lse_b) {
    detail::cp::for_each_row(out.extents(), [&](std::int64_t b, std::int64_t s, std::int64_t h) {
      detail::cp::merge_row(&out(b, s, h, 0), out.stride(3), lse(b, s, h, 0), &out_b(b, s, h, 0), out_b.stride(3),
                            lse_b(b, s, h, 0), out.extent(3));
    });
  }

  /// Called before a buffer is handed to the communicator: every operation issued so far
  /// has completed (host: they complete as they are called). A space that queues work may
  /// instead offer two optional members, which the ring then uses around its transfers
  /// (detail::cp::before_transfer and transfer_settler in ring_core.hpp):
  ///   m.order_before(comm)   the communicator's next transfers start after the work
  ///                          queued so far, without the host waiting for it;
  ///   m.order_after(request) work queued from now on starts after the transfer, without
  ///                          the host waiting for it.
  /// cuda_device_memory offers both for a communicator and requests that take CUDA events
  /// (nccl_communicator), so a ring step makes no host synchronisation.
  void synchronize() noexcept {}

  /// Calls f(send, recv) with spans the communicator can move: the agreement's descriptors
  /// live on the host; a device space stages them through device buffers.
  template <class F>
  void with_host_bytes(std::span<const std::byte> send, std::span<std::byte> recv, F&& f) {
    f(send, recv);
  }

  /// Empty when `data` may be a tensor this space works on, else why not (host: anything is).
  std::string check_tensor(const void* /*data*/, const char* /*name*/) const { return {}; }
};

namespace detail::cp {
// The callback cp_memory_space probes with_host_bytes with (a named type: nvcc does not take
// a lambda inside a requires-expression).
struct host_bytes_probe {
  void operator()(std::span<const std::byte> /*send*/, std::span<std::byte> /*recv*/) const noexcept {}
};
}  // namespace detail::cp

/// What the context-parallel layer needs of a memory space M (see host_memory for the
/// meaning of each member; cuda_device_memory in <baton/cp/cuda.hpp> is the other model).
template <class M>
concept cp_memory_space =
    std::copy_constructible<M> &&
    requires(M& m, const M& cm, tensor_view<const float, 4> src, tensor_view<float, 4> dst,
             tensor_view<const double, 4> src_d, std::span<float> flat, std::span<const std::byte> send,
             std::span<std::byte> recv) {
      { M::location } -> std::convertible_to<cp_memory_location>;
      { m.template allocate<float>(std::size_t{1}).data() } -> std::same_as<float*>;
      { m.template allocate<float>(std::size_t{1}).size() } -> std::convertible_to<std::size_t>;
      m.fill(flat, 0.0f);
      m.copy(src, dst);
      m.copy(src_d, dst, cp_copy_mode::through_accumulator);
      m.accumulate(dst, src);
      m.merge(dst, dst, src, src);
      m.synchronize();
      m.with_host_bytes(send, recv, detail::cp::host_bytes_probe{});
      { cm.check_tensor(static_cast<const void*>(nullptr), "q") } -> std::convertible_to<std::string>;
    };

/// The memory space a backend's tensors live in: host_memory unless specialised.
/// <baton/cp/cuda.hpp> specialises it for CUDA backends (those with a stream). A
/// specialisation provides `type` and `static type make(const Backend&)`.
template <class Backend>
struct cp_memory_space_of {
  using type = host_memory;
  static type make(const Backend& /*backend*/) { return {}; }
};

template <class Backend>
using cp_memory_space_t = typename cp_memory_space_of<std::remove_cvref_t<Backend>>::type;

namespace detail::cp {

// A backend that says which CUDA stream it runs on: a device backend. Used only to turn the
// forgotten #include <baton/cp/cuda.hpp> into a compile error instead of host loops over
// device pointers.
template <class B>
concept has_stream_member = requires(const B& b) { b.stream(); };

// A communicator that runs on a stream (nccl_communicator) moves device memory only.
template <class C>
concept device_communicator = requires(const C& c) { c.stream(); };

template <class M, class Backend>
constexpr bool memory_matches_backend() {
  constexpr bool trait_agrees = M::location == cp_memory_space_t<Backend>::location;
  static_assert(trait_agrees,
                "baton context parallelism: the memory space must be where the backend's tensors live "
                "(cp_memory_space_t<Backend>): host_memory for host backends, cuda_device_memory for CUDA backends "
                "(#include <baton/cp/cuda.hpp>)");
  constexpr bool not_forgotten = !(has_stream_member<Backend> && M::location == cp_memory_location::host);
  static_assert(not_forgotten,
                "baton context parallelism: this backend runs on a CUDA stream but the memory space is the host's; "
                "#include <baton/cp/cuda.hpp> (it maps CUDA backends to cuda_device_memory) so that the layer's "
                "buffers are device memory");
  return trait_agrees && not_forgotten;
}

template <class M, class Comm>
constexpr bool memory_matches_communicator() {
  constexpr bool ok = device_communicator<Comm> == (M::location == cp_memory_location::cuda_device);
  static_assert(ok,
                "baton context parallelism: the communicator and the memory space disagree: nccl_communicator "
                "moves device memory (use a CUDA backend, whose memory space is cuda_device_memory), host "
                "communicators (local world, MPI) move host memory (use a host backend)");
  return ok;
}

// A grow-only buffer of the memory space, reused across calls (see scratch_buffer). A copy
// starts empty: buffers belong to one object, which one rank uses at a time.
template <class M>
class scratch {
 public:
  scratch() = default;
  scratch(const scratch&) noexcept {}
  scratch& operator=(const scratch&) noexcept { return *this; }
  scratch(scratch&&) noexcept = default;
  scratch& operator=(scratch&&) noexcept = default;
  ~scratch() = default;

  // n elements of T; the previous contents are kept unless the buffer had to grow, when it
  // is zeroed (its contents are always defined).
  template <class T>
  T* get(M& mem, std::size_t n) {
    static_assert(std::is_trivially_copyable_v<T> && alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
                  "scratch holds plain numbers");
    const std::size_t bytes = n * sizeof(T);
    if (bytes > bytes_) {
      data_ = buffer_t();  // free first: the peak is the new size, not old + new
      data_ = mem.template allocate<std::byte>(bytes);
      mem.fill(std::span<std::byte>(data_.data(), bytes), std::byte{0});
      bytes_ = bytes;
    }
    return reinterpret_cast<T*>(data_.data());
  }
  void release() noexcept {
    data_ = buffer_t();
    bytes_ = 0;
  }

 private:
  using buffer_t = typename M::template buffer<std::byte>;
  buffer_t data_{};
  std::size_t bytes_ = 0;
};

}  // namespace detail::cp
}  // namespace baton
