// baton/core/meta.hpp — compile-time helpers every layer uses: a string usable as a template
// argument (record field names, tag range names) and the false that waits for instantiation
// (a static_assert in a primary template that names what to specialise).
#pragma once

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace baton {

/// A string usable as a template argument: `field<"hidden", T>`, `tag_range<"cp", 64, 16>`.
template <std::size_t N>
struct fixed_string {
  char chars[N]{};

  constexpr fixed_string(const char (&s)[N]) noexcept { std::copy_n(s, N, chars); }  // NOLINT: implicit by design

  constexpr std::string_view view() const noexcept { return {chars, N - 1}; }
  constexpr operator std::string_view() const noexcept { return view(); }

  template <std::size_t M>
  constexpr bool operator==(const fixed_string<M>& other) const noexcept {
    return view() == other.view();
  }
};

namespace detail::core {
/// false, but only once T is known: `static_assert(dependent_false_v<T>, "what to do")` in a
/// branch or primary template fires when that branch is instantiated, not when it is parsed.
template <class T>
inline constexpr bool dependent_false_v = false;
}  // namespace detail::core

}  // namespace baton
