// baton/cp/cross.hpp — the key/value side of a context-parallel cross-attention: queries
// and keys/values come from different sequences (a decoder attending to an encoder, text to
// image tokens), of different lengths, each sharded by its own sequence_sharding.
#pragma once

#include <baton/cp/sharding.hpp>

#include <cstdint>
#include <utility>

namespace baton {

/// How the keys and values of a cross-attention are sharded, and where their positions lie
/// in the mask's position space.
///
/// `sharding` cuts the Sk keys over the same ranks as the queries' sharding cuts the Sq
/// queries (same degree and inner degree; any layouts, any lengths: a shard may be empty).
/// Rank r passes q, out, dout, dq of `q_sharding.local_len(r)` tokens and k, v, dk, dv of
/// `sharding.local_len(r)` tokens.
///
/// Masks see query i at global position i and key j at global position `position_offset + j`.
/// With offset 0 the two sequences share the positions 0.. (a key padding mask:
/// `padding_mask(no_mask{}, Sq, valid_keys)`); with offset Sq the keys lie after the queries,
/// so one `document_mask` over Sq + Sk ids pairs each query document with its key document
/// (the ids of queries first, then of keys).
struct kv_sharding {
  sequence_sharding sharding;
  std::int64_t position_offset = 0;

  friend bool operator==(const kv_sharding&, const kv_sharding&) = default;
};

}  // namespace baton
