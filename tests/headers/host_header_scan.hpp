// The scanner behind test_no_cuda_in_host_headers.cpp: finds CUDA and NCCL symbols in C++
// source text outside comments, string and character literals, and `#include <baton/...>`
// lines (an umbrella header may include a backend header under #if BATON_HAS_NCCL(): the
// header check compiles it without the backend, so an unguarded include fails there).
#pragma once

#include <cctype>
#include <cstddef>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

namespace header_scan {

struct finding {
  int line = 0;           // 1-based
  std::string symbol;     // what matched
  std::string text;       // the line, as written
};

// The code of `source` with every comment, string and character literal replaced by spaces
// (newlines kept, so line numbers still hold).
inline std::string code_only(std::string_view source) {
  std::string out(source);
  enum class state { code, line_comment, block_comment, string, character, raw_string } s = state::code;
  std::string raw_end;  // ")delim\"" of the raw string being skipped
  for (std::size_t i = 0; i < source.size(); ++i) {
    const char c = source[i];
    const char next = i + 1 < source.size() ? source[i + 1] : '\0';
    auto blank = [&](std::size_t at) {
      if (out[at] != '\n') out[at] = ' ';
    };
    switch (s) {
      case state::code:
        if (c == '/' && next == '/') {
          s = state::line_comment;
          blank(i);
        } else if (c == '/' && next == '*') {
          s = state::block_comment;
          blank(i);
          blank(++i);
        } else if (c == 'R' && next == '"' && (i == 0 || !(std::isalnum(static_cast<unsigned char>(source[i - 1])) || source[i - 1] == '_'))) {
          const auto open = source.find('(', i + 2);
          if (open == std::string_view::npos) break;
          raw_end = ")" + std::string(source.substr(i + 2, open - (i + 2))) + "\"";
          for (std::size_t k = i; k <= open; ++k) blank(k);
          i = open;
          s = state::raw_string;
        } else if (c == '"') {
          s = state::string;
          blank(i);
        } else if (c == '\'' && !(i > 0 && std::isxdigit(static_cast<unsigned char>(source[i - 1])) &&
                                  std::isxdigit(static_cast<unsigned char>(next)))) {  // not a digit separator
          s = state::character;
          blank(i);
        }
        break;
      case state::line_comment:
        if (c == '\n') s = state::code;
        else blank(i);
        break;
      case state::block_comment:
        if (c == '*' && next == '/') {
          blank(i);
          blank(++i);
          s = state::code;
        } else {
          blank(i);
        }
        break;
      case state::string:
      case state::character:
        if (c == '\\' && next != '\0') {
          blank(i);
          if (next != '\n') blank(++i);
          else ++i;
        } else if ((s == state::string && c == '"') || (s == state::character && c == '\'') || c == '\n') {
          blank(i);
          s = state::code;
        } else {
          blank(i);
        }
        break;
      case state::raw_string:
        if (source.compare(i, raw_end.size(), raw_end) == 0) {
          for (std::size_t k = i; k < i + raw_end.size(); ++k) blank(k);
          i += raw_end.size() - 1;
          s = state::code;
        } else {
          blank(i);
        }
        break;
    }
  }
  return out;
}

// CUDA and NCCL symbols: execution-space and memory-space keywords, kernel launches and
// built-in variables, the runtime and NCCL APIs (cudaX / ncclX), their headers, NVIDIA's
// __nv_ types. baton's own names that merely contain "cuda" or "nccl" (nccl_communicator,
// cuda_device_memory) are not symbols of CUDA and do not match.
inline const std::regex& cuda_symbol() {
  static const std::regex re(
      R"(__global__|__device__|__host__|__shared__|__constant__|__managed__|__launch_bounds__|__syncthreads|)"
      R"(__CUDA_ARCH__|\b__nv_\w+|<<<|\bthreadIdx\b|\bblockIdx\b|\bblockDim\b|\bgridDim\b|)"
      R"(\bcuda[A-Z]\w*|\bnccl[A-Z]\w*|\bCU(stream|event|context|deviceptr|result|module|function)\b|#\s*include\s*<\s*(cuda|nccl|cub/|thrust/|cooperative_groups|mma\.h|crt/)[^>]*>)");
  return re;
}

inline std::vector<finding> scan(std::string_view source) {
  std::vector<finding> found;
  const std::string code = code_only(source);
  static const std::regex baton_include(R"(^\s*#\s*include\s*<baton/)");
  std::size_t start = 0;
  int line = 1;
  while (start <= code.size()) {
    std::size_t end = code.find('\n', start);
    if (end == std::string::npos) end = code.size();
    const std::string text = code.substr(start, end - start);
    if (!std::regex_search(text, baton_include)) {
      for (auto it = std::sregex_iterator(text.begin(), text.end(), cuda_symbol()); it != std::sregex_iterator(); ++it) {
        found.push_back({line, it->str(), std::string(source.substr(start, end - start))});
      }
    }
    if (end == code.size()) break;
    start = end + 1;
    ++line;
  }
  return found;
}

// Whether a header (path relative to include/, "baton/payload/cuda.hpp") may hold CUDA: a
// .cuh, or a path component or file stem named cuda or nccl — the grouping of
// tests/headers/CMakeLists.txt, whose cuda and nccl groups are compiled against CUDA.
inline bool may_hold_cuda(const std::string& relative_path) {
  static const std::regex backend(R"((^|/)(cuda|nccl)(/|\.hpp$|_[a-z_]*\.hpp$))");
  return relative_path.ends_with(".cuh") || std::regex_search(relative_path, backend);
}

}  // namespace header_scan
