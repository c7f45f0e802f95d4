// baton/attention/cuda/detail/simt.cuh — the device reading of a simt kernel body: each
// thread runs it with its own registers; lanes<T, 1> is one T (see simt.hpp).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include <baton/attention/cuda/detail/simt.hpp>

namespace baton::detail::attention::cuda::simt {

template <int Threads>
class device_block {
 public:
  static_assert(Threads % warp_size == 0, "baton simt: a block is whole warps");
  static constexpr int threads = Threads;
  static constexpr int width = 1;
  static constexpr bool is_device = true;
  template <class T>
  using lanes_of = lanes<T, 1>;

  __device__ int block_x() const noexcept { return static_cast<int>(blockIdx.x); }
  __device__ int block_y() const noexcept { return static_cast<int>(blockIdx.y); }
  __device__ int block_z() const noexcept { return static_cast<int>(blockIdx.z); }

  __device__ static lanes_of<int> thread_index() noexcept { return lanes_of<int>(static_cast<int>(threadIdx.x)); }
  __device__ static lanes_of<int> lane() noexcept { return lanes_of<int>(static_cast<int>(threadIdx.x) & (warp_size - 1)); }
  __device__ static lanes_of<int> warp() noexcept { return lanes_of<int>(static_cast<int>(threadIdx.x) / warp_size); }

  __device__ static void sync_block() noexcept { __syncthreads(); }
  __device__ static bool sync_or(const lanes_of<bool>& pred) noexcept { return __syncthreads_or(pred.v[0] ? 1 : 0) != 0; }
  /// Whether pred holds on any thread of the calling warp (a vote, no barrier).
  __device__ static bool warp_any(const lanes_of<bool>& pred) noexcept { return __any_sync(0xffffffffu, pred.v[0]); }

  __device__ static std::byte* shared_base() noexcept {
    extern __shared__ __align__(128) std::byte baton_simt_shared[];
    return baton_simt_shared;
  }
  __device__ static std::uint32_t shared_address(std::uint32_t offset) noexcept {
    return static_cast<std::uint32_t>(__cvta_generic_to_shared(shared_base())) + offset;
  }

  template <class T>
  __device__ static lanes_of<T> shared_load(const lanes_of<std::uint32_t>& offset) noexcept {
    return lanes_of<T>(*reinterpret_cast<const T*>(shared_base() + offset.v[0]));
  }
  template <class T>
  __device__ static void shared_store(const lanes_of<std::uint32_t>& offset, const lanes_of<T>& value,
                                      const lanes_of<bool>& active = lanes_of<bool>(true)) noexcept {
    if (active.v[0]) *reinterpret_cast<T*>(shared_base() + offset.v[0]) = value.v[0];
  }

  __device__ static void copy16_async(const lanes_of<std::uint32_t>& dst, const lanes_of<const void*>& src,
                                      const lanes_of<bool>& valid) noexcept {
    const int bytes = valid.v[0] ? 16 : 0;  // 0: zero-fill, src not read
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst.v[0])),
                 "l"(src.v[0]), "r"(bytes)
                 : "memory");
  }
  __device__ static void commit_async() noexcept { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
  template <int Pending>
  __device__ static void wait_async() noexcept {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(Pending) : "memory");
  }

  __device__ static void ldmatrix_x4(lanes_of<std::uint32_t> (&out)[4], const lanes_of<std::uint32_t>& row_offset,
                                     bool trans) noexcept {
    const std::uint32_t address = shared_address(row_offset.v[0]);
    if (trans)
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(out[0].v[0]), "=r"(out[1].v[0]), "=r"(out[2].v[0]), "=r"(out[3].v[0])
                   : "r"(address));
    else
      asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(out[0].v[0]), "=r"(out[1].v[0]), "=r"(out[2].v[0]), "=r"(out[3].v[0])
                   : "r"(address));
  }

  template <class T>
  __device__ static lanes_of<T> shfl_xor(const lanes_of<T>& x, int mask) noexcept {
    return lanes_of<T>(__shfl_xor_sync(0xffffffffu, x.v[0], mask));
  }
  template <class T>
  __device__ static lanes_of<T> shfl(const lanes_of<T>& x, const lanes_of<int>& source) noexcept {
    return lanes_of<T>(__shfl_sync(0xffffffffu, x.v[0], source.v[0]));
  }

  template <class T>
  __device__ static lanes_of<T> load(const lanes_of<const T*>& p, const lanes_of<bool>& active) noexcept {
    return lanes_of<T>(active.v[0] ? *p.v[0] : T{});
  }
  template <class T>
  __device__ static void store(const lanes_of<T*>& p, const lanes_of<T>& value, const lanes_of<bool>& active) noexcept {
    if (active.v[0]) *p.v[0] = value.v[0];
  }
};

}  // namespace baton::detail::attention::cuda::simt
