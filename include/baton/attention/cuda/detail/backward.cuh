// baton/attention/cuda/detail/backward.cuh — the device side of the backward: the three
// __global__ kernels over the bodies of backward_kernel.hpp, and launch_backward, which runs
// them in order on one stream. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include <baton/attention/cuda/detail/backward_args.hpp>
#include <baton/attention/cuda/detail/backward_kernel.hpp>
#include <baton/attention/cuda/detail/launches.cuh>
#include <baton/attention/cuda/detail/mma.cuh>
#include <baton/attention/cuda/detail/simt.cuh>
#include <baton/attention/cuda/plan.hpp>
#include <baton/attention/cuda/storage.hpp>
#include <baton/attention/error.hpp>
#include <baton/core/cuda_check.hpp>

namespace baton::detail::attention::cuda {

// The bodies take the arguments by reference; __grid_constant__ lets them refer to the
// kernel parameter itself instead of a per-thread stack copy of the struct.
template <class S>
__global__ void __launch_bounds__(prepass_threads)
    backward_prepass_kernel(const __grid_constant__ backward_args<S> a, int row_blocks) {
  simt::device_block<prepass_threads> ctx;
  backward_detail::prepass_block<S>(ctx, a, row_blocks);
}

template <class S, int Dim, bool KeyPass>
__global__ void __launch_bounds__(backward_pass_layout<S, Dim, KeyPass>::threads)
    backward_tile_kernel(const __grid_constant__ backward_args<S> a) {
  simt::device_block<backward_pass_layout<S, Dim, KeyPass>::threads> ctx;
  backward_tile_block<S, Dim, KeyPass>(ctx, a);
}

namespace backward_detail {

// Who a failed launch names (core::check_cuda's message).
inline constexpr const char* backward_who = "baton cuda attention (backward)";

template <class S, int Dim, bool KeyPass>
void launch_tile_pass(const backward_args<S>& a, std::int64_t tiles, int heads, cudaStream_t stream) {
  using L = backward_pass_layout<S, Dim, KeyPass>;
  if (tiles == 0 || heads == 0 || a.batch == 0) return;
  const auto kernel = backward_tile_kernel<S, Dim, KeyPass>;
  // Above 48 KiB a block's dynamic shared memory must be opted into, per kernel and device.
  core::check_cuda<std::runtime_error>(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(L::bytes)), backward_who,
      KeyPass ? "cudaFuncSetAttribute (key pass shared memory)" : "cudaFuncSetAttribute (query pass shared memory)");
  kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(heads), static_cast<unsigned>(a.batch)),
           dim3(L::threads), L::bytes, stream>>>(a);
  core::check_cuda<std::runtime_error>(cudaGetLastError(), backward_who,
                                       KeyPass ? "launching the key pass" : "launching the query pass");
}

template <class S, int Dim>
void launch_backward_dim(const backward_args<S>& a, cudaStream_t stream) {
  const backward_grids g = backward_grids_for(a);
  if (g.prepass_blocks > 0) {
    backward_prepass_kernel<S><<<dim3(static_cast<unsigned>(g.prepass_blocks)), dim3(prepass_threads), 0, stream>>>(
        a, static_cast<int>(g.prepass_row_blocks));
    core::check_cuda<std::runtime_error>(cudaGetLastError(), backward_who, "launching the D = rowsum(dO * O) pre-pass");
  }
  launch_tile_pass<S, Dim, true>(a, g.key_tiles, a.heads_kv, stream);
  launch_tile_pass<S, Dim, false>(a, g.query_tiles, a.heads_q, stream);
}

}  // namespace backward_detail

/// Runs the backward's three passes on `stream`, in order: the pre-pass (D and the
/// non-finite flags into a.workspace), the key pass (dk, dv), the query pass (dq). Every
/// pointer in `a`, the plan's arrays included, is device memory that stays alive until the
/// stream reaches the end of the query pass. Returns once the launches are queued; throws
/// attention_error for arguments the kernels cannot run (check_backward_args) and
/// std::runtime_error when a launch fails.
template <class S>
void launch_backward(const backward_args<S>& a, cudaStream_t stream) {
  check_backward_args(a);
  constexpr std::int64_t grid_yz_max = 65535;
  if (a.heads_q > grid_yz_max || a.batch > grid_yz_max)
    throw attention_error("baton cuda attention (backward): " + std::to_string(a.heads_q) + " query heads x " +
                          std::to_string(a.batch) + " batch entries exceed the grid's 65535 per axis; split the batch");
  dispatch_head_dim(a.dim, [&](auto dim_constant) {
    backward_detail::launch_backward_dim<S, decltype(dim_constant)::value>(a, stream);
  });
}

}  // namespace baton::detail::attention::cuda

// With BATON_CUDA_ATTENTION_EXTERN_KERNELS the kernels are compiled elsewhere in the program
// (cuda/instantiate.cuh says how); this translation unit only queues them.
#if defined(BATON_CUDA_ATTENTION_EXTERN_KERNELS)
BATON_DETAIL_CUDA_ATTENTION_EXTERN(BATON_DETAIL_CUDA_ATTENTION_BACKWARD_LAUNCHES)
#endif
