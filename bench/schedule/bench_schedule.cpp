// Time to generate, lower and validate big schedules, against the simulator run on the same
// program in the same pair (the reference: the same dependency walk over the same index, so it
// moves with the machine as validation does) and against a copy of the lowered program (the
// roof: a pass that allocates and writes the same actions once). Validation is linear in the
// number of actions, so 64 ranks x 512 microbatches (454 656 lowered actions) takes
// milliseconds.
//
//   bench_schedule [--pairs N]
//
// Each pair times the copy and the work in turn (--pairs, 7 by default, at least 5, the order
// flipping from pair to pair), each as the best of 3 calls in a row:
//   schedule_zbv_p64_m512_ms                     generate + lower (which validates the compute
//                                                program) + validate the lowered one
//   schedule_validate_zbv_p64_m512_lowered_ms    validate the lowered program
//   schedule_simulate_zbv_p64_m512_ms            simulate it
//   schedule_copy_zbv_p64_m512_lowered_ms        copy it (the roof)
//   schedule_*_vs_simulate                       each time / the simulator's, per pair
//   schedule_*_vs_copy                           each time / the copy's, per pair (a copy
//                                                streams; validation chases indices, so this
//                                                ratio grows when a neighbour takes the cache)
//   schedule_zbv_p64_m64_ms                      the first line's work at 64 microbatches
//   schedule_zbv_p64_m512_vs_m64_per_action      time per lowered action at 512 microbatches /
//                                                at 64, per pair: 1 if the cost were only the
//                                                number of actions; the index validation builds
//                                                (64 bytes per stage and microbatch: 4 MiB at
//                                                m = 512) outgrows the core's L2 cache, and the
//                                                random accesses into it then cost 2-3x more
//   schedule_zbv_p64_m512_sys_fraction           system CPU time / all CPU time of the first
//                                                line's work: page faults of fresh memory
//   schedule_zbv_p64_m512_page_faults            minor page faults per such call (the first of
//                                                each 3 takes most)
// Validation is linear in the number of actions (the m64 line checks it), but memory-bound:
// a figure several times the notes' on another machine of the same kind comes from the cache
// and memory it shares (a compiler or a test on the other core, a neighbour on the host: the
// load average does not see the latter), an unoptimised build (see `build:`; -O2 without
// -march=native is 1.5x slower, -O0 10x), or page faults that cost more (the sys fraction).
#include "bench_common.hpp"

#include <baton/schedule.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace {

struct usage {
  double user = 0, system = 0;
  long minor_faults = 0;
};

usage process_usage() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {static_cast<double>(u.ru_utime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec),
          static_cast<double>(u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_stime.tv_usec), u.ru_minflt};
}

// The best of 3 calls: the steady state (the allocator has the memory of the previous call),
// and one interruption does not set a figure.
double milliseconds(const std::function<void()>& work) {
  double best = 1e300;
  for (int i = 0; i < 3; ++i) {
    const auto start = std::chrono::steady_clock::now();
    work();
    best = std::min(best, 1e3 * bench::seconds_since(start));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int pairs = bench::pairs_from_args(argc, argv);
  bench::print_build();
  bench::print_load("before");
  const auto shape = baton::shape_for<baton::zbv>(64, 512);
  const baton::program lowered = baton::lower(baton::zbv::generate(shape));
  std::size_t actions = 0;
  double makespan = 0;
  usage spent;  // of the pipeline runs
  int runs = 0;
  const auto pipeline = [&] {
    const usage before = process_usage();
    const baton::program compute = baton::zbv::generate(shape);
    const baton::program lowered_again = baton::lower(compute);  // validates the compute-only program
    baton::validate(lowered_again);
    actions = baton::action_count(lowered_again);
    const usage after = process_usage();
    spent.user += after.user - before.user;
    spent.system += after.system - before.system;
    spent.minor_faults += after.minor_faults - before.minor_faults;
    ++runs;
  };
  const auto copy_ms = [&] {
    return milliseconds([&] {
      const baton::program duplicate = lowered;
      if (duplicate.ranks.size() != lowered.ranks.size()) std::printf("copy failed\n");
    });
  };
  const auto small_shape = baton::shape_for<baton::zbv>(64, 64);
  std::size_t small_actions = 0;
  const auto small_pipeline = [&] {
    const baton::program small = baton::lower(baton::zbv::generate(small_shape));
    baton::validate(small);
    small_actions = baton::action_count(small);
  };
  const std::array<std::function<void()>, 4> work{pipeline, [&] { baton::validate(lowered); },
                                                  [&] { makespan = baton::simulate(lowered).makespan; }, small_pipeline};
  const std::array<const char*, 4> names{"schedule_zbv_p64_m512", "schedule_validate_zbv_p64_m512_lowered",
                                         "schedule_simulate_zbv_p64_m512", "schedule_zbv_p64_m64"};
  for (const auto& w : work) w();  // warm up
  static_cast<void>(copy_ms());
  bench::series roof, per_action, pipeline_vs_simulate, validate_vs_simulate;
  std::array<bench::series, 4> ms, vs_copy;
  for (int p = 0; p < pairs; ++p) {
    // The copy, then the pieces of work, or the other way round.
    std::array<double, 4> t{};
    double c = 0;
    if (p % 2 == 0) c = copy_ms();
    for (std::size_t i = 0; i < work.size(); ++i) {
      const std::size_t k = p % 2 == 0 ? i : work.size() - 1 - i;
      t[k] = milliseconds(work[k]);
    }
    if (p % 2 != 0) c = copy_ms();
    roof.add(c);
    for (std::size_t i = 0; i < work.size(); ++i) {
      ms[i].add(t[i]);
      vs_copy[i].add(t[i] / c);
    }
    per_action.add((t[0] / static_cast<double>(actions)) / (t[3] / static_cast<double>(small_actions)));
    pipeline_vs_simulate.add(t[0] / t[2]);
    validate_vs_simulate.add(t[1] / t[2]);
  }
  for (std::size_t i = 0; i < 3; ++i) {
    bench::print(std::string(names[i]) + "_ms", ms[i], "%.3f");
    if (i == 0) bench::print(std::string(names[i]) + "_vs_simulate", pipeline_vs_simulate, "%.3f");
    if (i == 1) bench::print(std::string(names[i]) + "_vs_simulate", validate_vs_simulate, "%.3f");
    bench::print(std::string(names[i]) + "_vs_copy", vs_copy[i], "%.2f");
  }
  bench::print(std::string(names[3]) + "_ms", ms[3], "%.3f");
  bench::print("schedule_zbv_p64_m512_vs_m64_per_action", per_action, "%.2f");
  bench::print("schedule_copy_zbv_p64_m512_lowered_ms", roof, "%.3f");
  std::printf("schedule_zbv_p64_m512_lowered_actions: %zu\n", actions);
  std::printf("schedule_zbv_p64_m512_sys_fraction: %.3f\n", spent.system / (spent.user + spent.system));
  std::printf("schedule_zbv_p64_m512_page_faults: %ld\n", spent.minor_faults / runs);
  std::printf("schedule_zbv_p64_m512_makespan: %.1f\n", makespan);
  bench::print_load("after");
  return actions > 0 ? 0 : 1;
}
