// no_cp over a type that is not an attention backend.
// build error: baton::nn::no_cp<Backend>: Backend must model baton::attention_backend<Backend, T>
#include <baton/nn.hpp>

struct not_a_backend {};

int main() {
  baton::nn::transformer_block<double, baton::nn::no_cp<not_a_backend>> block({}, baton::nn::initializer(1), {});
  (void)block;
}
