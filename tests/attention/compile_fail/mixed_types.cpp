// q of float, k and v of double: baton's own message, not a failed overload.
// build error: baton attention: q, k and v must have the same element type
#include <baton/attention.hpp>

#include <vector>

int main() {
  std::vector<float> q(16), out(16), lse(4);
  std::vector<double> k(16), v(16);
  baton::reference_attention{}.forward(baton::make_tensor_view(q.data(), {1, 4, 1, 4}),
                                       baton::make_tensor_view(k.data(), {1, 4, 1, 4}),
                                       baton::make_tensor_view(v.data(), {1, 4, 1, 4}), baton::no_mask{},
                                       baton::make_tensor_view(out.data(), {1, 4, 1, 4}),
                                       baton::make_tensor_view(lse.data(), {1, 1, 4}));
}
