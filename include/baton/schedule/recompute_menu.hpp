// baton/schedule/recompute_menu.hpp — what the planner is told about recomputation and memory:
// each stage's options (recompute_option: the bytes a live microbatch of the stage holds, before
// and after its backward-input, and the time that backward-input pays to recompute), a rank's
// memory budget in bytes, and the per-rank peak of a program's live bytes under such options.
// synthesize_with_recompute (recompute_plan.hpp) chooses among the options.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/program.hpp>

#include <algorithm>
#include <cstddef>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace baton {

// One way to run a stage's backward. A live microbatch of the stage holds saved_bytes from its
// F to its I, and weight_bytes (what W reads: the GEMMs' inputs and output gradients; unset:
// saved_bytes) from its I to its W; a fused B frees saved_bytes. extra_backward_input is the
// time the I (and a fused B) pays to recompute; F and W cost the same under every option.
struct recompute_option {
  std::string name;  // e.g. "none", "selective", "full"
  double saved_bytes = 0;
  double extra_backward_input = 0;
  std::optional<double> weight_bytes{};
};

// One list of options for every stage, or one list per stage.
using recompute_menu = std::vector<std::vector<recompute_option>>;

// What a rank may hold: cap_bytes >= fixed_bytes (one value for every rank, or one per rank) +
// the peak of its live microbatch-stages' bytes.
struct memory_budget {
  double cap_bytes = std::numeric_limits<double>::infinity();
  std::vector<double> fixed_bytes{0.0};
};

// Per rank, the most bytes its live microbatch-stages hold at once when each holds saved[s]
// from its F to its I (or B) and weight[s] from its I to its W. Program order on a rank is
// execution order, so no timing is needed (as in simulate()'s peak_activation).
[[nodiscard]] inline std::vector<double> live_bytes_peak(const program& prog, const std::vector<double>& saved,
                                                         const std::vector<double>& weight) {
  std::vector<double> peak;
  for (const auto& row : prog.ranks) {
    double live = 0, most = 0;
    for (const action& a : row) {
      const auto s = static_cast<std::size_t>(a.stage);
      if (a.kind == action_kind::forward) live += saved[s];
      else if (a.kind == action_kind::backward_input) live += weight[s] - saved[s];
      else if (a.kind == action_kind::backward_weight) live -= weight[s];
      else if (a.kind == action_kind::backward) live -= saved[s];
      most = std::max(most, live);
    }
    peak.push_back(most);
  }
  return peak;
}

}  // namespace baton
