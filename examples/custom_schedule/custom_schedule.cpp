// A schedule policy of your own: a type with generate(), splits_backward and
// default_placement, proved valid at compile time for a fixed shape and compared with the
// built-in 1F1B by the simulator.
//
// eager_1f1b<Extra> is 1F1B whose ranks run Extra more warm-up forwards than they need:
// the pipeline keeps Extra more microbatches alive per rank, and in exchange a rank has a
// forward to do while a gradient is still on the wire, so slow messages stall it less.
#include <baton/schedule.hpp>

#include <algorithm>
#include <cstdio>

template <int Extra>
struct eager_1f1b {
  static constexpr bool splits_backward = false;
  static constexpr baton::placement default_placement = baton::placement::loop;

  static constexpr baton::program generate(const baton::schedule_shape& s) {
    if (s.stages_per_rank != 1 || s.place != baton::placement::loop)
      throw baton::schedule_error("eager_1f1b: one stage per rank in loop placement, please");
    baton::program prog{s, std::vector<std::vector<baton::action>>(static_cast<std::size_t>(s.ranks))};
    const int m = s.microbatches;
    for (int r = 0; r < s.ranks; ++r) {
      auto& row = prog.ranks[static_cast<std::size_t>(r)];
      const int warmup = std::min(m, s.ranks - 1 - r + Extra);
      int f = 0, b = 0;
      while (f < warmup) row.push_back({r, baton::action_kind::forward, f++});
      while (f < m) {
        row.push_back({r, baton::action_kind::forward, f++});
        row.push_back({r, baton::action_kind::backward, b++});
      }
      while (b < m) row.push_back({r, baton::action_kind::backward, b++});
    }
    return prog;
  }
};

static_assert(baton::schedule_policy<eager_1f1b<1>>);
// Generation, lowering to messages and validation (dependencies, pairing, no deadlock) all
// run while compiling: a mistake in generate() is a compile error here.
static_assert(baton::is_valid(baton::lower(eager_1f1b<1>::generate({4, 1, 8}))));
static_assert(baton::is_valid(baton::lower(eager_1f1b<2>::generate({4, 1, 8}))));

int main() {
  const baton::schedule_shape shape{4, 1, 8};
  // Messages that take as long as a forward.
  baton::cost_model costs = baton::cost_model::uniform(1, 1, 1, /*communication=*/1.0);
  const auto standard = baton::simulate(baton::one_f_one_b::generate(shape), costs);
  const auto eager = baton::simulate(eager_1f1b<1>::generate(shape), costs);
  std::printf("%s", baton::format_grid(eager_1f1b<1>::generate(shape)).c_str());
  std::printf("1F1B:          makespan %.2f, bubble %.3f, peak live %d\n", standard.makespan, standard.bubble_ratio,
              standard.peak_live());
  std::printf("eager 1F1B +1: makespan %.2f, bubble %.3f, peak live %d\n", eager.makespan, eager.bubble_ratio,
              eager.peak_live());
  return eager.peak_live() == standard.peak_live() + 1 ? 0 : 1;
}
