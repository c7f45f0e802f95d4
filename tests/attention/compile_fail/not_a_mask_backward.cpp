// backward() with a mask argument that is not an attention_mask (no classify()): baton's own
// message, not a failed constraint.
// build error: baton attention: the mask argument is not a mask: it must model baton::attention_mask, with const members allowed.q_pos, k_pos. -> bool and classify.position_block, position_block. -> block_kind. pass baton::no_mask{} for no masking, or wrap a predicate in baton::block_mask
#include <baton/attention.hpp>

#include <cstdint>
#include <vector>

struct only_allowed {  // no classify(): kernels could not skip tiles
  bool allowed(std::int64_t, std::int64_t) const { return true; }
};

int main() {
  std::vector<float> x(16), g(16), lse(4);
  const auto in = baton::make_tensor_view(static_cast<const float*>(x.data()), {1, 4, 1, 4});
  const auto grad = baton::make_tensor_view(g.data(), {1, 4, 1, 4});
  baton::reference_attention{}.backward(in, in, in, in, baton::make_tensor_view(static_cast<const float*>(lse.data()), {1, 1, 4}),
                                        in, only_allowed{}, grad, grad, grad);
}
