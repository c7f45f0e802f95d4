// Command-line helpers for baton's programs (baton-train, baton-schedule), on CLI11: program
// code, never included by the library. Every value is parsed strictly, whole and in decimal
// (no octal "010", no "1e3" for an integer, no trailing text), range-checked in the type it
// is stored in (so 4294967298 is refused, not truncated to 2), and refused with a message
// that names the flag, the accepted range and the text given. NaN and infinities are refused
// for every number. A parse error is explained in words: "unknown option" (with the closest
// known name), "needs a value", "given twice".
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

namespace example_support::cli {

inline std::string number_text(double x) {
  char text[40];
  std::snprintf(text, sizeof text, "%g", x);
  return text;
}

/// The integer `text` is, if it is one (optional '-', decimal digits, nothing else) and lies
/// in [lo, hi]; otherwise CLI::ValidationError naming `flag` and the range.
template <class Int>
Int parse_integer(const std::string& flag, const std::string& text, Int lo, Int hi) {
  const auto fail = [&](const char* why) -> Int {
    throw CLI::ValidationError(flag + " must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
                               ", got '" + text + "'" + why);
  };
  const bool negative = !text.empty() && text[0] == '-';
  const std::string_view digits = std::string_view(text).substr(negative ? 1 : 0);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return fail(" (decimal digits only)");
  // Parsed in the widest type of Int's signedness: a value beyond it, or beyond [lo, hi], is
  // out of range (never wrapped or truncated).
  using Wide = std::conditional_t<std::is_signed_v<Int>, long long, unsigned long long>;
  if (negative && !std::is_signed_v<Int>) return fail("");
  Wide value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || value < static_cast<Wide>(lo) ||
      value > static_cast<Wide>(hi))
    return fail("");
  return static_cast<Int>(value);
}

/// The finite number `text` is (decimal or scientific notation, nothing after it) when it
/// satisfies `ok`; otherwise CLI::ValidationError "<flag> must be <what>, got '<text>'".
template <class Ok>
double parse_number(const std::string& flag, const std::string& text, const std::string& what, Ok ok) {
  double value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value, std::chars_format::general);
  if (text.empty() || ec != std::errc() || ptr != end || !std::isfinite(value) || !ok(value))
    throw CLI::ValidationError(flag + " must be " + what + ", got '" + text + "'");
  return value;
}

/// --name INT in [lo, hi], stored in `target`.
template <class Int>
CLI::Option* add_integer(CLI::App& app, const std::string& name, Int& target, Int lo, Int hi, const std::string& help) {
  CLI::Option* o = app.add_option(
      name, [name, &target, lo, hi](const CLI::results_t& r) {
        target = parse_integer<Int>(name, r.at(0), lo, hi);
        return true;
      },
      help);
  o->type_name("INT")->default_str(std::to_string(target))->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  return o;
}

/// --name X, a finite number for which `ok(x)` holds (`what` says which, for the message).
template <class Ok>
CLI::Option* add_number(CLI::App& app, const std::string& name, double& target, const std::string& what, Ok ok,
                        const std::string& help) {
  CLI::Option* o = app.add_option(
      name, [name, &target, what, ok](const CLI::results_t& r) {
        target = parse_number(name, r.at(0), what, ok);
        return true;
      },
      help);
  o->type_name("X")->default_str(number_text(target))->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  return o;
}

/// --name WORD, one of `choices`, stored as the text.
inline CLI::Option* add_choice(CLI::App& app, const std::string& name, std::string& target,
                               const std::vector<std::string>& choices, const std::string& help) {
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : "|") + c;
  CLI::Option* o = app.add_option(
      name, [name, &target, choices, list](const CLI::results_t& r) {
        if (std::find(choices.begin(), choices.end(), r.at(0)) == choices.end())
          throw CLI::ValidationError(name + " is one of " + list + ", got '" + r.at(0) + "'");
        target = r.at(0);
        return true;
      },
      help);
  o->type_name(list)->default_str(target)->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  return o;
}

/// --name TEXT (a path, a name), any non-empty text.
inline CLI::Option* add_text(CLI::App& app, const std::string& name, std::string& target, const std::string& type,
                             const std::string& help) {
  CLI::Option* o = app.add_option(
      name, [name, &target](const CLI::results_t& r) {
        if (r.at(0).empty()) throw CLI::ValidationError(name + " needs a non-empty value");
        target = r.at(0);
        return true;
      },
      help);
  o->type_name(type)->multi_option_policy(CLI::MultiOptionPolicy::Throw);
  if (!target.empty()) o->default_str(target);
  return o;
}

inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

/// The long names of `app`'s options ("--pp", ...).
inline std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* o : app.get_options())
    for (const std::string& n : o->get_lnames()) names.push_back("--" + n);
  return names;
}

/// " (did you mean --lr?)" when a known name is within 2 edits of `given`, else "".
inline std::string suggestion(const std::string& given, const std::vector<std::string>& known) {
  const std::string bare = given.substr(0, given.find('='));
  std::string best;
  std::size_t distance = 3;
  for (const auto& k : known) {
    const std::size_t d = edit_distance(bare, k);
    if (d < distance) {
      distance = d;
      best = k;
    }
  }
  return best.empty() ? "" : " (did you mean " + best + "?)";
}

/// The parse error in words. `app` is the (sub)command that failed; `elsewhere(name)` may say
/// where an option that is not this command's belongs ("" when nowhere).
template <class Elsewhere>
std::string explain(const CLI::ParseError& e, const CLI::App& app, Elsewhere elsewhere) {
  const std::string what = e.what();
  const std::string name = what.substr(0, what.find(':'));
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
    std::vector<std::string> extras = app.remaining();
    for (const std::string& x : extras)
      if (x.size() > 1 && x[0] == '-' && !(x[1] >= '0' && x[1] <= '9') && x[1] != '.') {
        const std::string bare = x.substr(0, x.find('='));
        if (std::string where = elsewhere(bare); !where.empty()) return bare + " " + where;
        return "unknown option " + bare + suggestion(bare, option_names(app));
      }
    std::string list;
    for (const std::string& x : extras) list += (list.empty() ? "'" : ", '") + x + "'";
    return "unexpected argument" + std::string(extras.size() > 1 ? "s " : " ") + list;
  }
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    if (what.find("required") != std::string::npos && what.find("missing") != std::string::npos)
      return name + " needs a value";
    if (what.find("At Most") != std::string::npos) return name + " is given more than once; give it once";
  }
  return what;
}

}  // namespace example_support::cli
