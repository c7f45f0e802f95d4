// baton/cp/hybrid.hpp — hybrid (USP-style) attention on a 2-D mesh: Ulysses inside (heads
// exchanged within a group of U ranks, typically one node), ring outside (K/V blocks passed
// between the R groups).
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/comm/mesh.hpp>
#include <baton/cp/cross.hpp>
#include <baton/cp/detail/agree.hpp>
#include <baton/cp/detail/front_end.hpp>
#include <baton/cp/detail/ring_core.hpp>
#include <baton/cp/detail/ulysses_core.hpp>
#include <baton/cp/detail/views.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/memory.hpp>
#include <baton/cp/ring.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/cp/ulysses.hpp>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// The two groups of a context-parallel mesh over a world of ring_degree x ulysses_degree
/// ranks: world rank w is Ulysses rank w % U of group w / U, and ring rank w / U.
/// Consecutive ranks share a Ulysses group, so on a machine with U devices per node the
/// all-to-all stays inside the node and only the ring crosses nodes.
template <class Comm>
struct cp_mesh {
  Comm ulysses;  ///< the U ranks exchanging heads (same ring rank)
  Comm ring;     ///< the R ranks passing K/V blocks (same Ulysses rank)
  int ring_degree = 1;
  int ulysses_degree = 1;
};

/// Splits `world` into a cp_mesh (collective). Every rank throws cp_error when
/// ring_degree x ulysses_degree is not the world size, or when ranks pass different degrees.
///
/// `memory`: where the communicator can move the agreement's few bytes from (a device
/// communicator needs cuda_device_memory, <baton/cp/cuda.hpp>); host_memory by default.
template <class Comm, cp_memory_space Memory = host_memory>
cp_mesh<Comm> make_cp_mesh(Comm& world, int ring_degree, int ulysses_degree, Memory memory = {}) {
  static_assert(splittable_communicator<Comm> && all_to_all_communicator<Comm>,
                "baton::make_cp_mesh: the world communicator must model splittable_communicator (split(color, key)) "
                "and all_to_all_communicator (to agree on the degrees first)");
  using namespace detail::cp;
  call_descriptor mine;
  mine.protocol = tags::cp::first;
  mine.operation = op_make_cp_mesh;
  mine.rank = world.rank();
  mine.values[call_field::degree] = ring_degree;
  mine.values[call_field::inner_degree] = ulysses_degree;
  mine.values[call_field::world_size] = world.size();
  if (ring_degree < 1 || ulysses_degree < 1 || std::int64_t{ring_degree} * ulysses_degree != world.size()) {
    mine.fail(1, "rank " + std::to_string(world.rank()) + ": the mesh ring " + std::to_string(ring_degree) +
              " x Ulysses " + std::to_string(ulysses_degree) + " = " +
              std::to_string(std::int64_t{ring_degree} * ulysses_degree) + " ranks does not match the world size " +
              std::to_string(world.size()) + "; choose degrees whose product is the world size");
  }
  [[maybe_unused]] constexpr bool memory_ok = memory_matches_communicator<Memory, Comm>();  // asserts
  const auto all =
      baton::all_to_all_gather_descriptors(world, std::span<const call_descriptor>(&mine, 1), staged_by(memory));
  agree_settle_or_throw("baton::make_cp_mesh", all, [&] { baton::settle_all_to_all(world, staged_by(memory)); });
  const int w = world.rank();
  cp_mesh<Comm> mesh{world.split(w / ulysses_degree, w % ulysses_degree), world.split(w % ulysses_degree, w / ulysses_degree),
                     ring_degree, ulysses_degree};
  return mesh;
}

/// Hybrid attention: Ulysses over `ulysses` (U ranks), ring attention over `ring` (R ranks).
///
/// The sharding is `sequence_sharding(layout, S, R, U)`: the layout (zigzag for causal
/// balance) cuts the sequence over the R ring groups, and each group's shard is split
/// contiguously over its U Ulysses ranks. The Ulysses exchange re-assembles the group's
/// shard for heads h/U; the ring then runs over the groups exactly as ring_attention does.
/// Head rules are Ulysses' (over U). The gathered buffers of the Ulysses stage are kept for
/// the next call (release_workspace() frees them): one object per rank, one call at a time.
///
/// Example, on every rank of a world of 4 (views as for ring_attention, of shard
/// attn.shard_index()):
/// ```cpp
///   auto mesh = baton::make_cp_mesh(world, /*ring=*/2, /*ulysses=*/2);
///   baton::sequence_sharding sharding(baton::shard_layout::zigzag, seq_len, 2, 2);
///   baton::hybrid_attention attn(mesh, baton::reference_attention{}, sharding);
///   attn.forward(q, k, v, baton::causal_mask{}, out, lse);
/// ```
///
/// Memory spaces as for ring_attention: the backend's by default, or an explicit last
/// constructor argument.
template <all_to_all_communicator UlyssesComm, ring_communicator RingComm, class Backend,
          cp_memory_space Memory = cp_memory_space_t<Backend>>
class hybrid_attention
    : public detail::cp::front_end<hybrid_attention<UlyssesComm, RingComm, Backend, Memory>, Backend, Memory,
                                   UlyssesComm, RingComm>,
      public detail::cp::ulysses_stage<hybrid_attention<UlyssesComm, RingComm, Backend, Memory>, Memory> {
 public:
  /// The attention backend every step runs (what the model layer asks about its storage types).
  using backend_type = Backend;
  hybrid_attention(UlyssesComm& ulysses, RingComm& ring, Backend backend, sequence_sharding sharding)
      : ulysses_(&ulysses),
        ring_(&ring),
        backend_(std::move(backend)),
        sharding_(std::move(sharding)),
        kv_{sharding_, 0},
        memory_(cp_memory_space_of<Backend>::make(backend_)) {}
  hybrid_attention(UlyssesComm& ulysses, RingComm& ring, Backend backend, sequence_sharding sharding, Memory memory)
      : ulysses_(&ulysses),
        ring_(&ring),
        backend_(std::move(backend)),
        sharding_(std::move(sharding)),
        kv_{sharding_, 0},
        memory_(std::move(memory)) {}
  /// Cross-attention: the queries sharded by `q_sharding`, the keys and values by `kv`
  /// (cp/cross.hpp; both R x U): each exchanged in its group by its own lengths, the keys'
  /// group shards then travelling the ring.
  hybrid_attention(UlyssesComm& ulysses, RingComm& ring, Backend backend, sequence_sharding q_sharding, kv_sharding kv)
      : ulysses_(&ulysses),
        ring_(&ring),
        backend_(std::move(backend)),
        sharding_(std::move(q_sharding)),
        kv_(std::move(kv)),
        cross_(true),
        memory_(cp_memory_space_of<Backend>::make(backend_)) {}
  template <class Comm>
    requires(std::is_same_v<Comm, UlyssesComm> && std::is_same_v<Comm, RingComm>)
  hybrid_attention(cp_mesh<Comm>& mesh, Backend backend, sequence_sharding q_sharding, kv_sharding kv)
      : hybrid_attention(mesh.ulysses, mesh.ring, std::move(backend), std::move(q_sharding), std::move(kv)) {}

  template <class Comm>
    requires(std::is_same_v<Comm, UlyssesComm> && std::is_same_v<Comm, RingComm>)
  hybrid_attention(cp_mesh<Comm>& mesh, Backend backend, sequence_sharding sharding)
      : hybrid_attention(mesh.ulysses, mesh.ring, std::move(backend), std::move(sharding)) {}
  template <class Comm>
    requires(std::is_same_v<Comm, UlyssesComm> && std::is_same_v<Comm, RingComm>)
  hybrid_attention(cp_mesh<Comm>& mesh, Backend backend, sequence_sharding sharding, Memory memory)
      : hybrid_attention(mesh.ulysses, mesh.ring, std::move(backend), std::move(sharding), std::move(memory)) {}

  /// On the cp_ring x cp_ulysses group of a device_mesh (baton/comm/mesh.hpp).
  template <class Comm>
    requires(std::is_same_v<Comm, UlyssesComm> && std::is_same_v<Comm, RingComm>)
  hybrid_attention(device_mesh<Comm>& mesh, Backend backend, sequence_sharding sharding)
      : hybrid_attention(mesh.along(mesh_dim::cp_ulysses), mesh.along(mesh_dim::cp_ring), std::move(backend),
                         std::move(sharding)) {}

  /// The queries' sharding (and the keys' in self-attention).
  const sequence_sharding& sharding() const noexcept { return sharding_; }
  /// The keys' and values' sharding: the queries' with offset 0 unless built for cross-attention.
  const kv_sharding& kv() const noexcept { return kv_; }
  /// Built for cross-attention (with a kv_sharding).
  bool is_cross() const noexcept { return cross_; }
  /// Which shard of the sharding this rank must pass: ring rank x Ulysses degree + Ulysses
  /// rank (make_cp_mesh and device_mesh number the context-parallel ranks this way).
  int shard_index() const noexcept { return ring_->rank() * ulysses_->size() + ulysses_->rank(); }

  // forward(q, k, v, mask, out, lse, params) and backward(q, k, v, out, lse, dout, mask, dq,
  // dk, dv, params) come from detail::cp::front_end; release_workspace() from
  // detail::cp::ulysses_stage.

 private:
  friend class detail::cp::front_end<hybrid_attention, Backend, Memory, UlyssesComm, RingComm>;
  friend class detail::cp::ulysses_stage<hybrid_attention, Memory>;

  Memory& memory() noexcept { return memory_; }
  UlyssesComm& exchange_group() noexcept { return *ulysses_; }
  detail::cp::ulysses_workspace<Memory>& workspace() noexcept { return ws_; }

  detail::cp::ring_geometry ring_geometry_of(const detail::cp::ulysses_geometry& g) const {
    detail::cp::ring_geometry rg;
    for (int r = 0; r < ring_->size(); ++r) rg.pieces.push_back(sharding_.group_pieces(r));
    if (cross_)
      for (int r = 0; r < ring_->size(); ++r)
        rg.kv_pieces.push_back(detail::cp::offset_pieces(kv_.sharding.group_pieces(r), kv_.position_offset));
    rg.batch = g.batch;
    rg.heads_q = g.heads_q();
    rg.heads_kv = g.heads_kv();
    rg.dim = g.dim;
    rg.head_major = gathers_head_major;  // the ring computes in the layout the exchange leaves
    return rg;
  }

  static constexpr const char* name = "baton::hybrid_attention";
  static constexpr auto forward_op = detail::cp::op_hybrid_forward;
  static constexpr auto backward_op = detail::cp::op_hybrid_backward;
  int world_size() const noexcept { return ring_->size() * ulysses_->size(); }

  std::string topology_problem() const {
    if (sharding_.degree() != ring_->size() || sharding_.inner_degree() != ulysses_->size())
      return "the sequence_sharding is " + std::to_string(sharding_.degree()) + " (ring) x " +
             std::to_string(sharding_.inner_degree()) + " (Ulysses) but the mesh is " + std::to_string(ring_->size()) +
             " x " + std::to_string(ulysses_->size()) +
             "; build it as sequence_sharding(layout, seq_len, ring.size(), ulysses.size())";
    return {};
  }
  std::string heads_problem(const detail::cp::local_shape& s) const {
    return detail::cp::check_head_split(s.heads_q, s.heads_kv, ulysses_->size());
  }

  // Inside the Ulysses group first, then around the ring: every rank sees all.
  std::vector<detail::cp::call_descriptor> gather(const detail::cp::call_descriptor& mine) {
    const auto group = baton::all_to_all_gather_descriptors(*ulysses_, std::span(&mine, 1),
                                                                   detail::cp::staged_by(memory_));
    return baton::ring_gather_descriptors(*ring_, detail::cp::tag_agree,
                                                 std::span<const detail::cp::call_descriptor>(group),
                                                 detail::cp::staged_by(memory_));
  }
  void settle() {
    baton::settle_ring(*ring_, detail::cp::tag_settle, detail::cp::staged_by(memory_));
    baton::settle_all_to_all(*ulysses_, detail::cp::staged_by(memory_));
  }

  detail::cp::ulysses_geometry geometry(const detail::cp::local_shape& s) const {
    return detail::cp::ulysses_geometry_of(s, sharding_, kv_.sharding, ring_->rank() * ulysses_->size(), ulysses_->size(),
                                           ulysses_->rank());
  }

  // As in ulysses_attention: head-major on the host, and the ring over the groups then
  // computes in that layout too, on the gathered tensors in place.
  static constexpr bool gathers_head_major = Memory::location == cp_memory_location::host;

  // The ring over the groups. A ring's members share their Ulysses rank, so they hold the
  // same heads: where that is none (more Ulysses ranks than heads), ulysses_stage skips the
  // attention on the whole ring together.
  template <class T, class Mask>
  void attend_forward(const detail::cp::ulysses_geometry& g, const detail::cp::ulysses_gathered<T>& x,
                      const Mask& mask, double scale) {
    detail::cp::ring_forward<T>(*ring_, backend_, memory_, ring_geometry_of(g), x.q, x.k, x.v, mask, x.out, x.lse,
                                scale);
  }

  template <class T, class Mask>
  void attend_backward(const detail::cp::ulysses_geometry& g, const detail::cp::ulysses_gathered<T>& x,
                       const Mask& mask, double scale) {
    detail::cp::ring_backward<T>(*ring_, backend_, memory_, ring_geometry_of(g), x.q, x.k, x.v, x.out,
                                 tensor_view<const lse_t<T>, 3>(x.lse), x.dout, mask, x.dq, x.dk, x.dv, scale);
  }

  UlyssesComm* ulysses_;
  RingComm* ring_;
  Backend backend_;
  sequence_sharding sharding_;
  kv_sharding kv_;
  bool cross_ = false;
  Memory memory_;
  // The Ulysses group's gathered tensors and exchange scratch, reused by the next call
  // (as in ulysses_attention): O(b s h d / (R U)) per rank, held until release_workspace().
  detail::cp::ulysses_workspace<Memory> ws_;
};

template <class UComm, class RComm, class Backend>
hybrid_attention(UComm&, RComm&, Backend, sequence_sharding) -> hybrid_attention<UComm, RComm, Backend>;
template <class Comm, class Backend>
hybrid_attention(cp_mesh<Comm>&, Backend, sequence_sharding) -> hybrid_attention<Comm, Comm, Backend>;
template <class UComm, class RComm, class Backend>
hybrid_attention(UComm&, RComm&, Backend, sequence_sharding, kv_sharding) -> hybrid_attention<UComm, RComm, Backend>;
template <class Comm, class Backend>
hybrid_attention(cp_mesh<Comm>&, Backend, sequence_sharding, kv_sharding) -> hybrid_attention<Comm, Comm, Backend>;
template <class Comm, class Backend>
hybrid_attention(device_mesh<Comm>&, Backend, sequence_sharding) -> hybrid_attention<Comm, Comm, Backend>;
template <class UComm, class RComm, class Backend, class Memory>
hybrid_attention(UComm&, RComm&, Backend, sequence_sharding, Memory) -> hybrid_attention<UComm, RComm, Backend, Memory>;
template <class Comm, class Backend, class Memory>
hybrid_attention(cp_mesh<Comm>&, Backend, sequence_sharding, Memory) -> hybrid_attention<Comm, Comm, Backend, Memory>;

}  // namespace baton
