// baton/schedule/csv.hpp — programs as CSV (one row per rank), torch.distributed.pipelining's
// format, and csv_schedule, the policy that runs a schedule read from CSV.
//
// A row lists a rank's actions in order: `0F0,0F1,0B0,...`. Empty cells (torch writes idle
// steps as "") are skipped, blanks around a cell are ignored, lines that are blank or start
// with '#' are skipped. Compute-only and compute+comms rows are read alike.
#pragma once

#include <baton/schedule/detail/text.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/validate.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace baton {

namespace detail::sched {

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

}  // namespace detail::sched

// The rows of a CSV schedule, without interpreting stages. Throws schedule_error naming the
// rank (row), step (non-empty cell) and token of the first bad token, or for an empty text.
[[nodiscard]] constexpr std::vector<std::vector<action>> parse_csv_rows(std::string_view text) {
  std::vector<std::vector<action>> rows;
  std::size_t line_begin = 0;
  while (line_begin <= text.size()) {
    std::size_t line_end = text.find('\n', line_begin);
    if (line_end == std::string_view::npos) line_end = text.size();
    const std::string_view line = detail::sched::trim(text.substr(line_begin, line_end - line_begin));
    line_begin = line_end + 1;
    if (line.empty() || line.front() == '#') continue;
    std::vector<action> row;
    std::size_t cell_begin = 0;
    while (cell_begin <= line.size()) {
      std::size_t cell_end = line.find(',', cell_begin);
      if (cell_end == std::string_view::npos) cell_end = line.size();
      std::string_view cell = detail::sched::trim(line.substr(cell_begin, cell_end - cell_begin));
      cell_begin = cell_end + 1;
      if (cell.size() >= 2 && cell.front() == '"' && cell.back() == '"') cell = detail::sched::trim(cell.substr(1, cell.size() - 2));
      if (cell.empty()) continue;
      const auto parsed = try_parse_action(cell);
      if (!parsed)
        detail::sched::csv_error(static_cast<int>(rows.size()), static_cast<int>(row.size()), cell,
                                 "bad token: expected {stage}{F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B}{microbatch} "
                                 "with indices below 1048576, e.g. 2F0, 1I3 or 0SEND_F1");
      row.push_back(*parsed);
    }
    rows.push_back(std::move(row));
  }
  if (rows.empty()) detail::sched::csv_shape_error("the schedule is empty: expected one CSV row of actions per rank");
  return rows;
}

// The shape rows imply: one rank per row, stages 0..max, microbatches 0..max, and the
// placement (loop or v) that agrees with more of the actions. Throws when the stage count is
// not a multiple of the row count (a row missing or extra).
[[nodiscard]] constexpr schedule_shape infer_shape(const std::vector<std::vector<action>>& rows) {
  const int ranks = static_cast<int>(rows.size());
  if (ranks == 0) detail::sched::csv_shape_error("the schedule is empty: expected one CSV row of actions per rank");
  int max_stage = -1;
  int max_microbatch = -1;
  for (const auto& row : rows)
    for (const auto& a : row) {
      max_stage = std::max(max_stage, a.stage);
      max_microbatch = std::max(max_microbatch, a.microbatch);
    }
  if (max_stage < 0) detail::sched::csv_shape_error("the schedule has rows but no actions");
  const int stages = max_stage + 1;
  if (stages % ranks != 0) {
    detail::sched::csv_shape_error(
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

// One line per rank, actions separated by commas, a newline at the end.
[[nodiscard]] inline std::string to_csv(const program& prog) {
  std::string out;
  for (const auto& row : prog.ranks) {
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (i) out += ',';
      out += to_string(row[i]);
    }
    out += '\n';
  }
  return out;
}

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

inline void write_csv_file(const std::filesystem::path& path, const program& prog) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw schedule_error("baton: cannot open '" + path.string() + "' for writing");
  out << to_csv(prog);
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
