// baton/cp/detail/front_end.hpp — what ring, Ulysses and hybrid attention do before their
// algorithms run: compile-time checks of the backend and mask, shape checks, and agreement
// among the ranks, so that bad input on any rank makes every rank throw the same cp_error
// before any data moves.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/tensor_view.hpp>
#include <baton/cp/detail/agree.hpp>
#include <baton/cp/detail/views.hpp>
#include <baton/cp/params.hpp>
#include <baton/cp/sharding.hpp>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

namespace baton::detail::cp {

enum operation_code : std::int64_t {
  op_ring_forward = 1, op_ring_backward, op_ulysses_forward, op_ulysses_backward, op_hybrid_forward,
  op_hybrid_backward, op_make_cp_mesh
};

template <class T>
call_descriptor describe(operation_code op, const local_shape& s, const sequence_sharding& sharding, int world_size,
                         int world_rank) {
  call_descriptor d;
  using f = call_descriptor;
  d[f::operation] = op;
  d[f::batch] = s.batch;
  d[f::seq_local] = s.seq;
  d[f::heads_q] = s.heads_q;
  d[f::heads_kv] = s.heads_kv;
  d[f::head_dim] = s.dim;
  d[f::seq_len] = sharding.seq_len();
  d[f::layout] = static_cast<std::int64_t>(sharding.layout());
  d[f::degree] = sharding.degree();
  d[f::inner_degree] = sharding.inner_degree();
  d[f::element_size] = sizeof(T);
  d[f::lse_element_size] = sizeof(lse_t<T>);
  d[f::world_size] = world_size;
  d[f::rank] = world_rank;
  return d;
}

// The first non-empty message, if any.
inline std::string first_problem(std::initializer_list<std::string> problems) {
  for (const std::string& p : problems)
    if (!p.empty()) return p;
  return {};
}

template <class T, class TI>
std::string check_forward_tensors(const local_shape& s, const tensor_view<TI, 4>& k, const tensor_view<TI, 4>& v,
                                  const tensor_view<T, 4>& out, const tensor_view<lse_t<T>, 3>& lse) {
  const std::array<std::int64_t, 4> qs{s.batch, s.seq, s.heads_q, s.dim}, kvs{s.batch, s.seq, s.heads_kv, s.dim};
  return first_problem({expect(k, "k", kvs), expect(v, "v", kvs), expect(out, "out", qs),
                        expect(lse, "lse", std::array<std::int64_t, 3>{s.batch, s.heads_q, s.seq})});
}

template <class T>
std::string check_backward_tensors(const local_shape& s, const tensor_view<const T, 4>& k,
                                   const tensor_view<const T, 4>& v, const tensor_view<const T, 4>& out,
                                   const tensor_view<const lse_t<T>, 3>& lse, const tensor_view<const T, 4>& dout,
                                   const tensor_view<T, 4>& dq, const tensor_view<T, 4>& dk,
                                   const tensor_view<T, 4>& dv) {
  const std::array<std::int64_t, 4> qs{s.batch, s.seq, s.heads_q, s.dim}, kvs{s.batch, s.seq, s.heads_kv, s.dim};
  return first_problem({expect(k, "k", kvs), expect(v, "v", kvs), expect(out, "out", qs),
                        expect(lse, "lse", std::array<std::int64_t, 3>{s.batch, s.heads_q, s.seq}),
                        expect(dout, "dout", qs), expect(dq, "dq", qs), expect(dk, "dk", kvs), expect(dv, "dv", kvs)});
}

template <class Backend, class T>
constexpr bool static_check_backend() {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "baton context parallelism: tensors must hold float or double (the element type of out / dq)");
  static_assert(attention_backend<std::remove_cvref_t<Backend>, T>,
                "baton context parallelism: the backend must model baton::attention_backend<B, T>: "
                "b.forward(q, k, v, mask, out, lse, params) and b.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, "
                "params) over tensor_view (see baton/attention/backend.hpp; baton::reference_attention is one)");
  return (std::is_same_v<T, float> || std::is_same_v<T, double>) && attention_backend<std::remove_cvref_t<Backend>, T>;
}

template <class Mask>
constexpr bool static_check_mask() {
  static_assert(attention_mask<Mask>,
                "baton context parallelism: the mask must model baton::attention_mask: allowed(q_pos, k_pos) -> bool "
                "and classify(position_block, position_block) -> block_kind (see baton/attention/masks.hpp)");
  return attention_mask<Mask>;
}

// Both checks, reported together; the caller compiles its body only when they pass, so the
// static_assert messages are the whole error.
template <class Backend, class T, class Mask>
constexpr bool usable() {
  constexpr bool backend_ok = static_check_backend<Backend, T>();
  constexpr bool mask_ok = static_check_mask<Mask>();
  return backend_ok && mask_ok;
}

// Records this rank's problem (if any) in its descriptor, has `gather` collect every rank's
// descriptor, and then either every rank returns or every rank throws the same cp_error.
template <class T, class Gather>
void agree_on_call(const std::string& who, operation_code op, const local_shape& s, const sequence_sharding& sharding,
                   int world_size, int world_rank, const std::string& problem, Gather&& gather) {
  call_descriptor mine = describe<T>(op, s, sharding, world_size, world_rank);
  if (!problem.empty()) mine.fail("rank " + std::to_string(world_rank) + ": " + problem);
  const std::vector<call_descriptor> all = gather(mine);
  agree_or_throw(who, all);
}

// The public forward and backward of a context-parallel attention class (CRTP): checks,
// agreement, then the class's algorithm. Derived provides, as members this base may call
// (befriend it):
//   template <class T, class Mask> G agree(bool backward, const local_shape&, const Mask&,
//                                          const std::string& caller_problem,
//                                          const std::string& tensor_problem);
//   (reporting the caller's problem, cp_params::caller_problem, before any of its own);
//   template <class T, class Mask> void run_forward(const G&, q, k, v, mask, out, lse, double scale);
//   template <class T, class Mask> void run_backward(const G&, q, k, v, out, lse, dout, mask, dq, dk,
//                                                    dv, double scale);
// where G is whatever the algorithm needs to know once the ranks agree (its geometry).
template <class Derived, class Backend>
class front_end {
 public:
  /// Attention of this rank's queries over the whole sequence: out and lse for its shard.
  template <class T, class Mask>
  void forward(std::type_identity_t<tensor_view<const T, 4>> q, std::type_identity_t<tensor_view<const T, 4>> k,
               std::type_identity_t<tensor_view<const T, 4>> v, const Mask& mask, tensor_view<T, 4> out,
               std::type_identity_t<tensor_view<lse_t<T>, 3>> lse, const cp_params& params = {}) {
    if constexpr (usable<Backend, T, Mask>()) {
      const local_shape s = shape_of(q, k);
      const auto agreed =
          self().template agree<T>(false, s, mask, params.caller_problem, check_forward_tensors<T>(s, k, v, out, lse));
      self().template run_forward<T>(agreed, q, k, v, mask, out, lse, params.softmax_scale);
    }
  }

  /// The gradients: dq for this rank's queries, dk and dv for its own keys and values.
  template <class T, class Mask>
  void backward(std::type_identity_t<tensor_view<const T, 4>> q, std::type_identity_t<tensor_view<const T, 4>> k,
                std::type_identity_t<tensor_view<const T, 4>> v, std::type_identity_t<tensor_view<const T, 4>> out,
                std::type_identity_t<tensor_view<const lse_t<T>, 3>> lse,
                std::type_identity_t<tensor_view<const T, 4>> dout, const Mask& mask, tensor_view<T, 4> dq,
                std::type_identity_t<tensor_view<T, 4>> dk, std::type_identity_t<tensor_view<T, 4>> dv,
                const cp_params& params = {}) {
    if constexpr (usable<Backend, T, Mask>()) {
      const local_shape s = shape_of(q, k);
      const auto agreed =
          self().template agree<T>(true, s, mask, params.caller_problem,
                                   check_backward_tensors<T>(s, k, v, out, lse, dout, dq, dk, dv));
      self().template run_backward<T>(agreed, q, k, v, out, lse, dout, mask, dq, dk, dv, params.softmax_scale);
    }
  }

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }
};

}  // namespace baton::detail::cp
