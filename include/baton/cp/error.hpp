// baton/cp/error.hpp — the exception every context-parallel entry point throws on bad input.
#pragma once

#include <stdexcept>
#include <string>

namespace baton {

/// Thrown by the context-parallel layer when its input cannot be sharded or attended the way
/// it was asked: a sequence length the layout cannot divide, heads the Ulysses degree cannot
/// divide, ranks holding shards of different shapes, a mesh that does not cover the world.
/// Collective entry points (ring, Ulysses, hybrid attention) agree on their inputs across all
/// ranks before moving any data, so when one rank's input is wrong every rank throws a
/// cp_error and none waits forever on a peer that gave up.
class cp_error : public std::invalid_argument {
 public:
  explicit cp_error(const std::string& what) : std::invalid_argument(what) {}
};

}  // namespace baton
