// bench_cp_nccl: context-parallel attention over NCCL on the GPUs present against one
// cuda_attention call on one GPU, forward + backward, causal, float storage (the CP layer's
// device path and cuda_attention's 3xTF32 float path), B = 1, H = 8, D = 128, S = 8192
// (--quick: 2048). One rank per GPU (NCCL allows one rank of a communicator per device), so
// with one GPU the ring and Ulysses have one rank: their figures are then the layer's
// overhead over a plain call, not a speed-up.
//
// Figures (interleaved pairs with the single-GPU call as the baseline, bench_common.hpp):
//   cp_nccl_gpus, cp_single_gpu_fwd_bwd_ms_<size>, cp_ring<N>_fwd_bwd_ms_<size>,
//   cp_ring<N>_speedup_vs_single_gpu_<size> (single / ring per pair), and the same for
//   Ulysses when the heads divide among the ranks.
//
//   ./bench_cp_nccl [--quick] [--pairs N]
#include "bench_common.hpp"

#include <baton/attention/cuda.hpp>
#include <baton/comm/local.hpp>
#include <baton/comm/nccl.hpp>
#include <baton/cp.hpp>
#include <baton/cp/cuda.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

// Device memory of n floats (or LSE values), filled with deterministic values in [-1, 1).
struct device_buffer {
  float* data = nullptr;
  std::size_t size = 0;
  device_buffer(std::size_t n, std::uint64_t seed) : size(n) {
    check(cudaMalloc(&data, std::max<std::size_t>(n, 1) * sizeof(float)), "cudaMalloc");
    std::vector<float> host(n);
    std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& x : host) {
      z ^= z << 13;
      z ^= z >> 7;
      z ^= z << 17;
      x = static_cast<float>(static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
    }
    if (n != 0) check(cudaMemcpy(data, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  ~device_buffer() { cudaFree(data); }
};

// q, k, v, dout and the outputs of one rank's (or the single call's) attention over `len` tokens.
struct problem {
  std::int64_t batch, len, heads, dim;
  device_buffer q, k, v, dout, out, lse, dq, dk, dv;
  problem(std::int64_t b, std::int64_t l, std::int64_t h, std::int64_t d, std::uint64_t seed)
      : batch(b), len(l), heads(h), dim(d),
        q(count(), seed), k(count(), seed + 1), v(count(), seed + 2), dout(count(), seed + 3), out(count(), 0),
        lse(static_cast<std::size_t>(b * h * l), 0), dq(count(), 0), dk(count(), 0), dv(count(), 0) {}
  std::size_t count() const { return static_cast<std::size_t>(batch * len * heads * dim); }
  baton::tensor_view<const float, 4> in(const device_buffer& x) const {
    return baton::make_tensor_view(static_cast<const float*>(x.data), {batch, len, heads, dim});
  }
  baton::tensor_view<float, 4> outv(device_buffer& x) { return baton::make_tensor_view(x.data, {batch, len, heads, dim}); }
  baton::tensor_view<float, 3> lse_view() { return baton::make_tensor_view(lse.data, {batch, heads, len}); }
  baton::tensor_view<const float, 3> lse_in() const {
    return baton::make_tensor_view(static_cast<const float*>(lse.data), {batch, heads, len});
  }
};

// Forward (+ backward) of `attn` on p: the single call and the CP layers take the same arguments.
template <class Attention>
void run(Attention& attn, problem& p) {
  const baton::causal_mask mask{};
  attn.forward(p.in(p.q), p.in(p.k), p.in(p.v), mask, p.outv(p.out), p.lse_view());
  attn.backward(p.in(p.q), p.in(p.k), p.in(p.v), p.in(p.out), p.lse_in(), p.in(p.dout), mask, p.outv(p.dq),
                p.outv(p.dk), p.outv(p.dv));
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick = quick || std::strcmp(argv[i], "--quick") == 0;
  const int pairs = bench::pairs_from_args(argc, argv);
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device\n");
    return 0;
  }
  const int n = std::min(devices, 8);
  const std::int64_t batch = 1, seq = quick ? 2048 : 8192, heads = 8, dim = 128;
  const std::string size = "S" + std::to_string(seq) + "_D" + std::to_string(dim) + "_f32_causal";
  const std::string pass = "fwd_bwd";
  bench::print_build();
  bench::print_load("before");
  bench::print_value("cp_nccl_gpus", n);
  std::fflush(stdout);

  baton::run_local(
      n,
      [&](baton::local_communicator& host) {
        const int rank = host.rank();
        check(cudaSetDevice(rank), "cudaSetDevice");
        auto world = baton::nccl_communicator::bootstrap(host, rank);
        cudaStream_t stream = nullptr;
        check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        {
          baton::cuda_attention backend(stream);
          // Wall time of f on every rank, from a common start to the last rank's end.
          const auto timed = [&](auto&& f) {
            host.barrier();
            const auto start = std::chrono::steady_clock::now();
            f();
            check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
            host.barrier();
            return bench::seconds_since(start) * 1e3;
          };
          std::optional<problem> whole;
          if (rank == 0) whole.emplace(batch, seq, heads, dim, 7);
          const auto single = [&] {
            if (whole) run(backend, *whole);
          };

          const baton::sequence_sharding ring_sharding(baton::shard_layout::zigzag, seq, n);
          problem ring_part(batch, ring_sharding.local_len(rank), heads, dim, 100 + static_cast<std::uint64_t>(rank));
          baton::ring_attention ring(world, backend, ring_sharding);
          const auto ring_step = [&] { run(ring, ring_part); };

          const bool ulysses_fits = heads % n == 0;
          const baton::sequence_sharding ulysses_sharding(baton::shard_layout::contiguous, seq, n);
          problem ulysses_part(batch, ulysses_sharding.local_len(rank), heads, dim, 200 + static_cast<std::uint64_t>(rank));

          const auto measure = [&](const std::string& name, auto&& subject) {
            (void)timed(single);  // warm-up: plans, workspaces, NCCL connections
            (void)timed(subject);
            bench::series base, sub, speedup;
            bench::interleave(
                pairs, [&] { return timed(single); }, [&] { return timed(subject); },
                [&](int, double b, double s) {
                  base.add(b);
                  sub.add(s);
                  speedup.add(b / s);
                });
            if (rank == 0) {
              bench::print("cp_single_gpu_" + pass + "_ms_" + size, base);
              bench::print(name + "_" + pass + "_ms_" + size, sub);
              bench::print(name + "_speedup_vs_single_gpu_" + size, speedup);
              std::fflush(stdout);
            }
          };
          measure("cp_ring" + std::to_string(n), ring_step);
          if (ulysses_fits) {
            baton::ulysses_attention ulysses(world, backend, ulysses_sharding);
            measure("cp_ulysses" + std::to_string(n), [&] { run(ulysses, ulysses_part); });
          } else if (rank == 0) {
            std::printf("cp_ulysses: not run (%lld heads do not divide among %d GPUs)\n", static_cast<long long>(heads), n);
          }
        }
        check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        cudaStreamDestroy(stream);
      },
      baton::local_options{.timeout = std::chrono::seconds(300)});
  bench::print_load("after");
  return 0;
}
