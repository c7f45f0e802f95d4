// baton/attention/cuda/emulated.hpp — the CUDA backend's kernels run on the CPU.
//
// cuda_attention_emulated has the interface of cuda_attention (cuda.hpp) on HOST memory and
// runs the very kernel bodies the GPU runs (forward_kernel.hpp, backward_kernel.hpp) through
// the lockstep simt emulation (cuda/detail/emulate.hpp): block after block, tensor-core
// fragments emulated lane by lane, shared-memory races checked. It exists for tests (the CPU
// suite compares it with the reference backend, so the GPU kernels' logic is tested where
// there is no GPU); it is far too slow for anything else. Plain C++ (g++-compilable).
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>

#include <baton/attention/backend.hpp>
#include <baton/attention/cuda/detail/call.hpp>
#include <baton/attention/cuda/detail/emulate.hpp>
#include <baton/attention/cuda/plan_cache.hpp>
#include <baton/attention/cuda/storage.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/tensor_view.hpp>

namespace baton {

/// The CUDA backend's kernels on the CPU, for tests. Element types float, bfloat16, float16
/// (the LSE is float); head dims 64, 128, 256. Models attention_backend<..., float>.
class cuda_attention_emulated
    : public detail::attention::mask_argument_check,
      public detail::attention::cuda::shared_plan_workspace<detail::attention::cuda::host_workspace_ops> {
 public:
  static constexpr const char* name = "baton::cuda_attention_emulated";
  /// Takes bfloat16 storage (backend_stores_bfloat16).
  static constexpr bool stores_bfloat16 = true;

  /// reserve_workspace, release_workspace and workspace_stats are cuda_attention's, on host
  /// memory: the same workspace logic, so the tests count the same allocations and plans.
  cuda_attention_emulated() : shared_plan_workspace(name, {}) {}

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
    // Held for the whole call: the "kernels" below read the workspace (on a GPU the stream
    // orders that; here copies of this object on other threads must wait).
    auto& ws = workspace();
    std::lock_guard lock(ws.mutex());
    const dc::tile_plan_view plan = dc::plan_from(ws, f, mask);
    auto* key_bad = reinterpret_cast<std::uint8_t*>(
        ws.scratch(dc::key_flag_bytes(f.call.batch, f.call.heads_kv, f.call.seq_k)));
    const tensor_view<const S, 4> qc = q, kc = k, vc = v;
    if (f.call.seq_k > 0) dc::emulate_key_flags(dc::key_flag_args_for<S>(kc, vc, f.call, key_bad));
    dc::emulate_forward(dc::forward_args_for<S>(qc, kc, vc, out, lse, f.call, plan, key_bad));
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
    const tensor_view<const S, 4> qc = q, kc = k, vc = v, oc = out, dc_out = dout;
    const tensor_view<const float, 3> lc = lse;
    dc::emulate_backward(dc::backward_args_for<S>(qc, kc, vc, oc, lc, dc_out, dq, dk, dv, c, params.accumulate, plan, work));
  }
};

}  // namespace baton
