// baton/cp/params.hpp — the settings every context-parallel attention call takes.
#pragma once

namespace baton {

/// Settings of a context-parallel attention call. Positions are not among them: they come
/// from the sequence_sharding, which is the point.
struct cp_params {
  /// Multiplies q.k before the softmax; 0 selects 1/sqrt(head dim).
  double softmax_scale = 0;
};

}  // namespace baton
