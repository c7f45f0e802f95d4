// Payload types the tests share: an opaque block-mask-like value that splits along batch, an
// opaque value that is replicated, a scalar loss whose microbatches merge by summing, and a
// type that claims a tensor role without providing the tensor operations.
#pragma once

#include <baton/payload.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace baton_test {

// Like FlexAttention's BlockMask: per batch row, the number of key blocks each query block may
// see. Not a tensor: never differentiated, never sent. Splitting along batch keeps the rows of
// the microbatch's batch slice; records how it was split so tests can check the hook ran.
struct block_mask_like {
  std::vector<std::int64_t> kv_blocks_per_row;  // one entry per batch row
  std::int64_t block_size = 128;
  std::int64_t split_chunk = -1;  // which microbatch this is (-1: not split)
};

// Run configuration: opaque and replicated to every microbatch.
struct run_config {
  double dropout = 0.0;
  int seed = 0;
};

// A scalar loss: an activation tensor with one element whose microbatches merge by summing.
struct scalar_loss {
  double value = 0.0;
};

// Claims to be an activation tensor but provides none of the tensor operations.
struct tensor_without_operations {};

}  // namespace baton_test

template <>
struct baton::payload_traits<baton_test::block_mask_like> {
  static constexpr payload_role role = payload_role::opaque;
  static baton_test::block_mask_like split(const baton_test::block_mask_like& m, std::int64_t chunk,
                                           std::int64_t chunks) {
    const auto rows = static_cast<std::int64_t>(m.kv_blocks_per_row.size());
    const auto part = baton::microbatch_bounds(rows, chunks)[static_cast<std::size_t>(chunk)];  // the tensors' cut
    const auto first = m.kv_blocks_per_row.begin() + part.begin;
    return {{first, first + part.count}, m.block_size, chunk};
  }
  static baton_test::block_mask_like merge(std::span<const baton_test::block_mask_like> parts) {
    baton_test::block_mask_like out{{}, parts[0].block_size, -1};
    for (const auto& p : parts) out.kv_blocks_per_row.insert(out.kv_blocks_per_row.end(), p.kv_blocks_per_row.begin(),
                                                             p.kv_blocks_per_row.end());
    return out;
  }
};

template <>
struct baton::payload_traits<baton_test::run_config> {
  static constexpr payload_role role = payload_role::opaque;
};

template <>
struct baton::payload_traits<baton_test::scalar_loss> {
  static constexpr payload_role role = payload_role::activation;
  using value_type = double;
  using loss = baton_test::scalar_loss;
  static std::vector<std::int64_t> shape(const loss&) { return {}; }
  static std::span<const std::byte> bytes(const loss& l) { return std::as_bytes(std::span<const double, 1>(&l.value, 1)); }
  static std::span<std::byte> mutable_bytes(loss& l) { return std::as_writable_bytes(std::span<double, 1>(&l.value, 1)); }
  static loss allocate(std::span<const std::int64_t>) { return {}; }
  static loss allocate_like(const loss&) { return {}; }
  static loss slice(const loss& l, int, std::int64_t, std::int64_t) { return l; }
  static loss concat(std::span<const loss> parts, int) { return merge(parts); }
  // The reducer merge_microbatches uses instead of concat: losses of microbatches add up.
  static loss merge(std::span<const loss> parts) {
    loss total;
    for (const auto& p : parts) total.value += p.value;
    return total;
  }
};

template <>
struct baton::payload_traits<baton_test::tensor_without_operations> {
  static constexpr payload_role role = payload_role::activation;
};
