// baton/attention/cuda/detail/call.hpp — what the CUDA backend does before a launch, shared
// by the device backend (cuda.hpp) and its host twin (emulated.hpp): compile-time checks of
// the element types, the shape / layout / head-dim checks, the tile plans, and the kernels'
// argument structs built from tensor_views. Plain C++ (g++-compilable).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numbers>
#include <string>
#include <type_traits>

#include <baton/attention/backend.hpp>
#include <baton/attention/cuda/detail/backward_args.hpp>
#include <baton/attention/cuda/detail/forward_args.hpp>
#include <baton/attention/cuda/plan.hpp>
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

/// A checked forward call and its plan.
struct forward_call {
  attention::checked_call call;
  forward_config config;
  tile_plan plan;
};

/// Every check of a forward, then the plan (forward_config_for's tiles).
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
  f.plan = make_tile_plan(mask, f.call.q_pos, f.call.k_pos, f.call.seq_q, f.call.seq_k, f.config.tile_q, f.config.tile_k);
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

/// A checked backward call and its plan (backward_shape_for's tiles).
struct backward_call {
  attention::checked_call call;
  tile_plan plan;
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
  const backward_shape shape = backward_shape_for<S>(static_cast<int>(b.call.dim));
  b.plan = make_tile_plan(mask, b.call.q_pos, b.call.k_pos, b.call.seq_q, b.call.seq_k, shape.tile_q, shape.tile_k);
  return b;
}

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
