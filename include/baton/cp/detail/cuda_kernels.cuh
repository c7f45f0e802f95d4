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

#if !defined(__CUDACC__)
#error "baton/cp/detail/cuda_kernels.cuh holds CUDA kernels: compile this translation unit with nvcc (a .cu file)"
#endif

#include <baton/cp/detail/cuda_elementwise.hpp>
#include <baton/cp/detail/view4.hpp>
#include <baton/cp/error.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

namespace baton::detail::cp::cuda {

// Each thread runs the element functions of cuda_elementwise.hpp (which the CPU tests run
// over every index against host_memory); grid-stride loops over 64-bit indices.

template <class U, class T, class A, bool through_accumulator>
__global__ void copy_kernel(const U* src, dims4 s, T* dst, dims4 d, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    copy_element<U, T, A>(src, s, dst, d, i, through_accumulator);
}

template <class A, class T>
__global__ void accumulate_kernel(A* acc, dims4 a, const T* src, dims4 s, std::int64_t n) {
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
__global__ void merge_kernel(A* out, dims4 o, A* lse, dims4 l, const T* out_b, dims4 ob, const L* lse_b, dims4 lb,
                             std::int64_t rows) {
  for (std::int64_t r = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; r < rows;
       r += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    merge_row_element<A, T, L>(out, o, lse, l, out_b, ob, lse_b, lb, r);
}

inline void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw cp_error(std::string("baton::cuda_device_memory: ") + what + " failed: " + cudaGetErrorName(rc) + ": " +
                   cudaGetErrorString(rc));
}

inline unsigned blocks_for(std::int64_t n, unsigned threads) {
  const std::int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::min<std::int64_t>(blocks, 65535));
}

inline constexpr unsigned threads_per_block = 256;

template <class U, class T, class A>
void launch_copy(const view4<const U>& src, const view4<T>& dst, bool through_accumulator, cudaStream_t stream) {
  const std::int64_t n = dst.size();
  if (n == 0) return;
  if (through_accumulator)
    copy_kernel<U, T, A, true><<<blocks_for(n, threads_per_block), threads_per_block, 0, stream>>>(
        src.data, dims_of(src), dst.data, dims_of(dst), n);
  else
    copy_kernel<U, T, A, false><<<blocks_for(n, threads_per_block), threads_per_block, 0, stream>>>(
        src.data, dims_of(src), dst.data, dims_of(dst), n);
  check(cudaGetLastError(), "the copy kernel launch");
}

template <class A, class T>
void launch_accumulate(const view4<A>& acc, const view4<const T>& src, cudaStream_t stream) {
  const std::int64_t n = acc.size();
  if (n == 0) return;
  accumulate_kernel<A, T><<<blocks_for(n, threads_per_block), threads_per_block, 0, stream>>>(
      acc.data, dims_of(acc), src.data, dims_of(src), n);
  check(cudaGetLastError(), "the accumulate kernel launch");
}

template <class T>
void launch_fill(T* dst, std::int64_t n, T value, cudaStream_t stream) {
  if (n == 0) return;
  fill_kernel<T><<<blocks_for(n, threads_per_block), threads_per_block, 0, stream>>>(dst, n, value);
  check(cudaGetLastError(), "the fill kernel launch");
}

template <class A, class T, class L>
void launch_merge(const view4<A>& out, const view4<A>& lse, const view4<const T>& out_b, const view4<const L>& lse_b,
                  cudaStream_t stream) {
  const std::int64_t rows = out.ext[0] * out.ext[1] * out.ext[2];
  if (rows == 0) return;
  merge_kernel<A, T, L><<<blocks_for(rows, threads_per_block), threads_per_block, 0, stream>>>(
      out.data, dims_of(out), lse.data, dims_of(lse), out_b.data, dims_of(out_b), lse_b.data, dims_of(lse_b), rows);
  check(cudaGetLastError(), "the merge kernel launch");
}

}  // namespace baton::detail::cp::cuda
