// baton/attention/cuda/detail/forward.cuh — the device side of the forward: the __global__
// kernels over the bodies of forward_kernel.hpp (the key-flag pass and the flash forward)
// and their launches on a stream. nvcc only.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>

#include <baton/attention/cuda/detail/forward_args.hpp>
#include <baton/attention/cuda/detail/forward_kernel.hpp>
#include <baton/attention/cuda/detail/launches.cuh>
#include <baton/attention/cuda/detail/mma.cuh>
#include <baton/attention/cuda/detail/simt.cuh>
#include <baton/attention/cuda/plan.hpp>
#include <baton/attention/cuda/storage.hpp>
#include <baton/core/cuda_check.hpp>

namespace baton::detail::attention::cuda {

template <class S>
__global__ void __launch_bounds__(key_flag_threads) key_flag_kernel(const key_flag_args<S> a) {
  simt::device_block<key_flag_threads> ctx;
  key_flag_body(ctx, a);
}

template <class S, int D, int MT, int TK>
__global__ void __launch_bounds__(128) forward_kernel(const forward_args<S> a) {
  simt::device_block<128> ctx;
  forward_body<simt::device_block<128>, S, D, MT, TK>::run(ctx, a);
}

// Who a failed launch names (core::check_cuda's message).
inline constexpr const char* forward_who = "baton cuda attention (forward)";

/// Writes a.key_bad (one byte per key: k or v row non-finite) on `stream`.
template <class S>
void launch_key_flags(const key_flag_args<S>& a, cudaStream_t stream) {
  if (a.batch == 0 || a.heads_kv == 0 || a.seq_k == 0) return;
  const launch_shape s = key_flag_launch(a.seq_k, a.heads_kv, a.batch);
  key_flag_kernel<S><<<dim3(s.grid[0], s.grid[1], s.grid[2]), dim3(s.block[0]), 0, stream>>>(a);
  core::check_cuda<std::runtime_error>(cudaGetLastError(), forward_who, "launching the key-flag pass");
}

/// Runs the forward with tiling (MT, TK) on `stream` (after launch_key_flags wrote
/// a.key_bad); a.plan made with make_forward_config(sizeof(S), D, MT, TK)'s tiles. For
/// tuning (bench_cuda_attention sweeps tilings); launch_forward uses forward_config_for's.
template <class S, int D, int MT, int TK>
void launch_forward_tiled(const forward_args<S>& a, cudaStream_t stream) {
  constexpr forward_config cfg = forward_body<simt::device_block<128>, S, D, MT, TK>::config;
  check_plan_tiles(a.plan, cfg);
  if (a.plan.q_tiles == 0 || a.heads_q == 0 || a.batch == 0) return;
  const launch_shape s = forward_launch(cfg, a.plan.seq_q, a.heads_q, a.batch);
  const auto kernel = forward_kernel<S, D, MT, TK>;
  // Above 48 KiB a block's dynamic shared memory must be opted into, per kernel and device.
  core::check_cuda<std::runtime_error>(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(s.shared_bytes)),
      forward_who, "cudaFuncSetAttribute (forward shared memory)");
  kernel<<<dim3(s.grid[0], s.grid[1], s.grid[2]), dim3(s.block[0]), s.shared_bytes, stream>>>(a);
  core::check_cuda<std::runtime_error>(cudaGetLastError(), forward_who, "launching the forward");
}

/// Runs the forward on `stream` (after launch_key_flags wrote a.key_bad), with
/// forward_config_for's tiling. Every pointer in `a`, the plan's arrays included, is device
/// memory that stays alive until the stream has run the kernel. Returns once the launch is
/// queued; throws attention_error for arguments the kernel cannot run and
/// std::runtime_error when the launch fails.
template <class S>
void launch_forward(const forward_args<S>& a, cudaStream_t stream) {
  dispatch_head_dim(a.dim, [&](auto dim_constant) {
    constexpr int D = decltype(dim_constant)::value;
    constexpr forward_config cfg = forward_config_for(static_cast<int>(sizeof(S)), D);
    launch_forward_tiled<S, D, cfg.m_tiles, cfg.tile_k>(a, stream);
  });
}

}  // namespace baton::detail::attention::cuda

// With BATON_CUDA_ATTENTION_EXTERN_KERNELS the kernels are compiled elsewhere in the program
// (cuda/instantiate.cuh says how); this translation unit only queues them.
#if defined(BATON_CUDA_ATTENTION_EXTERN_KERNELS)
BATON_DETAIL_CUDA_ATTENTION_EXTERN(BATON_DETAIL_CUDA_ATTENTION_FORWARD_LAUNCHES)
#endif
