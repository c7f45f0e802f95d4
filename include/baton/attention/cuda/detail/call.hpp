// baton/attention/cuda/detail/call.hpp — what the CUDA backend does before a launch, shared
// by the device backend (cuda.hpp) and its host twin (emulated.hpp): compile-time checks of
// the element types, the shape / layout / head-dim checks, the tile plans, and the kernels'
// argument structs built from tensor_views. Plain C++ (g++-compilable).
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <numbers>
#include <string>
#include <type_traits>
#include <utility>

#include <baton/attention/backend.hpp>
#include <baton/attention/cuda/detail/backward_args.hpp>
#include <baton/attention/cuda/detail/forward_args.hpp>
#include <baton/attention/cuda/plan.hpp>
#include <baton/attention/cuda/plan_cache.hpp>
#include <baton/attention/cuda/storage.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/tensor_view.hpp>

namespace baton::detail::attention::cuda {

template <class TQ, class TK, class TV, class TO, class TL>
constexpr void static_check_forward_storage() {
  using S = std::remove_const_t<TQ>;
  static_assert(cuda_storage<S>, "baton::cuda_attention: q, k, v must hold float, baton::bfloat16 or baton::float16");
  static_assert(std::is_same_v<std::remove_const_t<TK>, S> && std::is_same_v<std::remove_const_t<TV>, S>,
                "baton::cuda_attention: q, k and v must have the same element type");
  static_assert(std::is_same_v<TO, S>, "baton::cuda_attention: out must be a mutable tensor_view<S, 4> with S the element type of q");
  static_assert(std::is_same_v<TL, float>, "baton::cuda_attention: lse must be a mutable tensor_view<float, 3> (fp32 for every storage type)");
}

template <class TQ, class TK, class TV, class TO, class TL, class TD, class TG1, class TG2, class TG3>
constexpr void static_check_backward_storage() {
  using S = std::remove_const_t<TQ>;
  static_assert(cuda_storage<S>, "baton::cuda_attention: q, k, v must hold float, baton::bfloat16 or baton::float16");
  static_assert(std::is_same_v<std::remove_const_t<TK>, S> && std::is_same_v<std::remove_const_t<TV>, S> &&
                    std::is_same_v<std::remove_const_t<TO>, S> && std::is_same_v<std::remove_const_t<TD>, S>,
                "baton::cuda_attention: q, k, v, out and dout must have the same element type");
  static_assert(std::is_same_v<std::remove_const_t<TL>, float>,
                "baton::cuda_attention: lse must be a tensor_view<const float, 3> (fp32 for every storage type)");
  static_assert(std::is_same_v<TG1, S> && std::is_same_v<TG2, S> && std::is_same_v<TG3, S>,
                "baton::cuda_attention: dq, dk, dv must be mutable tensor_view<S, 4> with S the element type of q");
}

/// The head dims the kernels are built for, or an attention_error naming them.
inline void check_head_dim(std::int64_t dim, const char* backend) {
  if (!is_supported_head_dim(dim))
    throw attention_error(std::string("baton attention: ") + backend + " supports head dims 64, 128 and 256; q has head dim " +
                          std::to_string(dim) + " (pad the head dim with zeros to the next supported one, or use the "
                          "kokkos or reference backend)");
}

/// Rows are copied as 16-byte vectors: the head dim contiguous, the data pointer and the
/// batch / seq / head strides 16-byte aligned.
template <class T, std::size_t N>
void check_layout(const tensor_view<T, N>& t, const char* name, const char* backend) {
  if (t.size() == 0) return;
  detail::attention::expect_unit_last_stride(t, name, backend);
  constexpr std::int64_t per_vector = static_cast<std::int64_t>(16 / sizeof(T));
  bool ok = reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0;
  for (std::size_t d = 0; d + 1 < N; ++d) ok = ok && (t.extent(d) <= 1 || t.stride(d) % per_vector == 0);
  if (!ok)
    throw attention_error(std::string("baton attention: tensor '") + name + "' is not laid out in 16-byte rows; " +
                          backend + " loads rows as 16-byte vectors: pass a 16-byte aligned pointer and strides that "
                          "are multiples of " + std::to_string(per_vector) + " elements (a contiguous tensor is fine)");
}

/// check_layout of each tensor t, named by names (in order: the first bad one is reported).
template <class... T, std::size_t... N>
void check_layouts(const char* backend, const std::array<const char*, sizeof...(T)>& names,
                   const tensor_view<T, N>&... t) {
  std::size_t i = 0;
  (check_layout(t, names[i++], backend), ...);
}

/// A checked forward call and its tiling (the plan is the workspace's business: a cached
/// one, or build_plan's).
struct forward_call {
  attention::checked_call call;
  forward_config config;
  [[nodiscard]] std::int32_t tile_q() const noexcept { return config.tile_q; }
  [[nodiscard]] std::int32_t tile_k() const noexcept { return config.tile_k; }
};

/// Every check of a forward (forward_config_for's tiles); no planning yet.
template <class TQ, class TK, class TV, class Mask, class TO, class TL>
[[nodiscard]] forward_call prepare_forward(const tensor_view<TQ, 4>& q, const tensor_view<TK, 4>& k,
                                           const tensor_view<TV, 4>& v, const Mask& mask, const tensor_view<TO, 4>& out,
                                           const tensor_view<TL, 3>& lse, const attention_params& params,
                                           const char* backend) {
  static_check_forward_storage<TQ, TK, TV, TO, TL>();
  forward_call f;
  f.call = attention::check_inputs(q, k, v, params);
  attention::check_forward_outputs(f.call, out, lse);
  check_head_dim(f.call.dim, backend);
  check_layouts(backend, {"q", "k", "v", "out"}, q, k, v, out);
  baton::validate_mask(mask, f.call.q_pos, f.call.k_pos);
  f.config = forward_config_for(static_cast<int>(sizeof(std::remove_const_t<TQ>)), static_cast<int>(f.call.dim));
  (void)forward_launch(f.config, f.call.seq_q, f.call.heads_q, f.call.batch);  // grid limits, before any work
  return f;
}

/// Copies the call's sizes into a kernel's arguments (int32: the kernels index in 32 bits).
template <class Args>
void set_sizes(Args& a, const attention::checked_call& call) noexcept {
  a.batch = static_cast<std::int32_t>(call.batch);
  a.heads_q = static_cast<std::int32_t>(call.heads_q);
  a.heads_kv = static_cast<std::int32_t>(call.heads_kv);
  a.dim = static_cast<std::int32_t>(call.dim);
}

template <class S>
[[nodiscard]] key_flag_args<S> key_flag_args_for(const tensor_view<const S, 4>& k, const tensor_view<const S, 4>& v,
                                                 const attention::checked_call& call, std::uint8_t* key_bad) {
  return {.k = k,
          .v = v,
          .batch = static_cast<std::int32_t>(call.batch),
          .heads_kv = static_cast<std::int32_t>(call.heads_kv),
          .seq_k = static_cast<std::int32_t>(call.seq_k),
          .dim = static_cast<std::int32_t>(call.dim),
          .key_bad = key_bad};
}

template <class S>
[[nodiscard]] forward_args<S> forward_args_for(const tensor_view<const S, 4>& q, const tensor_view<const S, 4>& k,
                                               const tensor_view<const S, 4>& v, const tensor_view<S, 4>& out,
                                               const tensor_view<float, 3>& lse, const attention::checked_call& call,
                                               const tile_plan_view& plan, const std::uint8_t* key_bad) {
  forward_args<S> a{.q = q, .k = k, .v = v, .out = out, .lse = lse,
                    .scale_log2 = static_cast<float>(call.scale * std::numbers::log2e), .plan = plan, .key_bad = key_bad};
  set_sizes(a, call);
  return a;
}

/// A checked backward call and its tiling (backward_shape_for's tiles).
struct backward_call {
  attention::checked_call call;
  backward_shape shape;
  [[nodiscard]] std::int32_t tile_q() const noexcept { return shape.tile_q; }
  [[nodiscard]] std::int32_t tile_k() const noexcept { return shape.tile_k; }
};

template <class TQ, class TK, class TV, class TO, class TL, class TD, class Mask, class TG1, class TG2, class TG3>
[[nodiscard]] backward_call prepare_backward(const tensor_view<TQ, 4>& q, const tensor_view<TK, 4>& k,
                                             const tensor_view<TV, 4>& v, const tensor_view<TO, 4>& out,
                                             const tensor_view<TL, 3>& lse, const tensor_view<TD, 4>& dout,
                                             const Mask& mask, const tensor_view<TG1, 4>& dq,
                                             const tensor_view<TG2, 4>& dk, const tensor_view<TG3, 4>& dv,
                                             const attention_params& params, const char* backend) {
  static_check_backward_storage<TQ, TK, TV, TO, TL, TD, TG1, TG2, TG3>();
  using S = std::remove_const_t<TQ>;
  backward_call b;
  b.call = attention::check_inputs(q, k, v, params);
  attention::check_backward_tensors(b.call, out, lse, dout, dq, dk, dv);
  check_head_dim(b.call.dim, backend);
  check_layouts(backend, {"q", "k", "v", "out", "dout", "dq", "dk", "dv"}, q, k, v, out, dout, dq, dk, dv);
  baton::validate_mask(mask, b.call.q_pos, b.call.k_pos);
  b.shape = backward_shape_for<S>(static_cast<int>(b.call.dim));
  return b;
}

/// The call's plan, built on the host (what a workspace does on a cache miss).
template <class Call, class Mask>
[[nodiscard]] tile_plan build_plan(const Call& c, const Mask& mask) {
  return make_tile_plan(mask, c.call.q_pos, c.call.k_pos, c.call.seq_q, c.call.seq_k, c.tile_q(), c.tile_k());
}

/// The call's plan from `workspace` (cached by plan_key_for, else built and uploaded).
template <class Workspace, class Call, class Mask>
[[nodiscard]] tile_plan_view plan_from(Workspace& workspace, const Call& c, const Mask& mask) {
  return workspace.plan(plan_key_for(mask, c.call.q_pos, c.call.k_pos, c.call.seq_q, c.call.seq_k, c.tile_q(), c.tile_k()),
                        [&] { return build_plan(c, mask); });
}

/// What a workspace must hold so that no call up to these sizes allocates: the scratch of
/// the largest forward and backward, and `plans` (0: room for one forward and one backward
/// plan with every tile partial, the most one call can need).
struct workspace_need {
  std::size_t scratch = 0, plans = 0;
};
[[nodiscard]] inline workspace_need workspace_need_for(const attention_workspace_shape& s, const char* backend) {
  const std::string where = std::string(backend) + "::reserve_workspace: ";
  check_head_dim(s.dim, backend);
  if (s.element_bytes != 2 && s.element_bytes != 4)
    throw attention_error(where + "element_bytes is " + std::to_string(s.element_bytes) +
                          "; give sizeof the storage: 2 (bfloat16, float16) or 4 (float)");
  if (s.batch < 0 || s.heads_q < 0 || s.heads_kv < 0 || s.seq_q < 0 || s.seq_k < 0)
    throw attention_error(where + "batch, heads and sequence lengths must be >= 0");
  const std::int64_t batch = s.batch, heads_q = s.heads_q, heads_kv = s.heads_kv, seq_q = s.seq_q, seq_k = s.seq_k;
  const std::size_t plan_bytes = s.plan_bytes;
  const forward_config f = forward_config_for(s.element_bytes, static_cast<int>(s.dim));
  const backward_shape b = s.element_bytes == 4 ? backward_shape_for<float>(static_cast<int>(s.dim))
                                                : backward_shape_for<bfloat16>(static_cast<int>(s.dim));
  workspace_need need;
  need.scratch = std::max(align_up(key_flag_bytes(batch, heads_kv, seq_k)),
                          backward_workspace_bytes(batch, heads_q, seq_q, heads_kv, seq_k));
  need.plans = plan_bytes != 0 ? plan_bytes
                               : align_up(tile_plan_bytes_bound(seq_q, seq_k, f.tile_q, f.tile_k)) +
                                     align_up(tile_plan_bytes_bound(seq_q, seq_k, b.tile_q, b.tile_k));
  return need;
}

/// The workspace half of the CUDA backend's interface, one piece for cuda_attention (device
/// memory through device ops) and cuda_attention_emulated (host memory): the object's
/// plan_workspace, shared by its copies, and the three public calls that lock it. The
/// kernels' callers lock workspace().mutex() themselves, from the plan lookup to the last launch.
template <class Ops>
class shared_plan_workspace {
 public:
  /// Allocates now what every call up to `shape` needs (cuda_attention::reserve_workspace).
  void reserve_workspace(const attention_workspace_shape& shape) const {
    const workspace_need need = workspace_need_for(shape, backend_);
    std::lock_guard lock(workspace_->mutex());
    workspace_->reserve(need.scratch, need.plans);
  }
  /// Frees the workspace (after the stream is past its users), cached plans included.
  void release_workspace() const {
    std::lock_guard lock(workspace_->mutex());
    workspace_->release();
  }
  /// Allocations, plan builds, uploads and cache hits so far (shared by copies).
  [[nodiscard]] cuda::workspace_stats workspace_stats() const {
    std::lock_guard lock(workspace_->mutex());
    return workspace_->stats();
  }

 protected:
  shared_plan_workspace(const char* backend, Ops ops)
      : backend_(backend), workspace_(std::make_shared<plan_workspace<Ops>>(std::move(ops))) {}
  [[nodiscard]] plan_workspace<Ops>& workspace() const noexcept { return *workspace_; }

 private:
  const char* backend_;
  std::shared_ptr<plan_workspace<Ops>> workspace_;
};

template <class S>
[[nodiscard]] backward_args<S> backward_args_for(const tensor_view<const S, 4>& q, const tensor_view<const S, 4>& k,
                                                 const tensor_view<const S, 4>& v, const tensor_view<const S, 4>& out,
                                                 const tensor_view<const float, 3>& lse,
                                                 const tensor_view<const S, 4>& dout, const tensor_view<S, 4>& dq,
                                                 const tensor_view<S, 4>& dk, const tensor_view<S, 4>& dv,
                                                 const attention::checked_call& call, bool accumulate,
                                                 const tile_plan_view& plan, void* workspace) {
  backward_args<S> a{.q = q, .k = k, .v = v, .out = out, .dout = dout, .lse = lse, .dq = dq, .dk = dk, .dv = dv,
                     .scale = static_cast<float>(call.scale), .accumulate = accumulate, .plan = plan,
                     .workspace = carve_backward_workspace(workspace, call.batch, call.heads_q, call.seq_q)};
  set_sizes(a, call);
  return a;
}

}  // namespace baton::detail::attention::cuda
