// build error: the backend must model baton::attention_backend
#include <baton/comm/local.hpp>
#include <baton/attention.hpp>
#include <baton/cp.hpp>

#include <vector>

struct not_a_backend {
  void forward() const {}
};

void attend(baton::local_communicator& comm) {
  baton::sequence_sharding sharding(baton::shard_layout::zigzag, 8, comm.size());
  baton::ring_attention ring(comm, not_a_backend{}, sharding);
  std::vector<float> t(64), lse(16);
  const auto in = baton::make_tensor_view(static_cast<const float*>(t.data()), {1, 4, 4, 4});
  ring.forward(in, in, in, baton::causal_mask{}, baton::make_tensor_view(t.data(), {1, 4, 4, 4}),
               baton::make_tensor_view(lse.data(), {1, 4, 4}));
}
