// Self-attention under a type that is not a mask.
// build error: Mask must model baton::attention_mask .allowed.q_pos, k_pos. and classify
#include <baton/attention/reference.hpp>
#include <baton/nn.hpp>

int main() {
  baton::nn::self_attention<float, baton::nn::no_cp<baton::reference_attention>, int> attention(
      {}, baton::nn::initializer(1), {}, 0);
  (void)attention;
}
