// baton/cp/ulysses.hpp — Ulysses (DeepSpeed-Ulysses) attention: one all-to-all turns the
// sequence-sharded q, k, v [b, s/P, h, d] into head-sharded [b, s, h/P, d]; each rank runs
// ordinary attention over the whole sequence for its heads; the inverse all-to-all brings out
// and lse back to sequence shards. The backward does the same with its tensors.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/cp/cross.hpp>
#include <baton/cp/detail/agree.hpp>
#include <baton/cp/detail/front_end.hpp>
#include <baton/cp/detail/ulysses_core.hpp>
#include <baton/cp/detail/views.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/memory.hpp>
#include <baton/cp/params.hpp>
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
  std::int64_t batch = 0, dim = 0;
  exchange_shape exchange;     // every group rank's (query) shard length, and this rank
  exchange_shape kv_exchange;  // the same for the key/value shards (cross-attention: their own)
  head_split q_split, kv_split;
  std::int64_t parts() const noexcept { return static_cast<std::int64_t>(exchange.lens.size()); }
  std::int64_t seq_local() const noexcept { return exchange.lens[static_cast<std::size_t>(exchange.rank)]; }
  std::int64_t seq() const noexcept { return exchange.total(); }
  std::int64_t kv_seq() const noexcept { return kv_exchange.total(); }
  std::int64_t heads_q() const noexcept { return q_split.count(exchange.rank); }
  std::int64_t heads_kv() const noexcept { return kv_split.count(exchange.rank); }
};

// `first_rank`: the sharding rank of the group's rank 0 (ranks first_rank .. + parts - 1
// form the group, in order).
inline ulysses_geometry ulysses_geometry_of(const local_shape& s, const sequence_sharding& sharding,
                                            const sequence_sharding& kv_sharding, int first_rank, int parts, int rank) {
  ulysses_geometry g;
  g.batch = s.batch;
  g.dim = s.dim;
  for (int i = 0; i < parts; ++i) g.exchange.lens.push_back(sharding.local_len(first_rank + i));
  for (int i = 0; i < parts; ++i) g.kv_exchange.lens.push_back(kv_sharding.local_len(first_rank + i));
  g.exchange.rank = g.kv_exchange.rank = rank;
  const head_splits splits = split_heads(s.heads_q, s.heads_kv, parts);
  g.q_split = splits.q;
  g.kv_split = splits.kv;
  return g;
}

// Views of a workspace's head-sharded buffers: a rank's whole sequence for its heads, stored
// dense or head-major (bshd_head_major; the LSE is [b, h, s] either way). The gradients are
// there only when gathered for a backward.
template <class T>
struct ulysses_gathered {
  tensor_view<T, 4> q, k, v, out, dout, dq, dk, dv;
  tensor_view<lse_t<T>, 3> lse;
  bool head_major = false;
};

// One tensor, sequence -> heads, into the head-sharded dst [b, e.total(), count(me), x] (a
// dense buffer, or a head-major one: bshd_head_major): in place when the shards and head
// groups are equal and dst is dense (or holds one head, where both layouts are one), run by
// run into a head-major dst, else through the general exchange. `e` is the exchange of the
// tensor's sequence (queries' or, in cross-attention, keys').
template <class T, class Comm, class M>
void gather_heads(Comm& comm, M& mem, const exchange_shape& e,
                  const tensor_view<const T, 4>& src, const head_split& split, const tensor_view<T, 4>& dst,
                  bool head_major, scratch<M>& send, scratch<M>& recv) {
  if (in_place_exchange(e, split)) {
    if (!head_major || split.per_rank() == 1)
      heads_from_sequence_into<T>(comm, mem, src, split, dst.data, send);
    else
      heads_from_sequence_head_major<T>(comm, mem, src, split, dst, send, recv);
    return;
  }
  heads_from_sequence_general<T>(comm, mem, e, src, split, dst, send, recv);
}

// One tensor, heads -> sequence, from the head-sharded src [b, e.total(), count(me), x].
template <class T, class Comm, class M>
void scatter_heads(Comm& comm, M& mem, const exchange_shape& e,
                   const tensor_view<const T, 4>& src, const head_split& split, const tensor_view<T, 4>& dst,
                   bool head_major, scratch<M>& send, scratch<M>& recv) {
  if (in_place_exchange(e, split)) {
    if (!head_major || split.per_rank() == 1)
      sequence_from_heads_from<T>(comm, mem, src.data, split, dst, recv);
    else
      sequence_from_heads_head_major<T>(comm, mem, src, split, dst, send, recv);
    return;
  }
  sequence_from_heads_general<T>(comm, mem, e, src, split, dst, send, recv);
}

template <class T, class Comm, class M>
void gather_qkv(Comm& comm, M& mem, const ulysses_geometry& g, tensor_view<const T, 4> q, tensor_view<const T, 4> k,
                tensor_view<const T, 4> v, const ulysses_gathered<T>& x, scratch<M>& send, scratch<M>& recv) {
  gather_heads<T>(comm, mem, g.exchange, q, g.q_split, x.q, x.head_major, send, recv);
  gather_heads<T>(comm, mem, g.kv_exchange, k, g.kv_split, x.k, x.head_major, send, recv);
  gather_heads<T>(comm, mem, g.kv_exchange, v, g.kv_split, x.v, x.head_major, send, recv);
}

// The LSE (h/d of a tensor's bytes) keeps the packed exchange of ulysses_core.hpp when the
// shards are even.
template <class T, class Comm, class M>
void gather_lse(Comm& comm, M& mem, const ulysses_geometry& g, tensor_view<const lse_t<T>, 3> lse, lse_t<T>* glse,
                scratch<M>& send, scratch<M>& recv) {
  using L = lse_t<T>;
  const auto dst = lse_as_bshd(lse_view<L>(glse, g.batch, g.heads_q(), g.seq()));
  if (in_place_exchange(g.exchange, g.q_split)) {
    const std::array<heads_part<L>, 1> lse_part{{{lse_as_bshd(lse), g.q_split, dst}}};
    heads_from_sequence<L>(comm, mem, std::span<const heads_part<L>>(lse_part));
    return;
  }
  heads_from_sequence_general<L>(comm, mem, g.exchange, lse_as_bshd(lse), g.q_split, dst, send, recv);
}

template <class T, class Comm, class M>
void scatter_lse(Comm& comm, M& mem, const ulysses_geometry& g, lse_t<T>* glse, tensor_view<lse_t<T>, 3> lse,
                 scratch<M>& send, scratch<M>& recv) {
  using L = lse_t<T>;
  const auto src = lse_as_bshd(lse_view<L>(glse, g.batch, g.heads_q(), g.seq())).as_const();
  if (in_place_exchange(g.exchange, g.q_split)) {
    const std::array<sequence_part<L>, 1> lse_part{{{src, g.q_split, lse_as_bshd(lse)}}};
    sequence_from_heads<L>(comm, mem, std::span<const sequence_part<L>>(lse_part));
    return;
  }
  sequence_from_heads_general<L>(comm, mem, g.exchange, src, g.q_split, lse_as_bshd(lse), send, recv);
}

// The head-sharded side of a Ulysses exchange, kept between calls: the gathered tensors,
// their gradients, the LSE and the send/receive scratch of the exchanges, in memory space M.
template <class M>
struct ulysses_workspace {
  enum slot : std::size_t { q, k, v, out, dout, dq, dk, dv, lse, exchange, exchange_recv, count };
  std::array<scratch<M>, count> slots;
  M* mem = nullptr;  // the owner's memory space (set before every use)

  template <class E>
  E* get(slot s, std::size_t n) {
    return slots[s].template get<E>(*mem, n);
  }
  // Slot s sized for geometry g: shaped as q (q, out, dout, dq), as k (k, v, dk, dv), or as
  // the LSE, [batch, heads_q, seq].
  template <class E>
  E* get(slot s, const ulysses_geometry& g) {
    const bool kv_shaped = s == k || s == v || s == dk || s == dv;
    const std::int64_t n = s == lse      ? g.batch * g.heads_q() * g.seq()
                           : kv_shaped ? g.batch * g.kv_seq() * g.heads_kv() * g.dim
                                       : g.batch * g.seq() * g.heads_q() * g.dim;
    return get<E>(s, static_cast<std::size_t>(n));
  }
  void release() noexcept {
    for (auto& b : slots) b.release();
  }
};

template <class T, class M>
ulysses_gathered<T> gathered_views(ulysses_workspace<M>& ws, const ulysses_geometry& g, bool backward, bool head_major) {
  using W = ulysses_workspace<M>;
  const auto shaped = [&](typename W::slot s, std::int64_t seq, std::int64_t heads) {
    return bshd_stored<T>(head_major, ws.template get<T>(s, g), g.batch, seq, heads, g.dim);
  };
  const auto q_shaped = [&](typename W::slot s) { return shaped(s, g.seq(), g.heads_q()); };
  const auto kv_shaped = [&](typename W::slot s) { return shaped(s, g.kv_seq(), g.heads_kv()); };
  ulysses_gathered<T> x;
  x.head_major = head_major;
  x.q = q_shaped(W::q);
  x.k = kv_shaped(W::k);
  x.v = kv_shaped(W::v);
  x.out = q_shaped(W::out);
  x.lse = lse_view<lse_t<T>>(ws.template get<lse_t<T>>(W::lse, g), g.batch, g.heads_q(), g.seq());
  if (backward) {
    x.dout = q_shaped(W::dout);
    x.dq = q_shaped(W::dq);
    x.dk = kv_shaped(W::dk);
    x.dv = kv_shaped(W::dv);
  }
  return x;
}

// Sequence shards in, head shards out (stored head-major when head_major): q, k, v for a forward.
template <class T, class Comm, class M>
ulysses_gathered<T> gather_for_forward(Comm& comm, ulysses_workspace<M>& ws, const ulysses_geometry& g,
                                       tensor_view<const T, 4> q, tensor_view<const T, 4> k, tensor_view<const T, 4> v,
                                       bool head_major) {
  using W = ulysses_workspace<M>;
  const ulysses_gathered<T> x = gathered_views<T>(ws, g, false, head_major);
  gather_qkv<T>(comm, *ws.mem, g, q, k, v, x, ws.slots[W::exchange], ws.slots[W::exchange_recv]);
  return x;
}

// The same for a backward: q, k, v, out, lse and dout.
template <class T, class Comm, class M>
ulysses_gathered<T> gather_for_backward(Comm& comm, ulysses_workspace<M>& ws, const ulysses_geometry& g,
                                        tensor_view<const T, 4> q, tensor_view<const T, 4> k, tensor_view<const T, 4> v,
                                        tensor_view<const T, 4> out, tensor_view<const lse_t<T>, 3> lse,
                                        tensor_view<const T, 4> dout, bool head_major) {
  using W = ulysses_workspace<M>;
  const ulysses_gathered<T> x = gathered_views<T>(ws, g, true, head_major);
  M& mem = *ws.mem;
  scratch<M>& send = ws.slots[W::exchange];
  scratch<M>& recv = ws.slots[W::exchange_recv];
  gather_qkv<T>(comm, mem, g, q, k, v, x, send, recv);
  gather_heads<T>(comm, mem, g.exchange, out, g.q_split, x.out, x.head_major, send, recv);
  gather_heads<T>(comm, mem, g.exchange, dout, g.q_split, x.dout, x.head_major, send, recv);
  gather_lse<T>(comm, mem, g, lse, x.lse.data, send, recv);
  return x;
}

// Head shards in, sequence shards out: the forward's out and lse.
template <class T, class Comm, class M>
void scatter_out_lse(Comm& comm, ulysses_workspace<M>& ws, const ulysses_geometry& g, const ulysses_gathered<T>& x,
                     tensor_view<T, 4> out, tensor_view<lse_t<T>, 3> lse) {
  using W = ulysses_workspace<M>;
  M& mem = *ws.mem;
  scratch<M>& send = ws.slots[W::exchange];
  scratch<M>& recv = ws.slots[W::exchange_recv];
  scatter_heads<T>(comm, mem, g.exchange, x.out.as_const(), g.q_split, out, x.head_major, send, recv);
  scatter_lse<T>(comm, mem, g, x.lse.data, lse, send, recv);
}

// The backward's dq, dk, dv.
template <class T, class Comm, class M>
void scatter_grads(Comm& comm, ulysses_workspace<M>& ws, const ulysses_geometry& g, const ulysses_gathered<T>& x,
                   tensor_view<T, 4> dq, tensor_view<T, 4> dk, tensor_view<T, 4> dv) {
  using W = ulysses_workspace<M>;
  M& mem = *ws.mem;
  scratch<M>& send = ws.slots[W::exchange];
  scratch<M>& recv = ws.slots[W::exchange_recv];
  scatter_heads<T>(comm, mem, g.exchange, x.dq.as_const(), g.q_split, dq, x.head_major, send, recv);
  scatter_heads<T>(comm, mem, g.kv_exchange, x.dk.as_const(), g.kv_split, dk, x.head_major, send, recv);
  scatter_heads<T>(comm, mem, g.kv_exchange, x.dv.as_const(), g.kv_split, dv, x.head_major, send, recv);
}

// The Ulysses stage of ulysses_attention and hybrid_attention (CRTP): the run_forward and
// run_backward front_end calls, which gather the whole sequence for this rank's heads, have
// Derived attend over it, and scatter the results back to sequence shards; and
// release_workspace(). A rank holding no heads (more ranks than heads) exchanges but does
// not attend. Derived provides, as members this base may call (befriend it):
//   Comm& exchange_group();   (the Ulysses group's all_to_all_communicator)
//   Memory& memory();
//   ulysses_workspace<Memory>& workspace();  (a member declared after the backend and the
//       memory space, so that its buffers are freed first: a device buffer is freed on the
//       backend's stream)
//   static constexpr bool gathers_head_major;  (store the gathered tensors head-major:
//       bshd_head_major)
//   template <class T, class Mask>
//   void attend_forward(const ulysses_geometry&, const ulysses_gathered<T>&, const Mask&, double scale);
//   template <class T, class Mask>
//   void attend_backward(const ulysses_geometry&, const ulysses_gathered<T>&, const Mask&, double scale);
//       (writes the gathered dq, dk, dv)
template <class Derived, class Memory>
class ulysses_stage {
 public:
  /// Frees the head-sharded buffers kept between calls (the next call allocates again); use
  /// one object per rank, one call at a time, as with the communicators.
  void release_workspace() noexcept { static_cast<Derived&>(*this).workspace().release(); }

 protected:
  template <class T, class Mask>
  void run_forward(const ulysses_geometry& g, tensor_view<const T, 4> q, tensor_view<const T, 4> k,
                   tensor_view<const T, 4> v, const Mask& mask, tensor_view<T, 4> out, tensor_view<lse_t<T>, 3> lse,
                   double scale) {
    Derived& self = static_cast<Derived&>(*this);
    ulysses_workspace<Memory>& ws = self.workspace();
    ws.mem = &self.memory();
    const ulysses_gathered<T> x = gather_for_forward<T>(self.exchange_group(), ws, g, q, k, v, Derived::gathers_head_major);
    if (g.heads_q() > 0) self.template attend_forward<T>(g, x, mask, scale);
    scatter_out_lse<T>(self.exchange_group(), ws, g, x, out, lse);
  }

  template <class T, class Mask>
  void run_backward(const ulysses_geometry& g, tensor_view<const T, 4> q, tensor_view<const T, 4> k,
                    tensor_view<const T, 4> v, tensor_view<const T, 4> out, tensor_view<const lse_t<T>, 3> lse,
                    tensor_view<const T, 4> dout, const Mask& mask, tensor_view<T, 4> dq, tensor_view<T, 4> dk,
                    tensor_view<T, 4> dv, double scale) {
    Derived& self = static_cast<Derived&>(*this);
    ulysses_workspace<Memory>& ws = self.workspace();
    ws.mem = &self.memory();
    const ulysses_gathered<T> x =
        gather_for_backward<T>(self.exchange_group(), ws, g, q, k, v, out, lse, dout, Derived::gathers_head_major);
    if (g.heads_q() > 0) self.template attend_backward<T>(g, x, mask, scale);
    scatter_grads<T>(self.exchange_group(), ws, g, x, dq, dk, dv);
  }
};

// The pieces of the gathered sequence: rank i's pieces, shifted past ranks 0 .. i-1's tokens.
// `position_offset` is added to every global position (a cross-attention's keys).
inline std::vector<shard_piece> gathered_pieces(const sequence_sharding& sharding, int first_rank, int count,
                                                std::int64_t position_offset = 0) {
  std::vector<shard_piece> out;
  std::int64_t offset = 0;
  for (int i = 0; i < count; ++i) {
    for (shard_piece p : sharding.pieces(first_rank + i)) {
      p.local_offset += offset;
      p.first += position_offset;
      out.push_back(p);
    }
    offset += sharding.local_len(first_rank + i);
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
/// The all-to-alls write the head-sharded tensors the backend reads in place (and read its
/// outputs in place), so each tensor is copied once on the way in (the pack) and once on the
/// way out (the unpack). Those buffers are kept for the next call (release_workspace() frees
/// them): use one object per rank, one call at a time, as with the communicator.
///
/// Example, on every rank of `comm` (`sharding` and the views as for ring_attention):
/// ```cpp
///   baton::ulysses_attention ulysses(comm, baton::reference_attention{}, sharding);
///   ulysses.forward(q, k, v, baton::causal_mask{}, out, lse);
///   ulysses.backward(q, k, v, out, lse, dout, baton::causal_mask{}, dq, dk, dv);
/// ```
template <all_to_all_communicator Comm, class Backend, cp_memory_space Memory = cp_memory_space_t<Backend>>
class ulysses_attention
    : public detail::cp::front_end<ulysses_attention<Comm, Backend, Memory>, Backend, Memory, Comm>,
      public detail::cp::ulysses_stage<ulysses_attention<Comm, Backend, Memory>, Memory> {
 public:
  /// The attention backend every step runs (what the model layer asks about its storage types).
  using backend_type = Backend;
  ulysses_attention(Comm& comm, Backend backend, sequence_sharding sharding)
      : comm_(&comm),
        backend_(std::move(backend)),
        sharding_(std::move(sharding)),
        kv_{sharding_, 0},
        memory_(cp_memory_space_of<Backend>::make(backend_)) {}
  /// With an explicit memory space (its location must be the backend's: see cp/memory.hpp).
  ulysses_attention(Comm& comm, Backend backend, sequence_sharding sharding, Memory memory)
      : comm_(&comm), backend_(std::move(backend)), sharding_(std::move(sharding)), kv_{sharding_, 0},
        memory_(std::move(memory)) {}
  /// Cross-attention: the queries sharded by `q_sharding`, the keys and values by `kv`
  /// (cp/cross.hpp); q and k/v are exchanged each by its own shard lengths.
  ulysses_attention(Comm& comm, Backend backend, sequence_sharding q_sharding, kv_sharding kv)
      : comm_(&comm),
        backend_(std::move(backend)),
        sharding_(std::move(q_sharding)),
        kv_(std::move(kv)),
        cross_(true),
        memory_(cp_memory_space_of<Backend>::make(backend_)) {}
  ulysses_attention(Comm& comm, Backend backend, sequence_sharding q_sharding, kv_sharding kv, Memory memory)
      : comm_(&comm), backend_(std::move(backend)), sharding_(std::move(q_sharding)), kv_(std::move(kv)),
        cross_(true),
        memory_(std::move(memory)) {}

  /// The queries' sharding (and the keys' in self-attention).
  const sequence_sharding& sharding() const noexcept { return sharding_; }
  /// The keys' and values' sharding: the queries' with offset 0 unless built for cross-attention.
  const kv_sharding& kv() const noexcept { return kv_; }
  /// Built for cross-attention (with a kv_sharding).
  bool is_cross() const noexcept { return cross_; }
  /// Which shard of the sharding this rank must pass (its rank in the communicator).
  int shard_index() const noexcept { return comm_->rank(); }

  // forward(q, k, v, mask, out, lse, params) and backward(q, k, v, out, lse, dout, mask, dq,
  // dk, dv, params) come from detail::cp::front_end; release_workspace() from
  // detail::cp::ulysses_stage.

 private:
  friend class detail::cp::front_end<ulysses_attention, Backend, Memory, Comm>;
  friend class detail::cp::ulysses_stage<ulysses_attention, Memory>;

  Memory& memory() noexcept { return memory_; }
  Comm& exchange_group() noexcept { return *comm_; }
  detail::cp::ulysses_workspace<Memory>& workspace() noexcept { return ws_; }

  static constexpr const char* name = "baton::ulysses_attention";
  // The gathered tensors are stored head-major on the host: the CPU kernels then read each
  // head's rows one after another, not heads x dim apart, which made a document-masked call
  // 10-14 % slower (docs/context-parallel.md, "The Ulysses call stored head-major"). On a
  // device the layout the exchange leaves stays (the CUDA kernels were never timed on both).
  static constexpr bool gathers_head_major = Memory::location == cp_memory_location::host;
  static constexpr auto forward_op = detail::cp::op_ulysses_forward;
  static constexpr auto backward_op = detail::cp::op_ulysses_backward;
  int world_size() const noexcept { return comm_->size(); }

  std::string topology_problem() const {
    return detail::cp::one_group_problem(sharding_, comm_->size(), "ulysses_attention shards over one all-to-all group",
                                         "the Ulysses communicator", "the communicator's size()");
  }
  std::string heads_problem(const detail::cp::local_shape& s) const {
    return detail::cp::check_head_split(s.heads_q, s.heads_kv, comm_->size());
  }

  std::vector<detail::cp::call_descriptor> gather(const detail::cp::call_descriptor& mine) {
    return baton::all_to_all_gather_descriptors(*comm_, std::span(&mine, 1), detail::cp::staged_by(memory_));
  }
  void settle() { baton::settle_all_to_all(*comm_, detail::cp::staged_by(memory_)); }

  detail::cp::ulysses_geometry geometry(const detail::cp::local_shape& s) const {
    return detail::cp::ulysses_geometry_of(s, sharding_, kv_.sharding, 0, comm_->size(), comm_->rank());
  }

  // After the exchange a rank holds the whole sequence (every rank's shard, in rank order):
  // the queries' and, in cross-attention, the keys' (their positions offset).
  attention_params gathered_params(std::vector<std::int64_t>& storage, std::vector<std::int64_t>& kv_storage,
                                   double scale) const {
    const auto pieces = detail::cp::gathered_pieces(sharding_, 0, comm_->size());
    attention_params ap;
    ap.q_pos = ap.k_pos = detail::cp::positions_for(pieces, 0, pieces.size(), storage);
    ap.softmax_scale = scale;
    if (cross_) {  // cross-attention: the keys' own
      const auto kv_pieces = detail::cp::gathered_pieces(kv_.sharding, 0, comm_->size(), kv_.position_offset);
      ap.k_pos = detail::cp::positions_for(kv_pieces, 0, kv_pieces.size(), kv_storage);
    }
    return ap;
  }

  template <class T, class Mask>
  void attend_forward(const detail::cp::ulysses_geometry&, const detail::cp::ulysses_gathered<T>& x, const Mask& mask,
                      double scale) {
    std::vector<std::int64_t> storage, kv_storage;
    backend_.forward(in(x.q), in(x.k), in(x.v), mask, x.out, x.lse, gathered_params(storage, kv_storage, scale));
  }

  template <class T, class Mask>
  void attend_backward(const detail::cp::ulysses_geometry&, const detail::cp::ulysses_gathered<T>& x, const Mask& mask,
                       double scale) {
    std::vector<std::int64_t> storage, kv_storage;
    backend_.backward(in(x.q), in(x.k), in(x.v), in(x.out), tensor_view<const lse_t<T>, 3>(x.lse), in(x.dout), mask,
                      x.dq, x.dk, x.dv, gathered_params(storage, kv_storage, scale));
  }

  // The backend reads its inputs through const views (deduction does not convert).
  template <class T>
  static tensor_view<const T, 4> in(const tensor_view<T, 4>& t) noexcept {
    return t;
  }

  Comm* comm_;
  Backend backend_;
  sequence_sharding sharding_;
  kv_sharding kv_;
  bool cross_ = false;
  Memory memory_;
  // The gathered tensors and exchange scratch, reused by the next call: O(b s h d / P) per
  // rank, held until release_workspace() or destruction.
  detail::cp::ulysses_workspace<Memory> ws_;
};

template <class Comm, class Backend>
ulysses_attention(Comm&, Backend, sequence_sharding) -> ulysses_attention<Comm, Backend>;
template <class Comm, class Backend, class Memory>
ulysses_attention(Comm&, Backend, sequence_sharding, Memory) -> ulysses_attention<Comm, Backend, Memory>;
template <class Comm, class Backend>
ulysses_attention(Comm&, Backend, sequence_sharding, kv_sharding) -> ulysses_attention<Comm, Backend>;
template <class Comm, class Backend, class Memory>
ulysses_attention(Comm&, Backend, sequence_sharding, kv_sharding, Memory) -> ulysses_attention<Comm, Backend, Memory>;

}  // namespace baton
