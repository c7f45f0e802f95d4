// bench_pipeline — figures of the pipeline executor, one `NAME: value` line each.
//
//   executor_overhead_us_per_action   4 ranks of the local world, stages that do nothing:
//                                     CPU time of a rank's thread per action it runs
//   executor_wall_us_per_action       the same setting: wall time of a step / actions of the
//                                     busiest rank (adds thread wake-up latency)
//   makespan_vs_simulated_1f1b        p = 4, m = 8, stages that sleep T_F = 20 ms, T_B = 40 ms:
//   makespan_vs_simulated_zbv         measured step time / the simulator's makespan for the
//                                     same program and costs (T_F = T_I = T_W = 20 ms for ZBV)
// Sleeping stages make the makespans independent of how many cores the machine has.
#include <baton/comm.hpp>
#include <baton/payload.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <mutex>
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

int main() {
  using namespace std::chrono_literals;
  {
    const auto shape = baton::shape_for<baton::one_f_one_b>(4, 8);
    const timing t = run<baton::one_f_one_b>(shape, 0us, 0us, 0us, 20, 200);
    // The executor's cost per action: CPU time of a rank's thread (executor plus communicator
    // calls, not time spent blocked waiting for a peer) divided by the actions it ran.
    std::printf("executor_overhead_us_per_action: %.2f\n",
                t.cpu_seconds_per_step * 1e6 / static_cast<double>(t.mean_actions));
    // Wall time of a step over the busiest rank's actions: adds the local world's thread
    // wake-up latency along the schedule's critical path (machine- and load-dependent).
    std::printf("executor_wall_us_per_action: %.2f\n",
                t.seconds_per_step * 1e6 / static_cast<double>(t.busiest_actions));
  }
  const double r1 = makespan_ratio<baton::one_f_one_b>("1f1b", 20ms, 20ms, 20ms);
  std::printf("makespan_vs_simulated_1f1b: %.3f\n", r1);
  const double rz = makespan_ratio<baton::zbv>("zbv", 20ms, 20ms, 20ms);
  std::printf("makespan_vs_simulated_zbv: %.3f\n", rz);
  return 0;
}
