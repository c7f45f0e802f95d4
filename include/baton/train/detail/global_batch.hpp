// baton/train/detail/global_batch.hpp — a rank's part of the global batch every rank is given:
// the check of its shape, this rank's rows and sequence positions, and the tokens the loss
// counts.
#pragma once

#include <baton/core/sizes.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/train/config.hpp>
#include <baton/train/text_data.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace baton::detail::train {

// Rows [row0, row0 + rows) of a [R, S] tensor, and the given sequence positions of each.
inline host_tensor<std::int64_t> take(const host_tensor<std::int64_t>& t, std::int64_t row0, std::int64_t rows,
                                      const std::vector<std::int64_t>& positions) {
  const std::int64_t seq = t.shape()[1];
  host_tensor<std::int64_t> out({rows, static_cast<std::int64_t>(positions.size())});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < positions.size(); ++i)
      out(r, static_cast<std::int64_t>(i)) = t[(row0 + r) * seq + positions[i]];
  return out;
}

inline void check_batch(const baton::train::lm_batch& b, std::int64_t rows, std::int64_t seq) {
  const std::vector<std::int64_t> expected{rows, seq};
  if (b.tokens.shape() != expected || b.targets.shape() != expected)
    throw baton::train::config_error("batch", "the global batch has tokens " + core::shape_text(b.tokens.shape()) +
                                                  " and targets " + core::shape_text(b.targets.shape()) +
                                                  " but expected " + core::shape_text(expected) +
                                                  " (dp x batch rows of seq tokens)");
  if (b.documents && b.documents->shape() != expected)
    throw baton::train::config_error("batch", "the global batch's document ids have shape " +
                                                  core::shape_text(b.documents->shape()) + " but expected " +
                                                  core::shape_text(expected));
}

inline std::int64_t counted_tokens(const host_tensor<std::int64_t>& targets) {
  return static_cast<std::int64_t>(std::count_if(targets.values().begin(), targets.values().end(),
                                                 [](std::int64_t t) { return t != baton::train::ignore_target; }));
}

}  // namespace baton::detail::train
