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
#include <baton/attention/cuda/storage.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/cuda_check.hpp>
#include <baton/core/tensor_view.hpp>

namespace baton {

/// Flash attention on an NVIDIA GPU (sm_80 and later), FlashAttention-2 style, on tensor
/// cores. Models attention_backend<cuda_attention, float>, and takes baton::bfloat16 and
/// baton::float16 storage the same way (the LSE is always float).
///  - every tensor is DEVICE memory; the head dim is contiguous and rows 16-byte aligned
///    (any other strides); head dims 64, 128 and 256 (others throw attention_error);
///  - forward: online softmax in fp32, LSE in fp32; bf16/f16 through m16n8k16 tensor cores
///    with fp32 accumulation; float through 3xTF32 (fp32-level accuracy);
///  - backward: a pre-pass D = rowsum(dO * O), a key-tile pass (dK, dV) and a query-tile
///    pass (dQ); deterministic, no atomics;
///  - every mask through the CPU kernels' tile classification, made on the host per call
///    (empty tiles skipped, full tiles unmasked, partial tiles by a bitmask);
///  - the non-finite rule of docs/attention.md;
///  - ASYNCHRONOUS: a call queues its kernels on the object's stream (the constructor's
///    argument; default: the legacy default stream) and returns. Synchronise that stream
///    before reading the results on the host. Each object owns a device workspace (the tile
///    plan, flags) reused across calls; the stream orders the calls that share it. Calls from
///    several threads on one object are serialised while they queue (a mutex), so they are
///    safe; for concurrency across streams make one object per stream.
class cuda_attention : public detail::attention::mask_argument_check {
 public:
  static constexpr const char* name = "baton::cuda_attention";
  /// Takes bfloat16 storage (backend_stores_bfloat16).
  static constexpr bool stores_bfloat16 = true;

  explicit cuda_attention(cudaStream_t stream = nullptr) : stream_(stream) {}

  [[nodiscard]] cudaStream_t stream() const noexcept { return stream_; }

  /// Frees the device workspace after the stream has finished with it (copies of this object
  /// share it); the next call allocates again.
  void release_workspace() const { workspace_->release(stream_); }

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
    const std::size_t plan_bytes = dc::align256(f.plan.size_bytes());
    const std::size_t flag_bytes = dc::align256(dc::key_flag_bytes(f.call.batch, f.call.heads_kv, f.call.seq_k));
    std::lock_guard lock(workspace_->mutex);
    std::byte* base = workspace_->reserve(plan_bytes + flag_bytes, stream_);
    workspace_->upload_plan(base, f.plan, stream_);
    auto* key_bad = reinterpret_cast<std::uint8_t*>(base + plan_bytes);
    const tensor_view<const S, 4> qc = q, kc = k, vc = v;
    dc::launch_key_flags(dc::key_flag_args_for<S>(kc, vc, f.call, key_bad), stream_);
    dc::launch_forward(dc::forward_args_for<S>(qc, kc, vc, out, lse, f.call, f.plan.view(base), key_bad), stream_);
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
    const std::size_t plan_bytes = dc::align256(bc.plan.size_bytes());
    const std::size_t work_bytes = dc::backward_workspace_bytes(c.batch, c.heads_q, c.seq_q, c.heads_kv, c.seq_k);
    std::lock_guard lock(workspace_->mutex);
    std::byte* base = workspace_->reserve(plan_bytes + work_bytes, stream_);
    workspace_->upload_plan(base, bc.plan, stream_);
    const tensor_view<const S, 4> qc = q, kc = k, vc = v, oc = out, doc = dout;
    const tensor_view<const float, 3> lc = lse;
    dc::launch_backward(dc::backward_args_for<S>(qc, kc, vc, oc, lc, doc, dq, dk, dv, c, params.accumulate,
                                                 bc.plan.view(base), base + plan_bytes),
                        stream_);
  }

 private:
  // One device allocation, grown when a call needs more, freed with the last copy of the
  // object (or release_workspace). The plan uploaded last is remembered: a call whose plan is
  // byte-identical (the same mask and shapes, every training step) skips the upload, and
  // with it the host-side wait that a copy from pageable memory implies.
  struct device_workspace {
    std::mutex mutex;
    std::byte* data = nullptr;
    std::size_t bytes = 0;
    std::vector<std::uint64_t> uploaded;  // the plan blob at the start of `data`
    std::byte* uploaded_at = nullptr;

    std::byte* reserve(std::size_t need, cudaStream_t stream) {
      if (need <= bytes && data != nullptr) return data;
      release_locked(stream);
      void* p = nullptr;
      detail::core::check_cuda<std::runtime_error>(cudaMalloc(&p, need == 0 ? 256 : need), name,
                                                   "cudaMalloc (attention workspace)");
      data = static_cast<std::byte*>(p);
      bytes = need;
      return data;
    }
    void upload_plan(std::byte* at, const detail::attention::cuda::tile_plan& plan, cudaStream_t stream) {
      const std::size_t n = plan.size_bytes();
      if (at == uploaded_at && uploaded.size() * 8 == n && std::memcmp(uploaded.data(), plan.blob(), n) == 0) return;
      // From pageable memory: the call returns once the bytes are staged, so `plan` may die.
      detail::core::check_cuda<std::runtime_error>(cudaMemcpyAsync(at, plan.blob(), n, cudaMemcpyHostToDevice, stream),
                                                   name, "cudaMemcpyAsync (tile plan)");
      uploaded.assign(plan.blob(), plan.blob() + n / 8);
      uploaded_at = at;
    }
    void release(cudaStream_t stream) {
      std::lock_guard lock(mutex);
      release_locked(stream);
    }
    void release_locked(cudaStream_t stream) {
      if (data == nullptr) return;
      // Kernels queued earlier may still read it.
      detail::core::check_cuda<std::runtime_error>(cudaStreamSynchronize(stream), name,
                                                   "cudaStreamSynchronize (before freeing the attention workspace)");
      detail::core::check_cuda<std::runtime_error>(cudaFree(data), name, "cudaFree (attention workspace)");
      data = nullptr;
      bytes = 0;
      uploaded.clear();
      uploaded_at = nullptr;
    }
    ~device_workspace() {
      if (data != nullptr) {
        (void)cudaDeviceSynchronize();  // the stream may be gone; no throw from a destructor
        (void)cudaFree(data);
      }
    }
  };

  cudaStream_t stream_ = nullptr;
  std::shared_ptr<device_workspace> workspace_ = std::make_shared<device_workspace>();
};

}  // namespace baton
