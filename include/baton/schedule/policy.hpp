// baton/schedule/policy.hpp — the schedule_policy concept.
#pragma once

#include <baton/schedule/program.hpp>

#include <concepts>
#include <string>
#include <type_traits>

namespace baton {

// A schedule policy turns a shape into each rank's compute order.
//
// Requirements on a type P (with p a const P and s a schedule_shape):
//   1. p.generate(s) returns a baton::program of compute actions only (F, B, I, W), one
//      row per rank, with program.shape == s; a shape the policy cannot serve throws
//      baton::schedule_error saying what to change. A static member function works.
//   2. P::splits_backward is a constant bool: true when the program may use I and W (the
//      pipeline's stages must then model split_backward_stage).
//   3. P::default_placement is a constant baton::placement: the layout the policy is
//      designed for (placement::v for V-shaped schedules).
//   Optional: P::default_stages_per_rank (an int constant; 1 when absent), used by
//   shape_for<P>().
//
// Example:
// ```cpp
//   struct forward_then_backward {
//     static constexpr bool splits_backward = false;
//     static constexpr baton::placement default_placement = baton::placement::loop;
//     static constexpr baton::program generate(const baton::schedule_shape& s) {
//       baton::program p{s, std::vector<std::vector<baton::action>>(s.ranks)};
//       for (int r = 0; r < s.ranks; ++r) {
//         for (int mb = 0; mb < s.microbatches; ++mb) p.ranks[r].push_back({r, baton::action_kind::forward, mb});
//         for (int mb = 0; mb < s.microbatches; ++mb) p.ranks[r].push_back({r, baton::action_kind::backward, mb});
//       }
//       return p;
//     }
//   };
//   static_assert(baton::schedule_policy<forward_then_backward>);
//   static_assert(baton::is_valid(forward_then_backward::generate({4, 1, 8})));
// ```
template <class P>
concept schedule_policy = requires(const P& p, const schedule_shape& s) {
  { p.generate(s) } -> std::same_as<program>;
  { P::splits_backward } -> std::convertible_to<bool>;
  { P::default_placement } -> std::convertible_to<placement>;
  typename std::bool_constant<static_cast<bool>(P::splits_backward)>;
  typename std::integral_constant<placement, static_cast<placement>(P::default_placement)>;
};

namespace detail::schedule {

template <class P>
constexpr int default_stages_per_rank() {
  if constexpr (requires { P::default_stages_per_rank; })
    return static_cast<int>(P::default_stages_per_rank);
  else
    return 1;
}

template <class P>
constexpr void require_policy() {
  static_assert(schedule_policy<P>,
                "baton: this type is not a schedule_policy. Give it `static program generate(const "
                "schedule_shape&)` (compute actions, one row per rank), `static constexpr bool splits_backward` "
                "and `static constexpr baton::placement default_placement`; see baton/schedule/policy.hpp.");
}

// The constants of requirements 2 and 3 and the optional default_stages_per_rank, in the
// order policy_traits<splits_backward, default_placement, default_stages_per_rank>: the
// built-in policies derive from it rather than each spelling the three out.
template <bool SplitsBackward, placement DefaultPlacement, int DefaultStagesPerRank>
struct policy_traits {
  static constexpr bool splits_backward = SplitsBackward;
  static constexpr placement default_placement = DefaultPlacement;
  static constexpr int default_stages_per_rank = DefaultStagesPerRank;
};

// Policies report impossible shapes through this, naming themselves and the fix.
inline void shape_error(const char* policy, const std::string& what) {
  throw schedule_error(std::string("baton::") + policy + ": " + what);
}

}  // namespace detail::schedule

// The shape a policy is designed for: its default placement and (when stages_per_rank is
// 0) its default stages per rank, e.g. shape_for<zbv>(4, 8) == {4, 2, 8, placement::v}.
template <class P>
[[nodiscard]] constexpr schedule_shape shape_for(int ranks, int microbatches, int stages_per_rank = 0) {
  detail::schedule::require_policy<P>();
  return schedule_shape{ranks, stages_per_rank > 0 ? stages_per_rank : detail::schedule::default_stages_per_rank<P>(),
                        microbatches, static_cast<placement>(P::default_placement)};
}

// p.generate(shape) for a policy type, with a readable error when P is not one.
template <class P>
[[nodiscard]] constexpr program generate(const schedule_shape& shape, const P& policy = P{}) {
  detail::schedule::require_policy<P>();
  return policy.generate(shape);
}

}  // namespace baton
