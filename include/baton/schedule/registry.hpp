// baton/schedule/registry.hpp — the built-in policies by name, for command lines and
// configuration files. Names are baton's (one_f_one_b, zbv, ...) or torch's
// (1F1B, ZBVZeroBubble, ...), compared case-insensitively. A torch name is one that
// torch.distributed.pipelining's get_schedule_class accepts; a policy torch has no such name
// for has an empty torch_name, and `origin` says where it comes from.
#pragma once

#include <baton/schedule/controllable_v.hpp>
#include <baton/schedule/policies.hpp>

#include <array>
#include <string>
#include <string_view>

namespace baton {

struct policy_info {
  std::string_view name;        // baton's type name
  std::string_view torch_name;  // torch's get_schedule_class name; empty: torch has none
  std::string_view origin;      // what the schedule is, and torch's class for it
  bool splits_backward;
  placement default_placement;
  int default_stages_per_rank;
  program (*generate)(const schedule_shape&);

  [[nodiscard]] constexpr schedule_shape shape(int ranks, int microbatches, int stages_per_rank = 0) const {
    return {ranks, stages_per_rank > 0 ? stages_per_rank : default_stages_per_rank, microbatches, default_placement};
  }
};

namespace detail::schedule {
template <class P>
constexpr policy_info info_of(std::string_view name, std::string_view torch_name, std::string_view origin) {
  return {name,       torch_name, origin, P::splits_backward, P::default_placement, P::default_stages_per_rank,
          &P::generate};
}
}  // namespace detail::schedule

// The torch names are keys of get_schedule_class's map in torch/distributed/pipelining/
// schedules.py (commit 00722e648b740f91d0e71494baa17891749fd291), which also names the base
// classes PipelineScheduleSingle and PipelineScheduleMulti (no schedule of their own).
inline constexpr std::array<policy_info, 11> builtin_policies{{
    detail::schedule::info_of<gpipe>("gpipe", "GPipe", "torch's ScheduleGPipe"),
    detail::schedule::info_of<one_f_one_b>("one_f_one_b", "1F1B", "torch's Schedule1F1B"),
    detail::schedule::info_of<interleaved_1f1b>("interleaved_1f1b", "Interleaved1F1B", "torch's ScheduleInterleaved1F1B"),
    detail::schedule::info_of<looped_bfs>("looped_bfs", "LoopedBFS", "torch's ScheduleLoopedBFS"),
    detail::schedule::info_of<zb1p>("zb1p", "", "ZB-H1; torch runs it as InterleavedZeroBubble at 1 stage per rank"),
    detail::schedule::info_of<interleaved_zero_bubble>("interleaved_zero_bubble", "InterleavedZeroBubble",
                                                    "torch's ScheduleInterleavedZeroBubble"),
    detail::schedule::info_of<zbv>("zbv", "ZBVZeroBubble", "torch's ScheduleZBVZeroBubble"),
    detail::schedule::info_of<dual_pipe_v>("dual_pipe_v", "DualPipeV", "torch's ScheduleDualPipeV"),
    detail::schedule::info_of<forward_only>("forward_only", "",
                                         "torch's _ScheduleForwardOnly, which get_schedule_class does not name"),
    detail::schedule::info_of<v_half>(
        "v_half", "", "V-Half of Qi et al. 2024, Pipeline Parallelism with Controllable Memory; not in torch"),
    detail::schedule::info_of<v_min>(
        "v_min", "", "V-Min of Qi et al. 2024, Pipeline Parallelism with Controllable Memory; not in torch"),
}};

namespace detail::schedule {
constexpr bool same_name(std::string_view a, std::string_view b) noexcept {
  auto fold = [](char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; };
  auto skip = [](char c) { return c == '_' || c == '-'; };
  std::size_t i = 0, j = 0;
  while (true) {
    while (i < a.size() && skip(a[i])) ++i;
    while (j < b.size() && skip(b[j])) ++j;
    if (i == a.size() || j == b.size()) return i == a.size() && j == b.size();
    if (fold(a[i]) != fold(b[j])) return false;
    ++i;
    ++j;
  }
}
}  // namespace detail::schedule

// The policy called `name` (baton's or torch's name; case, '_' and '-' ignored; "1f1b" and
// "zbv_zero_bubble" work too), or nullptr.
[[nodiscard]] constexpr const policy_info* find_policy(std::string_view name) noexcept {
  for (const auto& info : builtin_policies)
    if (detail::schedule::same_name(name, info.name) ||
        (!info.torch_name.empty() && detail::schedule::same_name(name, info.torch_name)))
      return &info;
  return nullptr;
}

// Like find_policy, but an unknown name throws schedule_error listing the known ones.
[[nodiscard]] inline const policy_info& policy_by_name(std::string_view name) {
  if (const auto* info = find_policy(name)) return *info;
  std::string known;
  for (const auto& info : builtin_policies) known += (known.empty() ? "" : ", ") + std::string(info.name);
  throw schedule_error("baton: unknown schedule policy " + detail::schedule::quote_for_message(name) + "; known: " + known);
}

}  // namespace baton
