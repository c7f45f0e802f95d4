// build error: the memory space must be where the backend's tensors live
// A device memory space with a host backend (reference attention would read device
// pointers): refused at compile time.
#include <baton/attention.hpp>
#include <baton/comm/local.hpp>
#include <baton/cp.hpp>

#include <vector>

// Host memory that claims to be device memory (as cuda_device_memory does, without CUDA).
struct pretend_device_memory : baton::host_memory {
  static constexpr baton::cp_memory_location location = baton::cp_memory_location::cuda_device;
};

void attend(baton::local_communicator& comm) {
  baton::sequence_sharding sharding(baton::shard_layout::contiguous, 8, comm.size());
  baton::ulysses_attention attn(comm, baton::reference_attention{}, sharding, pretend_device_memory{});
  std::vector<float> t(64), lse(16);
  const auto in = baton::make_tensor_view(static_cast<const float*>(t.data()), {1, 4, 4, 4});
  attn.forward(in, in, in, baton::causal_mask{}, baton::make_tensor_view(t.data(), {1, 4, 4, 4}),
               baton::make_tensor_view(lse.data(), {1, 4, 4}));
}
