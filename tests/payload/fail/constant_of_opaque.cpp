// constant<T> of something that is not a tensor.
// build error: baton::constant<T>: T is opaque. constant<T> marks a tensor
#include <baton/payload.hpp>

struct block_mask {
  int kv_blocks = 0;
};
template <>
struct baton::payload_traits<block_mask> {
  static constexpr payload_role role = payload_role::opaque;
};

baton::constant<block_mask> c;

int main() {}
