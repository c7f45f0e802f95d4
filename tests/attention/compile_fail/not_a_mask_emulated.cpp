// The same check in another backend (cuda_attention_emulated; every backend takes it from
// detail::attention::mask_argument_check): baton's own message, not a failed constraint.
// build error: baton attention: the mask argument is not a mask: it must model baton::attention_mask, with const members allowed.q_pos, k_pos. -> bool and classify.position_block, position_block. -> block_kind. pass baton::no_mask{} for no masking, or wrap a predicate in baton::block_mask
#include <baton/attention/cuda/emulated.hpp>

#include <cstdint>
#include <vector>

struct only_allowed {  // no classify(): kernels could not skip tiles
  bool allowed(std::int64_t, std::int64_t) const { return true; }
};

int main() {
  std::vector<float> q(4 * 64), out(4 * 64), lse(4);
  const auto in = baton::make_tensor_view(static_cast<const float*>(q.data()), {1, 4, 1, 64});
  baton::cuda_attention_emulated{}.forward(in, in, in, only_allowed{},
                                           baton::make_tensor_view(out.data(), {1, 4, 1, 64}),
                                           baton::make_tensor_view(lse.data(), {1, 1, 4}));
}
