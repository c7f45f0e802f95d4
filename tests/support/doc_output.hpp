// What a documentation example prints, for the docs check (cmake/batonCheckDocs.cmake). A
// test captures the example's std::cout and compares it with the raw string between the
// example's doc-output markers: the text the document shows right after the example.
#pragma once

#include <iostream>
#include <sstream>
#include <string>
#include <string_view>

namespace baton_test {

// Sends std::cout into a string until finish() (or the end of the scope).
class capture_cout {
 public:
  capture_cout() : previous_(std::cout.rdbuf(text_.rdbuf())) {}
  ~capture_cout() { restore(); }
  capture_cout(const capture_cout&) = delete;
  capture_cout& operator=(const capture_cout&) = delete;

  // Gives std::cout back and returns what was printed meanwhile.
  std::string finish() {
    restore();
    return text_.str();
  }

 private:
  void restore() {
    if (previous_ != nullptr) std::cout.rdbuf(previous_);
    previous_ = nullptr;
  }
  std::ostringstream text_;
  std::streambuf* previous_;
};

// The text of a doc-output raw string R"(...)": the newline right after R"( is layout, not
// output (the docs check drops it too).
inline std::string doc_output(std::string_view raw) {
  if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
  return std::string(raw);
}

}  // namespace baton_test
