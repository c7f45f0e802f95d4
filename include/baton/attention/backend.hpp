// baton/attention/backend.hpp — the contract every attention backend keeps.
//
// forward(q, k, v, mask, out, lse, params) and backward(q, k, v, out, lse, dout, mask, dq,
// dk, dv, params): every tensor the computation needs is an argument, nothing is saved
// between the calls. A ring-attention backward therefore hands each step the K/V it actually
// attended to (seed 001: a backward that re-read K/V saved at step 0 silently corrupted
// every gradient).
#pragma once

#include <array>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include <baton/attention/error.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/core/float16.hpp>
#include <baton/core/sizes.hpp>
#include <baton/core/tensor_view.hpp>

namespace baton {

/// The type of the log-sum-exp for element type T: at least fp32 (float for float, double
/// for double).
template <class T>
struct lse_type {
  static_assert(std::is_floating_point_v<T>,
                "baton attention: the element type must be float or double (add an lse_type "
                "specialisation for a custom type, mapping it to float or wider)");
  using type = std::conditional_t<(sizeof(T) < sizeof(float)), float, T>;
};
/// The 16-bit storage types keep a float LSE.
template <>
struct lse_type<bfloat16> {
  using type = float;
};
template <>
struct lse_type<float16> {
  using type = float;
};
template <class T>
using lse_t = typename lse_type<std::remove_cv_t<T>>::type;

/// Per-call settings shared by forward and backward.
struct attention_params {
  /// Global positions of the rows of q (and out, lse, dout, dq) and of k (and v, dk, dv).
  /// Default: 0..n-1. Masks see these, so a context-parallel shard only changes them.
  positions q_pos{};
  positions k_pos{};
  /// Multiplies q.k before the softmax; 0 selects 1/sqrt(head dim).
  double softmax_scale = 0;
  /// backward adds its gradients into dq, dk, dv instead of overwriting them, so a caller
  /// can sum the contributions of several key/value blocks (ring steps).
  bool accumulate = false;
};

/// The largest call a backend with a device workspace must serve without allocating: given
/// to its `reserve_workspace(shape)` when it has one (cuda_attention). Context parallelism
/// calls that at the start of every ring call with the ring's largest step, so that no
/// allocation happens between the steps.
struct attention_workspace_shape {
  std::int64_t batch = 1, heads_q = 1, heads_kv = 1, seq_q = 0, seq_k = 0, dim = 128;
  /// sizeof the storage type (2: bfloat16, float16; 4: float; 8: double).
  int element_bytes = 2;
  /// Device bytes kept for cached tile plans (cuda_attention). 0: the backend's default
  /// (cuda_attention: room for one forward and one backward plan of this shape with every
  /// tile partial, the most one call can need, which holds several real plans, as a causal
  /// plan has partial tiles on its diagonal only). Either way a later reservation also
  /// grows the room to the distinct plans built since the previous one, so calls that
  /// evicted one another's plans fit from the next reservation on.
  std::size_t plan_bytes = 0;
};

/// Whether backend B takes attention_workspace_shape reservations.
template <class B>
concept backend_with_workspace = requires(const B& b, const attention_workspace_shape& s) { b.reserve_workspace(s); };

/// A backend B models attention_backend<B, T> (T = float or double; a backend may also take
/// 16-bit storage, baton::bfloat16, with a float LSE) when, with q, k, v, out,
/// dout viewed as tensor_view<const T, 4>, outputs as tensor_view<T, 4> and the LSE as
/// tensor_view<lse_t<T>, 3> (const in backward), and any attention_mask:
///   1. `b.forward(q, k, v, mask, out, lse, params)` writes out [batch, seq_q, heads_q, dim]
///      and lse [batch, heads_q, seq_q] (natural log of the softmax denominator, including
///      the scale; -inf and out = 0 for a query that may attend to nothing);
///   2. `b.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, params)` writes (or with
///      params.accumulate adds) the gradients of sum(out * dout), computing P from the given
///      lse and D = rowsum(dout * out) from the given out — so a ring step may pass the final
///      merged out and lse rather than its own;
///   3. k and v are [batch, seq_k, heads_kv, dim] with heads_q % heads_kv == 0 (GQA/MQA);
///   4. bad shapes throw attention_error naming the tensor and the expected shape;
///   5. calls are stateless and may run concurrently from several threads;
///   6. non-finite values follow the rule of docs/attention.md ("Non-finite values"): a NaN
///      or infinity in q_i, k_j or v_j of a pair (i, j) the mask allows makes row i's out and
///      lse NaN, and in backward every gradient such a pair touches NaN; masked pairs are
///      never read, and a row with no allowed key keeps out 0, lse -inf.
template <class B, class T>
concept attention_backend =
    requires(B& b, tensor_view<const T, 4> in, tensor_view<T, 4> out_view, tensor_view<lse_t<T>, 3> lse,
             tensor_view<const lse_t<T>, 3> saved_lse, const no_mask& mask, const attention_params& params) {
      b.forward(in, in, in, mask, out_view, lse, params);
      b.backward(in, in, in, in, saved_lse, in, mask, out_view, out_view, out_view, params);
    };

/// Whether backend B computes on baton::bfloat16 storage (its kernels widen bf16 on load and
/// round its outputs to bf16): a backend says so with a member `static constexpr bool
/// stores_bfloat16 = true` (kokkos_attention, cuda_attention). attention_backend<B, bfloat16>
/// checks only that the calls are well-formed, which a backend whose element type is checked
/// inside its body (reference_attention) also passes; the model layer asks this instead.
template <class B>
inline constexpr bool backend_stores_bfloat16 = requires { requires B::stores_bfloat16; };

namespace detail::attention {

/// What a call computes (its sizes, scale and positions), once every check passed.
struct checked_call {
  std::int64_t batch = 0, seq_q = 0, seq_k = 0, heads_q = 0, heads_kv = 0, dim = 0;
  double scale = 1;
  positions q_pos, k_pos;
  [[nodiscard]] std::int64_t group() const noexcept { return heads_q / heads_kv; }
};

template <class T, std::size_t N>
void expect_shape(const tensor_view<T, N>& t, const char* name, const std::array<std::int64_t, N>& expected,
                  const char* meaning) {
  if (t.extents() != expected)
    throw attention_error(std::string("baton attention: tensor '") + name + "' has shape " +
                          core::shape_text(t.extents()) + " but expected " + core::shape_text(expected) + " " + meaning);
  if (t.data == nullptr && t.size() > 0)
    throw attention_error(std::string("baton attention: tensor '") + name + "' has shape " +
                          core::shape_text(t.extents()) + " but a null data pointer");
}

template <class T, std::size_t N>
void expect_unit_last_stride(const tensor_view<T, N>& t, const char* name, const char* backend) {
  if (t.extent(N - 1) > 1 && t.stride(N - 1) != 1)
    throw attention_error(std::string("baton attention: tensor '") + name + "' has stride " +
                          std::to_string(t.stride(N - 1)) + " along its last axis; " + backend +
                          " needs the head dim contiguous (stride 1): pass a copy laid out [..., dim]");
}

/// Checks q, k, v and the parameters, and returns the call they describe.
template <class TQ, class TK, class TV>
checked_call check_inputs(const tensor_view<TQ, 4>& q, const tensor_view<TK, 4>& k, const tensor_view<TV, 4>& v,
                     const attention_params& params) {
  checked_call call;
  call.batch = q.extent(0);
  call.seq_q = q.extent(1);
  call.heads_q = q.extent(2);
  call.dim = q.extent(3);
  for (auto e : q.extents())
    if (e < 0) throw attention_error("baton attention: tensor 'q' has a negative extent " + core::shape_text(q.extents()));
  if (q.data == nullptr && q.size() > 0)
    throw attention_error("baton attention: tensor 'q' has shape " + core::shape_text(q.extents()) + " but a null data pointer");
  if (call.dim == 0 && q.size() == 0 && call.batch * call.seq_q * call.heads_q > 0)
    throw attention_error("baton attention: tensor 'q' has head dim 0; expected [batch, seq_q, heads_q, dim] with dim >= 1");
  call.seq_k = k.extent(1);
  call.heads_kv = k.extent(2);
  if (call.seq_k < 0)
    throw attention_error("baton attention: tensor 'k' has a negative extent " + core::shape_text(k.extents()));
  if (call.heads_kv <= 0 && call.heads_q > 0)
    throw attention_error("baton attention: tensor 'k' has shape " + core::shape_text(k.extents()) +
                          "; expected [batch, seq_k, heads_kv, dim] with heads_kv >= 1");
  if (call.heads_kv > 0 && call.heads_q % call.heads_kv != 0)
    throw attention_error("baton attention: q has " + std::to_string(call.heads_q) + " heads and k/v have " +
                          std::to_string(call.heads_kv) +
                          "; the query heads must be a multiple of the key/value heads (GQA/MQA), "
                          "e.g. k/v shape [" + std::to_string(call.batch) + ", " + std::to_string(call.seq_k) +
                          ", heads_kv dividing " + std::to_string(call.heads_q) + ", " + std::to_string(call.dim) + "]");
  const std::array<std::int64_t, 4> kv_shape{call.batch, call.seq_k, call.heads_kv, call.dim};
  expect_shape(k, "k", kv_shape, "(k is [batch, seq_k, heads_kv, dim] with batch and dim of q)");
  expect_shape(v, "v", kv_shape, "(v must have the shape of k)");
  const double scale = params.softmax_scale;
  if (!(scale >= 0) || std::isinf(scale))
    throw attention_error("baton attention: softmax_scale is " + std::to_string(scale) +
                          "; it must be positive and finite (0 selects 1/sqrt(head dim))");
  call.scale = scale == 0 ? (call.dim > 0 ? 1.0 / std::sqrt(static_cast<double>(call.dim)) : 1.0) : scale;
  call.q_pos = params.q_pos.resolved(call.seq_q, "attention_params::q_pos");
  call.k_pos = params.k_pos.resolved(call.seq_k, "attention_params::k_pos");
  return call;
}

template <class TO, class TL>
void check_forward_outputs(const checked_call& call, const tensor_view<TO, 4>& out, const tensor_view<TL, 3>& lse) {
  const std::array<std::int64_t, 4> q_shape{call.batch, call.seq_q, call.heads_q, call.dim};
  expect_shape(out, "out", q_shape, "(out has the shape of q: [batch, seq_q, heads_q, dim])");
  expect_shape(lse, "lse", std::array<std::int64_t, 3>{call.batch, call.heads_q, call.seq_q}, "(lse is [batch, heads_q, seq_q])");
}

template <class TO, class TL, class TD, class TG, class TKV>
void check_backward_tensors(const checked_call& call, const tensor_view<TO, 4>& out, const tensor_view<TL, 3>& lse,
                            const tensor_view<TD, 4>& dout, const tensor_view<TG, 4>& dq,
                            const tensor_view<TKV, 4>& dk, const tensor_view<TKV, 4>& dv) {
  check_forward_outputs(call, out, lse);
  const std::array<std::int64_t, 4> q_shape{call.batch, call.seq_q, call.heads_q, call.dim};
  const std::array<std::int64_t, 4> kv_shape{call.batch, call.seq_k, call.heads_kv, call.dim};
  expect_shape(dout, "dout", q_shape, "(dout has the shape of out: [batch, seq_q, heads_q, dim])");
  expect_shape(dq, "dq", q_shape, "(dq has the shape of q: [batch, seq_q, heads_q, dim])");
  expect_shape(dk, "dk", kv_shape, "(dk has the shape of k: [batch, seq_k, heads_kv, dim])");
  expect_shape(dv, "dv", kv_shape, "(dv has the shape of v: [batch, seq_k, heads_kv, dim])");
}

/// Whether row (b, s, h) of t holds only finite values (the non-finite rule's test; one pass
/// over a row, never inside a kernel's inner loops).
template <class T>
[[nodiscard]] bool row_finite(const tensor_view<T, 4>& t, std::int64_t b, std::int64_t s, std::int64_t h,
                              std::int64_t dim) noexcept {
  bool finite = true;
  for (std::int64_t d = 0; d < dim; ++d) finite = finite && std::isfinite(static_cast<double>(t(b, s, h, d)));
  return finite;
}

/// bad[j] = whether key j of batch b, kv head hk has a non-finite value in k or in v (the
/// non-finite rule's per-key test, done once per (batch, head) before a row loop).
template <class TK, class TV>
void mark_non_finite_keys(const tensor_view<TK, 4>& k, const tensor_view<TV, 4>& v, std::int64_t b, std::int64_t hk,
                          std::int64_t seq_k, std::int64_t dim, std::vector<char>& bad) {
  for (std::int64_t j = 0; j < seq_k; ++j)
    bad[static_cast<std::size_t>(j)] = !row_finite(k, b, j, hk, dim) || !row_finite(v, b, j, hk, dim);
}

/// Compile-time check shared by backends: the mask argument models attention_mask.
template <class Mask>
constexpr void static_check_mask() {
  static_assert(attention_mask<Mask>,
                "baton attention: the mask argument is not a mask: it must model baton::attention_mask, with const "
                "members allowed(q_pos, k_pos) -> bool and classify(position_block, position_block) -> block_kind; "
                "pass baton::no_mask{} for no masking, or wrap a predicate in baton::block_mask");
}

/// The base of every backend: the forward and backward taken when the mask argument is not an
/// attention_mask, which only static_check_mask, so that a caller reads that message rather
/// than a failed constraint on the backend's own overloads (constrained on attention_mask).
/// A backend derives from it and declares `using mask_argument_check::forward;` and
/// `using mask_argument_check::backward;` beside its own (their constraints differ, so
/// neither hides the other).
struct mask_argument_check {
  template <class TQ, class TK, class TV, class Mask, class TO, class TL>
    requires(!attention_mask<Mask>)
  void forward(tensor_view<TQ, 4>, tensor_view<TK, 4>, tensor_view<TV, 4>, const Mask&, tensor_view<TO, 4>,
               tensor_view<TL, 3>, const attention_params& = {}) const {
    static_check_mask<Mask>();
  }

  template <class TQ, class TK, class TV, class TO, class TL, class TD, class Mask, class TG1, class TG2, class TG3>
    requires(!attention_mask<Mask>)
  void backward(tensor_view<TQ, 4>, tensor_view<TK, 4>, tensor_view<TV, 4>, tensor_view<TO, 4>, tensor_view<TL, 3>,
                tensor_view<TD, 4>, const Mask&, tensor_view<TG1, 4>, tensor_view<TG2, 4>, tensor_view<TG3, 4>,
                const attention_params& = {}) const {
    static_check_mask<Mask>();
  }
};

/// Which 16-bit storage a backend takes besides float and double (the reference: none; the
/// Kokkos kernels: bfloat16, widened on load).
enum class storage_16 { none, bfloat16 };

template <class T, storage_16 Storage>
inline constexpr bool element_type_accepted =
    std::is_same_v<T, float> || std::is_same_v<T, double> ||
    (Storage == storage_16::bfloat16 && std::is_same_v<T, baton::bfloat16>);

template <class T, storage_16 Storage>
constexpr void static_check_element_type() {
  if constexpr (Storage == storage_16::none)
    static_assert(element_type_accepted<T, Storage>, "baton attention: q, k, v must hold float or double");
  else
    static_assert(element_type_accepted<T, Storage>,
                  "baton attention: q, k, v must hold float, double or baton::bfloat16 (bf16 storage)");
}

/// Compile-time checks shared by backends: one element type, mutable outputs, lse_t LSE.
template <class TQ, class TK, class TV, class TO, class TL, storage_16 Storage = storage_16::none>
constexpr void static_check_forward_types() {
  using T = std::remove_const_t<TQ>;
  static_check_element_type<T, Storage>();
  static_assert(std::is_same_v<std::remove_const_t<TK>, T> && std::is_same_v<std::remove_const_t<TV>, T>,
                "baton attention: q, k and v must have the same element type");
  static_assert(std::is_same_v<TO, T>, "baton attention: out must be a mutable tensor_view<T, 4> with T the element type of q");
  static_assert(std::is_same_v<TL, lse_t<T>>,
                "baton attention: lse must be a mutable tensor_view<lse_t<T>, 3> (float for float, double for double)");
}

template <class TQ, class TK, class TV, class TO, class TL, class TD, class TG1, class TG2, class TG3,
          storage_16 Storage = storage_16::none>
constexpr void static_check_backward_types() {
  using T = std::remove_const_t<TQ>;
  static_check_element_type<T, Storage>();
  static_assert(std::is_same_v<std::remove_const_t<TK>, T> && std::is_same_v<std::remove_const_t<TV>, T> &&
                    std::is_same_v<std::remove_const_t<TO>, T> && std::is_same_v<std::remove_const_t<TD>, T>,
                "baton attention: q, k, v, out and dout must have the same element type");
  static_assert(std::is_same_v<std::remove_const_t<TL>, lse_t<T>>,
                "baton attention: lse must be a tensor_view<const lse_t<T>, 3> (float for float, double for double)");
  static_assert(std::is_same_v<TG1, T> && std::is_same_v<TG2, T> && std::is_same_v<TG3, T>,
                "baton attention: dq, dk, dv must be mutable tensor_view<T, 4> with T the element type of q");
}

}  // namespace detail::attention
}  // namespace baton
