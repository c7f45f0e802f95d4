// baton/cp/ring.hpp — ring attention: each rank holds a shard of the sequence; K/V blocks
// travel around the ring while every rank attends its queries to each block in turn.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/cp/cross.hpp>
#include <baton/cp/detail/agree.hpp>
#include <baton/cp/detail/front_end.hpp>
#include <baton/cp/detail/ring_core.hpp>
#include <baton/cp/detail/views.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/memory.hpp>
#include <baton/cp/params.hpp>
#include <baton/cp/sharding.hpp>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// Ring attention over any ring_communicator and any attention backend.
///
/// Every rank holds the shard `sharding.pieces(rank)` of q, k, v ([batch, local_len(rank),
/// heads, dim]; shards may differ in length, see sequence_sharding)
/// and gets out and lse for its queries, exactly as attention over the whole sequence would
/// give them (masks see global positions). backward returns dq for its queries and dk, dv
/// for its own keys. Requirements: `sharding.degree()` equals the ring size, inner degree 1;
/// every rank calls forward / backward together with shards of the same batch, heads and dim.
/// A ring step at which no rank's queries need the block held (e.g. beyond a sliding window)
/// is skipped by every rank: no compute and no transfer. Cross-attention (queries and keys
/// from different sequences, each sharded by its own layout): construct with a kv_sharding
/// (cp/cross.hpp); k, v, dk, dv then hold the keys' shard. Bad input on
/// any rank makes every rank throw cp_error before any data moves.
///
/// Example, on every rank of `comm`, with q, k, v, dout views of this rank's shard and out,
/// lse, dq, dk, dv of its results:
/// ```cpp
///   baton::sequence_sharding sharding(baton::shard_layout::zigzag, seq_len, comm.size());
///   baton::ring_attention ring(comm, baton::reference_attention{}, sharding);
///   ring.forward(q, k, v, baton::causal_mask{}, out, lse);
///   ring.backward(q, k, v, out, lse, dout, baton::causal_mask{}, dq, dk, dv);
/// ```
///
/// Buffers and data movement go through the memory space `Memory` (cp/memory.hpp): the
/// backend's by default (host_memory; cuda_device_memory for a CUDA backend once
/// <baton/cp/cuda.hpp> is included), or one passed as the last constructor argument.
template <ring_communicator Comm, class Backend, cp_memory_space Memory = cp_memory_space_t<Backend>>
class ring_attention : public detail::cp::front_end<ring_attention<Comm, Backend, Memory>, Backend, Memory, Comm> {
 public:
  /// The attention backend every step runs (what the model layer asks about its storage types).
  using backend_type = Backend;
  ring_attention(Comm& ring, Backend backend, sequence_sharding sharding)
      : ring_(&ring),
        backend_(std::move(backend)),
        sharding_(std::move(sharding)),
        kv_{sharding_, 0},
        memory_(cp_memory_space_of<Backend>::make(backend_)) {}
  /// With an explicit memory space (its location must be the backend's: see cp/memory.hpp).
  ring_attention(Comm& ring, Backend backend, sequence_sharding sharding, Memory memory)
      : ring_(&ring), backend_(std::move(backend)), sharding_(std::move(sharding)), kv_{sharding_, 0},
        memory_(std::move(memory)) {}
  /// Cross-attention: the queries sharded by `q_sharding`, the keys and values by `kv`
  /// (cp/cross.hpp); K/V blocks of the keys' shards travel the ring as in self-attention.
  ring_attention(Comm& ring, Backend backend, sequence_sharding q_sharding, kv_sharding kv)
      : ring_(&ring),
        backend_(std::move(backend)),
        sharding_(std::move(q_sharding)),
        kv_(std::move(kv)),
        cross_(true),
        memory_(cp_memory_space_of<Backend>::make(backend_)) {}
  ring_attention(Comm& ring, Backend backend, sequence_sharding q_sharding, kv_sharding kv, Memory memory)
      : ring_(&ring), backend_(std::move(backend)), sharding_(std::move(q_sharding)), kv_(std::move(kv)),
        cross_(true),
        memory_(std::move(memory)) {}

  /// The queries' sharding (and the keys' in self-attention).
  const sequence_sharding& sharding() const noexcept { return sharding_; }
  /// The keys' and values' sharding: the queries' with offset 0 unless built for cross-attention.
  const kv_sharding& kv() const noexcept { return kv_; }
  /// Built for cross-attention (with a kv_sharding).
  bool is_cross() const noexcept { return cross_; }
  /// Which shard of the sharding this rank must pass (its rank in the communicator).
  int shard_index() const noexcept { return ring_->rank(); }

  // forward(q, k, v, mask, out, lse, params) and backward(q, k, v, out, lse, dout, mask, dq,
  // dk, dv, params) come from detail::cp::front_end.

 private:
  friend class detail::cp::front_end<ring_attention, Backend, Memory, Comm>;

  Memory& memory() noexcept { return memory_; }

  static constexpr const char* name = "baton::ring_attention";
  static constexpr auto forward_op = detail::cp::op_ring_forward;
  static constexpr auto backward_op = detail::cp::op_ring_backward;
  int world_size() const noexcept { return ring_->size(); }

  std::string topology_problem() const {
    return detail::cp::one_group_problem(sharding_, ring_->size(), "ring_attention shards over the ring alone",
                                         "the ring communicator", "the ring's size()");
  }
  std::string heads_problem(const detail::cp::local_shape&) const { return {}; }

  std::vector<detail::cp::call_descriptor> gather(const detail::cp::call_descriptor& mine) {
    return baton::ring_gather_descriptors(*ring_, detail::cp::tag_agree, std::span(&mine, 1),
                                                 detail::cp::staged_by(memory_));
  }
  void settle() { baton::settle_ring(*ring_, detail::cp::tag_settle, detail::cp::staged_by(memory_)); }

  detail::cp::ring_geometry geometry(const detail::cp::local_shape& s) const {
    detail::cp::ring_geometry g;
    for (int r = 0; r < ring_->size(); ++r) g.pieces.push_back(sharding_.pieces(r));
    if (cross_)
      for (int r = 0; r < ring_->size(); ++r) g.kv_pieces.push_back(detail::cp::offset_pieces(kv_.sharding.pieces(r), kv_.position_offset));
    g.batch = s.batch;
    g.heads_q = s.heads_q;
    g.heads_kv = s.heads_kv;
    g.dim = s.dim;
    // On the host the ring computes head-major (ring_core.hpp); a device keeps the caller's layout.
    g.head_major = Memory::location == cp_memory_location::host;
    return g;
  }

  template <class T, class Mask>
  void run_forward(const detail::cp::ring_geometry& g, tensor_view<const T, 4> q, tensor_view<const T, 4> k,
                   tensor_view<const T, 4> v, const Mask& mask, tensor_view<T, 4> out, tensor_view<lse_t<T>, 3> lse,
                   double scale) {
    detail::cp::ring_forward<T>(*ring_, backend_, memory_, g, q, k, v, mask, out, lse, scale);
  }

  template <class T, class Mask>
  void run_backward(const detail::cp::ring_geometry& g, tensor_view<const T, 4> q, tensor_view<const T, 4> k,
                    tensor_view<const T, 4> v, tensor_view<const T, 4> out, tensor_view<const lse_t<T>, 3> lse,
                    tensor_view<const T, 4> dout, const Mask& mask, tensor_view<T, 4> dq, tensor_view<T, 4> dk,
                    tensor_view<T, 4> dv, double scale) {
    detail::cp::ring_backward<T>(*ring_, backend_, memory_, g, q, k, v, out, lse, dout, mask, dq, dk, dv, scale);
  }

  Comm* ring_;
  Backend backend_;
  sequence_sharding sharding_;
  kv_sharding kv_;
  bool cross_ = false;
  Memory memory_;
};

template <class Comm, class Backend>
ring_attention(Comm&, Backend, sequence_sharding) -> ring_attention<Comm, Backend>;
template <class Comm, class Backend, class Memory>
ring_attention(Comm&, Backend, sequence_sharding, Memory) -> ring_attention<Comm, Backend, Memory>;
template <class Comm, class Backend>
ring_attention(Comm&, Backend, sequence_sharding, kv_sharding) -> ring_attention<Comm, Backend>;
template <class Comm, class Backend, class Memory>
ring_attention(Comm&, Backend, sequence_sharding, kv_sharding, Memory) -> ring_attention<Comm, Backend, Memory>;

}  // namespace baton
