// baton-schedule: look at, check, lower, time and draw pipeline schedules.
//
//   baton-schedule show      --policy zbv --ranks 4 --microbatches 8
//   baton-schedule simulate  --policy all --ranks 4 --microbatches 8      (markdown table)
//   baton-schedule validate  my_schedule.csv [more.csv ...]
//   baton-schedule lower     my_schedule.csv > with_comms.csv
//   baton-schedule svg       --policy dual_pipe_v --ranks 4 --microbatches 8 --out dpv.svg
//   baton-schedule trace     --policy zb1p --ranks 4 --microbatches 8 --out zb1p.json
//   baton-schedule synthesize --ranks 4 --microbatches 8 --memory-cap 4 [--costs costs.json] [--csv plan.csv]
//   baton-schedule --help, COMMAND --help, help, --version
//
// The command line is CLI11's (examples/support/cli.hpp): each command takes only the options
// it uses, so an option another command owns is refused naming that command, and every value
// is range-checked as it is read.
#include "cli.hpp"

#include <baton/config.hpp>
#include <baton/schedule.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

namespace cli = example_support::cli;

// One line per built-in policy: baton's name and torch's, or, when torch has no name for it,
// where it comes from; built from the registry, so the help lists exactly the names it accepts.
std::string policy_list() {
  std::string policies = "policies (--policy NAME: baton's name or torch's, any case):\n";
  for (const auto& info : baton::builtin_policies) {
    std::string line = "  " + std::string(info.name);
    line.append(line.size() < 27 ? 27 - line.size() : 1, ' ');
    if (info.torch_name.empty()) {
      line += "(baton's own name)\n    " + std::string(info.origin);
    } else {
      line += info.torch_name;
    }
    policies += line + "\n";
  }
  return policies;
}

std::string version_text() {
  return "baton-schedule " + std::to_string(BATON_VERSION_MAJOR) + "." + std::to_string(BATON_VERSION_MINOR) + "." +
         std::to_string(BATON_VERSION_PATCH) + " (baton " + std::to_string(BATON_VERSION_MAJOR) + "." +
         std::to_string(BATON_VERSION_MINOR) + "." + std::to_string(BATON_VERSION_PATCH) + ", CLI11 " + CLI11_VERSION + ")";
}

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

constexpr int max_count = 1 << 20;  // ranks, microbatches, stages per rank: the shape check refuses large products

struct options {
  std::string command;
  std::string policy;
  std::string csv_path;  // the schedule to read; synthesize: the plan to write
  std::vector<std::string> files;
  int ranks = 0, microbatches = 0, stages_per_rank = 0;
  bool ranks_given = false, microbatches_given = false, stages_given = false;
  std::optional<baton::placement> place;
  std::string placement;
  double tf = 1, ti = 1, tw = 1, tcomm = 0, tb = 0;
  bool tb_given = false;
  bool per_stage = false;
  bool lowered = false;
  std::string out_path;
  std::string title;
  std::string costs_path;
  double memory_cap = 0;
};

struct loaded {
  std::string name;
  baton::program prog;
};

loaded load_policy(const options& o, const baton::policy_info& info) {
  if (!o.ranks_given || !o.microbatches_given) throw usage_error("--policy needs --ranks and --microbatches");
  baton::schedule_shape shape = info.shape(o.ranks, o.microbatches, o.stages_given ? o.stages_per_rank : 0);
  if (o.place) shape.place = *o.place;
  return {std::string(info.name), info.generate(shape)};
}

loaded load(const options& o) {
  if (!o.csv_path.empty()) {
    const auto schedule = baton::csv_schedule::from_file(o.csv_path);
    baton::schedule_shape shape = schedule.shape();
    if (o.ranks_given) shape.ranks = o.ranks;
    if (o.microbatches_given) shape.microbatches = o.microbatches;
    if (o.stages_given) shape.stages_per_rank = o.stages_per_rank;
    if (o.place) shape.place = *o.place;
    return {o.csv_path, schedule.generate(shape)};
  }
  if (o.policy.empty()) throw usage_error("give a schedule: --policy NAME or a CSV file");
  return load_policy(o, baton::policy_by_name(o.policy));
}

// The cost model: a cost file's per-stage costs (--costs), or the flags' (one rank's share of
// the model, divided among its stages, unless --costs-per-stage).
baton::cost_model costs_for(const options& o, const baton::schedule_shape& shape) {
  if (!o.costs_path.empty()) return baton::load_cost_file(o.costs_path).costs;
  baton::cost_model c = baton::cost_model::uniform(o.tf, o.ti, o.tw, o.tcomm);
  if (o.tb_given) c.backward = {o.tb};
  return o.per_stage ? c : c.per_rank_share(shape.stages_per_rank);
}

// The schedule timed under the cost model the options give.
baton::simulation simulated(const options& o, const loaded& l) {
  return baton::simulate(l.prog, costs_for(o, l.prog.shape));
}

// "ranks 4, stages per rank 2, microbatches 8, placement v"
std::string shape_text(const baton::schedule_shape& s) {
  return "ranks " + std::to_string(s.ranks) + ", stages per rank " + std::to_string(s.stages_per_rank) +
         ", microbatches " + std::to_string(s.microbatches) + ", placement " + std::string(to_string(s.place));
}

void emit(const options& o, const std::string& text) {
  if (o.out_path.empty()) {
    std::cout << text;
    return;
  }
  std::ofstream out(o.out_path, std::ios::binary);
  if (!out) throw baton::schedule_error("cannot open '" + o.out_path + "' for writing");
  out << text;
  if (!out) throw baton::schedule_error("writing '" + o.out_path + "' failed");
}

std::string fixed(double value, int digits) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", digits, value);
  return buffer;
}

std::string figures(const loaded& l, const baton::simulation& sim) {
  std::string out = "schedule:       " + l.name + "\n";
  out += "shape:          " + shape_text(sim.shape) + "\n";
  out += "makespan:       " + fixed(sim.makespan, 4) + "\n";
  out += "bubble ratio:   " + fixed(sim.bubble_ratio, 4) + "  (idle / (ranks x makespan))\n";
  out += "idle (total):   " + fixed(sim.total_idle(), 4) + "\n";
  out += "peak live:      " + std::to_string(sim.peak_live()) + " microbatch-stages\n";
  out += "peak memory:    " + fixed(sim.peak_activation(), 3) + " (units: one rank's share of the model's activations for one microbatch)\n";
  out += "rank   busy      idle      finish    peak live  peak memory\n";
  for (std::size_t r = 0; r < sim.ranks.size(); ++r) {
    const auto& f = sim.ranks[r];
    char line[160];
    std::snprintf(line, sizeof line, "%-6zu %-9.4f %-9.4f %-9.4f %-10d %.3f\n", r, f.busy, f.idle, f.finish, f.peak_live,
                  f.peak_activation);
    out += line;
  }
  return out;
}

std::string table_of_all(const options& o) {
  std::string out = "| policy | stages/rank | placement | makespan | bubble ratio | peak live (rank 0 / max) | peak memory |\n";
  out += "|---|---|---|---|---|---|---|\n";
  for (const auto& info : baton::builtin_policies) {
    try {
      const auto l = load_policy(o, info);
      const auto sim = simulated(o, l);
      out += "| " + l.name + " | " + std::to_string(l.prog.shape.stages_per_rank) + " | " +
             std::string(to_string(l.prog.shape.place)) + " | " + fixed(sim.makespan, 2) + " | " +
             fixed(sim.bubble_ratio, 4) + " | " + std::to_string(sim.ranks.front().peak_live) + " / " +
             std::to_string(sim.peak_live()) + " | " + fixed(sim.peak_activation(), 2) + " |\n";
    } catch (const baton::schedule_error& e) {
      std::string why = e.what();
      if (const auto colon = why.find(": "); colon != std::string::npos) why = why.substr(colon + 2);
      out += "| " + std::string(info.name) + " | | | n/a | n/a | n/a | " + why + " |\n";
    }
  }
  return out;
}

// The planner: synthesize a program, print how good it is, write it with --csv.
std::string synthesize_report(const options& o) {
  baton::schedule_shape shape{o.ranks, o.stages_given ? o.stages_per_rank : 1, o.microbatches, baton::placement::loop};
  shape.place = o.place.value_or(shape.stages_per_rank == 2 ? baton::placement::v : baton::placement::loop);
  const baton::cost_model costs = costs_for(o, shape);
  const baton::synthesis_result plan = baton::synthesize(shape, costs, o.memory_cap);
  if (!o.csv_path.empty()) {
    std::ofstream out(o.csv_path, std::ios::binary);
    if (!out) throw baton::schedule_error("cannot open '" + o.csv_path + "' for writing");
    out << baton::to_csv(plan.prog);
    if (!out) throw baton::schedule_error("writing '" + o.csv_path + "' failed");
  }
  std::string text = "schedule:       synthesized: " + plan.method + "\n";
  text += "shape:          " + shape_text(shape) + "\n";
  text += "memory cap:     " + fixed(o.memory_cap, 4) + "\n";
  text += "makespan:       " + fixed(plan.makespan, 4) + "\n";
  text += "lower bound:    " + fixed(plan.lower_bound, 4) + "  (no schedule of this shape can be faster)\n";
  text += "gap:            " + fixed(plan.gap, 4) + "  (makespan / lower bound)\n";
  text += std::string("proven optimal: ") + (plan.proven_optimal ? "yes" : "no") + "\n";
  if (plan.best_builtin.empty()) {
    text += "best built-in:  none fits the memory cap\n";
  } else {
    text += "best built-in:  " + plan.best_builtin + ", makespan " + fixed(plan.best_builtin_makespan, 4) +
            "  (synthesized / best built-in: " + fixed(plan.makespan / plan.best_builtin_makespan, 4) + ")\n";
  }
  text += "rank   peak memory\n";
  for (std::size_t r = 0; r < plan.peak_memory.size(); ++r) {
    char line[64];
    std::snprintf(line, sizeof line, "%-6zu %.4f\n", r, plan.peak_memory[r]);
    text += line;
  }
  if (!o.csv_path.empty()) text += "wrote:          " + o.csv_path + "\n";
  return text;
}

int run(const options& o) {
  if (o.command == "synthesize") {
    emit(o, synthesize_report(o));
    return 0;
  }
  if (o.command == "simulate" && baton::detail::schedule::same_name(o.policy, "all")) {
    emit(o, table_of_all(o));
    return 0;
  }
  if (o.command == "validate" && o.files.size() > 1) {
    // Several files: each checked and answered on its own line; exit 1 when any is not valid.
    int code = 0;
    std::string text;
    for (const std::string& file : o.files) {
      options one = o;
      one.csv_path = file;
      try {
        const loaded l = load(one);
        baton::validate(l.prog);
        text += "valid: " + l.name + ": " + shape_text(l.prog.shape) + ", " +
                (baton::is_lowered(l.prog) ? "compute+comms" : "compute-only") + ", " +
                std::to_string(baton::action_count(l.prog)) + " actions\n";
      } catch (const baton::schedule_error& e) {
        text += "invalid: " + file + ": " + e.what() + "\n";
        code = 1;
      }
    }
    emit(o, text);
    return code;
  }
  const loaded l = load(o);
  if (o.command == "show") {
    emit(o, baton::format_grid(o.lowered ? baton::lower(l.prog) : l.prog));
  } else if (o.command == "csv") {
    emit(o, baton::to_csv(l.prog));
  } else if (o.command == "lower") {
    emit(o, baton::to_csv(baton::lower(l.prog)));
  } else if (o.command == "validate") {
    baton::validate(l.prog);
    emit(o, "valid: " + l.name + ": " + shape_text(l.prog.shape) + ", " +
                (baton::is_lowered(l.prog) ? "compute+comms" : "compute-only") + ", " +
                std::to_string(baton::action_count(l.prog)) + " actions\n");
  } else if (o.command == "simulate") {
    emit(o, figures(l, simulated(o, l)));
  } else if (o.command == "svg") {
    baton::svg_options svg;
    svg.title = o.title.empty() ? l.name : o.title;
    emit(o, baton::to_svg(simulated(o, l), svg));
  } else if (o.command == "trace") {
    emit(o, baton::to_chrome_trace(simulated(o, l), o.title.empty() ? l.name : o.title));
  }
  return 0;
}

// Adds the options of each command (and only those) to its subcommand.
struct command_line {
  CLI::App app{"baton-schedule: look at, check, lower, time and draw pipeline schedules, and plan one for your costs "
               "and memory.",
               "baton-schedule"};
  options o;
  std::map<std::string, std::vector<std::string>> owners;  // option name -> the commands that take it

  void note(CLI::App* sub, CLI::Option* opt) {
    for (const std::string& n : opt->get_lnames()) owners["--" + n].push_back(sub->get_name());
  }

  void schedule_options(CLI::App* sub) {
    note(sub, cli::add_text(*sub, "--policy", o.policy, "NAME", "a built-in policy (below), or 'all' (simulate)"));
    note(sub, cli::add_text(*sub, "--csv", o.csv_path, "FILE", "the schedule as a CSV file (torch's format; or give FILE)"));
    sub->add_option("FILE", o.files, "the schedule as a CSV file")->type_name("FILE.csv");
    shape_options(sub, " (required for a policy)");
  }

  void shape_options(CLI::App* sub, const std::string& when) {
    note(sub, cli::add_integer(*sub, "--ranks", o.ranks, 1, max_count, "pipeline ranks" + when)->default_str(""));
    note(sub, cli::add_integer(*sub, "--microbatches", o.microbatches, 1, max_count, "microbatches" + when)
                  ->default_str(""));
    note(sub, cli::add_integer(*sub, "--stages-per-rank", o.stages_per_rank, 1, max_count,
                               "default: the policy's (1, or 2 for interleaved and V schedules)")->default_str(""));
    note(sub, cli::add_choice(*sub, "--placement", o.placement, {"loop", "v"},
                              "default: the policy's; for a CSV, inferred from the rows")->default_str(""));
  }

  void cost_options(CLI::App* sub) {
    const auto time = [](double x) { return x >= 0; };
    const std::string what = "a finite time >= 0";
    CLI::Option* flags[] = {
        cli::add_number(*sub, "--tf", o.tf, what, time, "forward time"),
        cli::add_number(*sub, "--ti", o.ti, what, time, "input-gradient time"),
        cli::add_number(*sub, "--tw", o.tw, what, time, "weight-gradient time"),
        cli::add_number(*sub, "--tb", o.tb, what, time, "full backward time (default ti + tw)")->default_str(""),
        cli::add_number(*sub, "--tcomm", o.tcomm, what, time, "time per message between ranks"),
        sub->add_flag("--costs-per-stage", o.per_stage,
                      "the times above are per stage (default: one rank's share of the model, divided evenly among "
                      "its stages)")};
    CLI::Option* file = cli::add_text(*sub, "--costs", o.costs_path, "FILE",
                                      "per-stage costs from a JSON cost file (baton/schedule/cost_file.hpp), instead "
                                      "of the flags above");
    note(sub, file);
    for (CLI::Option* f : flags) {
      note(sub, f);
      f->excludes(file);
      f->group("Cost model");
    }
    file->group("Cost model");
  }

  void output_options(CLI::App* sub, bool title) {
    note(sub, cli::add_text(*sub, "--out", o.out_path, "FILE", "write there instead of standard output"));
    if (title) note(sub, cli::add_text(*sub, "--title", o.title, "TEXT", "title of the picture / trace"));
  }

  CLI::App* command(const std::string& name, const std::string& help) {
    CLI::App* sub = app.add_subcommand(name, help);
    sub->callback([this, name] { o.command = name; });
    sub->footer(policy_list());
    return sub;
  }

  command_line() {
    app.set_version_flag("--version", version_text(), "print the version and exit");
    app.require_subcommand(1);
    app.footer("Each command's options: baton-schedule COMMAND --help. A schedule is --policy NAME with --ranks and "
               "--microbatches, or a CSV file.\n\n" + policy_list());
    app.get_formatter()->column_width(34);
    CLI::App* show = command("show", "print each rank's program as a grid");
    schedule_options(show);
    note(show, show->add_flag("--lowered", o.lowered, "include SEND/RECV actions"));
    output_options(show, false);
    for (const char* name : {"csv", "lower", "validate"}) {
      CLI::App* sub = command(name, std::string(name) == "csv"     ? "print the compute-only CSV (one row per rank)"
                                    : std::string(name) == "lower" ? "print the compute+comms CSV"
                                                                   : "check a schedule; prints the first problem (rank, step, action, grid)");
      schedule_options(sub);
      output_options(sub, false);
    }
    CLI::App* sim = command("simulate", "print makespan, bubble ratio, busy/idle time and peak memory per rank; with "
                                        "--policy all, a markdown table over every built-in policy");
    schedule_options(sim);
    cost_options(sim);
    output_options(sim, false);
    for (const char* name : {"svg", "trace"}) {
      CLI::App* sub = command(name, std::string(name) == "svg" ? "write an SVG Gantt chart of the simulated schedule"
                                                               : "write a Chrome/Perfetto trace (JSON) of the simulated schedule");
      schedule_options(sub);
      cost_options(sub);
      output_options(sub, true);
    }
    CLI::App* syn = command("synthesize", "plan a schedule for the shape and the costs under --memory-cap; prints its "
                                          "makespan, a lower bound no schedule beats, their ratio, peak memory per rank "
                                          "and the best built-in policy under the same cap");
    syn->footer("");
    shape_options(syn, "");
    syn->get_option("--ranks")->required();
    syn->get_option("--microbatches")->required();
    cost_options(syn);
    note(syn, cli::add_number(*syn, "--memory-cap", o.memory_cap, "a finite number >= 0",
                              [](double x) { return x >= 0; },
                              "the most live activation a rank may hold, in the cost model's unit (use a large "
                              "number for no cap)")->required()->default_str(""));
    note(syn, cli::add_text(*syn, "--csv", o.csv_path, "FILE", "write the plan there (torch's compute-only CSV)"));
    output_options(syn, false);
    CLI::App* help = app.add_subcommand("help", "print this help");
    help->callback([this] { o.command = "help"; });
  }

  // " is an option of synthesize, not of simulate (see baton-schedule simulate --help)"
  std::string elsewhere(const std::string& name, const std::string& command_name) const {
    const auto it = owners.find(name);
    if (it == owners.end()) return {};
    std::string list;
    for (const auto& c : it->second) list += (list.empty() ? "" : ", ") + c;
    return "is an option of " + list + ", not of " + command_name + " (see baton-schedule " + command_name + " --help)";
  }
};

// The checks that involve several options of the chosen command.
void check_combinations(const command_line& line, options& opts) {
  options& o = opts;
  const CLI::App* sub = line.app.get_subcommand(o.command);
  const auto given = [&](const char* name) {
    const CLI::Option* opt = sub->get_option_no_throw(name);
    return opt != nullptr && opt->count() > 0;
  };
  o.ranks_given = given("--ranks");
  o.microbatches_given = given("--microbatches");
  o.stages_given = given("--stages-per-rank");
  o.tb_given = given("--tb");
  if (!o.placement.empty()) o.place = o.placement == "v" ? baton::placement::v : baton::placement::loop;
  if (o.command == "synthesize" || o.command == "help") return;
  if (o.files.size() > 1 && o.command != "validate") {
    std::string list;
    for (const auto& f : o.files) list += (list.empty() ? "'" : ", '") + f + "'";
    throw usage_error(o.command + " takes one schedule, got " + std::to_string(o.files.size()) + " files: " + list +
                      " (run it once per file)");
  }
  if (o.files.size() > 1 && (!o.csv_path.empty() || !o.policy.empty()))
    throw usage_error("validate checks the files given, or one --csv / --policy schedule, not both");
  if (o.files.size() == 1) {
    if (!o.csv_path.empty())
      throw usage_error("the schedule is given twice: as FILE (" + o.files[0] + ") and as --csv " + o.csv_path +
                        "; give one");
    o.csv_path = o.files[0];
  }
  if (!o.csv_path.empty() && !o.policy.empty())
    throw usage_error("give one schedule: --policy " + o.policy + " or the CSV file " + o.csv_path + ", not both");
  if (baton::detail::schedule::same_name(o.policy, "all") && o.command != "simulate")
    throw usage_error("--policy all is for simulate (a table over every policy); " + o.command +
                      " takes one schedule");
}

}  // namespace

int main(int argc, char** argv) {
  command_line line;
  options& o = line.o;
  try {
    try {
      line.app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      std::cout << line.app.help();
      return std::cout.good() ? 0 : 1;
    } catch (const CLI::CallForVersion&) {
      std::cout << version_text() << "\n";
      return 0;
    } catch (const CLI::ParseError& e) {
      // The command that failed, if any was recognised.
      const CLI::App* failed = &line.app;
      for (const CLI::App* sub : line.app.get_subcommands({})) {
        if (sub->parsed()) failed = sub;
      }
      if (failed != &line.app) o.command = failed->get_name();  // for "see baton-schedule COMMAND --help"
      std::string why;
      if (failed == &line.app && !line.app.remaining().empty() && line.app.remaining().front().rfind("-", 0) != 0) {
        why = "unknown command '" + line.app.remaining().front() +
              "' (commands: show, csv, lower, validate, simulate, svg, trace, synthesize, help)";
      } else if (failed == &line.app && dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
        why = "missing COMMAND (one of show, csv, lower, validate, simulate, svg, trace, synthesize, help)";
      } else if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr) {
        const std::string what = e.what();
        const std::string flag = what.substr(0, what.find(' '));
        why = failed->get_name() + " needs " + flag +
              (flag == "--memory-cap" ? " (the most live activation a rank may hold; use a large number for no cap)" : "");
      } else if (dynamic_cast<const CLI::ExcludesError*>(&e) != nullptr) {
        why = std::string(e.what()) + ": --costs gives every cost (per stage, and the message time); leave the cost "
                                      "flags out, or the cost file";
      } else {
        const std::string name = failed == &line.app ? std::string("baton-schedule") : failed->get_name();
        why = cli::explain(e, *failed, [&](const std::string& option) { return line.elsewhere(option, name); });
      }
      throw usage_error(why);
    }
    if (o.command == "help") {  // the program's help (app.help() would give the help command's own)
      std::cout << line.app.get_formatter()->make_help(&line.app, "baton-schedule", CLI::AppFormatMode::Normal);
      return std::cout.good() ? 0 : 1;
    }
    check_combinations(line, o);
    return run(o);
  } catch (const usage_error& e) {
    std::cerr << "baton-schedule: " << e.what() << "\nbaton-schedule: see baton-schedule "
              << (o.command.empty() || o.command == "help" ? "" : o.command + " ") << "--help\n";
    return 2;
  } catch (const baton::schedule_error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "baton-schedule: " << e.what() << "\n";
    return 1;
  }
}
