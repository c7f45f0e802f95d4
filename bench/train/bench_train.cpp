// bench_train — training steps of a transformer LM on ranks that are threads, against the
// schedule simulator fed with the per-action times measured in the same steps.
//
//   env -u OPENBLAS_CORETYPE ./bench_train           5 interleaved repetitions of 4 steps per mesh
//   env -u OPENBLAS_CORETYPE ./bench_train --quick   what ctest runs (5 repetitions of 2 steps)
//
// Meshes: pp 2 x cp_ring 2 under ZBV (ring zigzag), and pp 4 under 1F1B; both 4 ranks on
// the local world, float, Kokkos attention, one BLAS thread per rank. Model: 8 layers,
// d_model 128, 4 heads / 2 kv heads, seq 512, 8 rows per step in 8 microbatches.
//
// Per step, per mesh:
//   train_step_vs_simulated   the pipeline call's wall time (its longest rank) / the makespan
//                             the simulator predicts for the same lowered program with the
//                             per-stage T_F, T_I, T_W (or T_B) measured in that very step
//                             (mean over the ranks that ran each stage; no communication
//                             cost): what the schedule itself explains. Goal <= 1.10.
//   train_overhead_fraction   (the whole training step's wall time - that makespan) / the
//                             step's wall time: everything that is neither compute nor the
//                             schedule's own bubbles — messages, waits beyond the schedule,
//                             the gradient all-reduce, clipping, AdamW, slicing the batch.
//                             Goal <= 0.05.
//   step_ms, tokens_per_s, measured_bubble (1 - mean busy share of the pipeline call),
//   simulated_bubble (the simulator's bubble ratio for the measured costs);
//   page_faults_first_step, page_faults_per_step   minor page faults of the whole process (all
//                             ranks) in the first step of a fresh world and in each measured
//                             step (goal: a measured step <= 1 % of the first);
//   metrics_cost_fraction     what baton-train's --metrics adds to a step (every rank gathers
//                             the stage times, rank 0 writes and flushes the JSON line), timed
//                             on rank 0 between barriers / the step's wall time. Goal <= 0.01.
//   trace_cost_fraction       what --trace adds to the one step it draws (every rank gathers
//                             the action events; rank 0 builds the measured and the simulated
//                             timelines and writes the trace) / the step's wall time: paid once
//                             per run, so a run of N steps pays it / N.
// Every figure prints as `name: median (min .., max .., n ..)` over the steps of all
// repetitions (--pairs, 5 by default, at least 5); the two meshes alternate repetition by
// repetition, and each ratio is taken per step against the simulator fed with that step's own
// action times; the load average prints before and after (bench_common.hpp).
#include "bench_common.hpp"
#include "native_blas.hpp"

#include <baton/attention/kokkos.hpp>
#include <baton/comm/local.hpp>
#include <baton/nn/blas.hpp>
#include <baton/schedule.hpp>
#include <baton/train.hpp>

#include <Kokkos_Core.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace {

namespace train = baton::train;

struct figures {
  std::map<std::string, bench::series> values;
  void add(const std::string& name, double v) { values[name].add(v); }
  void print(const std::string& prefix) const {
    for (const auto& [name, v] : values) bench::print(prefix + name, v);
  }
};

long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

struct mesh_case {
  std::string name;
  train::lm_parallelism parallelism;
  baton::program schedule;
};

// One repetition: a fresh world of 4 threads, `warmup` untimed steps, then `steps` measured.
void run_case(const mesh_case& c, const train::lm_config& config, const train::byte_corpus& corpus, int warmup,
              int steps, int first_step, figures& out) {
  const int ranks = c.parallelism.mesh.size();
  std::mutex m;
  std::vector<std::vector<baton::action_time>> times(static_cast<std::size_t>(ranks));
  std::vector<train::lm_step_report> reports(static_cast<std::size_t>(ranks));
  std::FILE* sink = std::tmpfile();  // where the metrics line and the trace go (a real file, removed when closed)
  if (sink == nullptr) {
    std::perror("bench_train: tmpfile");
    std::exit(1);
  }
  baton::run_local(ranks, [&](baton::local_communicator& world) {
    train::lm_trainer<float, baton::local_communicator, baton::kokkos_attention> trainer(world, config, c.parallelism,
                                                                                        c.schedule);
    const baton::program& lowered = trainer.executor().lowered_program();
    long faults_before = 0;
    for (int s = 0; s < warmup + steps; ++s) {
      world.barrier();
      if (world.rank() == 0) faults_before = minor_faults();
      const auto r = trainer.step(corpus.train_batch(first_step + s, config.batch, config.seq, false));
      world.barrier();
      if (world.rank() == 0) {
        // Every rank's faults (one process); the first step of a fresh world faults its
        // activations in, later ones reuse them.
        const double faults = static_cast<double>(minor_faults() - faults_before);
        if (s == 0) out.add("page_faults_first_step", faults);
        if (s >= warmup) out.add("page_faults_per_step", faults);
      }
      if (s < warmup) continue;
      {
        std::lock_guard<std::mutex> lock(m);
        times[static_cast<std::size_t>(world.rank())] = r.action_times;
        reports[static_cast<std::size_t>(world.rank())] = r;
      }
      world.barrier();
      if (world.rank() == 0) {
        std::vector<baton::action_time> all;
        for (const auto& t : times) all.insert(all.end(), t.begin(), t.end());
        const baton::cost_model costs = baton::measured_cost_model(all, lowered.shape.num_stages());
        const baton::simulation sim = baton::simulate(lowered, costs);
        double step_seconds = 0;
        for (const auto& rep : reports) step_seconds = std::max(step_seconds, rep.seconds);
        const auto& lead = reports[0];
        out.add("train_step_vs_simulated", lead.pipeline_seconds / sim.makespan);
        out.add("train_overhead_fraction", (step_seconds - sim.makespan) / step_seconds);
        out.add("step_ms", 1e3 * step_seconds);
        out.add("tokens_per_s", static_cast<double>(lead.tokens) / step_seconds);
        out.add("measured_bubble", lead.bubble_fraction);
        out.add("sync_fraction", lead.sync_seconds / step_seconds);
        out.add("optimizer_fraction", lead.optimizer_seconds / step_seconds);
        out.add("pipeline_excess_fraction", (lead.pipeline_seconds - sim.makespan) / step_seconds);
        out.add("simulated_bubble", sim.bubble_ratio);
      }
      world.barrier();
      // What --metrics and --trace add (examples/train_lm/run.hpp does the same per step).
      const auto t0 = std::chrono::steady_clock::now();
      const auto stage_times = train::gather_action_times(world, r.action_times, lowered.shape.num_stages());
      if (world.rank() == 0) {
        const std::string line =
            train::to_json_line({.step = s, .report = &r, .stage_times = stage_times, .num_stages = lowered.shape.num_stages(),
                                 .elapsed = 0, .eval_loss = std::nullopt, .predicted_peak_bytes = std::nullopt}) +
            "\n";
        std::fputs(line.c_str(), sink);
        std::fflush(sink);
      }
      world.barrier();
      const auto t1 = std::chrono::steady_clock::now();
      const auto events = train::gather_action_events(world, r.action_events);
      if (world.rank() == 0) {
        const std::string trace = train::measured_vs_simulated_trace(
            train::measured_timeline(events, c.schedule.shape), train::simulated_timeline(c.schedule, stage_times), c.name);
        std::fputs(trace.c_str(), sink);
        std::fflush(sink);
      }
      world.barrier();
      const auto t2 = std::chrono::steady_clock::now();
      if (world.rank() == 0) {
        double step_seconds = 0;
        for (const auto& rep : reports) step_seconds = std::max(step_seconds, rep.seconds);
        out.add("metrics_cost_fraction", std::chrono::duration<double>(t1 - t0).count() / step_seconds);
        out.add("trace_cost_fraction", std::chrono::duration<double>(t2 - t1).count() / step_seconds);
      }
      world.barrier();
    }
  });
  std::fclose(sink);
}

}  // namespace

int main(int argc, char** argv) {
  example_support::use_native_blas_kernel(argv);
  Kokkos::ScopeGuard kokkos(argc, argv);
  baton::nn::set_blas_threads(1);
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const int repetitions = bench::pairs_from_args(argc, argv, 5), steps = quick ? 2 : 4, warmup = 1;
  bench::print_build();
  bench::print_load("before");

  train::lm_config config;
  config.model = {.d_model = 128, .heads = 4, .kv_heads = 2, .vocab = train::byte_corpus::vocab};
  config.layers = 8;
  config.seq = 512;
  config.batch = 8;
  config.optimizer.lr = 1e-3;
  const train::byte_corpus corpus = train::byte_corpus::from_file("/usr/share/common-licenses/GPL-3");

  const std::vector<mesh_case> cases{
      {"pp2xcp2_zbv", {{.pp = 2, .cp_ring = 2}, baton::nn::cp_mode::ring, baton::shard_layout::zigzag},
       baton::zbv::generate(baton::shape_for<baton::zbv>(2, 8))},
      {"pp4_1f1b", {{.pp = 4}, baton::nn::cp_mode::none, baton::shard_layout::zigzag},
       baton::one_f_one_b::generate(baton::shape_for<baton::one_f_one_b>(4, 8))},
  };
  std::printf("openblas_core: %s\n", baton::nn::blas_kernel().c_str());
  std::printf("model: 8 layers, d_model 128, 4 heads / 2 kv heads, seq 512, 8 rows per step, 8 microbatches, float, "
              "kokkos attention; 4 ranks as threads\n");
  std::printf("repetitions: %d interleaved, %d measured step(s) each after %d warm-up\n", repetitions, steps, warmup);
  std::vector<figures> results(cases.size());
  for (int rep = 0; rep < repetitions; ++rep)
    for (std::size_t c = 0; c < cases.size(); ++c)
      run_case(cases[c], config, corpus, warmup, steps, rep * (steps + warmup), results[c]);
  for (std::size_t c = 0; c < cases.size(); ++c) results[c].print(cases[c].name + "_");
  bench::print_load("after");
  return 0;
}
