// baton/attention/cuda.hpp — flash attention on NVIDIA GPUs: cuda_attention, the CUDA
// backend, on tensor_views of DEVICE memory.
//
// The kernels are in cuda/detail/: forward_kernel.hpp and backward_kernel.hpp hold their
// bodies (one source, also run on the CPU by cuda_attention_emulated in cuda/emulated.hpp),
// forward.cuh and backward.cuh the __global__ wrappers and launches. This header includes
// them, so it is compiled by nvcc only: include it from a .cu file (and link baton::cuda).
// Host-only translation units use nothing from here.
#pragma once

#include <baton/core/cuda_annotations.hpp>

#if !BATON_CUDA_COMPILATION()
#error "baton/attention/cuda.hpp holds CUDA kernels: include it from a .cu file compiled by nvcc (link baton::cuda)"
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include <baton/attention/backend.hpp>
#include <baton/attention/cuda/detail/backward.cuh>
#include <baton/attention/cuda/detail/call.hpp>
#include <baton/attention/cuda/detail/forward.cuh>
#include <baton/attention/cuda/plan.hpp>
#include <baton/attention/cuda/plan_cache.hpp>
#include <baton/attention/cuda/storage.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/cuda_check.hpp>
#include <baton/core/tensor_view.hpp>

namespace baton {

namespace detail::attention::cuda {
// The workspace's device operations (plan_cache.hpp): cudaMalloc, a stream-ordered upload,
// and a free that first waits for the kernels queued earlier (they may still read it).
struct device_workspace_ops {
  static constexpr const char* who = "baton::cuda_attention";
  cudaStream_t stream = nullptr;
  void* allocate(std::size_t bytes) {
    void* p = nullptr;
    core::check_cuda<std::runtime_error>(cudaMalloc(&p, bytes), who, "cudaMalloc (attention workspace)");
    return p;
  }
  void free(void* p) {
    core::check_cuda<std::runtime_error>(cudaStreamSynchronize(stream), who,
                                         "cudaStreamSynchronize (before freeing the attention workspace)");
    core::check_cuda<std::runtime_error>(cudaFree(p), who, "cudaFree (attention workspace)");
  }
  void free_at_exit(void* p) noexcept {
    (void)cudaDeviceSynchronize();  // the stream may be gone; no throw from a destructor
    (void)cudaFree(p);
  }
  // From pageable memory, so the runtime waits for the stream before it copies (a host
  // synchronisation) and returns once the bytes are staged: `src` may die. A cached plan
  // is uploaded once, so this wait happens on a cache miss only.
  void upload(void* dst, const void* src, std::size_t bytes) {
    core::check_cuda<std::runtime_error>(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), who,
                                         "cudaMemcpyAsync (tile plan)");
  }
  // Cached plans moving into a grown arena (before the old one is freed).
  void copy(void* dst, const void* src, std::size_t bytes) {
    core::check_cuda<std::runtime_error>(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream), who,
                                         "cudaMemcpyAsync (moving cached tile plans)");
  }
};
}  // namespace detail::attention::cuda

/// Flash attention on an NVIDIA GPU (sm_80 and later), FlashAttention-2 style, on tensor
/// cores. Models attention_backend<cuda_attention, float>, and takes baton::bfloat16 and
/// baton::float16 storage the same way (the LSE is always float).
///  - every tensor is DEVICE memory; the head dim is contiguous and rows 16-byte aligned
///    (any other strides); head dims 64, 128 and 256 (others throw attention_error);
///  - forward: online softmax in fp32, LSE in fp32; bf16/f16 through m16n8k16 tensor cores
///    with fp32 accumulation; float through 3xTF32 (fp32-level accuracy);
///  - backward: a pre-pass D = rowsum(dO * O), a key-tile pass (dK, dV) and a query-tile
///    pass (dQ); deterministic, no atomics;
///  - every mask through the CPU kernels' tile classification, made on the host (empty
///    tiles skipped, full tiles unmasked, partial tiles by a bitmask) and cached on the
///    device by (mask fingerprint, positions, lengths, tiles): a repeated call neither
///    plans nor uploads (plan_cache.hpp says which masks have a fingerprint);
///  - the non-finite rule of docs/attention.md;
///  - ASYNCHRONOUS: a call queues its kernels on the object's stream (the constructor's
///    argument; default: the legacy default stream) and returns. Synchronise that stream
///    before reading the results on the host. Each object owns a device workspace (cached
///    tile plans, flags) reused across calls; the stream orders the calls that share it;
///    reserve_workspace sizes it up front so that no call allocates. Calls from
///    several threads on one object are serialised while they queue (a mutex), so they are
///    safe; for concurrency across streams make one object per stream.
class cuda_attention
    : public detail::attention::mask_argument_check,
      public detail::attention::cuda::shared_plan_workspace<detail::attention::cuda::device_workspace_ops> {
 public:
  static constexpr const char* name = "baton::cuda_attention";
  /// Takes bfloat16 storage (backend_stores_bfloat16).
  static constexpr bool stores_bfloat16 = true;

  explicit cuda_attention(cudaStream_t stream = nullptr)
      : shared_plan_workspace(name, detail::attention::cuda::device_workspace_ops{stream}), stream_(stream) {}

  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  // reserve_workspace(attention_workspace_shape) allocates now the device workspace every
  // call up to that shape needs (the scratch and room for cached tile plans), so that such
  // calls allocate and free nothing: no cudaMalloc / cudaFree between a ring's steps. It
  // allocates only what is missing (a second call with a covered shape does nothing), plus
  // room for the distinct plans built since the previous reservation (so calls that evicted
  // one another's plans fit from now on); growing frees the old block after a stream
  // synchronisation. ring_attention (and hybrid's ring) call it before the first step of
  // every call, with their largest step's shape. release_workspace() frees it after the
  // stream is done with it; workspace_stats() counts allocations, plan builds, uploads and
  // hits. Copies of this object share the workspace (shared_plan_workspace, detail/call.hpp).

  // A mask argument that is not an attention_mask: one readable error (mask_argument_check).
  using detail::attention::mask_argument_check::forward;
  using detail::attention::mask_argument_check::backward;

  template <class TQ, class TK, class TV, attention_mask Mask, class TO, class TL>
  void forward(tensor_view<TQ, 4> q, tensor_view<TK, 4> k, tensor_view<TV, 4> v, const Mask& mask,
               tensor_view<TO, 4> out, tensor_view<TL, 3> lse, const attention_params& params = {}) const {
    namespace dc = detail::attention::cuda;
    using S = std::remove_const_t<TQ>;
    const dc::forward_call f = dc::prepare_forward(q, k, v, mask, out, lse, params, name);
    if (f.call.batch * f.call.heads_q * f.call.seq_q == 0) return;
    auto& ws = workspace();
    std::lock_guard lock(ws.mutex());
    const dc::tile_plan_view plan = dc::plan_from(ws, f, mask);  // cached: no build, no upload
    auto* key_bad = reinterpret_cast<std::uint8_t*>(
        ws.scratch(dc::key_flag_bytes(f.call.batch, f.call.heads_kv, f.call.seq_k)));
    const tensor_view<const S, 4> qc = q, kc = k, vc = v;
    dc::launch_key_flags(dc::key_flag_args_for<S>(kc, vc, f.call, key_bad), stream_);
    dc::launch_forward(dc::forward_args_for<S>(qc, kc, vc, out, lse, f.call, plan, key_bad), stream_);
  }

  template <class TQ, class TK, class TV, class TO, class TL, class TD, attention_mask Mask, class TG1, class TG2,
            class TG3>
  void backward(tensor_view<TQ, 4> q, tensor_view<TK, 4> k, tensor_view<TV, 4> v, tensor_view<TO, 4> out,
                tensor_view<TL, 3> lse, tensor_view<TD, 4> dout, const Mask& mask, tensor_view<TG1, 4> dq,
                tensor_view<TG2, 4> dk, tensor_view<TG3, 4> dv, const attention_params& params = {}) const {
    namespace dc = detail::attention::cuda;
    using S = std::remove_const_t<TQ>;
    const dc::backward_call bc = dc::prepare_backward(q, k, v, out, lse, dout, mask, dq, dk, dv, params, name);
    const auto& c = bc.call;
    auto& ws = workspace();
    std::lock_guard lock(ws.mutex());
    const dc::tile_plan_view plan = dc::plan_from(ws, bc, mask);
    std::byte* work = ws.scratch(dc::backward_workspace_bytes(c.batch, c.heads_q, c.seq_q, c.heads_kv, c.seq_k));
    const tensor_view<const S, 4> qc = q, kc = k, vc = v, oc = out, doc = dout;
    const tensor_view<const float, 3> lc = lse;
    dc::launch_backward(dc::backward_args_for<S>(qc, kc, vc, oc, lc, doc, dq, dk, dv, c, params.accumulate, plan, work),
                        stream_);
  }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace baton
