// baton/cp/params.hpp — the settings every context-parallel attention call takes.
#pragma once

#include <string>

namespace baton {

/// Settings of a context-parallel attention call. Positions are not among them: they come
/// from the sequence_sharding, which is the point.
struct cp_params {
  /// Multiplies q.k before the softmax; 0 selects 1/sqrt(head dim).
  double softmax_scale = 0;
  /// A problem the caller found in its own input on this rank (empty: none). It is reported
  /// through the call's agreement, before any data moves, so that every rank of the group
  /// throws the same cp_error carrying it, instead of this rank throwing alone while its
  /// peers wait in the collective. A layer built on top (baton::nn) uses it to reject a bad
  /// input on every rank together.
  std::string caller_problem{};
};

}  // namespace baton
