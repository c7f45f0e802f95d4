// baton/schedule/grid.hpp — a program as a text grid: one line per rank, one column per step.
#pragma once

#include <baton/schedule/program.hpp>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

namespace baton {

struct grid_options {
  int first_step = 0;
  int last_step = -1;     // inclusive; -1: the end of the longest row
  int first_rank = 0;
  int last_rank = -1;     // inclusive; -1: the last rank
  int mark_rank = -1;     // the cell shown in [brackets]
  int mark_step = -1;
};

// rank 0:  0F0  0F1  0F2  0B0 ...
// A step past the end of a row is blank; the marked cell may be one past the end (shown
// as [end]) so that a "missing" problem can point at where the action should be.
[[nodiscard]] inline std::string format_grid(const program& prog, grid_options options = {}) {
  const int ranks = static_cast<int>(prog.ranks.size());
  if (ranks == 0) return "(no ranks)\n";
  int longest = 0;
  for (const auto& row : prog.ranks) longest = std::max(longest, static_cast<int>(row.size()));
  const int first_rank = std::clamp(options.first_rank, 0, ranks - 1);
  const int last_rank = options.last_rank < 0 ? ranks - 1 : std::clamp(options.last_rank, first_rank, ranks - 1);
  const int first_step = std::max(0, options.first_step);
  int last_step = options.last_step < 0 ? longest - 1 : std::min(options.last_step, longest - 1);
  if (options.mark_rank >= 0) last_step = std::max(last_step, options.mark_step);
  last_step = std::max(last_step, first_step);

  auto cell = [&](int r, int t) -> std::string {
    const auto& row = prog.ranks[static_cast<std::size_t>(r)];
    std::string text;
    if (t < static_cast<int>(row.size())) text = to_string(row[static_cast<std::size_t>(t)]);
    const bool marked = r == options.mark_rank && t == options.mark_step;
    if (!marked) return text;
    // Built by appending: g++ 12 warns (-Wrestrict, a false positive) on "[" + string.
    std::string boxed(1, '[');
    boxed.append(text.empty() ? std::string_view("end") : std::string_view(text));
    boxed.push_back(']');
    return boxed;
  };
  const std::string rank_label_prefix = "rank ";
  int label_width = 0;
  for (int r = first_rank; r <= last_rank; ++r)
    label_width = std::max(label_width, static_cast<int>(rank_label_prefix.size() + std::to_string(r).size() + 1));
  label_width = std::max(label_width, 5);

  std::vector<std::size_t> widths;
  for (int t = first_step; t <= last_step; ++t) {
    std::size_t w = std::to_string(t).size();
    for (int r = first_rank; r <= last_rank; ++r) w = std::max(w, cell(r, t).size());
    widths.push_back(w);
  }
  auto pad = [](std::string text, std::size_t width) {
    if (text.size() < width) text.append(width - text.size(), ' ');
    return text;
  };
  std::string out = pad("step", static_cast<std::size_t>(label_width));
  for (int t = first_step; t <= last_step; ++t)
    out += "  " + pad(std::to_string(t), widths[static_cast<std::size_t>(t - first_step)]);
  while (!out.empty() && out.back() == ' ') out.pop_back();
  out += '\n';
  for (int r = first_rank; r <= last_rank; ++r) {
    std::string line = pad(rank_label_prefix + std::to_string(r) + ":", static_cast<std::size_t>(label_width));
    for (int t = first_step; t <= last_step; ++t)
      line += "  " + pad(cell(r, t), widths[static_cast<std::size_t>(t - first_step)]);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + '\n';
  }
  return out;
}

// The few steps and ranks around (rank, step), for error messages.
[[nodiscard]] inline std::string format_grid_excerpt(const program& prog, int rank, int step, int radius = 4) {
  grid_options options;
  options.first_step = std::max(0, step - radius);
  options.last_step = std::max(0, step + radius);
  const int ranks = static_cast<int>(prog.ranks.size());
  if (ranks > 12 && rank >= 0) {
    options.first_rank = std::max(0, rank - 3);
    options.last_rank = std::min(ranks - 1, rank + 3);
  }
  options.mark_rank = rank;
  options.mark_step = step;
  return format_grid(prog, options);
}

}  // namespace baton
