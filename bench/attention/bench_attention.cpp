// bench_attention — the Kokkos flash kernels against the OpenBLAS sgemm roof, one thread.
//
//   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./bench_attention           full table
//   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./bench_attention --quick   what ctest runs
//   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./bench_attention --seq 1024 one length, no memory run
//
// FLOPs as flash-attention's benchmark counts them: forward = 4 B H S^2 D, halved for causal;
// backward = 2.5 x forward. Prints one "name: value" line per figure. Times are the best of a
// few runs in process CPU time (see cpu_seconds).
#include <baton/attention.hpp>
#include <baton/attention/kokkos.hpp>

#include <Kokkos_Core.hpp>
#include <cblas.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <ctime>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

extern "C" char* openblas_get_corename(void);
extern "C" void openblas_set_num_threads(int);

namespace {

// Process CPU time, not wall time: the machines this runs on are shared, and a descheduled
// process would otherwise count other programs' time as its own. Single-threaded throughout
// (OpenBLAS set to one thread, Kokkos Serial), so CPU time is the time of the computation.
double cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Best of `reps` runs, and of more when a run is short: at least ~0.3 s of runs in all, so
// a 10 ms case is not decided by two samples.
template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e300, total = 0;
  for (int r = 0; r < reps || (total < 0.3 && r < 100); ++r) {
    const double t0 = cpu_seconds();
    f();
    const double t = cpu_seconds() - t0;
    best = std::min(best, t);
    total += t;
  }
  return best;
}

double sgemm_gflops(int n, int reps) {
  std::vector<float> a(static_cast<std::size_t>(n) * n), b(a.size()), c(a.size());
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (auto& x : a) x = u(gen);
  for (auto& x : b) x = u(gen);
  const auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  run();
  return 2.0 * n * n * double(n) / best_seconds(reps, run) / 1e9;
}

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

struct result {
  double fwd_gflops, bwd_gflops;
};

result bench_case(std::int64_t seq, std::int64_t dim, bool causal, int reps, bool backward = true) {
  constexpr std::int64_t batch = 1, heads = 8;
  const auto n = static_cast<std::size_t>(batch * seq * heads * dim);
  std::vector<float> q(n), k(n), v(n), out(n), dout(n), dq(n), dk(n), dv(n);
  std::vector<float> lse(static_cast<std::size_t>(batch * heads * seq));
  std::mt19937 gen(11);
  std::normal_distribution<float> normal;
  for (auto* t : {&q, &k, &v, &dout})
    for (auto& x : *t) x = normal(gen);
  const auto view = [&](std::vector<float>& x) { return baton::make_tensor_view(x.data(), {batch, seq, heads, dim}); };
  const auto lse_view = baton::make_tensor_view(lse.data(), {batch, heads, seq});
  baton::kokkos_attention attention;
  const auto forward = [&](const auto& mask) {
    attention.forward(view(q), view(k), view(v), mask, view(out), lse_view);
  };
  const auto backward_pass = [&](const auto& mask) {
    attention.backward(view(q), view(k), view(v), view(out), lse_view, view(dout), mask, view(dq), view(dk), view(dv));
  };
  double flops = 4.0 * batch * heads * double(seq) * double(seq) * double(dim);
  if (causal) flops /= 2;
  result r{};
  const auto time_both = [&](const auto& mask) {
    forward(mask);  // warm-up (and the out/lse backward needs); also sizes the workspace
    if (backward) backward_pass(mask);
    r.fwd_gflops = flops / best_seconds(reps, [&] { forward(mask); }) / 1e9;
    if (backward) r.bwd_gflops = 2.5 * flops / best_seconds(reps, [&] { backward_pass(mask); }) / 1e9;
  };
  if (causal)
    time_both(baton::causal_mask{});
  else
    time_both(baton::no_mask{});
  return r;
}

// The kernels timed below are the ones this build compiled (its vector width and register
// tiles), which the test suite may not have built: check them against the reference first.
double self_check_error() {
  constexpr std::int64_t batch = 1, seq_q = 77, seq_k = 141, heads = 8, heads_kv = 2, dim = 128;
  std::vector<float> q(batch * seq_q * heads * dim), k(batch * seq_k * heads_kv * dim), v(k.size()), dout(q.size());
  std::mt19937 gen(3);
  std::normal_distribution<float> normal;
  for (auto* t : {&q, &k, &v, &dout})
    for (auto& x : *t) x = normal(gen);
  double worst = 0;
  const auto run = [&](auto backend, std::array<std::vector<float>, 5>& results) {
    auto& [out, lse, dq, dk, dv] = results;
    out.assign(q.size(), 0);
    dq.assign(q.size(), 0);
    dk.assign(k.size(), 0);
    dv.assign(k.size(), 0);
    lse.assign(batch * heads * seq_q, 0);
    const auto Q = [&](std::vector<float>& x) { return baton::make_tensor_view(x.data(), {batch, seq_q, heads, dim}); };
    const auto K = [&](std::vector<float>& x) { return baton::make_tensor_view(x.data(), {batch, seq_k, heads_kv, dim}); };
    const auto L = baton::make_tensor_view(lse.data(), {batch, heads, seq_q});
    baton::attention_params params;
    params.q_pos = baton::positions(seq_k - seq_q, seq_q);
    backend.forward(Q(q), K(k), K(v), baton::causal_mask{}, Q(out), L, params);
    backend.backward(Q(q), K(k), K(v), Q(out), L, Q(dout), baton::causal_mask{}, Q(dq), K(dk), K(dv), params);
  };
  std::array<std::vector<float>, 5> expected, got;
  run(baton::reference_attention{}, expected);
  run(baton::kokkos_attention{}, got);
  for (std::size_t t = 0; t < 5; ++t) {
    double err = 0, mag = 0;
    for (std::size_t i = 0; i < got[t].size(); ++i) {
      err = std::max(err, static_cast<double>(std::abs(got[t][i] - expected[t][i])));
      mag = std::max(mag, static_cast<double>(std::abs(expected[t][i])));
    }
    worst = std::max(worst, err / mag);
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const std::int64_t only_seq = argc > 2 && std::strcmp(argv[1], "--seq") == 0 ? std::atoll(argv[2]) : 0;
  openblas_set_num_threads(1);
  std::printf("openblas_core: %s\n", openblas_get_corename());
  std::printf("simd_vector_bytes: %d\n", baton::detail::attn::vector_bytes);
  const double check = self_check_error();
  std::printf("self_check_max_rel_error: %.2e\n", check);
  if (!(check <= 1e-5)) {
    std::printf("FAILED: the kernels disagree with the reference; timings would be meaningless\n");
    return 1;
  }
  const double roof = sgemm_gflops(quick ? 1024 : 2048, quick ? 3 : 5);
  std::printf("sgemm_gflops: %.1f\n", roof);

  const std::vector<std::int64_t> seqs = only_seq > 0 ? std::vector<std::int64_t>{only_seq}
                                        : quick       ? std::vector<std::int64_t>{1024}
                                                      : std::vector<std::int64_t>{1024, 2048, 4096};
  const int reps = quick ? 2 : 3;
  const std::int64_t ratio_seq = quick ? 1024 : 2048;
  for (std::int64_t dim : {64, 128})
    for (std::int64_t seq : seqs) {
      const result full = bench_case(seq, dim, false, reps);
      const result causal = bench_case(seq, dim, true, reps);
      char tag_buffer[48];
      std::snprintf(tag_buffer, sizeof tag_buffer, "S%lld_D%lld", static_cast<long long>(seq), static_cast<long long>(dim));
      const std::string tag = tag_buffer;
      std::printf("fwd_gflops_%s: %.1f\n", tag.c_str(), full.fwd_gflops);
      std::printf("bwd_gflops_%s: %.1f\n", tag.c_str(), full.bwd_gflops);
      std::printf("fwd_gflops_%s_causal: %.1f\n", tag.c_str(), causal.fwd_gflops);
      std::printf("bwd_gflops_%s_causal: %.1f\n", tag.c_str(), causal.bwd_gflops);
      std::printf("fwd_causal_vs_full_%s: %.3f\n", tag.c_str(), causal.fwd_gflops / full.fwd_gflops);
      std::printf("bwd_causal_vs_full_%s: %.3f\n", tag.c_str(), causal.bwd_gflops / full.bwd_gflops);
      if (seq == ratio_seq && dim == 128) {
        std::printf("fwd_vs_sgemm_%s: %.3f\n", tag.c_str(), full.fwd_gflops / roof);
        std::printf("bwd_vs_sgemm_%s: %.3f\n", tag.c_str(), full.bwd_gflops / roof);
      }
      std::fflush(stdout);
    }

  if (!quick && only_seq == 0) {
    // Memory grows as O(S): the packed copies and tiles are linear in the sequence; the
    // S x S score matrix is never formed (it alone would be B*H*S^2*4 bytes).
    for (std::int64_t seq : {16384, 32768}) {
      const result r = bench_case(seq, 64, true, 1);
      std::printf("fwd_gflops_S%lld_D64_causal: %.1f\n", static_cast<long long>(seq), r.fwd_gflops);
      std::printf("bwd_gflops_S%lld_D64_causal: %.1f\n", static_cast<long long>(seq), r.bwd_gflops);
      std::printf("peak_rss_MiB_S%lld: %.0f\n", static_cast<long long>(seq), peak_rss_mib());
      std::printf("score_matrix_MiB_S%lld: %.0f\n", static_cast<long long>(seq), 8.0 * double(seq) * double(seq) * 4 / (1 << 20));
      std::fflush(stdout);
    }
  }
  return 0;
}
