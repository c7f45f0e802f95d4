// baton/cp/ulysses.hpp — Ulysses (DeepSpeed-Ulysses) attention: one all-to-all turns the
// sequence-sharded q, k, v [b, s/P, h, d] into head-sharded [b, s, h/P, d]; each rank runs
// ordinary attention over the whole sequence for its heads; the inverse all-to-all brings out
// and lse back to sequence shards. The backward does the same with its tensors.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/tensor_view.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/cp/detail/agree.hpp>
#include <baton/cp/detail/ulysses_core.hpp>
#include <baton/cp/detail/views.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/ring.hpp>
#include <baton/cp/sharding.hpp>

#include <array>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

namespace detail::cp {

// The head-sharded problem a rank attends after the exchange.
struct ulysses_geometry {
  std::int64_t batch = 0, seq_local = 0, parts = 1, dim = 0;
  head_split q_split, kv_split;
  std::int64_t seq() const noexcept { return parts * seq_local; }
  std::int64_t heads_q() const noexcept { return q_split.per_rank(); }
  std::int64_t heads_kv() const noexcept { return kv_split.per_rank(); }
};

inline ulysses_geometry ulysses_geometry_of(const local_shape& s, std::int64_t parts) {
  return {s.batch, s.seq, parts, s.dim, head_split{s.heads_q, parts}, head_split{s.heads_kv, parts}};
}

// Sequence-sharded inputs -> head-sharded buffers (owning), for forward and backward.
template <class T>
struct ulysses_buffers {
  std::vector<T> q, k, v, out, dout;
  std::vector<lse_t<T>> lse;
  explicit ulysses_buffers(const ulysses_geometry& g, bool with_grads) {
    const auto nq = static_cast<std::size_t>(g.batch * g.seq() * g.heads_q() * g.dim);
    const auto nkv = static_cast<std::size_t>(g.batch * g.seq() * g.heads_kv() * g.dim);
    q.resize(nq);
    k.resize(nkv);
    v.resize(nkv);
    out.resize(nq);
    lse.resize(static_cast<std::size_t>(g.batch * g.heads_q() * g.seq()));
    if (with_grads) dout.resize(nq);
  }
};

template <class T>
tensor_view<T, 4> gathered_q(std::vector<T>& b, const ulysses_geometry& g) {
  return bshd_view<T>(b.data(), g.batch, g.seq(), g.heads_q(), g.dim);
}
template <class T>
tensor_view<T, 4> gathered_kv(std::vector<T>& b, const ulysses_geometry& g) {
  return bshd_view<T>(b.data(), g.batch, g.seq(), g.heads_kv(), g.dim);
}
template <class L>
tensor_view<L, 3> gathered_lse(std::vector<L>& b, const ulysses_geometry& g) {
  return lse_view<L>(b.data(), g.batch, g.heads_q(), g.seq());
}

template <class T, class Comm>
void gather_qkv(Comm& comm, const ulysses_geometry& g, tensor_view<const T, 4> q, tensor_view<const T, 4> k,
                tensor_view<const T, 4> v, ulysses_buffers<T>& buf) {
  const std::array<heads_part<T>, 3> parts{{
      {as_view4(q), g.q_split, as_view4(gathered_q(buf.q, g))},
      {as_view4(k), g.kv_split, as_view4(gathered_kv(buf.k, g))},
      {as_view4(v), g.kv_split, as_view4(gathered_kv(buf.v, g))},
  }};
  heads_from_sequence<T>(comm, std::span<const heads_part<T>>(parts));
}

template <class T, class Comm>
void gather_for_backward(Comm& comm, const ulysses_geometry& g, tensor_view<const T, 4> q, tensor_view<const T, 4> k,
                         tensor_view<const T, 4> v, tensor_view<const T, 4> out, tensor_view<const lse_t<T>, 3> lse,
                         tensor_view<const T, 4> dout, ulysses_buffers<T>& buf) {
  const std::array<heads_part<T>, 5> parts{{
      {as_view4(q), g.q_split, as_view4(gathered_q(buf.q, g))},
      {as_view4(k), g.kv_split, as_view4(gathered_kv(buf.k, g))},
      {as_view4(v), g.kv_split, as_view4(gathered_kv(buf.v, g))},
      {as_view4(out), g.q_split, as_view4(gathered_q(buf.out, g))},
      {as_view4(dout), g.q_split, as_view4(gathered_q(buf.dout, g))},
  }};
  heads_from_sequence<T>(comm, std::span<const heads_part<T>>(parts));
  using L = lse_t<T>;
  const std::array<heads_part<L>, 1> lse_part{{{lse_as_view4(lse), g.q_split, lse_as_view4(gathered_lse(buf.lse, g))}}};
  heads_from_sequence<L>(comm, std::span<const heads_part<L>>(lse_part));
}

template <class T, class Comm>
void scatter_out_lse(Comm& comm, const ulysses_geometry& g, ulysses_buffers<T>& buf, tensor_view<T, 4> out,
                     tensor_view<lse_t<T>, 3> lse) {
  using L = lse_t<T>;
  const std::array<sequence_part<T>, 1> out_part{{{as_view4(gathered_q(buf.out, g)).as_const(), g.q_split, as_view4(out)}}};
  sequence_from_heads<T>(comm, std::span<const sequence_part<T>>(out_part));
  const std::array<sequence_part<L>, 1> lse_part{
      {{lse_as_view4(gathered_lse(buf.lse, g)).as_const(), g.q_split, lse_as_view4(lse)}}};
  sequence_from_heads<L>(comm, std::span<const sequence_part<L>>(lse_part));
}

template <class T, class Comm>
void scatter_grads(Comm& comm, const ulysses_geometry& g, std::vector<T>& dq, std::vector<T>& dk, std::vector<T>& dv,
                   tensor_view<T, 4> dq_out, tensor_view<T, 4> dk_out, tensor_view<T, 4> dv_out) {
  const std::array<sequence_part<T>, 3> parts{{
      {as_view4(gathered_q(dq, g)).as_const(), g.q_split, as_view4(dq_out)},
      {as_view4(gathered_kv(dk, g)).as_const(), g.kv_split, as_view4(dk_out)},
      {as_view4(gathered_kv(dv, g)).as_const(), g.kv_split, as_view4(dv_out)},
  }};
  sequence_from_heads<T>(comm, std::span<const sequence_part<T>>(parts));
}

// The pieces of the gathered sequence: rank i's pieces, shifted to rows [i s_local, ...).
inline std::vector<shard_piece> gathered_pieces(const sequence_sharding& sharding, int first_rank, int count) {
  std::vector<shard_piece> out;
  for (int i = 0; i < count; ++i)
    for (shard_piece p : sharding.pieces(first_rank + i)) {
      p.local_offset += i * sharding.local_len();
      out.push_back(p);
    }
  return out;
}

}  // namespace detail::cp

/// Ulysses attention over any all_to_all_communicator and any attention backend.
///
/// Every rank holds the shard `sharding.pieces(rank)` of q, k, v ([batch, seq/P, heads, dim]);
/// the exchange gives it the whole sequence for heads [r h/P, (r+1) h/P). Head rule: the
/// query heads must be divisible by P; the key/value heads either divisible by P (each rank
/// gets h_kv/P of them) or dividing P (GQA with few kv heads: each kv head is replicated to
/// P/h_kv consecutive ranks — exactly those whose query heads use it — and the gradients of
/// the replicas are summed back). Anything else is a cp_error on every rank.
///
/// Example (compiled in tests/cp/test_cp_docs.cpp):
/// ```
///   baton::ulysses_attention ulysses(comm, baton::reference_attention{}, sharding);
///   ulysses.forward(q, k, v, baton::causal_mask{}, out, lse);
///   ulysses.backward(q, k, v, out, lse, dout, baton::causal_mask{}, dq, dk, dv);
/// ```
template <all_to_all_communicator Comm, class Backend>
class ulysses_attention {
 public:
  ulysses_attention(Comm& comm, Backend backend, sequence_sharding sharding)
      : comm_(&comm), backend_(std::move(backend)), sharding_(std::move(sharding)) {}

  const sequence_sharding& sharding() const noexcept { return sharding_; }
  /// Which shard of the sharding this rank must pass (its rank in the communicator).
  int shard_index() const noexcept { return comm_->rank(); }

  template <class T, class Mask>
  void forward(std::type_identity_t<tensor_view<const T, 4>> q, std::type_identity_t<tensor_view<const T, 4>> k,
               std::type_identity_t<tensor_view<const T, 4>> v, const Mask& mask, tensor_view<T, 4> out,
               std::type_identity_t<tensor_view<lse_t<T>, 3>> lse, const cp_params& params = {}) {
    using namespace detail::cp;
    if constexpr (detail::cp::usable<Backend, T, Mask>()) {
      const auto s = shape_of(q, k);
      agree<T>(op_ulysses_forward, s, mask, check_forward_tensors<T>(s, k, v, out, lse));
      const ulysses_geometry g = ulysses_geometry_of(s, comm_->size());
      ulysses_buffers<T> buf(g, false);
      gather_qkv<T>(*comm_, g, q, k, v, buf);
      std::vector<std::int64_t> storage;
      const auto pieces = gathered_pieces(sharding_, 0, comm_->size());
      attention_params ap;
      ap.q_pos = ap.k_pos = positions_for(pieces, 0, pieces.size(), storage);
      ap.softmax_scale = params.softmax_scale;
      backend_.forward(gathered_q<T>(buf.q, g), gathered_kv<T>(buf.k, g), gathered_kv<T>(buf.v, g), mask,
                       gathered_q<T>(buf.out, g), gathered_lse(buf.lse, g), ap);
      scatter_out_lse<T>(*comm_, g, buf, out, lse);
    }
  }

  template <class T, class Mask>
  void backward(std::type_identity_t<tensor_view<const T, 4>> q, std::type_identity_t<tensor_view<const T, 4>> k,
                std::type_identity_t<tensor_view<const T, 4>> v, std::type_identity_t<tensor_view<const T, 4>> out,
                std::type_identity_t<tensor_view<const lse_t<T>, 3>> lse,
                std::type_identity_t<tensor_view<const T, 4>> dout, const Mask& mask, tensor_view<T, 4> dq,
                std::type_identity_t<tensor_view<T, 4>> dk, std::type_identity_t<tensor_view<T, 4>> dv,
                const cp_params& params = {}) {
    using namespace detail::cp;
    if constexpr (detail::cp::usable<Backend, T, Mask>()) {
      const auto s = shape_of(q, k);
      agree<T>(op_ulysses_backward, s, mask, check_backward_tensors<T>(s, k, v, out, lse, dout, dq, dk, dv));
      const ulysses_geometry g = ulysses_geometry_of(s, comm_->size());
      ulysses_buffers<T> buf(g, true);
      gather_for_backward<T>(*comm_, g, q, k, v, out, lse, dout, buf);
      std::vector<std::int64_t> storage;
      const auto pieces = gathered_pieces(sharding_, 0, comm_->size());
      attention_params ap;
      ap.q_pos = ap.k_pos = positions_for(pieces, 0, pieces.size(), storage);
      ap.softmax_scale = params.softmax_scale;
      std::vector<T> gq(buf.q.size()), gk(buf.k.size()), gv(buf.v.size());
      backend_.backward(gathered_q<T>(buf.q, g), gathered_kv<T>(buf.k, g), gathered_kv<T>(buf.v, g),
                        gathered_q<T>(buf.out, g), tensor_view<const lse_t<T>, 3>(gathered_lse(buf.lse, g)),
                        gathered_q<T>(buf.dout, g), mask, gathered_q<T>(gq, g), gathered_kv<T>(gk, g),
                        gathered_kv<T>(gv, g), ap);
      scatter_grads<T>(*comm_, g, gq, gk, gv, dq, dk, dv);
    }
  }

 private:
  template <class T, class Mask>
  void agree(detail::cp::operation_code op, const detail::cp::local_shape& s, const Mask& mask,
             const std::string& tensor_problem) {
    using namespace detail::cp;
    call_descriptor mine = describe<T>(op, s, sharding_, comm_->size(), comm_->rank());
    std::string problem = first_problem({
        sharding_.inner_degree() != 1
            ? "the sequence_sharding has inner degree " + std::to_string(sharding_.inner_degree()) +
                  "; ulysses_attention shards over one all-to-all group (use hybrid_attention for Ulysses x ring)"
            : std::string(),
        sharding_.degree() != comm_->size()
            ? "the sequence_sharding spreads the sequence over " + std::to_string(sharding_.degree()) +
                  " ranks but the Ulysses communicator has " + std::to_string(comm_->size()) +
                  "; build the sharding with degree = the communicator's size()"
            : std::string(),
        check_local(s, sharding_.local_len()), tensor_problem, check_head_split(s.heads_q, s.heads_kv, comm_->size()),
        check_mask(mask, sharding_.seq_len())});
    if (!problem.empty()) mine.fail("rank " + std::to_string(comm_->rank()) + ": " + problem);
    const auto all = all_to_all_gather(*comm_, std::span<const call_descriptor>(&mine, 1));
    agree_or_throw(op == op_ulysses_forward ? "baton::ulysses_attention::forward" : "baton::ulysses_attention::backward",
                   all);
  }

  Comm* comm_;
  Backend backend_;
  sequence_sharding sharding_;
};

template <class Comm, class Backend>
ulysses_attention(Comm&, Backend, sequence_sharding) -> ulysses_attention<Comm, Backend>;

}  // namespace baton
