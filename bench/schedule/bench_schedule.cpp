// Time to generate, lower and validate big schedules: validation is linear in the number of
// actions, so 64 ranks x 512 microbatches (about 400k actions lowered) takes milliseconds.
#include <baton/schedule.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace {

template <class F>
double best_of_ms(int repeats, F&& work) {
  double best = 1e300;
  for (int i = 0; i < repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    work();
    const std::chrono::duration<double, std::milli> elapsed = std::chrono::steady_clock::now() - start;
    best = std::min(best, elapsed.count());
  }
  return best;
}

}  // namespace

int main() {
  const auto shape = baton::shape_for<baton::zbv>(64, 512);
  std::size_t actions = 0;
  const double pipeline_ms = best_of_ms(5, [&] {
    const baton::program compute = baton::zbv::generate(shape);
    const baton::program lowered = baton::lower(compute);  // validates the compute-only program
    baton::validate(lowered);
    actions = baton::action_count(lowered);
  });
  const baton::program lowered = baton::lower(baton::zbv::generate(shape));
  const double validate_ms = best_of_ms(5, [&] { baton::validate(lowered); });
  double makespan = 0;
  const double simulate_ms = best_of_ms(3, [&] { makespan = baton::simulate(lowered).makespan; });
  std::printf("schedule_zbv_p64_m512_ms: %.3f\n", pipeline_ms);
  std::printf("schedule_zbv_p64_m512_lowered_actions: %zu\n", actions);
  std::printf("schedule_validate_zbv_p64_m512_lowered_ms: %.3f\n", validate_ms);
  std::printf("schedule_simulate_zbv_p64_m512_ms: %.3f\n", simulate_ms);
  std::printf("schedule_zbv_p64_m512_makespan: %.1f\n", makespan);
  return actions > 0 ? 0 : 1;
}
