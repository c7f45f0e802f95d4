// baton/schedule/cost_file.hpp — a cost model as a small JSON file, for the planner's command
// line (baton-schedule synthesize --costs FILE) and for keeping what a run measured.
//
// The format is one flat JSON object; every value is a number or an array of numbers:
//
//     {
//       "format": 1,
//       "forward": [0.004, 0.008, 0.008, 0.012],
//       "backward_input": [0.004, 0.008, 0.008, 0.012],
//       "backward_weight": [0.004, 0.008, 0.008, 0.012],
//       "backward": [0.008, 0.016, 0.016, 0.024],
//       "activation": [1, 1, 1, 1],
//       "communication": 0.0001,
//       "bytes_per_message": 65536
//     }
//
// Arrays hold one value per stage, or one for all stages, as cost_model does. "backward"
// defaults to backward_input + backward_weight, "activation" to 1, "communication" and
// "bytes_per_message" (what one activation or gradient message carries, as measured; kept for
// the record, the simulator uses "communication") to 0. Unknown keys are an error, so a typo
// does not silently fall back to a default.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/simulate.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <locale>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

struct cost_file {
  cost_model costs;
  double bytes_per_message = 0;
};

namespace detail::schedule::planner {

inline std::string json_number(double x) {
  char text[40];
  std::snprintf(text, sizeof text, "%.17g", x);
  return text;
}

inline std::string json_array(const std::vector<double>& values) {
  std::string out = "[";
  for (std::size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + json_number(values[i]);
  return out + "]";
}

class json_reader {
 public:
  json_reader(std::string_view text, std::string_view origin) : text_(text), origin_(origin) {}

  [[noreturn]] void fail(const std::string& what) const {
    std::size_t line = 1;
    for (std::size_t i = 0; i < pos_ && i < text_.size(); ++i) line += text_[i] == '\n';
    throw schedule_error("baton: cost file " + std::string(origin_) + ", line " + std::to_string(line) + ": " + what +
                         " (the format: one JSON object of numbers and arrays of numbers, see "
                         "baton/schedule/cost_file.hpp)");
  }
  void skip() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r' || text_[pos_] == '\t'))
      ++pos_;
  }
  bool take(char c) {
    skip();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("expected '") + c + "'");
  }
  std::string key() {
    expect('"');
    const std::size_t end = text_.find('"', pos_);
    if (end == std::string_view::npos) fail("a key's closing quote is missing");
    std::string k(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return k;
  }
  double number() {
    skip();
    std::size_t end = pos_;
    while (end < text_.size() && std::string_view("+-.eE0123456789").find(text_[end]) != std::string_view::npos) ++end;
    const std::string token(text_.substr(pos_, end - pos_));
    double value = 0;
    std::istringstream in(token);
    in.imbue(std::locale::classic());
    if (token.empty() || !(in >> value) || !in.eof()) fail("expected a number");
    pos_ = end;
    return value;
  }
  std::vector<double> numbers() {
    skip();
    std::vector<double> values;
    if (!take('[')) {
      values.push_back(number());
      return values;
    }
    if (take(']')) fail("an empty array; give one value per stage or one for all");
    do values.push_back(number());
    while (take(','));
    expect(']');
    return values;
  }
  [[nodiscard]] bool at_end() {
    skip();
    return pos_ == text_.size();
  }

 private:
  std::string_view text_;
  std::string_view origin_;
  std::size_t pos_ = 0;
};

}  // namespace detail::schedule::planner

[[nodiscard]] inline std::string to_json(const cost_file& file) {
  const cost_model& c = file.costs;
  std::string out = "{\n  \"format\": 1,\n";
  out += "  \"forward\": " + detail::schedule::planner::json_array(c.forward) + ",\n";
  out += "  \"backward_input\": " + detail::schedule::planner::json_array(c.backward_input) + ",\n";
  out += "  \"backward_weight\": " + detail::schedule::planner::json_array(c.backward_weight) + ",\n";
  out += "  \"backward\": " + detail::schedule::planner::json_array(c.backward) + ",\n";
  out += "  \"activation\": " + detail::schedule::planner::json_array(c.activation) + ",\n";
  out += "  \"communication\": " + detail::schedule::planner::json_number(c.communication) + ",\n";
  out += "  \"bytes_per_message\": " + detail::schedule::planner::json_number(file.bytes_per_message) + "\n}\n";
  return out;
}

// Parses the format above; throws schedule_error naming the line and what was expected.
[[nodiscard]] inline cost_file cost_file_from_json(std::string_view text, std::string_view origin = "<text>") {
  detail::schedule::planner::json_reader in(text, origin);
  cost_file file;
  cost_model& c = file.costs;
  bool backward_given = false, format_seen = false;
  in.expect('{');
  if (!in.take('}')) {
    do {
      const std::string key = in.key();
      in.expect(':');
      if (key == "format") {
        if (in.number() != 1) in.fail("\"format\" is 1; this file is of another version");
        format_seen = true;
      } else if (key == "forward") c.forward = in.numbers();
      else if (key == "backward_input") c.backward_input = in.numbers();
      else if (key == "backward_weight") c.backward_weight = in.numbers();
      else if (key == "backward") {
        c.backward = in.numbers();
        backward_given = true;
      } else if (key == "activation") c.activation = in.numbers();
      else if (key == "communication") c.communication = in.number();
      else if (key == "bytes_per_message") file.bytes_per_message = in.number();
      else in.fail("unknown key \"" + key + "\"; known: format, forward, backward_input, backward_weight, backward, "
                   "activation, communication, bytes_per_message");
    } while (in.take(','));
    in.expect('}');
  }
  if (!in.at_end()) in.fail("text after the closing '}'");
  if (!format_seen) in.fail("\"format\": 1 is missing");
  if (!backward_given) {
    const std::size_t ni = c.backward_input.size(), nw = c.backward_weight.size();
    if (ni != nw && ni != 1 && nw != 1)
      in.fail("\"backward_input\" has " + std::to_string(ni) + " values and \"backward_weight\" " + std::to_string(nw) +
              "; give both one per stage, or one for all");
    const std::size_t n = std::max(ni, nw);
    c.backward.assign(n, 0.0);
    for (std::size_t s = 0; s < n; ++s)
      c.backward[s] = c.backward_input[c.backward_input.size() == 1 ? 0 : s] + c.backward_weight[c.backward_weight.size() == 1 ? 0 : s];
  }
  if (!(file.bytes_per_message >= 0) || !std::isfinite(file.bytes_per_message))
    in.fail("\"bytes_per_message\" must be finite and >= 0");
  return file;
}

inline void save_cost_file(const cost_file& file, const std::string& path) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw schedule_error("baton: cannot open cost file '" + path + "' for writing; check the directory exists");
  out << to_json(file);
  if (!out) throw schedule_error("baton: writing cost file '" + path + "' failed (disk full?)");
}

[[nodiscard]] inline cost_file load_cost_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw schedule_error("baton: cannot read cost file '" + path + "'; check the path");
  std::ostringstream text;
  text << in.rdbuf();
  return cost_file_from_json(text.str(), path);
}

}  // namespace baton
