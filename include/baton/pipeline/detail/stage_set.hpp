// baton/pipeline/detail/stage_set.hpp — the stage types of one pipeline: what
// stage_list<S...> and uniform_stages<S> stand for (the types, which type index runs stage s,
// the common side input) and the compile-time checks that they chain.
#pragma once

#include <baton/pipeline/stage.hpp>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace baton::detail::pipeline {

template <class Stages>
struct stage_set {
  static_assert(core::dependent_false_v<Stages>,
                "baton::pipeline_executor: the stage types are given as baton::stage_list<S0, S1, ...> "
                "(one type per stage) or baton::uniform_stages<S> (every stage of type S)");
};

template <class... S>
struct stage_set<stage_list<S...>> {
  static_assert(sizeof...(S) > 0, "baton::stage_list needs at least one stage type");
  using types = std::tuple<S...>;
  static constexpr std::size_t type_count = sizeof...(S);
  static constexpr bool uniform = false;
  static constexpr std::size_t type_of(int stage) noexcept { return static_cast<std::size_t>(stage); }
};

template <class S>
struct stage_set<uniform_stages<S>> {
  using types = std::tuple<S>;
  static constexpr std::size_t type_count = 1;
  static constexpr bool uniform = true;
  static constexpr std::size_t type_of(int) noexcept { return 0; }
};

// The side input type of a pipeline: the one `side` type its stages declare other than no_side.
template <class Tuple>
struct side_of;
template <class... S>
struct side_of<std::tuple<S...>> {
  template <class... T>
  struct first_real {
    using type = no_side;
  };
  template <class T, class... Rest>
  struct first_real<T, Rest...> {
    using type = std::conditional_t<std::is_same_v<T, no_side>, typename first_real<Rest...>::type, T>;
  };
  using type = typename first_real<typename S::side...>::type;
  static constexpr bool consistent =
      ((std::is_same_v<typename S::side, no_side> || std::is_same_v<typename S::side, type>) && ...);
};

// Whether stage Stage's output type is stage Stage + 1's input type. The failing assertion
// below shows this variable with its arguments, so the error names the boundary's index and
// both types (GCC in the note under the error, Clang in the error line itself).
template <std::size_t Stage, class Output, class NextInput>
inline constexpr bool stage_output_matches_next_input = std::is_same_v<Output, NextInput>;

// Instantiated once per boundary of a stage_list: each mismatch is its own error.
template <std::size_t Stage, class Output, class NextInput>
struct stage_boundary {
  static_assert(stage_output_matches_next_input<Stage, Output, NextInput>,
                "baton::stage_list<S0, S1, ...>: the output type of stage I must be exactly the input type of "
                "stage I+1, but at one boundary they differ; the compiler shows I and both types with this error, "
                "as stage_output_matches_next_input<I, output of stage I, input of stage I+1>; make the two types "
                "the same, converting inside one of the two stages");
  static constexpr bool matches = stage_output_matches_next_input<Stage, Output, NextInput>;
};

template <class Tuple, std::size_t... I>
constexpr bool boundaries_match(std::index_sequence<I...>) {
  return (stage_boundary<I, typename std::tuple_element_t<I, Tuple>::output,
                         typename std::tuple_element_t<I + 1, Tuple>::input>::matches &&
          ...);
}

// Every stage type is a stage, consecutive stages chain, and the side inputs agree (or a
// static_assert says what to change).
template <class Set>
constexpr bool check_stage_set() {
  using types = typename Set::types;
  constexpr bool all_stages = []<std::size_t... I>(std::index_sequence<I...>) {
    return (check_stage<std::tuple_element_t<I, types>>() && ...);
  }(std::make_index_sequence<Set::type_count>{});
  static_assert(all_stages);
  if constexpr (Set::uniform) {
    using S = std::tuple_element_t<0, types>;
    static_assert(std::is_same_v<typename S::input, typename S::output>,
                  "baton::uniform_stages<S>: the stages are chained, so S::output must be S::input; "
                  "for stages of different types use baton::stage_list<S0, S1, ...>");
  } else if constexpr (Set::type_count > 1) {
    // A mismatch fails inside stage_boundary, with its own message; asserting the result here
    // as well would only add an error without one.
    (void)boundaries_match<types>(std::make_index_sequence<Set::type_count - 1>{});
  }
  static_assert(side_of<types>::consistent,
                "baton pipeline: every stage must have the same `side` type or baton::no_side: side "
                "inputs are split once per microbatch and given to every stage");
  return true;
}

}  // namespace baton::detail::pipeline
