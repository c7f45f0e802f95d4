// baton-train on the local world: every rank is a thread of this process.
#include "run.hpp"

#include <baton/comm/local.hpp>

#include <algorithm>
#include <vector>

namespace train_lm {

int run_local_world(const options& o, const prepared& p, std::FILE* metrics) {
  const std::vector<int> codes = baton::run_local(o.world_size(), [&](baton::local_communicator& world) {
    return run_any(world, o, p, world.rank() == 0 ? metrics : nullptr);
  });
  return *std::max_element(codes.begin(), codes.end());
}

}  // namespace train_lm
