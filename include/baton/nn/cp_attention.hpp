// baton/nn/cp_attention.hpp — the context-parallel mode chosen at run time: one strategy type
// that is no_cp, ring, Ulysses or hybrid attention, so that one compiled program (a trainer
// with a --cp-mode flag) runs every mode.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/comm/mesh.hpp>
#include <baton/cp/hybrid.hpp>
#include <baton/cp/params.hpp>
#include <baton/cp/ring.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/cp/ulysses.hpp>
#include <baton/nn/attention.hpp>
#include <baton/nn/error.hpp>

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <variant>

namespace baton::nn {

/// How attention is spread over the context-parallel ranks.
enum class cp_mode { none, ring, ulysses, hybrid };

constexpr std::string_view to_string(cp_mode m) noexcept {
  switch (m) {
    case cp_mode::none: return "none";
    case cp_mode::ring: return "ring";
    case cp_mode::ulysses: return "ulysses";
    case cp_mode::hybrid: return "hybrid";
  }
  return "unknown";
}

/// An attention strategy whose mode is a run-time value: no_cp<Backend>, ring_attention,
/// ulysses_attention or hybrid_attention over communicators of type Comm. A self_attention
/// or transformer_block over cp_attention<Comm, Backend> is one type for every mode; each call
/// dispatches to the mode it was built with.
///
/// ```cpp
///   auto attention = baton::nn::cp_attention<baton::local_communicator, baton::kokkos_attention>::from_mesh(
///       mesh, baton::nn::cp_mode::ring, baton::kokkos_attention{}, baton::shard_layout::zigzag, seq_len);
/// ```
template <class Comm, class Backend>
class cp_attention {
 public:
  /// The attention backend every step runs (what the model layer asks about its storage types).
  using backend_type = Backend;
  using ring_type = ring_attention<Comm, Backend>;
  using ulysses_type = ulysses_attention<Comm, Backend>;
  using hybrid_type = hybrid_attention<Comm, Comm, Backend>;

  /// Whole sequences on this rank.
  static cp_attention none(Backend backend = {}) { return cp_attention(no_cp<Backend>(std::move(backend))); }
  static cp_attention ring(Comm& ring, Backend backend, sequence_sharding sharding) {
    return cp_attention(ring_type(ring, std::move(backend), std::move(sharding)));
  }
  static cp_attention ulysses(Comm& group, Backend backend, sequence_sharding sharding) {
    return cp_attention(ulysses_type(group, std::move(backend), std::move(sharding)));
  }
  static cp_attention hybrid(Comm& ulysses_group, Comm& ring_group, Backend backend, sequence_sharding sharding) {
    return cp_attention(hybrid_type(ulysses_group, ring_group, std::move(backend), std::move(sharding)));
  }

  /// The strategy of `mode` on the context-parallel groups of a device mesh: ring over
  /// cp_ring, Ulysses over cp_ulysses, hybrid over both (none: whole sequences). Throws
  /// nn_error when the mesh's cp extents do not fit the mode (ring with cp_ulysses > 1, ...),
  /// and cp_error when seq_len cannot be sharded so.
  static cp_attention from_mesh(device_mesh<Comm>& mesh, cp_mode mode, Backend backend, shard_layout layout,
                                std::int64_t seq_len) {
    const int ring_degree = mesh.shape().cp_ring, ulysses_degree = mesh.shape().cp_ulysses;
    const auto need = [&](bool ok, const char* what) {
      if (!ok)
        throw nn_error(std::string("baton::nn::cp_attention: cp mode ") + std::string(to_string(mode)) + " " + what +
                       ", but the mesh is " + mesh.shape().text());
    };
    switch (mode) {
      case cp_mode::none:
        need(ring_degree == 1 && ulysses_degree == 1, "needs cp_ring = cp_ulysses = 1");
        return none(std::move(backend));
      case cp_mode::ring:
        need(ulysses_degree == 1, "runs over cp_ring alone and needs cp_ulysses = 1 (use hybrid for both)");
        return ring(mesh.along(mesh_dim::cp_ring), std::move(backend), sequence_sharding(layout, seq_len, ring_degree));
      case cp_mode::ulysses:
        need(ring_degree == 1, "runs over cp_ulysses alone and needs cp_ring = 1 (use hybrid for both)");
        return ulysses(mesh.along(mesh_dim::cp_ulysses), std::move(backend),
                       sequence_sharding(layout, seq_len, ulysses_degree));
      case cp_mode::hybrid:
        return hybrid(mesh.along(mesh_dim::cp_ulysses), mesh.along(mesh_dim::cp_ring), std::move(backend),
                      sequence_sharding(layout, seq_len, ring_degree, ulysses_degree));
    }
    throw nn_error("baton::nn::cp_attention: unknown cp mode");
  }

  cp_mode mode() const noexcept { return static_cast<cp_mode>(impl_.index()); }

  /// The sharding of the sequence over the context-parallel group; null for cp_mode::none.
  const sequence_sharding* sharding() const noexcept {
    return std::visit(
        [](const auto& s) -> const sequence_sharding* {
          if constexpr (requires { s.sharding(); }) {
            return &s.sharding();
          } else {
            return nullptr;
          }
        },
        impl_);
  }

  /// Which shard of sharding() this rank holds (0 for cp_mode::none).
  int shard_index() const noexcept {
    return std::visit(
        [](const auto& s) {
          if constexpr (requires { s.shard_index(); }) {
            return s.shard_index();
          } else {
            return 0;
          }
        },
        impl_);
  }

  template <class T, class Mask>
  void forward(tensor_view<const T, 4> q, tensor_view<const T, 4> k, tensor_view<const T, 4> v, const Mask& mask,
               tensor_view<T, 4> out, tensor_view<lse_t<T>, 3> lse, std::span<const std::int64_t> positions,
               const cp_params& params) {
    std::visit(
        [&](auto& s) {
          if constexpr (detail::nn::is_no_cp<std::remove_cvref_t<decltype(s)>>::value) {
            s.forward(q, k, v, mask, out, lse, positions, params.softmax_scale);
          } else {
            s.forward(q, k, v, mask, out, lse, params);
          }
        },
        impl_);
  }

  template <class T, class Mask>
  void backward(tensor_view<const T, 4> q, tensor_view<const T, 4> k, tensor_view<const T, 4> v,
                tensor_view<const T, 4> out, tensor_view<const lse_t<T>, 3> lse, tensor_view<const T, 4> dout,
                const Mask& mask, tensor_view<T, 4> dq, tensor_view<T, 4> dk, tensor_view<T, 4> dv,
                std::span<const std::int64_t> positions, const cp_params& params) {
    std::visit(
        [&](auto& s) {
          if constexpr (detail::nn::is_no_cp<std::remove_cvref_t<decltype(s)>>::value) {
            s.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, positions, params.softmax_scale);
          } else {
            s.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, params);
          }
        },
        impl_);
  }

 private:
  template <class S>
  explicit cp_attention(S s) : impl_(std::in_place_type<S>, std::move(s)) {}

  // The order matches cp_mode.
  std::variant<no_cp<Backend>, ring_type, ulysses_type, hybrid_type> impl_;
};

}  // namespace baton::nn
