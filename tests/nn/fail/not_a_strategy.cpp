// A block whose attention "strategy" is a bare backend: the strategy must be no_cp<Backend>
// or a context-parallel attention object.
// build error: Strategy must be baton::nn::no_cp<Backend> .one rank holds whole sequences., a context-parallel attention object
#include <baton/attention/reference.hpp>
#include <baton/nn.hpp>

int main() {
  baton::nn::transformer_block<float, baton::reference_attention> block({}, baton::nn::initializer(1),
                                                                        baton::reference_attention{});
  (void)block;
}
