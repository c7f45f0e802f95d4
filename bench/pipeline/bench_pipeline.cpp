// bench_pipeline — figures of the pipeline executor, one `NAME: value` line each; figures
// taken over repetitions print as `name: median (min .., max .., n ..)`.
//
//   executor_overhead_us_per_action   4 ranks of the local world, stages that do nothing,
//                                     1F1B, p = 4, m = 8: CPU time of a rank's thread per
//                                     action it runs (the executor plus its communicator calls)
//   p2p_round_trip_cpu_us             the roof it is compared with, measured in the same run:
//                                     2 ranks of the local world bounce an 8-byte message
//                                     (isend + irecv each way); CPU time of a rank's thread
//                                     per round trip
//   executor_overhead_vs_p2p_round_trip
//                                     the ratio of the two, per repetition: what one action of
//                                     the executor costs in local round trips (CPU to CPU, so
//                                     neither side counts time spent descheduled)
//   executor_wall_us_per_action       wall time of a step / actions of the busiest rank
//   p2p_round_trip_wall_us            wall time of one round trip (thread wake-ups included)
//   executor_wall_vs_p2p_round_trip   their ratio, per repetition
//   makespan_vs_simulated_1f1b        p = 4, m = 8, stages that sleep T_F = 20 ms, T_B = 40 ms:
//   makespan_vs_simulated_zbv         measured step time / the simulator's makespan for the
//                                     same program and costs (T_F = T_I = T_W = 20 ms for ZBV)
//
// The executor and the round trip alternate (--pairs, 7 by default, at least 5), so a load
// change on the shared machine moves both sides of a ratio; the load average is printed
// before and after. Sleeping stages make the makespans independent of how many cores the
// machine has. `--overhead-only` skips the makespans (for profiling: perf record).
#include <baton/comm.hpp>
#include <baton/payload.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <time.h>  // clock_gettime(CLOCK_THREAD_CPUTIME_ID): the CPU time of one rank's thread

namespace {

using clock_type = std::chrono::steady_clock;
using tensor = baton::host_tensor<float>;

// A stage that sleeps for given forward / input-gradient / weight-gradient costs and passes a
// one-element tensor along (costs of zero: an empty stage).
struct sleeping_stage {
  using input = tensor;
  using output = tensor;
  using side = baton::no_side;
  struct saved {};
  std::chrono::microseconds f{}, i{}, w{};

  static void pause(std::chrono::microseconds d) {
    if (d.count() > 0) std::this_thread::sleep_for(d);
  }
  output forward(const input& x, const side&, saved&) {
    pause(f);
    return x;
  }
  baton::grad_t<input> backward_input(saved&, const baton::grad_t<output>& dy) {
    pause(i);
    return dy;
  }
  void backward_weight(saved&) { pause(w); }
  baton::grad_t<input> backward(saved& st, const baton::grad_t<output>& dy) {
    auto dx = backward_input(st, dy);
    backward_weight(st);
    return dx;
  }
};

struct zero_loss {
  baton::loss_result<tensor> operator()(const tensor& y, const tensor&) const { return {0.0, tensor(y.shape())}; }
};

struct timing {
  double seconds_per_step = 0;      // max over ranks of (end - start), averaged over steps
  double cpu_seconds_per_step = 0;  // mean over ranks of the rank thread's CPU time
  std::size_t busiest_actions = 0;
  std::size_t mean_actions = 0;
};

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

template <class Policy>
timing run(const baton::schedule_shape& shape, std::chrono::microseconds f, std::chrono::microseconds i,
           std::chrono::microseconds w, int warmup, int steps) {
  std::vector<double> elapsed(static_cast<std::size_t>(shape.ranks)), cpu(static_cast<std::size_t>(shape.ranks));
  std::vector<std::size_t> actions(static_cast<std::size_t>(shape.ranks));
  std::mutex m;
  baton::run_local(shape.ranks, [&](baton::local_communicator& comm) {
    auto pipe = baton::make_pipeline<Policy, baton::uniform_stages<sleeping_stage>>(
        comm, shape, [&](int) { return sleeping_stage{f, i, w}; }, zero_loss{});
    tensor batch({shape.microbatches, 1});
    for (int k = 0; k < warmup; ++k) pipe.step(batch, batch);
    comm.barrier();
    const auto start = clock_type::now();
    const double cpu_start = thread_cpu_seconds();
    std::size_t n = 0;
    for (int k = 0; k < steps; ++k) n = pipe.step(batch, batch).actions;
    const double s = std::chrono::duration<double>(clock_type::now() - start).count();
    const double c = thread_cpu_seconds() - cpu_start;
    std::lock_guard lock(m);
    elapsed[static_cast<std::size_t>(comm.rank())] = s;
    cpu[static_cast<std::size_t>(comm.rank())] = c;
    actions[static_cast<std::size_t>(comm.rank())] = n;
  });
  timing t;
  t.seconds_per_step = *std::max_element(elapsed.begin(), elapsed.end()) / steps;
  t.busiest_actions = *std::max_element(actions.begin(), actions.end());
  double cpu_total = 0;
  std::size_t actions_total = 0;
  for (std::size_t r = 0; r < cpu.size(); ++r) {
    cpu_total += cpu[r];
    actions_total += actions[r];
  }
  t.cpu_seconds_per_step = cpu_total / static_cast<double>(cpu.size()) / steps;
  t.mean_actions = actions_total / cpu.size();
  return t;
}

struct round_trip {
  double wall_seconds = 0;  // per round trip, on rank 0
  double cpu_seconds = 0;   // per round trip, mean over the two ranks' threads
};

// The roof: one small message there and back between two ranks of the local world, through
// the same communicator calls the executor makes (isend, irecv, wait).
round_trip time_round_trip(int warmup, int trips) {
  std::array<double, 2> wall{}, cpu{};
  baton::run_local(2, [&](baton::local_communicator& comm) {
    std::array<std::int64_t, 1> message{comm.rank()};
    const int peer = 1 - comm.rank();
    const auto bounce = [&] {
      if (comm.rank() == 0) {
        auto out = baton::isend(comm, std::span<const std::int64_t>(message), peer, 0);
        auto in = baton::irecv(comm, std::span<std::int64_t>(message), peer, 0);
        out.wait();
        in.wait();
      } else {
        auto in = baton::irecv(comm, std::span<std::int64_t>(message), peer, 0);
        in.wait();
        auto out = baton::isend(comm, std::span<const std::int64_t>(message), peer, 0);
        out.wait();
      }
    };
    for (int k = 0; k < warmup; ++k) bounce();
    comm.barrier();
    const auto start = clock_type::now();
    const double cpu_start = thread_cpu_seconds();
    for (int k = 0; k < trips; ++k) bounce();
    const auto r = static_cast<std::size_t>(comm.rank());
    cpu[r] = thread_cpu_seconds() - cpu_start;
    wall[r] = std::chrono::duration<double>(clock_type::now() - start).count();
  });
  return {wall[0] / trips, (cpu[0] + cpu[1]) / 2 / trips};
}

struct series {
  std::vector<double> values;
  void add(double v) { values.push_back(v); }
  [[nodiscard]] double median() const {
    std::vector<double> s = values;
    std::sort(s.begin(), s.end());
    const std::size_t n = s.size();
    return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  }
  [[nodiscard]] double min() const { return *std::min_element(values.begin(), values.end()); }
  [[nodiscard]] double max() const { return *std::max_element(values.begin(), values.end()); }
};

void print(const char* name, const series& s, const char* format) {
  char m[32], lo[32], hi[32];
  std::snprintf(m, sizeof m, format, s.median());
  std::snprintf(lo, sizeof lo, format, s.min());
  std::snprintf(hi, sizeof hi, format, s.max());
  std::printf("%s: %s (min %s, max %s, n %zu)\n", name, m, lo, hi, s.values.size());
}

// The 1-, 5- and 15-minute load averages, as /proc/loadavg has them.
std::string load_average() {
  std::ifstream in("/proc/loadavg");
  double a = -1, b = -1, c = -1;
  in >> a >> b >> c;
  char text[64];
  std::snprintf(text, sizeof text, "%.2f %.2f %.2f", a, b, c);
  return text;
}

template <class Policy>
double makespan_ratio(const char* name, std::chrono::milliseconds f, std::chrono::milliseconds i,
                      std::chrono::milliseconds w) {
  const auto shape = baton::shape_for<Policy>(4, 8);
  const auto costs = baton::cost_model::uniform(static_cast<double>(f.count()), static_cast<double>(i.count()),
                                                static_cast<double>(w.count()));
  const double simulated_ms = baton::simulate(baton::lower(Policy::generate(shape)), costs).makespan;
  // Best of two steps: a step is a second long, and on a loaded machine a late thread wake-up
  // (not the executor) can stretch one of them.
  const timing t = run<Policy>(shape, f, i, w, 0, 1);
  const timing again = run<Policy>(shape, f, i, w, 0, 1);
  const double measured_ms = std::min(t.seconds_per_step, again.seconds_per_step) * 1e3;
  std::printf("makespan_simulated_%s_ms: %.1f\n", name, simulated_ms);
  std::printf("makespan_measured_%s_ms: %.1f\n", name, measured_ms);
  return measured_ms / simulated_ms;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  int pairs = 7;
  int steps = 200;
  bool overhead_only = false;
  for (int a = 1; a < argc; ++a) {
    if (std::strcmp(argv[a], "--overhead-only") == 0) overhead_only = true;
    else if (std::strcmp(argv[a], "--pairs") == 0 && a + 1 < argc) pairs = std::max(5, std::atoi(argv[++a]));
    else if (std::strcmp(argv[a], "--steps") == 0 && a + 1 < argc) steps = std::max(1, std::atoi(argv[++a]));
  }
  std::printf("loadavg_before: %s\n", load_average().c_str());
  series overhead, wall, trip_cpu, trip_wall, ratio_cpu, ratio_wall;
  const auto shape = baton::shape_for<baton::one_f_one_b>(4, 8);
  for (int k = 0; k < pairs; ++k) {
    // Alternate which side goes first, so that neither always follows the other's wake-ups.
    timing t;
    round_trip rt;
    if (k % 2 == 0) {
      t = run<baton::one_f_one_b>(shape, 0us, 0us, 0us, 20, steps);
      rt = time_round_trip(200, 4000);
    } else {
      rt = time_round_trip(200, 4000);
      t = run<baton::one_f_one_b>(shape, 0us, 0us, 0us, 20, steps);
    }
    // The executor's cost per action: CPU time of a rank's thread (executor plus communicator
    // calls, not time spent blocked waiting for a peer) divided by the actions it ran.
    const double per_action = t.cpu_seconds_per_step / static_cast<double>(t.mean_actions);
    // Wall time of a step over the busiest rank's actions: adds the local world's thread
    // wake-up latency along the schedule's critical path (machine- and load-dependent).
    const double wall_per_action = t.seconds_per_step / static_cast<double>(t.busiest_actions);
    overhead.add(per_action * 1e6);
    wall.add(wall_per_action * 1e6);
    trip_cpu.add(rt.cpu_seconds * 1e6);
    trip_wall.add(rt.wall_seconds * 1e6);
    ratio_cpu.add(per_action / rt.cpu_seconds);
    ratio_wall.add(wall_per_action / rt.wall_seconds);
  }
  print("executor_overhead_us_per_action", overhead, "%.2f");
  print("p2p_round_trip_cpu_us", trip_cpu, "%.2f");
  print("executor_overhead_vs_p2p_round_trip", ratio_cpu, "%.3f");
  print("executor_wall_us_per_action", wall, "%.2f");
  print("p2p_round_trip_wall_us", trip_wall, "%.2f");
  print("executor_wall_vs_p2p_round_trip", ratio_wall, "%.3f");
  std::printf("loadavg_after: %s\n", load_average().c_str());
  if (overhead_only) return 0;
  const double r1 = makespan_ratio<baton::one_f_one_b>("1f1b", 20ms, 20ms, 20ms);
  std::printf("makespan_vs_simulated_1f1b: %.3f\n", r1);
  const double rz = makespan_ratio<baton::zbv>("zbv", 20ms, 20ms, 20ms);
  std::printf("makespan_vs_simulated_zbv: %.3f\n", rz);
  return 0;
}
