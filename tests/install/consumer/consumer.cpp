// Built against the installed package only: proves the exported targets carry the include
// directories, the C++20 requirement and each component's BATON_HAS_* macro, and that the
// layers work from an install (a schedule validated, a payload split, ranks reducing, a
// linear layer's matrix product, a safetensors file with the json component).
#include <baton/baton.hpp>

#if BATON_HAS_KOKKOS()
#include <Kokkos_Core.hpp>
#endif
#if BATON_HAS_TORCH()
#include <baton/torch.hpp>
#endif

#include <cstdio>
#include <filesystem>
#include <span>
#include <vector>

int main(int argc, char** argv) {
  std::printf("baton %d.%d.%d kokkos=%d mpi=%d blas=%d json=%d torch=%d cuda=%d nccl=%d\n", BATON_VERSION_MAJOR,
              BATON_VERSION_MINOR, BATON_VERSION_PATCH, BATON_HAS_KOKKOS(), BATON_HAS_MPI(),
              BATON_HAS_BLAS(), BATON_HAS_JSON(), BATON_HAS_TORCH(), BATON_HAS_CUDA(), BATON_HAS_NCCL());

  static_assert(baton::is_valid(baton::lower(baton::one_f_one_b::generate({2, 1, 4}))));

  baton::host_tensor<float> batch({6, 2});
  const auto parts = baton::split_microbatches(batch, 4);  // sizes 2, 2, 1, 1
  if (parts.size() != 4 || parts[3].shape()[0] != 1) return 1;

  const auto sums = baton::run_local(2, [](baton::local_communicator& comm) {
    std::int64_t value = comm.rank() + 1;
    comm.all_reduce(std::span<std::int64_t>(&value, 1), baton::reduce_op::sum);
    return value;
  });
  if (sums[0] != 3 || sums[1] != 3) return 1;

  // The model layer's matrix product (cblas when the blas component is linked).
  baton::nn::linear<float> layer(3, 2, true, baton::nn::initializer(1));
  layer.weight().value.fill(1.0f);
  const auto y = layer.apply(baton::host_tensor<float>({1, 3}, {1.0f, 2.0f, 3.0f}));
  if (y[0] != 6.0f || y[1] != 6.0f) return 1;

#if BATON_HAS_JSON()
  // A checkpoint's safetensors file, written and read back through the installed json component.
  const std::vector<float> w{1.5f, -2.0f};
  const baton::train::tensor_bytes tensor{"w", baton::train::tensor_dtype::F32, {2}, std::as_bytes(std::span<const float>(w))};
  const auto file = std::filesystem::temp_directory_path() / "baton_consumer.safetensors";
  baton::train::write_safetensors(file, std::span<const baton::train::tensor_bytes>(&tensor, 1));
  if (baton::train::safetensors_file(file).load<float>("w")[1] != -2.0f) return 1;
  std::filesystem::remove(file);
#endif

#if BATON_HAS_TORCH()
  // A torch::Tensor is a payload: split into microbatches through the installed adapter.
  const auto torch_parts = baton::split_microbatches(torch::ones({5, 2}), 2);
  if (torch_parts.size() != 2 || torch_parts[1].size(0) != 2) return 1;
#endif

#if BATON_HAS_KOKKOS()
  Kokkos::ScopeGuard kokkos(argc, argv);
  Kokkos::View<float**> view("v", 4, 2);
  if (baton::payload_traits<Kokkos::View<float**>>::shape(view).size() != 2) return 1;
#else
  (void)argc;
  (void)argv;
#endif
  std::printf("consumer: schedule, payload and local world work from the installed package\n");
  return 0;
}
