// baton/cp/ring.hpp — ring attention: each rank holds a shard of the sequence; K/V blocks
// travel around the ring while every rank attends its queries to each block in turn.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/tensor_view.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/cp/detail/agree.hpp>
#include <baton/cp/detail/ring_core.hpp>
#include <baton/cp/detail/views.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/sharding.hpp>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// Settings of a context-parallel attention call. Positions are not among them: they come
/// from the sequence_sharding, which is the point.
struct cp_params {
  /// Multiplies q.k before the softmax; 0 selects 1/sqrt(head dim).
  double softmax_scale = 0;
};

namespace detail::cp {

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

}  // namespace detail::cp

/// Ring attention over any ring_communicator and any attention backend.
///
/// Every rank holds the shard `sharding.pieces(rank)` of q, k, v ([batch, seq/R, heads, dim])
/// and gets out and lse for its queries, exactly as attention over the whole sequence would
/// give them (masks see global positions). backward returns dq for its queries and dk, dv
/// for its own keys. Requirements: `sharding.degree()` equals the ring size, inner degree 1;
/// every rank calls forward / backward together with shards of the same shape. Bad input on
/// any rank makes every rank throw cp_error before any data moves.
///
/// Example (compiled in tests/cp/test_cp_docs.cpp):
/// ```
///   baton::run_local(2, [&](baton::local_communicator& comm) {
///     baton::sequence_sharding sharding(baton::shard_layout::zigzag, seq_len, comm.size());
///     baton::ring_attention ring(comm, baton::reference_attention{}, sharding);
///     ring.forward(q, k, v, baton::causal_mask{}, out, lse);          // this rank's shard
///     ring.backward(q, k, v, out, lse, dout, baton::causal_mask{}, dq, dk, dv);
///   });
/// ```
template <ring_communicator Comm, class Backend>
class ring_attention {
 public:
  ring_attention(Comm& ring, Backend backend, sequence_sharding sharding)
      : ring_(&ring), backend_(std::move(backend)), sharding_(std::move(sharding)) {}

  const sequence_sharding& sharding() const noexcept { return sharding_; }
  /// Which shard of the sharding this rank must pass (its rank in the communicator).
  int shard_index() const noexcept { return ring_->rank(); }

  template <class T, class Mask>
  void forward(std::type_identity_t<tensor_view<const T, 4>> q, std::type_identity_t<tensor_view<const T, 4>> k,
               std::type_identity_t<tensor_view<const T, 4>> v, const Mask& mask, tensor_view<T, 4> out,
               std::type_identity_t<tensor_view<lse_t<T>, 3>> lse, const cp_params& params = {}) {
    if constexpr (detail::cp::usable<Backend, T, Mask>()) {
      const auto s = detail::cp::shape_of(q, k);
      const auto g = agree<T>(detail::cp::op_ring_forward, s, mask,
                              detail::cp::check_forward_tensors<T>(s, k, v, out, lse));
      detail::cp::ring_forward<T>(*ring_, backend_, g, q, k, v, mask, out, lse, params.softmax_scale);
    }
  }

  template <class T, class Mask>
  void backward(std::type_identity_t<tensor_view<const T, 4>> q, std::type_identity_t<tensor_view<const T, 4>> k,
                std::type_identity_t<tensor_view<const T, 4>> v, std::type_identity_t<tensor_view<const T, 4>> out,
                std::type_identity_t<tensor_view<const lse_t<T>, 3>> lse,
                std::type_identity_t<tensor_view<const T, 4>> dout, const Mask& mask, tensor_view<T, 4> dq,
                std::type_identity_t<tensor_view<T, 4>> dk, std::type_identity_t<tensor_view<T, 4>> dv,
                const cp_params& params = {}) {
    if constexpr (detail::cp::usable<Backend, T, Mask>()) {
      const auto s = detail::cp::shape_of(q, k);
      const auto g = agree<T>(detail::cp::op_ring_backward, s, mask,
                              detail::cp::check_backward_tensors<T>(s, k, v, out, lse, dout, dq, dk, dv));
      detail::cp::ring_backward<T>(*ring_, backend_, g, q, k, v, out, lse, dout, mask, dq, dk, dv,
                                   params.softmax_scale);
    }
  }

 private:
  template <class T, class Mask>
  detail::cp::ring_geometry agree(detail::cp::operation_code op, const detail::cp::local_shape& s, const Mask& mask,
                                  const std::string& tensor_problem) {
    using namespace detail::cp;
    call_descriptor mine = describe<T>(op, s, sharding_, ring_->size(), ring_->rank());
    std::string problem = first_problem({
        sharding_.inner_degree() != 1
            ? "the sequence_sharding has inner degree " + std::to_string(sharding_.inner_degree()) +
                  "; ring_attention shards over the ring alone (use hybrid_attention for Ulysses x ring)"
            : std::string(),
        sharding_.degree() != ring_->size()
            ? "the sequence_sharding spreads the sequence over " + std::to_string(sharding_.degree()) +
                  " ranks but the ring communicator has " + std::to_string(ring_->size()) +
                  "; build the sharding with degree = the ring's size()"
            : std::string(),
        check_local(s, sharding_.local_len()), tensor_problem, check_mask(mask, sharding_.seq_len())});
    if (!problem.empty()) mine.fail("rank " + std::to_string(ring_->rank()) + ": " + problem);
    const std::vector<call_descriptor> all = ring_all_gather(*ring_, std::span<const call_descriptor>(&mine, 1));
    agree_or_throw(op == op_ring_forward ? "baton::ring_attention::forward" : "baton::ring_attention::backward", all);
    ring_geometry g;
    for (int r = 0; r < ring_->size(); ++r) g.pieces.push_back(sharding_.pieces(r));
    g.batch = s.batch;
    g.seq = s.seq;
    g.heads_q = s.heads_q;
    g.heads_kv = s.heads_kv;
    g.dim = s.dim;
    return g;
  }

  Comm* ring_;
  Backend backend_;
  sequence_sharding sharding_;
};

template <class Comm, class Backend>
ring_attention(Comm&, Backend, sequence_sharding) -> ring_attention<Comm, Backend>;

}  // namespace baton
