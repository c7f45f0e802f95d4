// Asking for the gradient of an opaque value (the seed-000 crash, caught at compile time).
// build error: baton::grad_t<P>: P is an opaque value, which is never differentiated and has no gradient
#include <baton/payload.hpp>

struct block_mask {
  int kv_blocks = 0;
};
template <>
struct baton::payload_traits<block_mask> {
  static constexpr payload_role role = payload_role::opaque;
};

using input = baton::record<baton::field<"hidden", baton::host_tensor<float>>, baton::field<"mask", block_mask>>;
// The record's gradient is fine (it drops the mask); the mask's own gradient is not.
using g = baton::grad_t<baton::field_type_t<input, "mask">>;
g* unused = nullptr;

int main() {}
