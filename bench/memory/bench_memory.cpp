// bench_memory — what recomputation costs in step time and saves in memory, training a
// transformer LM on ranks that are threads (issue 29).
//
//   env -u OPENBLAS_CORETYPE ./bench_memory           sequences 256 and 512, 5 pairs each
//   env -u OPENBLAS_CORETYPE ./bench_memory --quick   what ctest runs (sequence 128, 5 pairs; the fit searched, not trained)
//   env -u OPENBLAS_CORETYPE ./bench_memory --fit [--budget-mib N]   max_seq_fit_ratio only
//   env -u OPENBLAS_CORETYPE ./bench_memory --sweep   peak vs sequence length (docs/memory.md's picture)
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
//   bf16_step_ratio                  step time with bf16 as baton-train --dtype bf16 runs it
//                                    (storage: saved state, messages between stages, the ring's
//                                    K/V blocks; the blocks' projections on bf16 operands) / with
//                                    float, policy none, trainers on the same ranks stepping in
//                                    interleaved rounds. Goal: <= 1.0. (bench_nn's figure of the
//                                    same name is one block on one thread: no messages, no ring.)
//   bf16_storage_step_ratio          the same with bf16 storage alone (products in float).
//   peak_bytes_<policy>              the largest measured peak over the ranks
//                                    (lm_step_report::peak_host_bytes) over that policy's steps;
//   predicted_peak_bytes_<policy>    estimate_memory's largest over the pipeline ranks.
//
// The longest sequence that fits (--fit, also part of the default run; --budget-mib N, default 512):
//   max_seq_<schedule>_<policy>_<dtype>  the longest sequence whose every rank's peak, by
//                                         estimate_memory, is within 98 % of the budget, under ZBV
//                                         and under 1F1B (whose fused backward frees each block as
//                                         it goes), every policy, float and bf16 (the search: every
//                                         multiple of 4, what zigzag over cp_ring 2 needs, by
//                                         bisection; the next multiple must not fit);
//   max_seq_none_float, max_seq_best      the longest with none in float, and with any policy and
//                                         storage, each over both schedules;
//   max_seq_fit_ratio_{zbv,1f1b}          best / none-float within one schedule;
//   max_seq_fit_ratio                     their ratio (the goal: >= 4);
//   fit_peak_bytes_{baseline,best}        the measured peak (largest over the ranks, second
//                                         step) of one training step at each found length:
//                                         it must be within the budget (the run fails if not).
//   --quick searches without training the two steps.
// Peak memory against sequence length (--sweep): `sweep: seq S policy P dtype D measured M
// predicted E` per run, for docs/memory.md's picture (bench/memory/plot_memory.py draws it).
//
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
#include <chrono>
#include <cstdlib>
#include <tuple>
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

// One fit run's configuration: the model at `seq` under policy p (and bf16 storage), pp 2 x
// cp_ring 2, and its schedule, ZBV (the bench's) or 1F1B.
struct fit_run {
  train::lm_config config;
  train::lm_parallelism parallelism{{.pp = 2, .cp_ring = 2}, nn::cp_mode::ring, baton::shard_layout::zigzag};
  baton::program schedule;
  fit_run(std::int64_t seq, recompute_policy p, bool bf16, bool one_f_one_b)
      : config(model_config(seq)),
        schedule(one_f_one_b ? baton::one_f_one_b::generate(baton::shape_for<baton::one_f_one_b>(2, 4))
                             : baton::zbv::generate(baton::shape_for<baton::zbv>(2, 4))) {
    config.model.recompute = p;
    if (bf16) {  // as baton-train --dtype bf16
      config.model.storage = nn::activation_storage::bf16;
      config.model.matmul = nn::matmul_precision::bf16;
    }
  }
};

// bf16_step_ratio: the same model trained by three trainers on the same ranks: float; bf16 as
// baton-train --dtype bf16 runs it (activation_storage::bf16: saved state, stage-to-stage
// messages and the ring's K/V blocks in bf16; matmul_precision::bf16: the blocks' projections
// on bf16 operands, float sums); and bf16 storage alone (bf16_storage_step_ratio). Policy none,
// ZBV; their steps interleaved in rounds whose order rotates. Each trainer faults its pages in
// first.
struct bf16_ratios {
  bench::series full, storage_only;
};
bf16_ratios measure_bf16(std::int64_t seq, int pairs) {
  const fit_run float_run(seq, recompute_policy::none, false, false), bf16_run(seq, recompute_policy::none, true, false);
  fit_run storage_run(seq, recompute_policy::none, true, false);
  storage_run.config.model.matmul = nn::matmul_precision::native;
  const auto ranks = baton::run_local(4, [&](baton::local_communicator& world) {
    using trainer_t = train::lm_trainer<float, baton::local_communicator, baton::kokkos_attention>;
    trainer_t float_trainer(world, float_run.config, float_run.parallelism, float_run.schedule);
    trainer_t bf16_trainer(world, bf16_run.config, bf16_run.parallelism, bf16_run.schedule);
    trainer_t storage_trainer(world, storage_run.config, storage_run.parallelism, storage_run.schedule);
    int step = 0;
    const auto run = [&](trainer_t& t) {
      return t.step(corpus().train_batch(step++, float_run.config.batch, float_run.config.seq, false)).seconds;
    };
    run(float_trainer), run(bf16_trainer), run(storage_trainer);
    std::vector<double> ratios;  // full, storage-only, per round
    for (int round = 0; round < pairs; ++round) {
      double seconds[3] = {};
      trainer_t* trainers[3] = {&float_trainer, &bf16_trainer, &storage_trainer};
      for (int i = 0; i < 3; ++i) {
        const int which = (round + i) % 3;
        seconds[which] = run(*trainers[which]);
      }
      ratios.push_back(seconds[1] / seconds[0]);
      ratios.push_back(seconds[2] / seconds[0]);
    }
    return ratios;
  });
  bf16_ratios out;
  for (std::size_t i = 0; i + 1 < ranks[0].size(); i += 2) {
    out.full.add(ranks[0][i]);
    out.storage_only.add(ranks[0][i + 1]);
  }
  return out;
}

// The largest estimate over the pipeline ranks, under ZBV (the bench's schedule) or 1F1B.
double predicted_peak(std::int64_t seq, recompute_policy p, bool bf16 = false, bool one_f_one_b = false) {
  const fit_run run(seq, p, bf16, one_f_one_b);
  const auto& [config, parallelism, schedule] = run;
  double most = 0;
  for (const auto& e : train::estimate_memory(config, parallelism, schedule, sizeof(float)))
    most = std::max(most, e.total());
  return most;
}

// The measured peak of one training step (the second: the estimate is of a steady step), the
// largest over the ranks, with a fresh trainer.
double measured_peak(std::int64_t seq, recompute_policy p, bool bf16, bool one_f_one_b = false) {
  const fit_run run(seq, p, bf16, one_f_one_b);
  const auto& [config, parallelism, schedule] = run;
  const auto peaks = baton::run_local(4, [&](baton::local_communicator& world) {
    train::lm_trainer<float, baton::local_communicator, baton::kokkos_attention> trainer(world, config, parallelism,
                                                                                        schedule);
    double peak = 0;
    for (int step = 0; step < 2; ++step)
      peak = static_cast<double>(trainer.step(corpus().train_batch(step, config.batch, config.seq, false)).peak_host_bytes);
    return peak;
  });
  return *std::max_element(peaks.begin(), peaks.end());
}

constexpr std::int64_t seq_step = 4;  // zigzag over a ring of 2: 2 x 2 chunks
// The search asks the estimate for 2 % less than the budget: it is within 0.99-1.02 of the
// measured peak (docs/memory.md; at this model's 2k tokens 0.990-0.999), and falls short by the
// Kokkos attention's packing buffer, which it does not model. The trained steps check it.
constexpr double headroom = 0.98;

// The longest multiple of seq_step whose estimate is within `budget`, or 0 (bisection: the
// estimate grows with the sequence).
std::int64_t longest_fit(double budget, recompute_policy p, bool bf16, bool one_f_one_b = false) {
  const auto fits = [&](std::int64_t units) {
    return predicted_peak(units * seq_step, p, bf16, one_f_one_b) <= headroom * budget;
  };
  if (!fits(1)) return 0;
  std::int64_t lo = 1, hi = 2;  // in units of seq_step: lo fits, hi is being tried
  while (fits(hi)) lo = hi, hi *= 2;
  while (hi - lo > 1) {
    const std::int64_t mid = (lo + hi) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo * seq_step;
}

// max_seq_fit_ratio and its checks; false when a check fails. Each side is the longest over the
// two schedules (ZBV, whose W waits after I, and 1F1B, whose fused backward frees each block as
// it goes): a user fitting a long context picks the schedule too.
bool fit(double budget, bool verify) {
  bool ok = true;
  const auto check = [&](bool good, const std::string& what) {
    if (!good) std::printf("FAILED: %s\n", what.c_str());
    ok = ok && good;
  };
  struct found {
    std::int64_t seq = 0;
    recompute_policy policy = recompute_policy::none;
    bool bf16 = false, one_f_one_b = false;
    std::string text() const {
      return std::string(one_f_one_b ? "1f1b " : "zbv ") + std::string(nn::to_string(policy)) + (bf16 ? " bf16" : " float");
    }
  };
  bench::print_value("fit_budget_bytes", budget, "%.0f");
  found baseline, best;
  std::int64_t best_same[2] = {0, 0}, baseline_same[2] = {0, 0};
  for (bool one_f_one_b : {false, true})
    for (bool bf16 : {false, true})
      for (recompute_policy p : policies) {
        const found f{longest_fit(budget, p, bf16, one_f_one_b), p, bf16, one_f_one_b};
        std::printf("max_seq_%s_%s_%s: %lld\n", one_f_one_b ? "1f1b" : "zbv", std::string(nn::to_string(p)).c_str(),
                    bf16 ? "bf16" : "float", static_cast<long long>(f.seq));
        if (p == recompute_policy::none && !bf16) {
          baseline_same[one_f_one_b] = f.seq;
          if (f.seq > baseline.seq) baseline = f;
        }
        best_same[one_f_one_b] = std::max(best_same[one_f_one_b], f.seq);
        if (f.seq > best.seq) best = f;
      }
  for (int k : {0, 1})
    bench::print_value(std::string("max_seq_fit_ratio_") + (k ? "1f1b" : "zbv"),
                       baseline_same[k] > 0 ? static_cast<double>(best_same[k]) / static_cast<double>(baseline_same[k]) : 0,
                       "%.3f");
  std::printf("max_seq_baseline: %s\nmax_seq_best_policy: %s\n", baseline.text().c_str(), best.text().c_str());
  bench::print_value("max_seq_none_float", static_cast<double>(baseline.seq), "%.0f");
  bench::print_value("max_seq_best", static_cast<double>(best.seq), "%.0f");
  bench::print_value("max_seq_fit_ratio", baseline.seq > 0 ? static_cast<double>(best.seq) / static_cast<double>(baseline.seq) : 0,
                     "%.3f");
  std::fflush(stdout);
  check(baseline.seq > 0 && best.seq >= baseline.seq, "the search found a sequence that fits");
  for (const found& f : {baseline, best}) {
    check(predicted_peak(f.seq, f.policy, f.bf16, f.one_f_one_b) <= headroom * budget, "seq " + std::to_string(f.seq) + " " + f.text() + " fits by the estimate");
    check(predicted_peak(f.seq + seq_step, f.policy, f.bf16, f.one_f_one_b) > headroom * budget,
          "seq " + std::to_string(f.seq) + " " + f.text() + ": the next length does not fit by the estimate");
  }
  if (!verify) return ok;
  for (auto [name, f] : {std::pair{"baseline", baseline}, std::pair{"best", best}}) {
    const auto start = std::chrono::steady_clock::now();
    const double measured = measured_peak(f.seq, f.policy, f.bf16, f.one_f_one_b);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double predicted = predicted_peak(f.seq, f.policy, f.bf16, f.one_f_one_b);
    bench::print_value(std::string("fit_peak_bytes_") + name, measured, "%.0f");
    bench::print_value(std::string("fit_predicted_over_measured_") + name, predicted / measured, "%.4f");
    bench::print_value(std::string("fit_two_steps_seconds_") + name, seconds, "%.1f");
    std::fflush(stdout);
    check(measured <= budget, std::string(name) + ": the measured peak is within the budget");
  }
  return ok;
}

// Measured and predicted peak against the sequence length, every policy in float and bf16.
void sweep(const std::vector<std::int64_t>& seqs) {
  for (std::int64_t seq : seqs)
    for (bool bf16 : {false, true})
      for (recompute_policy p : policies) {
        const double measured = measured_peak(seq, p, bf16);
        std::printf("sweep: seq %lld policy %s dtype %s measured %.0f predicted %.0f\n", static_cast<long long>(seq),
                    std::string(nn::to_string(p)).c_str(), bf16 ? "bf16" : "float", measured, predicted_peak(seq, p, bf16));
        std::fflush(stdout);
      }
}

}  // namespace

int main(int argc, char** argv) {
  example_support::use_native_blas_kernel(argv);
  Kokkos::ScopeGuard kokkos(argc, argv);
  baton::nn::set_blas_threads(1);
  bool quick = false, fit_only = false, sweep_only = false;
  double budget = 512.0 * 1024 * 1024;
  std::vector<std::int64_t> sweep_seqs{256, 512, 1024, 1536};
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::strcmp(argv[i], "--quick") == 0;
    fit_only = fit_only || std::strcmp(argv[i], "--fit") == 0;
    sweep_only = sweep_only || std::strcmp(argv[i], "--sweep") == 0;
    if (std::strcmp(argv[i], "--budget-mib") == 0 && i + 1 < argc) budget = std::atof(argv[++i]) * 1024 * 1024;
  }
  if (sweep_only) {
    bench::print_build();
    bench::print_load("before");
    sweep(sweep_seqs);
    bench::print_load("after");
    return 0;
  }
  if (fit_only) {
    bench::print_build();
    bench::print_load("before");
    const bool ok = fit(budget, true);
    bench::print_load("after");
    return ok ? 0 : 1;
  }
  const int pairs = bench::pairs_from_args(argc, argv, bench::min_pairs);
  const std::vector<std::int64_t> seqs = quick ? std::vector<std::int64_t>{128} : std::vector<std::int64_t>{256, 512};
  bench::print_build();
  bench::print_load("before");
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const std::int64_t seq = seqs[i];
    const figures f = measure(seq, pairs);
    const bf16_ratios bf16_ratio = measure_bf16(seq, pairs);
    for (const std::string& suffix : {"_seq" + std::to_string(seq), std::string()}) {
      if (suffix.empty() && i + 1 != seqs.size()) continue;
      bench::print("recompute_full_step_ratio" + suffix, f.full_ratio, "%.3f");
      bench::print("recompute_selective_step_ratio" + suffix, f.selective_ratio, "%.3f");
      bench::print("bf16_step_ratio" + suffix, bf16_ratio.full, "%.3f");
      bench::print("bf16_storage_step_ratio" + suffix, bf16_ratio.storage_only, "%.3f");
      for (std::size_t p = 0; p < 3; ++p) {
        const std::string name(nn::to_string(policies[p]));
        bench::print_value("peak_bytes_" + name + suffix, f.peak[p], "%.0f");
        bench::print_value("predicted_peak_bytes_" + name + suffix, predicted_peak(seq, policies[p]), "%.0f");
      }
    }
    std::fflush(stdout);
  }
  const bool ok = fit(budget, !quick);
  bench::print_load("after");
  return ok ? 0 : 1;
}
