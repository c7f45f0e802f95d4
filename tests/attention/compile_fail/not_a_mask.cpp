// build error: the mask argument must model baton::attention_mask (allowed + classify)
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
