// The rules of docs/architecture.md, checked on the headers as they are: every include of a
// baton header follows the layer graph (no layer reaches into another's detail/, the core
// includes nothing else of baton, no layer includes one above it), and no header outgrows
// 700 lines. A failure names the file, the line and the rule.
#include "catch.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// What each layer may include besides itself, config.hpp and the core (the table of
// docs/architecture.md). "umbrella" is a top-level header (baton/cp.hpp): it may include
// anything of its layer, and baton.hpp every umbrella.
const std::map<std::string, std::set<std::string>>& allowed() {
  static const std::map<std::string, std::set<std::string>> table{
      {"core", {}},
      {"payload", {}},
      {"schedule", {}},
      {"comm", {}},
      {"attention", {}},
      {"pipeline", {"payload", "schedule", "comm"}},
      {"cp", {"attention", "comm"}},
      {"nn", {"payload", "attention", "cp", "comm", "pipeline"}},
      {"train", {"nn", "pipeline", "schedule", "comm", "payload", "attention", "cp"}},
      {"torch", {"payload", "pipeline", "attention", "cp", "comm"}},
  };
  return table;
}

struct include_line {
  int line;
  std::string target;  // "cp/detail/agree.hpp"
};

std::vector<include_line> baton_includes(const fs::path& file) {
  static const std::regex re(R"(^\s*#\s*include\s*<baton/([^>]+)>)");
  std::vector<include_line> out;
  std::ifstream in(file);
  std::string text;
  for (int n = 1; std::getline(in, text); ++n) {
    std::smatch m;
    if (std::regex_search(text, m, re)) out.push_back({n, m[1].str()});
  }
  return out;
}

std::string layer_of(const std::string& relative) {  // "cp/detail/agree.hpp" -> "cp"
  const auto slash = relative.find('/');
  return slash == std::string::npos ? "umbrella" : relative.substr(0, slash);
}

bool in_detail(const std::string& relative) { return relative.find("/detail/") != std::string::npos; }

std::vector<std::string> headers() {
  std::vector<std::string> out;
  const fs::path root = fs::path(BATON_INCLUDE_DIR) / "baton";
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const auto ext = entry.path().extension().string();
    if (entry.is_regular_file() && (ext == ".hpp" || ext == ".cuh")) out.push_back(fs::relative(entry.path(), root).generic_string());
  }
  return out;
}

}  // namespace

TEST_CASE("layering: every include of a baton header follows the layer graph", "[quality][layering]") {
  const auto all = headers();
  REQUIRE(all.size() > 100);  // the walk found the headers (a wrong root would pass vacuously)
  std::string problems;
  for (const std::string& h : all) {
    const std::string layer = layer_of(h);
    for (const include_line& inc : baton_includes(fs::path(BATON_INCLUDE_DIR) / "baton" / h)) {
      const std::string target = layer_of(inc.target);
      const std::string where = "include/baton/" + h + ":" + std::to_string(inc.line) + ": includes <baton/" + inc.target + ">: ";
      if (layer == "core") {
        if (target != "core") problems += where + "the core includes nothing else of baton\n";
        continue;
      }
      if (layer == "umbrella" || inc.target == "config.hpp" || target == "core" || target == layer) continue;
      if (in_detail(inc.target)) {
        problems += where + "another layer's detail/ is not API; move what both layers need into include/baton/core/\n";
        continue;
      }
      const auto rules = allowed().find(layer);
      if (rules == allowed().end()) {
        problems += where + "the header is in no known layer (add it to docs/architecture.md and this test)\n";
      } else if (target == "umbrella") {
        problems += where + "a library header never includes an umbrella; include the headers it uses\n";
      } else if (!rules->second.contains(target)) {
        problems += where + "layer " + layer + " may not use layer " + target + " (docs/architecture.md)\n";
      }
    }
  }
  INFO(problems);
  CHECK(problems.empty());
}

TEST_CASE("layering: no layer names another layer's internals", "[quality][layering]") {
  // detail::<layer>:: (or detail::<layer>:: inside a backend) of another layer, outside
  // comments: what two layers share belongs in the core (detail::core) or in public API.
  static const std::regex re(R"(\bdetail::([a-z_]+)::)");
  std::string problems;
  for (const std::string& h : headers()) {
    const std::string layer = layer_of(h);
    if (layer == "umbrella") continue;
    std::ifstream in(fs::path(BATON_INCLUDE_DIR) / "baton" / h);
    std::string text;
    for (int n = 1; std::getline(in, text); ++n) {
      const auto comment = text.find("//");
      const std::string code = comment == std::string::npos ? text : text.substr(0, comment);
      for (auto it = std::sregex_iterator(code.begin(), code.end(), re); it != std::sregex_iterator(); ++it) {
        const std::string used = (*it)[1].str();
        const bool own = used == layer || (layer == "torch" && used == "torch_adapter");
        if (!own && used != "core" && allowed().contains(used))
          problems += "include/baton/" + h + ":" + std::to_string(n) + ": uses detail::" + used +
                      ":: of layer " + used + "; move what both need into the core or make it public\n";
      }
    }
  }
  INFO(problems);
  CHECK(problems.empty());
}

TEST_CASE("layering: no header is over 700 lines", "[quality][layering]") {
  std::string problems;
  for (const std::string& h : headers()) {
    std::ifstream in(fs::path(BATON_INCLUDE_DIR) / "baton" / h);
    int lines = 0;
    for (std::string s; std::getline(in, s);) ++lines;
    if (lines > 700)
      problems += "include/baton/" + h + " has " + std::to_string(lines) + " lines: split it by what a reader looks for\n";
  }
  INFO(problems);
  CHECK(problems.empty());
}
