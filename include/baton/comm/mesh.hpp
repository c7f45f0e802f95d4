// baton/comm/mesh.hpp — a device mesh: one world seen as pp x dp x cp_ring x cp_ulysses.
//
//     baton::device_mesh mesh(world, {.pp = 2, .cp_ring = 2});
//     auto& ring = mesh.along(baton::mesh_dim::cp_ring);  // ranks differing only in cp_ring
//     int stage = mesh.coord(baton::mesh_dim::pp);
//
// Ranks are laid out with pp slowest and cp_ulysses fastest, so the Ulysses all-to-all
// (the most bandwidth-hungry exchange) runs between neighbouring ranks, which on a real
// machine share a node:  rank = ((pp * DP + dp) * RING + cp_ring) * ULYSSES + cp_ulysses.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/comm/error.hpp>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace baton {

/// The named dimensions of a device mesh, slowest-varying first.
enum class mesh_dim { pp, dp, cp_ring, cp_ulysses };

/// Every dimension, in rank-layout order (slowest first).
inline constexpr std::array<mesh_dim, 4> mesh_dims{mesh_dim::pp, mesh_dim::dp, mesh_dim::cp_ring, mesh_dim::cp_ulysses};

constexpr std::string_view to_string(mesh_dim d) noexcept {
  switch (d) {
    case mesh_dim::pp: return "pp";
    case mesh_dim::dp: return "dp";
    case mesh_dim::cp_ring: return "cp_ring";
    case mesh_dim::cp_ulysses: return "cp_ulysses";
  }
  return "unknown mesh_dim";
}

/// How many ranks each dimension spans. The product must equal the world size.
struct mesh_shape {
  int pp = 1;
  int dp = 1;
  int cp_ring = 1;
  int cp_ulysses = 1;

  constexpr int extent(mesh_dim d) const noexcept {
    switch (d) {
      case mesh_dim::pp: return pp;
      case mesh_dim::dp: return dp;
      case mesh_dim::cp_ring: return cp_ring;
      case mesh_dim::cp_ulysses: return cp_ulysses;
    }
    return 0;
  }
  constexpr int size() const noexcept { return pp * dp * cp_ring * cp_ulysses; }
  constexpr bool operator==(const mesh_shape&) const = default;

  /// "pp=2 x dp=1 x cp_ring=2 x cp_ulysses=1"
  std::string text() const {
    std::string t;
    for (mesh_dim d : mesh_dims) {
      t += (t.empty() ? "" : " x ") + std::string(to_string(d)) + "=" + std::to_string(extent(d));
    }
    return t;
  }
};

/// A rank's position in the mesh.
struct mesh_coords {
  int pp = 0;
  int dp = 0;
  int cp_ring = 0;
  int cp_ulysses = 0;

  constexpr int& operator[](mesh_dim d) noexcept {
    switch (d) {
      case mesh_dim::pp: return pp;
      case mesh_dim::dp: return dp;
      case mesh_dim::cp_ring: return cp_ring;
      case mesh_dim::cp_ulysses: break;
    }
    return cp_ulysses;
  }
  constexpr int operator[](mesh_dim d) const noexcept { return const_cast<mesh_coords&>(*this)[d]; }
  constexpr bool operator==(const mesh_coords&) const = default;
};

/// Rank -> coordinates. Throws comm_error for a rank outside the mesh.
constexpr mesh_coords mesh_coords_of(const mesh_shape& shape, int rank) {
  if (rank < 0 || rank >= shape.size()) {
    throw comm_error("mesh_coords_of: rank " + std::to_string(rank) + " is outside the mesh " + shape.text() +
                     " (ranks 0.." + std::to_string(shape.size() - 1) + ")");
  }
  mesh_coords c;
  for (auto it = mesh_dims.rbegin(); it != mesh_dims.rend(); ++it) {  // fastest first
    c[*it] = rank % shape.extent(*it);
    rank /= shape.extent(*it);
  }
  return c;
}

/// Coordinates -> rank. Throws comm_error for a coordinate outside its dimension.
constexpr int mesh_rank_of(const mesh_shape& shape, const mesh_coords& c) {
  int rank = 0;
  for (mesh_dim d : mesh_dims) {
    if (c[d] < 0 || c[d] >= shape.extent(d)) {
      throw comm_error("mesh_rank_of: coordinate " + std::string(to_string(d)) + "=" + std::to_string(c[d]) +
                       " is outside the mesh " + shape.text());
    }
    rank = rank * shape.extent(d) + c[d];
  }
  return rank;
}

/// One world split into the sub-communicators of a mesh_shape. Collective to construct:
/// every rank of `world` must build it with the same shape. Owns its communicators.
template <class C>
class device_mesh {
  static_assert(splittable_communicator<C>,
                "baton::device_mesh<C>: C must model baton::splittable_communicator (rank(), size() and "
                "c.split(color, key) returning a C); use local_communicator, mpi_communicator or nccl_communicator");

 public:
  /// Splits `world` (which stays usable) into one communicator per dimension. Throws
  /// comm_error, on every rank, when a size is < 1 or the sizes' product is not world.size().
  device_mesh(C& world, mesh_shape shape) : shape_(shape) {
    for (mesh_dim d : mesh_dims) {
      if (shape.extent(d) < 1) {
        throw comm_error("device_mesh: " + std::string(to_string(d)) + " = " + std::to_string(shape.extent(d)) +
                         " in mesh " + shape.text() + "; every dimension needs at least 1 rank");
      }
    }
    if (shape.size() != world.size()) {
      throw comm_error("device_mesh: the mesh " + shape.text() + " has " + std::to_string(shape.size()) +
                       " ranks but the world has " + std::to_string(world.size()) +
                       "; choose sizes whose product is the world size");
    }
    coords_ = mesh_coords_of(shape, world.rank());
    // Ranks that share every coordinate but d form the group along d; their coordinate in d
    // is the key, so a group's rank equals that coordinate.
    for (mesh_dim d : mesh_dims) {
      mesh_coords others = coords_;
      others[d] = 0;
      along_[static_cast<std::size_t>(d)].emplace(world.split(mesh_rank_of(shape, others), coords_[d]));
    }
    mesh_coords cp_others = coords_;
    cp_others.cp_ring = 0;
    cp_others.cp_ulysses = 0;
    context_parallel_.emplace(world.split(mesh_rank_of(shape, cp_others), coords_.cp_ring * shape.cp_ulysses + coords_.cp_ulysses));
    world_.emplace(world.split(0, world.rank()));
  }

  const mesh_shape& shape() const noexcept { return shape_; }
  const mesh_coords& coords() const noexcept { return coords_; }
  int coord(mesh_dim d) const noexcept { return coords_[d]; }
  int rank() const noexcept { return world_->rank(); }
  int size() const noexcept { return shape_.size(); }

  /// The ranks that differ from this one only in `d`; its rank() is coord(d).
  C& along(mesh_dim d) noexcept { return *along_[static_cast<std::size_t>(d)]; }
  /// The context-parallel group (cp_ring x cp_ulysses); rank = cp_ring * cp_ulysses-size + cp_ulysses.
  C& context_parallel() noexcept { return *context_parallel_; }
  /// The whole mesh (a copy of the world given to the constructor).
  C& world() noexcept { return *world_; }

  mesh_coords coords_of(int rank) const { return mesh_coords_of(shape_, rank); }
  int rank_of(const mesh_coords& c) const { return mesh_rank_of(shape_, c); }

 private:
  mesh_shape shape_;
  mesh_coords coords_{};
  std::array<std::optional<C>, 4> along_{};
  std::optional<C> context_parallel_{};
  std::optional<C> world_{};
};

}  // namespace baton
