// build error: this backend runs on a CUDA stream but the memory space is the host's
// A device backend (one with a stream() member) without <baton/cp/cuda.hpp>: the default
// memory space would be the host's, and host loops would read device pointers. Refused at
// compile time, naming the include that fixes it.
#include <baton/attention.hpp>
#include <baton/comm/local.hpp>
#include <baton/cp.hpp>

#include <vector>

struct stream_backend : baton::reference_attention {
  void* stream() const noexcept { return nullptr; }
};

void attend(baton::local_communicator& comm) {
  baton::sequence_sharding sharding(baton::shard_layout::zigzag, 8, comm.size());
  baton::ring_attention ring(comm, stream_backend{}, sharding);
  std::vector<float> t(64), lse(16);
  const auto in = baton::make_tensor_view(static_cast<const float*>(t.data()), {1, 4, 4, 4});
  ring.forward(in, in, in, baton::causal_mask{}, baton::make_tensor_view(t.data(), {1, 4, 4, 4}),
               baton::make_tensor_view(lse.data(), {1, 4, 4}));
}
