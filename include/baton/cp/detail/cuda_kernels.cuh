// baton/cp/detail/cuda_kernels.cuh — the kernels of cuda_device_memory (cp/cuda.hpp): the
// context-parallel layer's copies, fills, accumulations and online-softmax merges on device
// memory. Compiled by nvcc only.
//
// Correctness first: one thread per element (per row for the merge), grid-stride loops,
// 64-bit indices, strided views decoded from a linear index; what a thread does is in
// cuda_elementwise.hpp, host-and-device code the CPU tests run. They move O(b s h d) bytes
// per ring step against the attention's O(b s^2 h d / R^2) flops, so they are not where the
// time goes; a tiled or vectorised version can come when a profile says so.
#pragma once

#include <baton/core/cuda_annotations.hpp>
#include <baton/core/cuda_check.hpp>

#if !BATON_CUDA_COMPILATION()
#error "baton/cp/detail/cuda_kernels.cuh holds CUDA kernels: compile this translation unit with nvcc (a .cu file)"
#endif

#include <baton/cp/detail/cuda_elementwise.hpp>
#include <baton/cp/detail/bshd.hpp>
#include <baton/cp/error.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace baton::detail::cp::cuda {

// Each thread runs the element functions of cuda_elementwise.hpp (which the CPU tests run
// over every index against host_memory); grid-stride loops over 64-bit indices.

template <class U, class T, class A, bool through_accumulator>
__global__ void copy_kernel(const U* src, strided_layout<4> s, T* dst, strided_layout<4> d, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    copy_element<U, T, A>(src, s, dst, d, i, through_accumulator);
}

template <class A, class T>
__global__ void accumulate_kernel(A* acc, strided_layout<4> a, const T* src, strided_layout<4> s, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    accumulate_element<A, T>(acc, a, src, s, i);
}

template <class T>
__global__ void fill_kernel(T* dst, std::int64_t n, T value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    dst[i] = value;
}

// One thread per row (b, s, h) of the partial results.
template <class A, class T, class L>
__global__ void merge_kernel(A* out, strided_layout<4> o, A* lse, strided_layout<4> l, const T* out_b, strided_layout<4> ob, const L* lse_b, strided_layout<4> lb,
                             std::int64_t rows) {
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    merge_row_element<A, T, L>(out, o, lse, l, out_b, ob, lse_b, lb, r);
}

inline unsigned blocks_for(std::int64_t n, unsigned threads) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<std::int64_t>(blocks, 65535));
}

inline constexpr unsigned threads_per_block = 256;

template <class U, class T, class A>
void launch_copy(const tensor_view<const U, 4>& src, const tensor_view<T, 4>& dst, bool through_accumulator, cudaStream_t stream) {
  const std::int64_t n = dst.size();
  if (n == 0) return;
  if (through_accumulator)
    copy_kernel<U, T, A, true><<<blocks_for(n, threads_per_block), threads_per_block, 0, stream>>>(
        src.data, src.layout, dst.data, dst.layout, n);
  else
    copy_kernel<U, T, A, false><<<blocks_for(n, threads_per_block), threads_per_block, 0, stream>>>(
        src.data, src.layout, dst.data, dst.layout, n);
  core::check_cuda<cp_error>(cudaGetLastError(), "baton::cuda_device_memory", "the copy kernel launch");
}

template <class A, class T>
void launch_accumulate(const tensor_view<A, 4>& acc, const tensor_view<const T, 4>& src, cudaStream_t stream) {
  const std::int64_t n = acc.size();
  if (n == 0) return;
  accumulate_kernel<A, T><<<blocks_for(n, threads_per_block), threads_per_block, 0, stream>>>(
      acc.data, acc.layout, src.data, src.layout, n);
  core::check_cuda<cp_error>(cudaGetLastError(), "baton::cuda_device_memory", "the accumulate kernel launch");
}

template <class T>
void launch_fill(T* dst, std::int64_t n, T value, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<T><<<blocks_for(n, threads_per_block), threads_per_block, 0, stream>>>(dst, n, value);
  core::check_cuda<cp_error>(cudaGetLastError(), "baton::cuda_device_memory", "the fill kernel launch");
}

template <class A, class T, class L>
void launch_merge(const tensor_view<A, 4>& out, const tensor_view<A, 4>& lse, const tensor_view<const T, 4>& out_b, const tensor_view<const L, 4>& lse_b,
                  cudaStream_t stream) {
  const std::int64_t rows = out.extent(0) * out.extent(1) * out.extent(2);
  if (rows == 0) return;
  merge_kernel<A, T, L><<<blocks_for(rows, threads_per_block), threads_per_block, 0, stream>>>(
      out.data, out.layout, lse.data, lse.layout, out_b.data, out_b.layout, lse_b.data, lse_b.layout, rows);
  core::check_cuda<cp_error>(cudaGetLastError(), "baton::cuda_device_memory", "the merge kernel launch");
}

}  // namespace baton::detail::cp::cuda
