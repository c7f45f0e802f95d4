// forward() with a mask argument that is not an attention_mask (no classify()): baton's own
// message, not a failed constraint.
// build error: baton attention: the mask argument is not a mask: it must model baton::attention_mask, with const members allowed.q_pos, k_pos. -> bool and classify.position_block, position_block. -> block_kind. pass baton::no_mask{} for no masking, or wrap a predicate in baton::block_mask
#include <baton/attention.hpp>

#include <cstdint>
#include <vector>

struct only_allowed {  // no classify(): kernels could not skip tiles
  bool allowed(std::int64_t, std::int64_t) const { return true; }
};

int main() {
  std::vector<float> q(16), k(16), v(16), out(16), lse(4);
  baton::reference_attention{}.forward(baton::make_tensor_view(q.data(), {1, 4, 1, 4}),
                                       baton::make_tensor_view(k.data(), {1, 4, 1, 4}),
                                       baton::make_tensor_view(v.data(), {1, 4, 1, 4}), only_allowed{},
                                       baton::make_tensor_view(out.data(), {1, 4, 1, 4}),
                                       baton::make_tensor_view(lse.data(), {1, 1, 4}));
}
