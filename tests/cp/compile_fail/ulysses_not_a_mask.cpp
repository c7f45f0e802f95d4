// build error: the mask must model baton::attention_mask
#include <baton/comm/local.hpp>
#include <baton/attention.hpp>
#include <baton/cp.hpp>

#include <vector>

struct not_a_mask {
  bool allowed(int, int) const { return true; }  // no classify()
};

void attend(baton::local_communicator& comm) {
  baton::sequence_sharding sharding(baton::shard_layout::contiguous, 8, comm.size());
  baton::ulysses_attention ulysses(comm, baton::reference_attention{}, sharding);
  std::vector<float> t(64), lse(16);
  const auto in = baton::make_tensor_view(static_cast<const float*>(t.data()), {1, 4, 4, 4});
  ulysses.forward(in, in, in, not_a_mask{}, baton::make_tensor_view(t.data(), {1, 4, 4, 4}),
                  baton::make_tensor_view(lse.data(), {1, 4, 4}));
}
