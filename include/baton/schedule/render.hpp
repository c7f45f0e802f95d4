// baton/schedule/render.hpp — pictures of a simulated schedule: a Chrome/Perfetto trace
// (open in chrome://tracing or ui.perfetto.dev) and an SVG Gantt chart.
#pragma once

#include <baton/schedule/simulate.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>

namespace baton {

namespace detail::schedule {

inline std::string format_number(double value, int precision = 6) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*g", precision, value);
  return buffer;
}

inline std::string xml_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '&': out += "&amp;"; break;
      case '"': out += "&quot;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

inline std::string json_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out.push_back(c);
    }
  }
  return out;
}

inline std::string_view kind_category(action_kind kind) {
  switch (kind) {
    case action_kind::forward: return "forward";
    case action_kind::backward: return "backward";
    case action_kind::backward_input: return "backward_input";
    case action_kind::backward_weight: return "backward_weight";
    default: return "communication";
  }
}

// Colour per kind; a rank's later local stages (chunks) get a lighter shade.
inline std::string kind_colour(action_kind kind, int chunk) {
  static constexpr const char* dark[] = {"#3b6ea5", "#3e8e41", "#7bbf6a", "#d9822b"};
  static constexpr const char* light[] = {"#8fb3dc", "#8fd18f", "#b9e3ad", "#f2b77a"};
  const int k = std::clamp(static_cast<int>(kind), 0, 3);
  return chunk % 2 == 0 ? dark[k] : light[k];
}

}  // namespace detail::schedule

// Chrome trace event format: one process, one thread per rank, an X event per compute
// action (1 cost unit = 1 ms), and flow arrows for the messages between ranks.
[[nodiscard]] inline std::string to_chrome_trace(const simulation& sim, std::string_view title = "baton schedule") {
  using detail::schedule::format_number;
  const double scale = 1000.0;  // trace timestamps are microseconds
  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n";
  out += "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"" + detail::schedule::json_escape(title) +
         "\"}}";
  for (std::size_t r = 0; r < sim.ranks.size(); ++r)
    out += ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":0,\"tid\":" + std::to_string(r) +
           ",\"args\":{\"name\":\"rank " + std::to_string(r) + "\"}}";
  for (const auto& t : sim.timeline) {
    out += ",\n{\"name\":\"" + to_string(t.act) + "\",\"cat\":\"" + std::string(detail::schedule::kind_category(t.act.kind)) +
           "\",\"ph\":\"X\",\"pid\":0,\"tid\":" + std::to_string(t.rank) + ",\"ts\":" + format_number(t.start * scale, 12) +
           ",\"dur\":" + format_number((t.finish - t.start) * scale, 12) + ",\"args\":{\"stage\":" +
           std::to_string(t.act.stage) + ",\"microbatch\":" + std::to_string(t.act.microbatch) +
           ",\"step\":" + std::to_string(t.step) + "}}";
  }
  int id = 0;
  for (const auto& m : sim.messages) {
    const std::string name = "\"name\":\"" + to_string(m.sent_by) + "\",\"cat\":\"message\"";
    out += ",\n{" + name + ",\"ph\":\"s\",\"id\":" + std::to_string(id) + ",\"pid\":0,\"tid\":" +
           std::to_string(m.from_rank) + ",\"ts\":" + format_number(m.sent * scale, 12) + "}";
    out += ",\n{" + name + ",\"ph\":\"f\",\"bp\":\"e\",\"id\":" + std::to_string(id) + ",\"pid\":0,\"tid\":" +
           std::to_string(m.to_rank) + ",\"ts\":" + format_number(m.arrived * scale, 12) + "}";
    ++id;
  }
  out += "\n]}\n";
  return out;
}

struct svg_options {
  std::string title = "baton schedule";
  int width = 1200;      // pixels, including the labels
  int row_height = 26;
  bool show_figures = true;  // makespan and bubble ratio under the title
};

// A Gantt chart: one row per rank, a box per compute action labelled with its microbatch,
// coloured by kind (F blue, B green, I light green, W orange; later local stages lighter).
[[nodiscard]] inline std::string to_svg(const simulation& sim, const svg_options& options = {}) {
  using detail::schedule::format_number;
  const int ranks = static_cast<int>(sim.ranks.size());
  const double left = 64;
  const double right = 16;
  const double top = options.show_figures ? 52 : 34;
  const double row = options.row_height;
  const double axis = 28;
  const double legend = 28;
  const double plot_width = std::max(100.0, options.width - left - right);
  const double height = top + row * ranks + axis + legend;
  const double span = sim.makespan > 0 ? sim.makespan : 1.0;
  const double px = plot_width / span;
  auto x_of = [&](double t) { return left + t * px; };

  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(options.width) +
                    "\" height=\"" + format_number(height) + "\" viewBox=\"0 0 " + std::to_string(options.width) + " " +
                    format_number(height) + "\" font-family=\"sans-serif\">\n";
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out += "<text x=\"" + format_number(left) + "\" y=\"20\" font-size=\"15\" font-weight=\"bold\">" +
         detail::schedule::xml_escape(options.title) + "</text>\n";
  if (options.show_figures) {
    char figures[200];
    std::snprintf(figures, sizeof figures,
                  "ranks %d, stages %d, microbatches %d, placement %s: makespan %.4g, bubble %.2f%%, peak live %d",
                  sim.shape.ranks, sim.shape.num_stages(), sim.shape.microbatches,
                  std::string(to_string(sim.shape.place)).c_str(), sim.makespan, 100.0 * sim.bubble_ratio,
                  sim.peak_live());
    out += "<text x=\"" + format_number(left) + "\" y=\"40\" font-size=\"12\" fill=\"#444\">" + figures + "</text>\n";
  }
  for (int r = 0; r < ranks; ++r) {
    const double y = top + r * row;
    out += "<rect x=\"" + format_number(left) + "\" y=\"" + format_number(y) + "\" width=\"" +
           format_number(plot_width) + "\" height=\"" + format_number(row - 2) + "\" fill=\"#f3f3f3\"/>\n";
    out += "<text x=\"" + format_number(left - 8) + "\" y=\"" + format_number(y + row / 2 + 4) +
           "\" font-size=\"12\" text-anchor=\"end\">rank " + std::to_string(r) + "</text>\n";
  }
  for (const auto& t : sim.timeline) {
    // The stage's place among its rank's stages: under either placement a rank holds one
    // stage of each run of `ranks` consecutive stages.
    const int chunk = t.act.stage / sim.shape.ranks;
    const double x = x_of(t.start);
    const double w = std::max(0.5, (t.finish - t.start) * px);
    const double y = top + t.rank * row;
    out += "<rect x=\"" + format_number(x) + "\" y=\"" + format_number(y) + "\" width=\"" + format_number(w) +
           "\" height=\"" + format_number(row - 2) + "\" fill=\"" + detail::schedule::kind_colour(t.act.kind, chunk) +
           "\" stroke=\"white\" stroke-width=\"0.6\"><title>" + to_string(t.act) + " [" + format_number(t.start) + ", " +
           format_number(t.finish) + ")</title></rect>\n";
    const std::string label = std::to_string(t.act.microbatch);
    if (w >= 7.0 * static_cast<double>(label.size()))
      out += "<text x=\"" + format_number(x + w / 2) + "\" y=\"" + format_number(y + row / 2 + 3) +
             "\" font-size=\"10\" text-anchor=\"middle\" fill=\"white\">" + label + "</text>\n";
  }
  // Time axis: about ten ticks at a round step.
  const double axis_y = top + row * ranks + 4;
  double tick = std::pow(10.0, std::floor(std::log10(span / 10.0)));
  if (span / tick > 20) tick *= 5;
  else if (span / tick > 10) tick *= 2;
  out += "<line x1=\"" + format_number(left) + "\" y1=\"" + format_number(axis_y) + "\" x2=\"" +
         format_number(left + plot_width) + "\" y2=\"" + format_number(axis_y) + "\" stroke=\"#888\"/>\n";
  for (double t = 0; t <= span + tick * 1e-9; t += tick) {
    out += "<line x1=\"" + format_number(x_of(t)) + "\" y1=\"" + format_number(axis_y) + "\" x2=\"" +
           format_number(x_of(t)) + "\" y2=\"" + format_number(axis_y + 4) + "\" stroke=\"#888\"/>\n";
    out += "<text x=\"" + format_number(x_of(t)) + "\" y=\"" + format_number(axis_y + 15) +
           "\" font-size=\"10\" text-anchor=\"middle\" fill=\"#444\">" + format_number(t) + "</text>\n";
  }
  const double legend_y = axis_y + axis;
  const std::pair<action_kind, const char*> entries[] = {{action_kind::forward, "F forward"},
                                                         {action_kind::backward, "B backward"},
                                                         {action_kind::backward_input, "I input grad"},
                                                         {action_kind::backward_weight, "W weight grad"}};
  double lx = left;
  for (const auto& [kind, name] : entries) {
    out += "<rect x=\"" + format_number(lx) + "\" y=\"" + format_number(legend_y - 10) +
           "\" width=\"12\" height=\"12\" fill=\"" + detail::schedule::kind_colour(kind, 0) + "\"/>\n";
    out += "<text x=\"" + format_number(lx + 16) + "\" y=\"" + format_number(legend_y) + "\" font-size=\"11\">" + name +
           "</text>\n";
    lx += 110;
  }
  out += "<text x=\"" + format_number(lx) + "\" y=\"" + format_number(legend_y) +
         "\" font-size=\"11\" fill=\"#444\">(lighter: a rank's second stage)</text>\n";
  out += "</svg>\n";
  return out;
}

}  // namespace baton
