// An opaque value is passed where a tensor is required (its bytes, to send it).
// build error: an opaque value was given where a tensor is required: opaque values cannot cross a stage boundary. pass them as a side input
#include <baton/payload.hpp>

struct block_mask {
  int kv_blocks = 0;
};
template <>
struct baton::payload_traits<block_mask> {
  static constexpr payload_role role = payload_role::opaque;
};

int main() {
  block_mask m;
  auto bytes = baton::tensor_bytes(m);
  (void)bytes;
}
