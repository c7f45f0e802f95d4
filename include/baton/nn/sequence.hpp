// baton/nn/sequence.hpp — the side input of the model layer: which global positions a rank's
// rows hold, and (for packed sequences) which document each position belongs to.
#pragma once

#include <baton/core/sizes.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/nn/error.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/payload/microbatch.hpp>
#include <baton/payload/traits.hpp>

#include <cstdint>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

namespace baton::nn {

/// Per-microbatch information every attention layer needs and no stage sends: the global
/// positions of this rank's rows of the sequence axis (all of 0..S-1 unsharded; the shard's
/// positions, in its local order, under context parallelism) and, for packed sequences, the
/// document of every global position of every batch row.
///
/// RoPE rotates by these positions and masks see them, so a shard computes exactly what the
/// unsharded sequence computes for those rows. It is an opaque side input of the pipeline:
/// split per microbatch along the batch (documents) and never sent.
struct sequence_info {
  /// Global positions of this rank's rows of the sequence axis, in local order.
  std::vector<std::int64_t> positions;
  /// Optional, for packed sequences: [batch, seq_len] document ids over the *global*
  /// sequence (attention is then also restricted to keys of the query's document).
  std::shared_ptr<const host_tensor<std::int64_t>> documents;

  /// Positions 0..seq_len-1: an unsharded sequence.
  static sequence_info whole(std::int64_t seq_len) {
    if (seq_len < 1) throw nn_error("baton::nn::sequence_info::whole: seq_len " + std::to_string(seq_len) + " must be positive");
    sequence_info info;
    info.positions.resize(static_cast<std::size_t>(seq_len));
    std::iota(info.positions.begin(), info.positions.end(), std::int64_t{0});
    return info;
  }

  /// The positions a context-parallel rank holds: shard `shard_index` of `sharding` (the
  /// attention object's shard_index()).
  static sequence_info shard(const sequence_sharding& sharding, int shard_index) {
    sequence_info info;
    info.positions = sharding.global_positions(shard_index);
    return info;
  }

  /// The same positions with document ids [batch, seq_len] over the global sequence.
  sequence_info with_documents(host_tensor<std::int64_t> ids) const {
    if (ids.rank() != 2)
      throw nn_error("baton::nn::sequence_info::with_documents: document ids have shape " +
                     detail::core::shape_text(ids.shape()) + " but expected [batch, seq_len]");
    sequence_info info = *this;
    info.documents = std::make_shared<const host_tensor<std::int64_t>>(std::move(ids));
    return info;
  }
};

}  // namespace baton::nn

/// sequence_info is an opaque side input: microbatch c of a split gets the positions and its
/// rows of the document ids.
template <>
struct baton::payload_traits<baton::nn::sequence_info> {
  static constexpr payload_role role = payload_role::opaque;

  static baton::nn::sequence_info split(const baton::nn::sequence_info& info, std::int64_t chunk, std::int64_t chunks) {
    baton::nn::sequence_info part;
    part.positions = info.positions;
    if (info.documents) {
      const row_range rows = microbatch_bounds(info.documents->shape()[0], chunks)[static_cast<std::size_t>(chunk)];
      part.documents = std::make_shared<const host_tensor<std::int64_t>>(
          payload_traits<host_tensor<std::int64_t>>::slice(*info.documents, 0, rows.begin, rows.count));
    }
    return part;
  }
};
