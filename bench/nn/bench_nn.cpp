// bench_nn — one transformer block, forward + split backward, against the OpenBLAS sgemm roof
// measured in the same run, one thread (Kokkos Serial, OpenBLAS set to one thread).
//
//   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./bench_nn           full run
//   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE ./bench_nn --quick   what ctest runs
//   ./bench_nn --reps N --inner C   N repetitions (at least 5) of C interleaved rounds each
//   ./bench_nn --seq S              the block on S tokens (default 1024; the roof keeps its shape)
//   ./bench_nn --only bf16          the bf16 storage figures alone (docs/nn.md, "bf16 storage")
//
// The block: transformer_block<float, no_cp<kokkos_attention>>, d_model 512, 8 heads, 2 kv
// heads, head_dim 64, ffn_hidden from transformer_config::resolved(), batch 1, seq 1024
// (--seq), causal. One repetition of the block is forward, backward_input, backward_weight (the split
// a zero-bubble schedule runs).
//
// FLOPs, counted once and printed: every matrix product 2 M N K (forward: the q, k, v, o,
// gate, up, down projections; backward: the input and the weight gradient of each, 2 x the
// forward); attention as flash-attention's benchmark counts it, forward 4 B H S^2 D halved
// for causal, backward 2.5 x forward. Elementwise work (norms, RoPE, SwiGLU, residuals)
// counts nothing.
//
// Each repetition times these four, one call each per round, in an order that rotates from
// round to round, over --inner rounds (3; 2 in --quick), keeping each one's best round:
//   roof       cblas_sgemm 1024 x 1536 x 512 (M = the block's rows, K = d_model, N = 3 d_model:
//              the size of the block's projections), best of two calls;
//   block      forward + backward_input + backward_weight of the block;
//   attention  the kokkos_attention forward + backward calls of the block, alone, same shapes;
//   gemms      the block's 21 matrix products through baton::detail::nn::gemm, alone, same
//              shapes, transposes and betas;
// Ratios (block / roof, attention / block, gemms / block) are taken per repetition;
// other_fraction = 1 - attention_fraction - gemm_fraction is what the block spends beyond
// those calls (norms, RoPE, SwiGLU, residuals, copies, and the page faults of its fresh
// activations: block_page_faults counts them, per steady step, beside the first step's
// block_page_faults_first_step). Every figure prints as
//   name: median (min .., max .., n ..)
// over the repetitions, with the load average before and after (bench_common.hpp). Times are
// the calling thread's CPU time (user + system: the page faults of the block's fresh
// activations count), so a descheduled process does not count other programs' time; the
// machine is shared, and a figure can still move.
//
// Recomputation (docs/nn.md, "Recomputation"): the same block's step (forward,
// backward_input, backward_weight) under recompute_policy none, selective and full, in an order
// that rotates from round to round, each policy's best of --inner rounds per repetition;
// recompute_full_step_ratio and recompute_selective_step_ratio are full / none and
// selective / none per repetition (goals <= 1.35 and <= 1.10), and recompute_saved_bytes_*
// what each policy keeps after forward (saved.bytes(): a count, not a measurement).
//
// bf16 (docs/nn.md, "bf16 storage", "bf16 matrix products"): the same step native, as
// baton-train --dtype bf16 runs it (activation_storage::bf16 and matmul_precision::bf16) and with
// bf16 storage alone, in an order that rotates, each one's best of --inner rounds per
// repetition; bf16_step_ratio is bf16 / native per repetition (goal <= 1.0),
// bf16_storage_step_ratio storage-only / native, storage_saved_bytes_* what each keeps after
// forward, block_{forward,backward_input,backward_weight}_ms_* the phases of each one's best
// round, block_gemms_sgemm_vs_bf16 the block's 21 products through sgemm / through gemm_bf16.
//
// OpenBLAS picks its kernel by CPUID; a CPU newer than the library (OpenBLAS 0.3.21 on an
// Emerald Rapids Xeon, for one) gets the "Prescott" SSE3 fallback, several times below the
// CPU's roof. The program then re-executes itself with OPENBLAS_CORETYPE set to the kernel
// the CPU can run (examples/support/native_blas.hpp) and prints which kernel ran.
#include "bench_common.hpp"
#include "native_blas.hpp"

#include <baton/attention/kokkos.hpp>
#include <baton/nn.hpp>
#include <baton/nn/blas.hpp>

#include <Kokkos_Core.hpp>
#include <cblas.h>
#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <random>
#include <string>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace {

using T = float;
namespace nn = baton::nn;
namespace nn_detail = baton::detail::nn;  // the one gemm of the model layer
using strategy_t = nn::no_cp<baton::kokkos_attention>;
using block_t = nn::transformer_block<T, strategy_t>;
using tensor = baton::host_tensor<T>;

constexpr std::int64_t batch = 1;
std::int64_t seq = 1024;  // --seq
constexpr int roof_m = 1024, roof_n = 1536, roof_k = 512;

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_THREAD, &usage);
  return usage.ru_minflt;
}

template <class F>
double best_seconds(int calls, F&& f) {
  double best = 1e300;
  for (int c = 0; c < calls; ++c) {
    const double t0 = thread_cpu_seconds();
    f();
    best = std::min(best, thread_cpu_seconds() - t0);
  }
  return best;
}

std::vector<T> random_values(std::size_t n, unsigned seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<T> out(n);
  for (auto& x : out) x = normal(gen);
  return out;
}

tensor random_tensor(std::vector<std::int64_t> shape, unsigned seed) {
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  const auto values = random_values(static_cast<std::size_t>(n), seed);
  return tensor(std::move(shape), std::span<const T>(values));
}

// ---- the block's matrix products --------------------------------------------------------

enum class pass { forward, backward };

struct gemm_call {
  const char* name;
  pass when;
  nn_detail::op op_a, op_b;
  std::int64_t m, n, k;
  T beta;
  double flops() const { return 2.0 * double(m) * double(n) * double(k); }
};

// What transformer_block calls, in its order: linear::apply (x W, beta 0), add_input_grad
// (dy Wᵀ, beta 0 or 1), add_weight_grad (dW += xᵀ dy, beta 1), for W [in, out].
std::vector<gemm_call> block_gemms(const nn::transformer_config& c, std::int64_t rows) {
  using nn_detail::op;
  const std::int64_t d = c.d_model, q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim, f = c.ffn_hidden;
  struct proj {
    const char* name;
    std::int64_t in, out;
  };
  const std::array<proj, 7> p{{{"q", d, q}, {"k", d, kv}, {"v", d, kv}, {"o", q, d}, {"gate", d, f}, {"up", d, f},
                               {"down", f, d}}};
  std::vector<gemm_call> calls;
  for (const proj& x : p) calls.push_back({x.name, pass::forward, op::none, op::none, rows, x.out, x.in, T(0)});
  // backward_input: mlp (down, gate, up += ), then attention (o, q, k +=, v +=).
  const auto input_grad = [&](const proj& x, bool accumulate) {
    calls.push_back({x.name, pass::backward, op::none, op::transpose, rows, x.in, x.out, accumulate ? T(1) : T(0)});
  };
  input_grad(p[6], false);
  input_grad(p[4], false);
  input_grad(p[5], true);
  input_grad(p[3], false);
  input_grad(p[0], false);
  input_grad(p[1], true);
  input_grad(p[2], true);
  // backward_weight: down, gate, up, then q, k, v, o.
  for (int i : {6, 4, 5, 0, 1, 2, 3})
    calls.push_back({p[static_cast<std::size_t>(i)].name, pass::backward, op::transpose, op::none,
                     p[static_cast<std::size_t>(i)].in, p[static_cast<std::size_t>(i)].out, rows, T(1)});
  return calls;
}

// The calls above on operands of their own (distinct buffers, as in the block).
class gemm_set {
 public:
  explicit gemm_set(std::vector<gemm_call> calls) : calls_(std::move(calls)) {
    unsigned seed = 100;
    for (const gemm_call& g : calls_) {
      a_.push_back(random_values(static_cast<std::size_t>(g.m * g.k), seed++, 0.05f));
      b_.push_back(random_values(static_cast<std::size_t>(g.k * g.n), seed++, 0.05f));
      c_.push_back(random_values(static_cast<std::size_t>(g.m * g.n), seed++, 0.05f));
    }
  }
  const std::vector<gemm_call>& calls() const { return calls_; }
  // Product i through gemm, or with `bf16` on bf16 operands (matmul_precision::bf16: gemm_bf16).
  void run(std::size_t i, bool bf16 = false) {
    using nn_detail::op;
    const gemm_call& g = calls_[i];
    const std::int64_t lda = g.op_a == op::none ? g.k : g.m, ldb = g.op_b == op::none ? g.n : g.k;
    if (bf16)
      nn_detail::gemm_bf16(g.op_a, g.op_b, g.m, g.n, g.k, 1.0f, a_[i].data(), lda, b_[i].data(), ldb, g.beta,
                           c_[i].data(), g.n);
    else
      nn_detail::gemm<T>(g.op_a, g.op_b, g.m, g.n, g.k, T(1), a_[i].data(), lda, b_[i].data(), ldb, g.beta,
                         c_[i].data(), g.n);
  }
  void run_all(bool bf16 = false) {
    for (std::size_t i = 0; i < calls_.size(); ++i) run(i, bf16);
  }

 private:
  std::vector<gemm_call> calls_;
  std::vector<std::vector<T>> a_, b_, c_;
};

// ---- the block's attention calls -------------------------------------------------------

class attention_set {
 public:
  explicit attention_set(const nn::transformer_config& c)
      : h_(c.heads), hkv_(c.kv_heads), d_(c.head_dim), positions_(static_cast<std::size_t>(seq)) {
    for (std::int64_t i = 0; i < seq; ++i) positions_[static_cast<std::size_t>(i)] = i;
    const auto nq = static_cast<std::size_t>(batch * seq * h_ * d_), nkv = static_cast<std::size_t>(batch * seq * hkv_ * d_);
    q_ = random_values(nq, 1);
    k_ = random_values(nkv, 2);
    v_ = random_values(nkv, 3);
    dout_ = random_values(nq, 4);
    out_.resize(nq);
    dq_.resize(nq);
    dk_.resize(nkv);
    dv_.resize(nkv);
    lse_.resize(static_cast<std::size_t>(batch * h_ * seq));
  }
  // Exactly what self_attention calls: no_cp's forward and backward (positions as a list,
  // softmax scale 1/sqrt(head_dim)).
  void forward() {
    strategy_.forward<T>(view(q_, h_), view(k_, hkv_), view(v_, hkv_), baton::causal_mask{}, mview(out_, h_), lse(),
                         positions_, 0.0);
  }
  void backward() {
    strategy_.backward<T>(view(q_, h_), view(k_, hkv_), view(v_, hkv_), view(out_, h_), clse(), view(dout_, h_),
                          baton::causal_mask{}, mview(dq_, h_), mview(dk_, hkv_), mview(dv_, hkv_), positions_, 0.0);
  }

 private:
  baton::tensor_view<const T, 4> view(const std::vector<T>& x, std::int64_t heads) const {
    return baton::make_tensor_view(x.data(), std::array<std::int64_t, 4>{batch, seq, heads, d_});
  }
  baton::tensor_view<T, 4> mview(std::vector<T>& x, std::int64_t heads) {
    return baton::make_tensor_view(x.data(), std::array<std::int64_t, 4>{batch, seq, heads, d_});
  }
  baton::tensor_view<baton::lse_t<T>, 3> lse() {
    return baton::make_tensor_view(lse_.data(), std::array<std::int64_t, 3>{batch, h_, seq});
  }
  baton::tensor_view<const baton::lse_t<T>, 3> clse() const {
    return baton::make_tensor_view(static_cast<const baton::lse_t<T>*>(lse_.data()),
                                   std::array<std::int64_t, 3>{batch, h_, seq});
  }

  std::int64_t h_, hkv_, d_;
  std::vector<std::int64_t> positions_;
  std::vector<T> q_, k_, v_, dout_, out_, dq_, dk_, dv_;
  std::vector<baton::lse_t<T>> lse_;
  strategy_t strategy_;
};

// ---- statistics: bench::series and bench::print (bench_common.hpp) ----------------------

using bench::print;
using bench::series;

bool all_finite(const tensor& t) {
  for (std::int64_t i = 0; i < t.size(); ++i)
    if (!std::isfinite(t[i])) return false;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // The roof must be this CPU's: if OpenBLAS fell back to its generic kernel, start again on
  // the CPU's own (see examples/support/native_blas.hpp).
  example_support::use_native_blas_kernel(argv);
  Kokkos::ScopeGuard kokkos(argc, argv);
  bool quick = false, only_bf16 = false;
  int reps = 0, inner = 0;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
    else if (std::strcmp(argv[i], "--seq") == 0 && i + 1 < argc) seq = std::atoll(argv[++i]);
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc && std::strcmp(argv[i + 1], "bf16") == 0) {
      only_bf16 = true;
      ++i;
    }
    else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (std::strcmp(argv[i], "--inner") == 0 && i + 1 < argc) inner = std::atoi(argv[++i]);
  }
  if (reps == 0) reps = quick ? 5 : 11;
  if (inner == 0) inner = quick ? 2 : 3;
  if (reps < 5 || inner < 1 || seq < 1) {
    std::printf("FAILED: --reps must be at least 5, --inner at least 1 and --seq at least 1\n");
    return 1;
  }
  openblas_set_num_threads(1);
  bench::print_build();
  bench::print_load("before");

  nn::transformer_config config;
  config.d_model = 512;
  config.heads = 8;
  config.kv_heads = 2;
  config.head_dim = 64;
  config = config.resolved();
  const std::int64_t rows = batch * seq;

  const std::string core = nn::blas_kernel();
  const char* chosen = std::getenv("OPENBLAS_CORETYPE");
  std::printf("openblas_core: %s%s%s\n", core.c_str(), chosen ? " (OPENBLAS_CORETYPE=" : "", chosen ? (std::string(chosen) + ")").c_str() : "");
  if (core == "Prescott")
    std::printf("openblas_core_note: Prescott is OpenBLAS's generic SSE3 kernel; the roof and the block's GEMMs run "
                "below this CPU's speed\n");
  std::printf("gemm_implementation: %s\n", nn_detail::gemm_implementation());
  std::printf("kokkos_execution_space: %s (concurrency %d)\n", Kokkos::DefaultHostExecutionSpace::name(),
              Kokkos::DefaultHostExecutionSpace().concurrency());
  std::printf("shape: batch %lld seq %lld d_model %lld heads %lld kv_heads %lld head_dim %lld ffn_hidden %lld causal\n",
              static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(config.d_model),
              static_cast<long long>(config.heads), static_cast<long long>(config.kv_heads),
              static_cast<long long>(config.head_dim), static_cast<long long>(config.ffn_hidden));

  // ---- FLOPs ----
  gemm_set gemms(block_gemms(config, rows));
  double gemm_fwd = 0, gemm_bwd = 0;
  for (const gemm_call& g : gemms.calls()) (g.when == pass::forward ? gemm_fwd : gemm_bwd) += g.flops();
  const double attn_fwd = 4.0 * double(batch) * double(config.heads) * double(seq) * double(seq) *
                          double(config.head_dim) / 2.0;
  const double attn_bwd = 2.5 * attn_fwd;
  const double block_flops = gemm_fwd + gemm_bwd + attn_fwd + attn_bwd;
  std::printf("flops_gemm_forward: %.4e\n", gemm_fwd);
  std::printf("flops_gemm_backward: %.4e\n", gemm_bwd);
  std::printf("flops_attention_forward: %.4e\n", attn_fwd);
  std::printf("flops_attention_backward: %.4e\n", attn_bwd);
  std::printf("flops_block: %.4e\n", block_flops);
  std::printf("sgemm_roof_shape: %d x %d x %d (M x N x K, row-major, NN)\n", roof_m, roof_n, roof_k);
  std::printf("repetitions: %d interleaved, each the best of %d round(s)\n", reps, inner);
  std::fflush(stdout);

  // ---- the pieces ----
  block_t block(config, nn::initializer(2024), strategy_t{});
  const tensor x = random_tensor({batch, seq, config.d_model}, 21);
  const tensor dy = random_tensor({batch, seq, config.d_model}, 22);
  const nn::sequence_info info = nn::sequence_info::whole(seq);
  double t_forward = 0, t_input = 0, t_weight = 0;  // the phases of the last block call
  long faults = 0;                                  // minor page faults of the last block call
  const auto run_block = [&] {
    block_t::saved st;
    const long f0 = minor_faults();
    const double t0 = thread_cpu_seconds();
    tensor y = block.forward(x, info, st);
    const double t1 = thread_cpu_seconds();
    tensor dx = block.backward_input(st, dy);
    const double t2 = thread_cpu_seconds();
    block.backward_weight(st);
    const double t3 = thread_cpu_seconds();
    t_forward = t1 - t0;
    t_input = t2 - t1;
    t_weight = t3 - t2;
    faults = minor_faults() - f0;
    return std::pair<tensor, tensor>(std::move(y), std::move(dx));
  };
  long first_step_faults = 0;
  {
    const auto [y, dx] = run_block();  // warm-up, and a sanity check
    first_step_faults = faults;
    if (!all_finite(y) || !all_finite(dx)) {
      std::printf("FAILED: the block's output or input gradient is not finite\n");
      return 1;
    }
  }
  attention_set attention(config);
  const auto run_attention = [&] {
    attention.forward();
    attention.backward();
  };
  run_attention();
  gemms.run_all();

  std::vector<float> ra = random_values(static_cast<std::size_t>(roof_m) * roof_k, 31),
                     rb = random_values(static_cast<std::size_t>(roof_k) * roof_n, 32),
                     rc(static_cast<std::size_t>(roof_m) * roof_n);
  const auto run_roof = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, roof_m, roof_n, roof_k, 1.0f, ra.data(), roof_k, rb.data(),
                roof_n, 0.0f, rc.data(), roof_n);
  };
  run_roof();
  const double roof_flops = 2.0 * roof_m * double(roof_n) * roof_k;

  if (!only_bf16) {  // --only bf16 skips the roof, the split and recomputation
    // ---- interleaved repetitions ----
    series block_gflops, sgemm_gflops, ratio, attn_frac, gemm_frac, other_frac, block_ms, fwd_ms, in_ms, w_ms,
        attn_gflops, gemms_gflops, block_faults;
    for (int r = 0; r < reps; ++r) {
      // Each round runs the four once (the roof twice: it is short), in an order that rotates
      // with the round and the repetition; each keeps its best round. A burst of other work
      // then slows all four alike instead of whichever happened to be running.
      double t_block = 1e300, t_roof = 1e300, t_attn = 1e300, t_gemm = 1e300, best_fwd = 0, best_in = 0, best_w = 0;
      long best_faults = 0;
      const std::array<std::function<void()>, 4> steps{
          [&] { t_roof = std::min(t_roof, best_seconds(2, run_roof)); },
          [&] {
            const double t0 = thread_cpu_seconds();
            (void)run_block();
            const double t = thread_cpu_seconds() - t0;
            if (t < t_block) {
              t_block = t;
              best_fwd = t_forward;
              best_in = t_input;
              best_w = t_weight;
              best_faults = faults;
            }
          },
          [&] { t_attn = std::min(t_attn, best_seconds(1, run_attention)); },
          [&] { t_gemm = std::min(t_gemm, best_seconds(1, [&] { gemms.run_all(); })); }};
      for (int c = 0; c < inner; ++c)
        for (std::size_t s = 0; s < steps.size(); ++s)
          steps[(s + static_cast<std::size_t>(r + c)) % steps.size()]();
      const double bg = block_flops / t_block / 1e9, sg = roof_flops / t_roof / 1e9;
      block_gflops.add(bg);
      sgemm_gflops.add(sg);
      ratio.add(bg / sg);
      attn_frac.add(t_attn / t_block);
      gemm_frac.add(t_gemm / t_block);
      other_frac.add(1.0 - t_attn / t_block - t_gemm / t_block);
      block_ms.add(1e3 * t_block);
      fwd_ms.add(1e3 * best_fwd);
      in_ms.add(1e3 * best_in);
      w_ms.add(1e3 * best_w);
      attn_gflops.add((attn_fwd + attn_bwd) / t_attn / 1e9);
      gemms_gflops.add((gemm_fwd + gemm_bwd) / t_gemm / 1e9);
      block_faults.add(static_cast<double>(best_faults));
    }

    print("block_gflops", block_gflops, "%.1f");
    print("sgemm_gflops", sgemm_gflops, "%.1f");
    print("block_vs_sgemm", ratio, "%.3f");
    print("attention_fraction", attn_frac, "%.3f");
    print("gemm_fraction", gemm_frac, "%.3f");
    print("other_fraction", other_frac, "%.3f");
    print("block_ms", block_ms, "%.1f");
    print("block_forward_ms", fwd_ms, "%.1f");
    print("block_backward_input_ms", in_ms, "%.1f");
    print("block_backward_weight_ms", w_ms, "%.1f");
    print("attention_gflops", attn_gflops, "%.1f");
    print("gemms_gflops", gemms_gflops, "%.1f");
    print("block_page_faults", block_faults, "%.0f");
    // The first step faults its activations in; later ones reuse them (host_tensor's block
    // cache). Goal: a steady step <= 1 % of the first step's faults.
    std::printf("block_page_faults_first_step: %ld\n", first_step_faults);
    std::printf("block_page_faults_steady_vs_first: %.4f\n",
                first_step_faults > 0 ? block_faults.median() / static_cast<double>(first_step_faults) : 0.0);

    // ---- recomputation: the block's step under each policy, interleaved ----
    const std::array<nn::recompute_policy, 3> policies{nn::recompute_policy::none, nn::recompute_policy::selective,
                                                       nn::recompute_policy::full};
    for (const nn::recompute_policy p : policies) {
      block.set_recompute(p);
      block_t::saved st;
      (void)block.forward(x, info, st);
      std::printf("recompute_saved_bytes_%s: %zu\n", std::string(nn::to_string(p)).c_str(), st.bytes());
      (void)block.backward(st, dy);
    }
    series full_ratio, selective_ratio, policy_ms[3];
    for (int r = 0; r < reps; ++r) {
      std::array<double, 3> best{1e300, 1e300, 1e300};
      for (int c = 0; c < inner; ++c)
        for (std::size_t s = 0; s < policies.size(); ++s) {
          const std::size_t i = (s + static_cast<std::size_t>(r + c)) % policies.size();
          block.set_recompute(policies[i]);
          const double t0 = thread_cpu_seconds();
          (void)run_block();
          best[i] = std::min(best[i], thread_cpu_seconds() - t0);
        }
      full_ratio.add(best[2] / best[0]);
      selective_ratio.add(best[1] / best[0]);
      for (std::size_t i = 0; i < policies.size(); ++i) policy_ms[i].add(1e3 * best[i]);
    }
    block.set_recompute(nn::recompute_policy::none);
    print("recompute_full_step_ratio", full_ratio, "%.3f");
    print("recompute_selective_step_ratio", selective_ratio, "%.3f");
    print("block_ms_recompute_none", policy_ms[0], "%.1f");
    print("block_ms_recompute_selective", policy_ms[1], "%.1f");
    print("block_ms_recompute_full", policy_ms[2], "%.1f");
  }

  // ---- bf16: the block's step as --dtype bf16 runs it, and with bf16 storage alone ----
  struct variant {
    const char* name;
    nn::activation_storage storage;
    nn::matmul_precision matmul;
  };
  const std::array<variant, 3> variants{{{"native", nn::activation_storage::native, nn::matmul_precision::native},
                                         {"bf16", nn::activation_storage::bf16, nn::matmul_precision::bf16},
                                         {"bf16_storage_only", nn::activation_storage::bf16, nn::matmul_precision::native}}};
  const auto use = [&](const variant& v) {
    block.set_storage(v.storage);
    block.set_matmul(v.matmul);
  };
  std::printf("gemm_bf16_implementation: %s\n", nn_detail::bf16_gemm_implementation());
  for (const variant& v : variants) {
    use(v);
    block_t::saved st;
    (void)block.forward(x, info, st);
    std::printf("storage_saved_bytes_%s: %zu\n", v.name, st.bytes());
    (void)block.backward(st, dy);
  }
  // The phases (forward, backward_input, backward_weight) of each variant's best round, to
  // show where bf16 gains or loses; and the block's 21 products alone, sgemm against gemm_bf16.
  series bf16_ratio, storage_ratio, gemm_speedup, variant_ms[3], variant_phase_ms[3][3];
  for (int r = 0; r < reps; ++r) {
    std::array<double, 3> best{1e300, 1e300, 1e300};
    double best_sgemm = 1e300, best_bf16_gemm = 1e300;
    std::array<std::array<double, 3>, 3> phases{};
    for (int c = 0; c < inner; ++c) {
      for (std::size_t s = 0; s < variants.size(); ++s) {
        const std::size_t i = (s + static_cast<std::size_t>(r + c)) % variants.size();
        use(variants[i]);
        const double t0 = thread_cpu_seconds();
        (void)run_block();
        const double t = thread_cpu_seconds() - t0;
        if (t < best[i]) {
          best[i] = t;
          phases[i] = {t_forward, t_input, t_weight};
        }
      }
      const bool sgemm_first = (r + c) % 2 == 0;
      for (int k = 0; k < 2; ++k) {
        const double t0 = thread_cpu_seconds();
        if ((k == 0) == sgemm_first) {
          gemms.run_all();
          best_sgemm = std::min(best_sgemm, thread_cpu_seconds() - t0);
        } else {
          gemms.run_all(true);
          best_bf16_gemm = std::min(best_bf16_gemm, thread_cpu_seconds() - t0);
        }
      }
    }
    bf16_ratio.add(best[1] / best[0]);
    storage_ratio.add(best[2] / best[0]);
    gemm_speedup.add(best_sgemm / best_bf16_gemm);
    for (std::size_t i = 0; i < variants.size(); ++i) {
      variant_ms[i].add(1e3 * best[i]);
      for (std::size_t p = 0; p < 3; ++p) variant_phase_ms[i][p].add(1e3 * phases[i][p]);
    }
  }
  use(variants[0]);
  print("bf16_step_ratio", bf16_ratio, "%.3f");
  print("bf16_storage_step_ratio", storage_ratio, "%.3f");
  print("block_gemms_sgemm_vs_bf16", gemm_speedup, "%.2f");
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const std::string name = variants[i].name;
    print("block_ms_" + name, variant_ms[i], "%.1f");
    print("block_forward_ms_" + name, variant_phase_ms[i][0], "%.1f");
    print("block_backward_input_ms_" + name, variant_phase_ms[i][1], "%.1f");
    print("block_backward_weight_ms_" + name, variant_phase_ms[i][2], "%.1f");
  }
  bench::print_load("after");
  return 0;
}
