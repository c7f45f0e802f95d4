// The conventions every baton benchmark follows (see CONTRIBUTING.md, "Benchmarks"):
//
//   - one `NAME: value` line per figure;
//   - a ratio compares the subject with a roof (or baseline) measured in the same run, in
//     interleaved pairs: baseline and subject alternate, at least 5 pairs, the order flipping
//     from pair to pair, and the ratio is taken per pair. A burst of load from other programs on
//     a shared machine then slows both sides of a pair instead of whichever ran at the time
//     (an "efficiency above 1" is the sign of a baseline timed in a slow moment);
//   - a figure taken over repetitions prints as `NAME: median (min A, max B, n N)`;
//   - `loadavg_before:` and `loadavg_after:` give /proc/loadavg's 1-, 5- and 15-minute load
//     averages around the measurements, and `build:` whether the program was optimised.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace bench {

/// The 1-, 5- and 15-minute load averages, as /proc/loadavg has them ("0.31 1.65 2.45"), or
/// "unknown" where the file cannot be read.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  double one = -1, five = -1, fifteen = -1;
  if (!(in >> one >> five >> fifteen)) return "unknown";
  char text[64];
  std::snprintf(text, sizeof text, "%.2f %.2f %.2f", one, five, fifteen);
  return text;
}

/// `loadavg_before: ...` (or `_after`, ...), flushed so that it precedes the figures.
inline void print_load(const char* when) {
  std::printf("loadavg_%s: %s\n", when, load_average().c_str());
  std::fflush(stdout);
}

/// `build: optimized, NDEBUG` — an unoptimised or assert-enabled build times something else
/// than the library's users run (bench_schedule runs 10x slower at -O0, 1.5x at -O2 without
/// -march=native than under the bench preset).
inline void print_build() {
#if defined(__OPTIMIZE__)
  const char* optimized = "optimized";
#else
  const char* optimized = "NOT optimized (configure with the bench preset: -O3 -march=native)";
#endif
#if defined(NDEBUG)
  const char* asserts = "NDEBUG";
#else
  const char* asserts = "asserts on";
#endif
  std::printf("build: %s, %s\n", optimized, asserts);
}

/// Values of one figure over repetitions.
struct series {
  std::vector<double> values;

  void add(double v) { values.push_back(v); }
  [[nodiscard]] bool empty() const noexcept { return values.empty(); }
  [[nodiscard]] std::size_t size() const noexcept { return values.size(); }
  [[nodiscard]] double median() const {
    if (values.empty()) return 0;
    std::vector<double> s = values;
    std::sort(s.begin(), s.end());
    const std::size_t n = s.size();
    return n % 2 != 0 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  }
  [[nodiscard]] double min() const { return values.empty() ? 0 : *std::min_element(values.begin(), values.end()); }
  [[nodiscard]] double max() const { return values.empty() ? 0 : *std::max_element(values.begin(), values.end()); }
};

/// `name: median (min A, max B, n N)`, each number in `format` (a printf conversion of a double).
inline void print(const std::string& name, const series& s, const char* format = "%.4g") {
  char m[48], lo[48], hi[48];
  std::snprintf(m, sizeof m, format, s.median());
  std::snprintf(lo, sizeof lo, format, s.min());
  std::snprintf(hi, sizeof hi, format, s.max());
  std::printf("%s: %s (min %s, max %s, n %zu)\n", name.c_str(), m, lo, hi, s.size());
}

/// `name: value` for a figure measured once (a count, a size, a self-check).
inline void print_value(const std::string& name, double value, const char* format = "%.4g") {
  char v[48];
  std::snprintf(v, sizeof v, format, value);
  std::printf("%s: %s\n", name.c_str(), v);
}

/// The least number of interleaved pairs a ratio may come from.
inline constexpr int min_pairs = 5;

/// `--pairs N` from the command line (at least min_pairs), or `fallback`.
inline int pairs_from_args(int argc, char** argv, int fallback = 7) {
  int pairs = fallback;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--pairs") == 0) pairs = std::atoi(argv[i + 1]);
  }
  return std::max(pairs, min_pairs);
}

/// Runs `pairs` pairs of baseline() and subject(), alternating which of the two goes first.
/// Each returns its measurement; `record(pair, baseline_value, subject_value)` receives both.
template <class Baseline, class Subject, class Record>
void interleave(int pairs, Baseline&& baseline, Subject&& subject, Record&& record) {
  for (int p = 0; p < pairs; ++p) {
    double b = 0, s = 0;
    if (p % 2 == 0) {
      b = baseline();
      s = subject();
    } else {
      s = subject();
      b = baseline();
    }
    record(p, b, s);
  }
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace bench
