// baton/schedule/detail/text.hpp — constexpr number formatting for action tokens.
//
// std::to_chars is not constexpr in C++20 and std::to_string never is, yet the action
// text form must be printable while a schedule is checked by static_assert.
#pragma once

#include <string>
#include <string_view>

namespace baton::detail::schedule {

constexpr void append_int(std::string& out, long long value) {
  // Negate in unsigned arithmetic so the most negative value does not overflow.
  unsigned long long magnitude = static_cast<unsigned long long>(value);
  if (value < 0) {
    out.push_back('-');
    magnitude = 0ULL - magnitude;
  }
  char digits[24]{};
  int count = 0;
  do {
    digits[count++] = static_cast<char>('0' + magnitude % 10);
    magnitude /= 10;
  } while (magnitude != 0);
  while (count > 0) out.push_back(digits[--count]);
}

constexpr std::string int_to_string(long long value) {
  std::string out;
  append_int(out, value);
  return out;
}

constexpr bool is_blank(char c) noexcept { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

constexpr std::string_view trim(std::string_view text) noexcept {
  while (!text.empty() && is_blank(text.front())) text.remove_prefix(1);
  while (!text.empty() && is_blank(text.back())) text.remove_suffix(1);
  return text;
}

// Quote user text for an error message: at most 40 characters, unprintable bytes as \xNN,
// so that a corrupt file cannot put control characters on the user's terminal.
inline std::string quote_for_message(std::string_view text) {
  constexpr std::size_t max_shown = 40;
  static constexpr char hex[] = "0123456789abcdef";
  std::string out = "'";
  for (std::size_t i = 0; i < text.size() && i < max_shown; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 0xf]);
    }
  }
  if (text.size() > max_shown) out += "...";
  out.push_back('\'');
  return out;
}

}  // namespace baton::detail::schedule
