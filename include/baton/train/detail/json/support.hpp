// baton/train/detail/json/support.hpp — what every checkpoint header needs from nlohmann-json:
// the refusal without it, the JSON type (keys kept in the order written, so a manifest reads
// top-down), and parsing that names the file and refuses a key given twice (nlohmann keeps
// the last silently; the safetensors format forbids duplicates).
#pragma once

#include <baton/config.hpp>

#if !BATON_HAS_JSON()
#error "baton/train/json/ (checkpoints) needs nlohmann-json: link baton::json (find_package(baton COMPONENTS json)); Debian: apt-get install nlohmann-json3-dev"
#endif

#include <baton/train/checkpoint_error.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace baton::detail::train::json {

using value = nlohmann::ordered_json;
using baton::train::checkpoint_error;
using problem = baton::train::checkpoint_error::kind;

/// Parses `text`; on invalid JSON or a key repeated within one object, throws checkpoint_error
/// (kind damaged) whose message starts with `where` ("'dir/manifest.json'").
inline value parse(std::string_view text, const std::string& where) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  std::string repeated;
  const auto callback = [&](int, nlohmann::json::parse_event_t event, value& parsed) {
    using ev = nlohmann::json::parse_event_t;
    if (event == ev::object_start) keys.emplace_back();
    if (event == ev::object_end && !keys.empty()) keys.pop_back();
    if (event == ev::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second && repeated.empty())
      repeated = parsed.get<std::string>();
    return true;
  };
  value v;
  try {
    v = value::parse(text.begin(), text.end(), callback);
  } catch (const nlohmann::json::exception& e) {
    throw checkpoint_error(problem::damaged, where + " is not valid JSON: " + e.what());
  }
  if (!repeated.empty()) throw checkpoint_error(problem::damaged, where + " gives the key '" + repeated + "' twice");
  return v;
}

/// The text of a JSON value, or a damaged-file error naming `what` when it is not a string.
inline std::string text_of(const value& v, const std::string& what) {
  if (!v.is_string()) throw checkpoint_error(problem::damaged, what + " is not a string");
  return v.get<std::string>();
}

/// A non-negative integer of JSON, or a damaged-file error naming `what`.
inline std::uint64_t count_of(const value& v, const std::string& what) {
  if (!v.is_number_unsigned())
    throw checkpoint_error(problem::damaged, what + " is not a non-negative integer (it is " + v.dump() + ")");
  return v.get<std::uint64_t>();
}

}  // namespace baton::detail::train::json
