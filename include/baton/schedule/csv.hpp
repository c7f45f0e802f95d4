// baton/schedule/csv.hpp — programs as CSV (one row per rank), torch.distributed.pipelining's
// format, and csv_schedule, the policy that runs a schedule read from CSV.
//
// A row lists a rank's actions in order: `0F0,0F1,0B0,...`. Every cell torch writes reads:
// compute and message actions, the stage-level `3UNSHARD`, `3RESHARD`, `3REDUCE_GRAD` of its
// runtime schedules, and DualPipeV's overlapped pairs `(0F3;3B1)OVERLAP_F_B` (two actions, the
// forward marked overlaps_next). Empty cells (torch writes idle steps as "") are skipped,
// blanks around a cell and quotes are ignored, lines that are blank or start with '#' are
// skipped. Compute-only and compute+comms rows are read alike. parse_csv_document also keeps
// the idle cells and the line end, so that a file torch wrote is written back byte for byte.
#pragma once

#include <baton/schedule/detail/text.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/validate.hpp>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace baton {

// What a CSV file holds besides the program: the empty cells torch writes for its idle steps
// (None in its pipeline_order), and the line end. With it, to_csv writes a file torch wrote
// back byte for byte (comments, blank lines, quotes and blanks around cells are not kept).
struct csv_layout {
  // idle_cells[r][i]: empty cells right before action i of row r (0 before the backward of an
  // overlapped pair, which shares its forward's cell); the last entry, at index
  // ranks[r].size(), counts those after the row's last action. An empty vector: none.
  std::vector<std::vector<int>> idle_cells;
  std::string_view line_end = "\n";  // Python's csv module, which torch writes with, ends lines "\r\n"

  friend constexpr bool operator==(const csv_layout&, const csv_layout&) = default;
};

// A CSV file read: the program and the layout it was written in.
struct csv_document {
  program prog;
  csv_layout layout;
};

namespace detail::schedule {

[[noreturn]] inline void csv_error(int rank, int step, std::string_view cell, const std::string& what) {
  std::optional<action> none;
  throw schedule_error("baton: invalid schedule: rank " + std::to_string(rank) + ", step " + std::to_string(step) +
                           ", action " + (cell.empty() ? std::string("(none)") : quote_for_message(cell)) + ": " + what,
                       rank, step, none);
}

// A problem with the schedule as a whole (no rank, step or action to point at).
[[noreturn]] inline void csv_shape_error(const std::string& what) {
  throw schedule_error("baton: invalid schedule: " + what);
}

inline constexpr std::string_view overlap_suffix = "OVERLAP_F_B";

// One CSV cell read: one action, or the two of an overlapped pair; or why it is not a cell.
struct parsed_cell {
  enum class problem : unsigned char {
    none,
    bad_token,       // not an action
    unclosed_pair,   // "(" without ")"
    pair_suffix,     // ")" followed by anything but OVERLAP_F_B
    pair_size,       // not exactly two actions inside
    pair_member,     // an action inside does not parse
    pair_kinds,      // not a forward then a B or I
  };
  std::array<action, 2> actions{};
  int count = 0;
  problem why = problem::none;
  std::string_view offending{};  // the bad part of the cell
  int pair_members = 0;
};

constexpr parsed_cell parse_cell(std::string_view cell) {
  using problem = parsed_cell::problem;
  parsed_cell out;
  if (cell.front() != '(') {
    if (const auto a = try_parse_action(cell)) {
      out.actions[0] = *a;
      out.count = 1;
    } else {
      out.why = problem::bad_token;
      out.offending = cell;
    }
    return out;
  }
  const std::size_t close = cell.find(')');
  if (close == std::string_view::npos) {
    out.why = problem::unclosed_pair;
    return out;
  }
  const std::string_view inside = cell.substr(1, close - 1);
  std::size_t begin = trim(inside).empty() ? inside.size() + 1 : 0;  // "()" holds no action
  while (begin <= inside.size()) {
    std::size_t end = inside.find(';', begin);
    if (end == std::string_view::npos) end = inside.size();
    const std::string_view member = trim(inside.substr(begin, end - begin));
    begin = end + 1;
    if (out.pair_members < 2) {
      if (const auto a = try_parse_action(member)) {
        out.actions[static_cast<std::size_t>(out.pair_members)] = *a;
      } else if (out.why == problem::none) {
        out.why = problem::pair_member;
        out.offending = member;
      }
    }
    ++out.pair_members;
  }
  if (out.pair_members != 2) {
    out.why = problem::pair_size;
    return out;
  }
  if (out.why != problem::none) return out;
  if (trim(cell.substr(close + 1)) != overlap_suffix) {
    out.why = problem::pair_suffix;
    out.offending = cell.substr(close + 1);
    return out;
  }
  if (out.actions[0].kind != action_kind::forward || !is_input_backward(out.actions[1].kind)) {
    out.why = problem::pair_kinds;
    return out;
  }
  out.actions[0].overlaps_next = true;
  out.count = 2;
  return out;
}

[[noreturn]] inline void bad_cell(int rank, int step, std::string_view cell, const parsed_cell& parsed) {
  using problem = parsed_cell::problem;
  const std::string example = "write it as torch does, (F;B)OVERLAP_F_B, e.g. (0F3;3B1)OVERLAP_F_B";
  switch (parsed.why) {
    case problem::unclosed_pair:
      csv_error(rank, step, cell, "an overlapped pair opens '(' but never closes it: " + example);
    case problem::pair_suffix:
      csv_error(rank, step, cell,
                "a parenthesised cell must end in OVERLAP_F_B, the only pair torch writes, not " +
                    quote_for_message(trim(parsed.offending)) + ": " + example);
    case problem::pair_size:
      csv_error(rank, step, cell,
                "an OVERLAP_F_B cell pairs exactly two actions, a forward and then a backward, separated by ';' (it "
                "holds " + std::to_string(parsed.pair_members) + "): " + example);
    case problem::pair_member:
      csv_error(rank, step, cell,
                "bad token " + quote_for_message(parsed.offending) + " in an OVERLAP_F_B cell: " +
                    why_not_a_token(parsed.offending));
    case problem::pair_kinds:
      csv_error(rank, step, cell,
                "an OVERLAP_F_B cell pairs a forward with the backward (B or I) run after it, but this one holds " +
                    to_string(parsed.actions[0]) + " then " + to_string(parsed.actions[1]) + ": " + example);
    default:
      csv_error(rank, step, cell, "bad token: " + why_not_a_token(parsed.offending));
  }
}

// The rows of `text`, and its layout when `layout` is given.
constexpr std::vector<std::vector<action>> read_csv_rows(std::string_view text, csv_layout* layout) {
  std::vector<std::vector<action>> rows;
  bool line_end_seen = false;
  std::size_t line_begin = 0;
  while (line_begin <= text.size()) {
    std::size_t line_end = text.find('\n', line_begin);
    if (line_end == std::string_view::npos) line_end = text.size();
    const std::string_view line = trim(text.substr(line_begin, line_end - line_begin));
    if (layout && !line_end_seen && line_end < text.size()) {
      line_end_seen = true;
      layout->line_end = line_end > line_begin && text[line_end - 1] == '\r' ? "\r\n" : "\n";
    }
    line_begin = line_end + 1;
    if (line.empty() || line.front() == '#') continue;
    std::vector<action> row;
    std::vector<int> idle;
    int idle_run = 0;
    std::size_t cell_begin = 0;
    while (cell_begin <= line.size()) {
      std::size_t cell_end = line.find(',', cell_begin);
      // A pair's ';' never holds a ',', but a bad one may: the cell runs to the ',' regardless.
      if (cell_end == std::string_view::npos) cell_end = line.size();
      std::string_view cell = trim(line.substr(cell_begin, cell_end - cell_begin));
      cell_begin = cell_end + 1;
      if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') cell = trim(cell.substr(1, cell.size() - 2));
      if (cell.empty()) {
        ++idle_run;
        continue;
      }
      const int row_index = static_cast<int>(rows.size());
      const parsed_cell parsed = parse_cell(cell);
      if (parsed.count == 0) bad_cell(row_index, static_cast<int>(row.size()), cell, parsed);
      for (int i = 0; i < parsed.count; ++i) {
        row.push_back(parsed.actions[static_cast<std::size_t>(i)]);
        if (layout) idle.push_back(i == 0 ? idle_run : 0);
      }
      idle_run = 0;
    }
    if (layout) {
      idle.push_back(idle_run);
      const bool any_idle = std::any_of(idle.begin(), idle.end(), [](int n) { return n != 0; });
      layout->idle_cells.push_back(any_idle ? std::move(idle) : std::vector<int>{});
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) csv_shape_error("the schedule is empty: expected one CSV row of actions per rank");
  return rows;
}

// torch's text for the cell of a[i]: the action, or with a[i + 1] the overlapped pair.
inline std::string cell_text(const std::vector<action>& row, std::size_t i) {
  if (!row[i].overlaps_next || i + 1 == row.size()) return to_string(row[i]);
  // Built by appending: g++ 12 warns (-Wrestrict, a false positive) on "(" + string.
  std::string text(1, '(');
  text += to_string(row[i]);
  text += ';';
  text += to_string(row[i + 1]);
  text += ')';
  text += overlap_suffix;
  return text;
}

}  // namespace detail::schedule

// The rows of a CSV schedule, without interpreting stages. Throws schedule_error naming the
// rank (row), step (index of the cell's first action in the row) and cell of the first bad
// cell, with what to write instead, or for an empty text.
[[nodiscard]] constexpr std::vector<std::vector<action>> parse_csv_rows(std::string_view text) {
  return detail::schedule::read_csv_rows(text, nullptr);
}

// The shape rows imply: one rank per row, stages 0..max, microbatches 0..max, and the
// placement (loop or v) that agrees with more of the actions. Throws when the stage count is
// not a multiple of the row count (a row missing or extra).
[[nodiscard]] constexpr schedule_shape infer_shape(const std::vector<std::vector<action>>& rows) {
  const int ranks = static_cast<int>(rows.size());
  if (ranks == 0) detail::schedule::csv_shape_error("the schedule is empty: expected one CSV row of actions per rank");
  int max_stage = -1;
  int max_microbatch = -1;
  for (const auto& row : rows)
    for (const auto& a : row) {
      max_stage = std::max(max_stage, a.stage);
      max_microbatch = std::max(max_microbatch, a.microbatch);
    }
  if (max_stage < 0) detail::schedule::csv_shape_error("the schedule has rows but no actions");
  const int stages = max_stage + 1;
  if (stages % ranks != 0) {
    detail::schedule::csv_shape_error(
        "the schedule has " + std::to_string(ranks) + (ranks == 1 ? " row" : " rows") +
        " (one per rank) but uses " + std::to_string(stages) + " stages (0.." + std::to_string(max_stage) +
        "), which is not a multiple of " + std::to_string(ranks) +
        " (every rank holds the same number of stages): a row is missing or extra, or give the shape explicitly");
  }
  schedule_shape shape{ranks, stages / ranks, max_microbatch + 1, placement::loop};
  schedule_shape v_shape = shape;
  v_shape.place = placement::v;
  long long loop_votes = 0;
  long long v_votes = 0;
  for (int r = 0; r < ranks; ++r)
    for (const auto& a : rows[static_cast<std::size_t>(r)]) {
      loop_votes += stage_rank(shape, a.stage) == r;
      v_votes += stage_rank(v_shape, a.stage) == r;
    }
  return v_votes > loop_votes ? v_shape : shape;
}

// Parses a CSV schedule into a program, with the given shape or the inferred one. The
// program is not validated here: call validate() or is_valid().
[[nodiscard]] constexpr program parse_csv(std::string_view text, std::optional<schedule_shape> shape = std::nullopt) {
  auto rows = parse_csv_rows(text);
  const schedule_shape s = shape ? *shape : infer_shape(rows);
  return program{s, std::move(rows)};
}

// Like parse_csv, and the layout (idle cells, line end) to write the file back with.
[[nodiscard]] constexpr csv_document parse_csv_document(std::string_view text,
                                                        std::optional<schedule_shape> shape = std::nullopt) {
  csv_document doc;
  auto rows = detail::schedule::read_csv_rows(text, &doc.layout);
  doc.prog = program{shape ? *shape : infer_shape(rows), std::move(rows)};
  return doc;
}

// One line per rank, `layout.line_end` after each, cells separated by commas: an action, or
// an overlapped pair as `(0F3;3B1)OVERLAP_F_B`, and the layout's idle cells as empty cells.
// Throws schedule_error when the layout is not one of this program (its rows differ).
[[nodiscard]] inline std::string to_csv(const program& prog, const csv_layout& layout) {
  const auto& idle = layout.idle_cells;
  if (!idle.empty() && idle.size() != prog.ranks.size()) {
    throw schedule_error("baton: the CSV layout has " + std::to_string(idle.size()) + " rows but the program has " +
                         std::to_string(prog.ranks.size()) +
                         ": it was read with another program; write this one without it (to_csv(prog))");
  }
  std::string out;
  for (std::size_t r = 0; r < prog.ranks.size(); ++r) {
    const auto& row = prog.ranks[r];
    const std::vector<int> none;
    const std::vector<int>& idle_row = idle.empty() ? none : idle[r];
    if (!idle_row.empty() && idle_row.size() != row.size() + 1) {
      throw schedule_error("baton: the CSV layout of rank " + std::to_string(r) + " is for " +
                           std::to_string(idle_row.size() - 1) + " actions but the row has " +
                           std::to_string(row.size()) +
                           ": it was read with another program; write this one without it (to_csv(prog))");
    }
    const auto idle_at = [&](std::size_t i) { return idle_row.empty() ? 0 : idle_row[i]; };
    bool first_cell = true;
    const auto add_cell = [&](std::string_view text) {
      if (!first_cell) out += ',';
      first_cell = false;
      out += text;
    };
    for (std::size_t i = 0; i < row.size(); ++i) {
      for (int k = 0; k < idle_at(i); ++k) add_cell("");
      add_cell(detail::schedule::cell_text(row, i));
      if (row[i].overlaps_next && i + 1 < row.size()) ++i;
    }
    for (int k = 0; k < idle_at(row.size()); ++k) add_cell("");
    out += layout.line_end;
  }
  return out;
}

// One line per rank ending in "\n", actions separated by commas, no idle cells.
[[nodiscard]] inline std::string to_csv(const program& prog) { return to_csv(prog, csv_layout{}); }

[[nodiscard]] inline std::string read_text_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw schedule_error("baton: cannot read schedule file '" + path.string() +
                         "': it is a directory; give the path of a CSV file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw schedule_error("baton: cannot open schedule file '" + path.string() + "' for reading");
  try {
    std::string text(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>{});
    if (in.bad()) throw schedule_error("baton: reading schedule file '" + path.string() + "' failed");
    return text;
  } catch (const schedule_error&) {
    throw;
  } catch (const std::exception& e) {  // the stream reports some read errors by throwing
    throw schedule_error("baton: reading schedule file '" + path.string() + "' failed: " + e.what());
  }
}

[[nodiscard]] inline program read_csv_file(const std::filesystem::path& path,
                                           std::optional<schedule_shape> shape = std::nullopt) {
  return parse_csv(read_text_file(path), shape);
}

[[nodiscard]] inline csv_document read_csv_document(const std::filesystem::path& path,
                                                    std::optional<schedule_shape> shape = std::nullopt) {
  return parse_csv_document(read_text_file(path), shape);
}

// Writes to_csv(prog, layout); the default layout is baton's (no idle cells, "\n").
inline void write_csv_file(const std::filesystem::path& path, const program& prog, const csv_layout& layout = {}) {
  const std::string text = to_csv(prog, layout);
  std::ofstream out(path, std::ios::binary);
  if (!out) throw schedule_error("baton: cannot open '" + path.string() + "' for writing");
  out << text;
  if (!out) throw schedule_error("baton: writing '" + path.string() + "' failed");
}

// A schedule written by hand or exported from torch (ScheduleX._dump_csv), as a policy.
// splits_backward is true because a CSV may use I and W: check uses_split_backward() on the
// generated program to know.
class csv_schedule {
 public:
  static constexpr bool splits_backward = true;
  static constexpr placement default_placement = placement::loop;

  constexpr explicit csv_schedule(std::vector<std::vector<action>> rows) : rows_(std::move(rows)) {}

  [[nodiscard]] static constexpr csv_schedule from_string(std::string_view text) {
    return csv_schedule(parse_csv_rows(text));
  }
  [[nodiscard]] static csv_schedule from_file(const std::filesystem::path& path) {
    return from_string(read_text_file(path));
  }

  [[nodiscard]] constexpr const std::vector<std::vector<action>>& rows() const noexcept { return rows_; }

  // The shape the rows imply (see infer_shape).
  [[nodiscard]] constexpr schedule_shape shape() const { return infer_shape(rows_); }

  // The rows as a program of `shape`; throws schedule_error (rank, step, action and the
  // grid) when they are not a valid schedule of that shape.
  [[nodiscard]] constexpr program generate(const schedule_shape& s) const {
    program prog{s, rows_};
    if (find_problem(prog)) validate(prog);
    return prog;
  }

 private:
  std::vector<std::vector<action>> rows_;
};

}  // namespace baton
