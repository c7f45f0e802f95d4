// baton/attention/tiles.hpp — what the host flash kernels (kokkos_attention) compute of a
// tile, for cost models outside the attention layer (the CP chooser, baton/cp/choose.hpp).
// The kernels cut a call into flash_tile_size x flash_tile_size tiles of queries x keys from
// its corner; a tile the mask classifies partial is computed only where each 4-row group of
// queries has allowed keys (detail/flash_tiles.hpp, tile_extent).
#pragma once

#include <baton/attention/detail/flash_tiles.hpp>
#include <baton/attention/error.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace baton {

/// Queries and keys of the host flash kernels' tile.
inline constexpr std::int64_t flash_tile_size = detail::attention::block_q;
static_assert(detail::attention::block_q == detail::attention::block_k, "the host flash tiles are square");

/// The share of a partial tile the host flash kernels compute (float tensors, this build's
/// vector width): each group of 4 query rows computes the key columns from its first allowed
/// key to its last, rounded out to whole vectors. In full tiles (of flash_tile_size x
/// flash_tile_size): a causal diagonal tile is 0.625 with 16-float vectors, 0.5625 with 8.
/// Holds the kernel's 16 KiB of tile scratch, so that one object serves many tiles.
class flash_tile_coverage {
 public:
  /// q and k hold at most flash_tile_size positions each (more throws attention_error).
  template <attention_mask Mask>
  [[nodiscard]] double of(const Mask& mask, const position_block& q, const position_block& k) {
    if (q.size() > flash_tile_size || k.size() > flash_tile_size)
      throw attention_error("baton::flash_tile_coverage: a tile holds at most " + std::to_string(flash_tile_size) +
                            " queries and keys (got " + std::to_string(q.size()) + " x " + std::to_string(k.size()) +
                            "); cut the call into flash_tile_size blocks first");
    if (!extent_) extent_ = std::make_unique_for_overwrite<extent>();
    extent_->set(block_kind::partial, mask, q, k, q.size(), k.size());
    std::int64_t cells = 0;
    for (std::int64_t g = 0; g < extent_->groups(); ++g)
      cells += (extent_->col_end[g] - extent_->col_begin[g]) * detail::attention::tile_rows;
    return static_cast<double>(cells) / static_cast<double>(flash_tile_size * flash_tile_size);
  }

 private:
  using extent = detail::attention::tile_extent<float>;
  std::unique_ptr<extent> extent_;
};

}  // namespace baton
