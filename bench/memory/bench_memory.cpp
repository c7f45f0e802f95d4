// bench_memory — what recomputation costs in step time and saves in memory, training a
// transformer LM on ranks that are threads (issue 29).
//
//   env -u OPENBLAS_CORETYPE ./bench_memory           sequences 256 and 512, 5 pairs each
//   env -u OPENBLAS_CORETYPE ./bench_memory --quick   what ctest runs (sequence 128, 5 pairs)
//
// Model: 8 layers, d_model 512, 8 heads (8 kv heads), vocab 256, float, Kokkos attention; mesh
// pp 2 x cp_ring 2 (zigzag) under ZBV (4 stages, 4 microbatches of one row), one BLAS thread
// per rank. One trainer per sequence length; the policy of every stage is switched between
// steps (lm_stage::set_recompute on every rank alike), so the steps compared run on the same
// weights' shapes and the same memory.
//
// Per sequence length (suffix _seqN; the longest also without the suffix):
//   recompute_full_step_ratio        step time under full / under none, in interleaved pairs
//                                    (which goes first alternates): median (min, max, n).
//                                    The goal: <= 1.35.
//   recompute_selective_step_ratio   the same for selective. Goal: <= 1.10.
//   peak_bytes_<policy>              the largest measured peak over the ranks
//                                    (lm_step_report::peak_host_bytes) over that policy's steps;
//   predicted_peak_bytes_<policy>    estimate_memory's largest over the pipeline ranks.
// A step's time is rank 0's whole training step (every rank ends it together: the gradient
// all-reduce and the report's reductions are collective). The load average prints before and
// after (bench_common.hpp): the step ratios are only as good as the machine is quiet.
#include "bench_common.hpp"
#include "native_blas.hpp"

#include <baton/attention/kokkos.hpp>
#include <baton/comm/local.hpp>
#include <baton/nn/blas.hpp>
#include <baton/schedule.hpp>
#include <baton/train.hpp>

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

namespace nn = baton::nn;
namespace train = baton::train;
using nn::recompute_policy;

constexpr std::array<recompute_policy, 3> policies{recompute_policy::none, recompute_policy::selective,
                                                   recompute_policy::full};

train::lm_config model_config(std::int64_t seq) {
  train::lm_config c;
  c.model = {.d_model = 512, .heads = 8, .kv_heads = 8, .vocab = train::byte_corpus::vocab};
  c.layers = 8;
  c.seq = seq;
  c.batch = 4;
  c.optimizer.lr = 1e-4;
  return c;
}

const train::byte_corpus& corpus() {
  static const train::byte_corpus c = [] {
    std::string t;
    for (int i = 0; i < 4000; ++i) t += "recomputation trades memory for time; the plan says how much. ";
    return train::byte_corpus(t);
  }();
  return c;
}

struct figures {
  bench::series full_ratio, selective_ratio;
  std::array<double, 3> peak{};  // by policy: the largest measured over the ranks
};

figures measure(std::int64_t seq, int pairs) {
  const train::lm_config config = model_config(seq);
  const train::lm_parallelism parallelism{{.pp = 2, .cp_ring = 2}, nn::cp_mode::ring, baton::shard_layout::zigzag};
  const baton::program schedule = baton::zbv::generate(baton::shape_for<baton::zbv>(2, 4));
  struct rank_figures {
    std::vector<double> full_ratio, selective_ratio;
    std::array<double, 3> peak{};
  };
  const auto ranks = baton::run_local(4, [&](baton::local_communicator& world) {
    train::lm_trainer<float, baton::local_communicator, baton::kokkos_attention> trainer(world, config, parallelism,
                                                                                        schedule);
    rank_figures f;
    int step = 0;
    const auto run = [&](recompute_policy p) {
      trainer.executor().for_each_local_stage([&](int, auto& stage) { stage.set_recompute(p); });
      const auto r = trainer.step(corpus().train_batch(step++, config.batch, config.seq, false));
      double& peak = f.peak[static_cast<std::size_t>(p == recompute_policy::none ? 0 : p == recompute_policy::selective ? 1 : 2)];
      peak = std::max(peak, static_cast<double>(r.peak_host_bytes));
      return r.seconds;
    };
    for (recompute_policy p : policies) run(p);  // the first steps fault their pages in
    bench::interleave(
        pairs, [&] { return run(recompute_policy::none); }, [&] { return run(recompute_policy::full); },
        [&](int, double none, double full) { f.full_ratio.push_back(full / none); });
    bench::interleave(
        pairs, [&] { return run(recompute_policy::none); }, [&] { return run(recompute_policy::selective); },
        [&](int, double none, double selective) { f.selective_ratio.push_back(selective / none); });
    return f;
  });
  figures out;
  for (double v : ranks[0].full_ratio) out.full_ratio.add(v);
  for (double v : ranks[0].selective_ratio) out.selective_ratio.add(v);
  for (const auto& r : ranks)
    for (std::size_t p = 0; p < 3; ++p) out.peak[p] = std::max(out.peak[p], r.peak[p]);
  return out;
}

double predicted_peak(std::int64_t seq, recompute_policy p) {
  train::lm_config config = model_config(seq);
  config.model.recompute = p;
  const train::lm_parallelism parallelism{{.pp = 2, .cp_ring = 2}, nn::cp_mode::ring, baton::shard_layout::zigzag};
  double most = 0;
  for (const auto& e : train::estimate_memory(config, parallelism, baton::zbv::generate(baton::shape_for<baton::zbv>(2, 4)),
                                              sizeof(float)))
    most = std::max(most, e.total());
  return most;
}

}  // namespace

int main(int argc, char** argv) {
  example_support::use_native_blas_kernel(argv);
  Kokkos::ScopeGuard kokkos(argc, argv);
  baton::nn::set_blas_threads(1);
  bool quick = false;
  for (int i = 1; i < argc; ++i) quick = quick || std::strcmp(argv[i], "--quick") == 0;
  const int pairs = bench::pairs_from_args(argc, argv, bench::min_pairs);
  const std::vector<std::int64_t> seqs = quick ? std::vector<std::int64_t>{128} : std::vector<std::int64_t>{256, 512};
  bench::print_build();
  bench::print_load("before");
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const std::int64_t seq = seqs[i];
    const figures f = measure(seq, pairs);
    for (const std::string& suffix : {"_seq" + std::to_string(seq), std::string()}) {
      if (suffix.empty() && i + 1 != seqs.size()) continue;
      bench::print("recompute_full_step_ratio" + suffix, f.full_ratio, "%.3f");
      bench::print("recompute_selective_step_ratio" + suffix, f.selective_ratio, "%.3f");
      for (std::size_t p = 0; p < 3; ++p) {
        const std::string name(nn::to_string(policies[p]));
        bench::print_value("peak_bytes_" + name + suffix, f.peak[p], "%.0f");
        bench::print_value("predicted_peak_bytes_" + name + suffix, predicted_peak(seq, policies[p]), "%.0f");
      }
    }
    std::fflush(stdout);
  }
  bench::print_load("after");
  return 0;
}
