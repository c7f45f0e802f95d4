// bench_attention — the Kokkos flash kernels against the OpenBLAS sgemm roof, one thread.
//
//   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./bench_attention           full table
//   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./bench_attention --quick   what ctest runs
//   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./bench_attention --seq 1024 one length, no memory run
//   ... [--pairs N]   interleaved repetitions (7 by default, 5 with --quick; at least 5)
//
// FLOPs as flash-attention's benchmark counts them: forward = 4 B H S^2 D, halved for causal;
// backward = 2.5 x forward. Times are in process CPU time (see cpu_seconds); each measurement
// is the best of a few calls (at least 0.1 s of them). For every shape the sgemm roof, the
// full-mask and the causal kernels are measured in turn, --pairs times, the order rotating
// from repetition to repetition, and every ratio (kernel / sgemm, causal / full) is taken per
// repetition: `name: median (min .., max .., n ..)`, with the load average before and after.
#include "bench_common.hpp"
#include "native_blas.hpp"

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
#include <functional>
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

// Best of `reps` calls, and of more when a call is short: at least `min_total` seconds of
// calls in all, so a 10 ms case is not decided by two samples.
template <class F>
double best_seconds(int reps, F&& f, double min_total = 0.3) {
  double best = 1e300, total = 0;
  for (int r = 0; r < reps || (total < min_total && r < 100); ++r) {
    const double t0 = cpu_seconds();
    f();
    const double t = cpu_seconds() - t0;
    best = std::min(best, t);
    total += t;
  }
  return best;
}

// The roof: cblas_sgemm of n x n matrices, C = A B^T.
class sgemm_roof {
 public:
  explicit sgemm_roof(int n) : n_(n), a_(static_cast<std::size_t>(n) * n), b_(a_.size()), c_(a_.size()) {
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : a_) x = u(gen);
    for (auto& x : b_) x = u(gen);
    run();
  }
  void run() {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_, n_, n_, 1.0f, a_.data(), n_, b_.data(), n_, 0.0f, c_.data(), n_);
  }
  double gflops() {
    return 2.0 * n_ * n_ * double(n_) / best_seconds(2, [&] { run(); }, 0.1) / 1e9;
  }

 private:
  int n_;
  std::vector<float> a_, b_, c_;
};

double peak_rss_mib() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

struct result {
  double fwd_gflops = 0, bwd_gflops = 0;
};

// One shape's tensors and kernels; measure() times its forward and backward.
class attention_case {
 public:
  static constexpr std::int64_t batch = 1, heads = 8;

  attention_case(std::int64_t seq, std::int64_t dim, bool causal) : seq_(seq), dim_(dim), causal_(causal) {
    const auto n = static_cast<std::size_t>(batch * seq * heads * dim);
    for (auto* t : {&q_, &k_, &v_, &out_, &dout_, &dq_, &dk_, &dv_}) t->resize(n);
    lse_.resize(static_cast<std::size_t>(batch * heads * seq));
    std::mt19937 gen(11);
    std::normal_distribution<float> normal;
    for (auto* t : {&q_, &k_, &v_, &dout_})
      for (auto& x : *t) x = normal(gen);
    flops_ = 4.0 * batch * heads * double(seq) * double(seq) * double(dim);
    if (causal) flops_ /= 2;
  }

  // `reps` calls at least (and 0.1 s of them) for each of forward and backward.
  result measure(int reps, bool backward = true) {
    if (!warm_) {  // sizes the workspace; the backward needs out and lse
      forward();
      if (backward) backward_pass();
      warm_ = true;
    }
    result r;
    r.fwd_gflops = flops_ / best_seconds(reps, [&] { forward(); }, 0.1) / 1e9;
    if (backward) r.bwd_gflops = 2.5 * flops_ / best_seconds(reps, [&] { backward_pass(); }, 0.1) / 1e9;
    return r;
  }

 private:
  baton::tensor_view<float, 4> view(std::vector<float>& x) {
    return baton::make_tensor_view(x.data(), {batch, seq_, heads, dim_});
  }
  baton::tensor_view<float, 3> lse_view() { return baton::make_tensor_view(lse_.data(), {batch, heads, seq_}); }
  void forward() {
    if (causal_)
      attention_.forward(view(q_), view(k_), view(v_), baton::causal_mask{}, view(out_), lse_view());
    else
      attention_.forward(view(q_), view(k_), view(v_), baton::no_mask{}, view(out_), lse_view());
  }
  void backward_pass() {
    if (causal_)
      attention_.backward(view(q_), view(k_), view(v_), view(out_), lse_view(), view(dout_), baton::causal_mask{}, view(dq_),
                          view(dk_), view(dv_));
    else
      attention_.backward(view(q_), view(k_), view(v_), view(out_), lse_view(), view(dout_), baton::no_mask{}, view(dq_),
                          view(dk_), view(dv_));
  }

  std::int64_t seq_, dim_;
  bool causal_;
  bool warm_ = false;
  double flops_ = 0;
  std::vector<float> q_, k_, v_, out_, dout_, dq_, dk_, dv_, lse_;
  baton::kokkos_attention attention_;
};

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
  // The roof must be this CPU's: if OpenBLAS fell back to its generic "Prescott" kernel, start
  // again on the CPU's own (see examples/support/native_blas.hpp).
  example_support::use_native_blas_kernel(argv);
  Kokkos::ScopeGuard kokkos(argc, argv);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const std::int64_t only_seq = argc > 2 && std::strcmp(argv[1], "--seq") == 0 ? std::atoll(argv[2]) : 0;
  openblas_set_num_threads(1);
  const char* chosen = std::getenv("OPENBLAS_CORETYPE");
  std::printf("openblas_core: %s%s%s%s\n", openblas_get_corename(), chosen ? " (OPENBLAS_CORETYPE=" : "",
              chosen ? chosen : "", chosen ? ")" : "");
  std::printf("simd_vector_bytes: %d\n", baton::detail::attention::vector_bytes);
  const double check = self_check_error();
  std::printf("self_check_max_rel_error: %.2e\n", check);
  if (!(check <= 1e-5)) {
    std::printf("FAILED: the kernels disagree with the reference; timings would be meaningless\n");
    return 1;
  }
  bench::print_build();
  bench::print_load("before");
  const int pairs = bench::pairs_from_args(argc, argv, quick ? 5 : 7);
  sgemm_roof roof(quick ? 1024 : 2048);
  std::printf("sgemm_roof_n: %d\n", quick ? 1024 : 2048);
  std::printf("repetitions: %d interleaved (sgemm, full, causal in rotating order)\n", pairs);
  std::fflush(stdout);

  const std::vector<std::int64_t> seqs = only_seq > 0 ? std::vector<std::int64_t>{only_seq}
                                        : quick       ? std::vector<std::int64_t>{1024}
                                                      : std::vector<std::int64_t>{1024, 2048, 4096};
  bench::series sgemm_all;
  for (std::int64_t dim : {64, 128})
    for (std::int64_t seq : seqs) {
      attention_case full(seq, dim, false), causal(seq, dim, true);
      bench::series fwd, bwd, fwd_c, bwd_c, fwd_roof, bwd_roof, fwd_ratio, bwd_ratio;
      for (int rep = 0; rep < pairs; ++rep) {
        double sgemm = 0;
        result f, c;
        const std::array<std::function<void()>, 3> steps{[&] { sgemm = roof.gflops(); }, [&] { f = full.measure(1); },
                                                         [&] { c = causal.measure(1); }};
        for (std::size_t i = 0; i < steps.size(); ++i) steps[(i + static_cast<std::size_t>(rep)) % steps.size()]();
        sgemm_all.add(sgemm);
        fwd.add(f.fwd_gflops);
        bwd.add(f.bwd_gflops);
        fwd_c.add(c.fwd_gflops);
        bwd_c.add(c.bwd_gflops);
        fwd_ratio.add(c.fwd_gflops / f.fwd_gflops);
        bwd_ratio.add(c.bwd_gflops / f.bwd_gflops);
        fwd_roof.add(f.fwd_gflops / sgemm);
        bwd_roof.add(f.bwd_gflops / sgemm);
      }
      char tag_buffer[48];
      std::snprintf(tag_buffer, sizeof tag_buffer, "S%lld_D%lld", static_cast<long long>(seq), static_cast<long long>(dim));
      const std::string tag = tag_buffer;
      bench::print("fwd_gflops_" + tag, fwd, "%.1f");
      bench::print("bwd_gflops_" + tag, bwd, "%.1f");
      bench::print("fwd_gflops_" + tag + "_causal", fwd_c, "%.1f");
      bench::print("bwd_gflops_" + tag + "_causal", bwd_c, "%.1f");
      bench::print("fwd_causal_vs_full_" + tag, fwd_ratio, "%.3f");
      bench::print("bwd_causal_vs_full_" + tag, bwd_ratio, "%.3f");
      bench::print("fwd_vs_sgemm_" + tag, fwd_roof, "%.3f");
      bench::print("bwd_vs_sgemm_" + tag, bwd_roof, "%.3f");
      std::fflush(stdout);
    }
  bench::print("sgemm_gflops", sgemm_all, "%.1f");

  if (!quick && only_seq == 0) {
    // Memory grows as O(S): the packed copies and tiles are linear in the sequence; the
    // S x S score matrix is never formed (it alone would be B*H*S^2*4 bytes).
    for (std::int64_t seq : {16384, 32768}) {
      const result r = attention_case(seq, 64, true).measure(1);
      std::printf("fwd_gflops_S%lld_D64_causal: %.1f\n", static_cast<long long>(seq), r.fwd_gflops);
      std::printf("bwd_gflops_S%lld_D64_causal: %.1f\n", static_cast<long long>(seq), r.bwd_gflops);
      std::printf("peak_rss_MiB_S%lld: %.0f\n", static_cast<long long>(seq), peak_rss_mib());
      std::printf("score_matrix_MiB_S%lld: %.0f\n", static_cast<long long>(seq), 8.0 * double(seq) * double(seq) * 4 / (1 << 20));
      std::fflush(stdout);
    }
  }
  bench::print_load("after");
  return 0;
}
