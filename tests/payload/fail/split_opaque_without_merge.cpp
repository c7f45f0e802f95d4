// An opaque type that splits itself but cannot be merged back.
// build error: this opaque type is split by its payload_traits but declares no merge. add `static T merge\(std::span<const T> parts\)`
#include <baton/payload.hpp>

#include <cstdint>
#include <vector>

struct block_mask {
  int kv_blocks = 0;
};
template <>
struct baton::payload_traits<block_mask> {
  static constexpr payload_role role = payload_role::opaque;
  static block_mask split(const block_mask& m, std::int64_t, std::int64_t) { return m; }
};

int main() {
  std::vector<block_mask> parts(2);
  auto merged = baton::merge_microbatches(parts);
  (void)merged;
}
