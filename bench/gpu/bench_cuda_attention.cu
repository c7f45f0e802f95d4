// bench_cuda_attention: cuda_attention's throughput on one GPU at S = 8192, D = 128
// (--quick: S = 2048), B = 2, H = 16 (32 heads x 8192 tokens, FlashAttention's benchmark
// shape), full and causal.
//
// FLOPs are the standard count: forward 4 S^2 D H B for full attention (two GEMMs), half of
// it for causal; backward 2.5x the forward. A ratio divides by 989 TFLOP/s, the H100/H200
// dense bf16 peak. A sample is CUDA events around 4 calls queued back to back, divided by 4;
// the median over the samples (after warm-up) is printed. The warm-up calls plan on the host
// and leave the plan cached on the device (attention/cuda/plan_cache.hpp), so the timed calls
// neither plan nor upload: the timed window holds device work and the host's per-call checks
// and cache lookup, which overlap the previous call's kernels. The plan's own time, what a
// cache miss costs, is its own figure (cuda_plan_ms_<case>).
//
// Figures:
//   cuda_fwd_tflops_S8192_D128_bf16, cuda_fwd_ratio_S8192_D128_bf16          full
//   cuda_fwd_tflops_S8192_D128_bf16_causal, cuda_fwd_ratio_S8192_D128_bf16_causal
//   cuda_bwd_tflops_S8192_D128_bf16[_causal], cuda_bwd_ratio_S8192_D128_bf16[_causal]
//   cuda_fwd_tflops_S8192_D128_{fp16,fp32}                                     full
//   cuda_fwd_tflops_S8192_D128_bf16_tile<Q>x<K>       forward tilings other than the default (128x64)
//   cuda_fwd_ms_<case>, cuda_bwd_ms_<case>            the times (run.sh divides PyTorch's by them)
//   cuda_plan_ms_<case>                               the host-side tile plan of that mask
// A case that throws prints `bench_cuda_attention: FAILED <case>: <what>` and the next case
// runs (the exit status is then 1). Without a CUDA device it prints a SKIPPED line and exits 0.
//
//   ./bench_cuda_attention [--quick] [--reps N]
#include "bench_common.hpp"

#include <baton/attention/cuda.hpp>
#include <baton/attention/cuda/detail/forward.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr double peak_tflops = 989.0;

void check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

template <class S>
struct device_tensor {
  S* data = nullptr;
  std::size_t n = 0;
  explicit device_tensor(std::size_t count, std::uint64_t seed) : n(count) {
    check(cudaMalloc(&data, n * sizeof(S)), "cudaMalloc");
    std::vector<S> host(n);
    std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (auto& e : host) {  // uniform in [-1, 1): values of typical activations' magnitude
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      e = baton::detail::attention::cuda::from_float<S>(
          static_cast<float>(static_cast<double>(x >> 11) * 0x1p-52 - 1.0));
    }
    check(cudaMemcpy(data, host.data(), n * sizeof(S), cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  device_tensor(const device_tensor&) = delete;
  device_tensor& operator=(const device_tensor&) = delete;
  ~device_tensor() { (void)cudaFree(data); }
};

constexpr int calls_per_sample = 4;

/// Seconds per call of `call`: reps samples of calls_per_sample calls queued back to back
/// (after 2 warm-up calls), by CUDA events.
bench::series time_calls(const std::function<void()>& call, cudaStream_t stream, int reps) {
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  for (int i = 0; i < 2; ++i) call();
  check(cudaStreamSynchronize(stream), "warm-up");
  bench::series s;
  for (int i = 0; i < reps; ++i) {
    check(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int c = 0; c < calls_per_sample; ++c) call();
    check(cudaEventRecord(stop, stream), "cudaEventRecord");
    check(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0;
    check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    s.add(ms * 1e-3 / calls_per_sample);
  }
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return s;
}

bench::series tflops_of(const bench::series& seconds, double flops) {
  bench::series t;
  for (double s : seconds.values) t.add(flops / s * 1e-12);
  return t;
}
bench::series milliseconds(const bench::series& seconds) {
  bench::series m;
  for (double s : seconds.values) m.add(s * 1e3);
  return m;
}
bench::series ratio_of(const bench::series& tflops) {
  bench::series r;
  for (double t : tflops.values) r.add(t / peak_tflops);
  return r;
}

struct problem_size {
  std::int64_t batch = 2, seq = 8192, heads = 16, dim = 128;
  [[nodiscard]] std::size_t elements() const { return static_cast<std::size_t>(batch * seq * heads * dim); }
  [[nodiscard]] double forward_flops(bool causal) const {
    const double full = 4.0 * static_cast<double>(seq) * static_cast<double>(seq) * static_cast<double>(dim * heads * batch);
    return causal ? full / 2 : full;
  }
};

template <class S>
struct operands {
  problem_size p;
  device_tensor<S> q, k, v, out, dout, dq, dk, dv;
  float* lse = nullptr;
  explicit operands(const problem_size& size)
      : p(size), q(size.elements(), 1), k(size.elements(), 2), v(size.elements(), 3), out(size.elements(), 4),
        dout(size.elements(), 5), dq(size.elements(), 6), dk(size.elements(), 7), dv(size.elements(), 8) {
    check(cudaMalloc(&lse, static_cast<std::size_t>(p.batch * p.heads * p.seq) * sizeof(float)), "cudaMalloc");
  }
  ~operands() { (void)cudaFree(lse); }
  [[nodiscard]] baton::tensor_view<S, 4> view(const device_tensor<S>& t) const {
    return baton::make_tensor_view(t.data, {p.batch, p.seq, p.heads, p.dim});
  }
  [[nodiscard]] baton::tensor_view<float, 3> lse_view() const {
    return baton::make_tensor_view(lse, {p.batch, p.heads, p.seq});
  }
};

template <class S, class Mask>
void bench_forward(const operands<S>& o, const Mask& mask, bool causal, const std::string& name, cudaStream_t stream,
                   int reps, bool with_ratio) {
  baton::cuda_attention backend(stream);
  const auto seconds = time_calls(
      [&] { backend.forward(o.view(o.q), o.view(o.k), o.view(o.v), mask, o.view(o.out), o.lse_view(), {}); }, stream, reps);
  const bench::series t = tflops_of(seconds, o.p.forward_flops(causal));
  bench::print("cuda_fwd_tflops_" + name, t);
  if (with_ratio) bench::print("cuda_fwd_ratio_" + name, ratio_of(t), "%.3f");
  bench::print("cuda_fwd_ms_" + name, milliseconds(seconds));
}

/// The host-side tile plan of `mask` at the default D = 128 forward tiling, milliseconds.
template <class Mask>
void bench_plan(const problem_size& p, const Mask& mask, const std::string& name, int reps) {
  namespace dc = baton::detail::attention::cuda;
  const dc::forward_config cfg = dc::forward_config_for(2, static_cast<int>(p.dim));
  const baton::positions all(0, p.seq);
  bench::series ms;
  for (int i = 0; i < std::max(reps, 5); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const dc::tile_plan plan = dc::make_tile_plan(mask, all, all, p.seq, p.seq, cfg.tile_q, cfg.tile_k);
    const auto t1 = std::chrono::steady_clock::now();
    if (plan.size_bytes() == 0) throw std::runtime_error("empty tile plan");
    ms.add(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  bench::print("cuda_plan_ms_" + name, ms);
}

template <class S, class Mask>
void bench_backward(const operands<S>& o, const Mask& mask, bool causal, const std::string& name, cudaStream_t stream,
                    int reps) {
  baton::cuda_attention backend(stream);
  backend.forward(o.view(o.q), o.view(o.k), o.view(o.v), mask, o.view(o.out), o.lse_view(), {});
  const baton::tensor_view<const float, 3> lse = o.lse_view();
  const auto seconds = time_calls(
      [&] {
        backend.backward(o.view(o.q), o.view(o.k), o.view(o.v), o.view(o.out), lse, o.view(o.dout), mask, o.view(o.dq),
                         o.view(o.dk), o.view(o.dv), {});
      },
      stream, reps);
  const bench::series t = tflops_of(seconds, 2.5 * o.p.forward_flops(causal));
  bench::print("cuda_bwd_tflops_" + name, t);
  bench::print("cuda_bwd_ratio_" + name, ratio_of(t), "%.3f");
  bench::print("cuda_bwd_ms_" + name, milliseconds(seconds));
}

/// The forward with tiling (MT, TK) through the detail launch (no mask), to compare tilings.
template <int MT, int TK>
void bench_tiling(const operands<baton::bfloat16>& o, const std::string& suffix, cudaStream_t stream, int reps) {
  namespace dc = baton::detail::attention::cuda;
  constexpr int D = 128;
  const dc::forward_config cfg = dc::make_forward_config(2, D, MT, TK);
  const baton::positions all(0, o.p.seq);
  const dc::tile_plan plan = dc::make_tile_plan(baton::no_mask{}, all, all, o.p.seq, o.p.seq, cfg.tile_q, cfg.tile_k);
  void* plan_device = nullptr;
  std::uint8_t* flags = nullptr;
  check(cudaMalloc(&plan_device, plan.size_bytes()), "cudaMalloc");
  check(cudaMalloc(&flags, dc::key_flag_bytes(o.p.batch, o.p.heads, o.p.seq)), "cudaMalloc");
  check(cudaMemcpy(plan_device, plan.blob(), plan.size_bytes(), cudaMemcpyHostToDevice), "cudaMemcpy");
  baton::detail::attention::checked_call call;
  call.batch = o.p.batch, call.seq_q = call.seq_k = o.p.seq, call.heads_q = call.heads_kv = o.p.heads, call.dim = D;
  call.scale = 1.0 / std::sqrt(static_cast<double>(D));
  const baton::tensor_view<const baton::bfloat16, 4> q = o.view(o.q), k = o.view(o.k), v = o.view(o.v);
  dc::launch_key_flags(dc::key_flag_args_for<baton::bfloat16>(k, v, call, flags), stream);
  const auto args = dc::forward_args_for<baton::bfloat16>(q, k, v, o.view(o.out), o.lse_view(), call, plan.view(plan_device), flags);
  const auto seconds = time_calls([&] { dc::launch_forward_tiled<baton::bfloat16, D, MT, TK>(args, stream); }, stream, reps);
  bench::print("cuda_fwd_tflops_" + suffix, tflops_of(seconds, o.p.forward_flops(false)));
  (void)cudaFree(plan_device);
  (void)cudaFree(flags);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no CUDA device (bench_cuda_attention needs one)\n");
    return 0;
  }
  int status = 0;
  // One case's failure is printed and the next case runs: every figure that can be measured is.
  const auto attempt = [&status](const std::string& what, const std::function<void()>& run) {
    try {
      run();
    } catch (const std::exception& e) {
      std::printf("bench_cuda_attention: FAILED %s: %s\n", what.c_str(), e.what());
      std::fflush(stdout);
      (void)cudaGetLastError();  // a sticky launch error would fail every later case instead
      status = 1;
    }
    std::fflush(stdout);
  };
  bench::print_build();
  cudaDeviceProp prop{};
  attempt("device", [&] {
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    std::printf("device: %s (sm_%d%d)\n", prop.name, prop.major, prop.minor);
  });
  bench::print_load("before");
  problem_size size;
  if (quick) size.seq = 2048;
  const std::string tag = "S" + std::to_string(size.seq) + "_D128";
  attempt("plans", [&] {
    bench_plan(size, baton::no_mask{}, tag + "_bf16", reps);
    bench_plan(size, baton::causal_mask{}, tag + "_bf16_causal", reps);
  });
  cudaStream_t stream = nullptr;
  attempt("stream", [&] { check(cudaStreamCreate(&stream), "cudaStreamCreate"); });
  attempt("bf16", [&] {
    const operands<baton::bfloat16> bf(size);
    attempt("forward bf16", [&] { bench_forward(bf, baton::no_mask{}, false, tag + "_bf16", stream, reps, true); });
    attempt("forward bf16 causal",
            [&] { bench_forward(bf, baton::causal_mask{}, true, tag + "_bf16_causal", stream, reps, true); });
    attempt("backward bf16", [&] { bench_backward(bf, baton::no_mask{}, false, tag + "_bf16", stream, reps); });
    attempt("backward bf16 causal",
            [&] { bench_backward(bf, baton::causal_mask{}, true, tag + "_bf16_causal", stream, reps); });
    // Tilings other than forward_config_for's (128 x 64 at D = 128), to tune it on hardware.
    attempt("tile 128x32", [&] { bench_tiling<2, 32>(bf, tag + "_bf16_tile128x32", stream, reps); });
    attempt("tile 64x64", [&] { bench_tiling<1, 64>(bf, tag + "_bf16_tile64x64", stream, reps); });
    attempt("tile 64x32", [&] { bench_tiling<1, 32>(bf, tag + "_bf16_tile64x32", stream, reps); });
  });
  attempt("forward fp16", [&] {
    const operands<baton::float16> h(size);
    bench_forward(h, baton::no_mask{}, false, tag + "_fp16", stream, reps, false);
  });
  attempt("forward fp32", [&] {
    const operands<float> f(size);
    bench_forward(f, baton::no_mask{}, false, tag + "_fp32", stream, std::max(3, reps / 3), false);
  });
  if (stream != nullptr) (void)cudaStreamDestroy(stream);
  bench::print_load("after");
  return status;
}
