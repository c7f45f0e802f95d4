// baton-schedule: look at, check, lower, time and draw pipeline schedules.
//
//   baton-schedule show      --policy zbv --ranks 4 --microbatches 8
//   baton-schedule simulate  --policy all --ranks 4 --microbatches 8      (markdown table)
//   baton-schedule validate  my_schedule.csv
//   baton-schedule lower     my_schedule.csv > with_comms.csv
//   baton-schedule svg       --policy dual_pipe_v --ranks 4 --microbatches 8 --out dpv.svg
//   baton-schedule trace     --policy zb1p --ranks 4 --microbatches 8 --out zb1p.json
//   baton-schedule synthesize --ranks 4 --microbatches 8 --memory-cap 4 [--costs costs.json] [--csv plan.csv]
//   baton-schedule --help    (or -h, or help: this usage on standard output, exit 0)
#include <baton/schedule.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace {

// The usage, with {POLICIES} replaced by the registry's names (see usage()).
constexpr std::string_view usage_template = R"(usage: baton-schedule COMMAND [options] [FILE.csv]

commands:
  show        print each rank's program as a grid (--lowered: with SEND/RECV)
  csv         print the compute-only CSV (one row per rank)
  lower       print the compute+comms CSV
  validate    check a schedule; prints the first problem (rank, step, action, grid)
  simulate    print makespan, bubble ratio, busy/idle time and peak memory per rank;
              with --policy all, a markdown table over every built-in policy
  svg         write an SVG Gantt chart
  trace       write a Chrome/Perfetto trace (JSON)
  synthesize  plan a schedule for --ranks, --microbatches (--stages-per-rank, --placement) and
              the costs, under --memory-cap; prints its makespan, a lower bound no schedule
              beats, their ratio (the gap), peak memory per rank and the best built-in policy
              under the same cap; --csv FILE writes the plan (torch's compute-only CSV)

schedule (a policy, or a CSV file given as FILE or --csv FILE, in torch's format: its
compute-only and runtime files, UNSHARD/RESHARD/REDUCE_GRAD and OVERLAP_F_B cells included):
  --policy NAME          baton's name or torch's (get_schedule_class), any case:
{POLICIES}
  --ranks P              pipeline ranks (required for a policy)
  --microbatches M       microbatches (required for a policy)
  --stages-per-rank V    default: the policy's (1, or 2 for interleaved and V schedules)
  --placement loop|v     default: the policy's; for a CSV, inferred from the rows

cost model (simulate, svg, trace):
  --tf T --ti T --tw T   forward, input-gradient and weight-gradient time (default 1, 1, 1)
  --tb T                 full backward time (default ti + tw)
  --tcomm T              time per message between ranks (default 0)
  --costs-per-stage      the times above are per stage; by default they are one rank's share
                         of the model, divided evenly among that rank's stages
  --costs FILE           (synthesize) per-stage costs from a JSON cost file
                         (baton/schedule/cost_file.hpp), instead of the flags above
  --memory-cap X         (synthesize) the most live activation a rank may hold, in the cost
                         model's unit (activation 1 per microbatch-stage by default, times
                         1 / stages per rank unless --costs-per-stage or --costs)

output:
  --out FILE             write there instead of standard output
  --title TEXT           title of the SVG / trace
  --lowered              (show) include SEND/RECV actions
  --help, -h             print this help and exit (also: baton-schedule help)
)";

// One line per built-in policy: baton's name and torch's, or, when torch has no name for it,
// where it comes from; built from the registry, so the help lists exactly the names it accepts.
std::string usage() {
  std::string policies;
  for (const auto& info : baton::builtin_policies) {
    std::string line = "                           " + std::string(info.name);
    line.append(line.size() < 52 ? 52 - line.size() : 1, ' ');
    if (info.torch_name.empty()) {
      line += "(baton's own name)\n                             " + std::string(info.origin);
    } else {
      line += info.torch_name;
    }
    policies += line + "\n";
  }
  std::string text(usage_template);
  const std::string_view placeholder = "{POLICIES}\n";
  text.replace(text.find(placeholder), placeholder.size(), policies);
  return text;
}

struct usage_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct options {
  std::string command;
  std::string policy;
  std::string csv_path;
  std::optional<int> ranks, microbatches, stages_per_rank;
  std::optional<baton::placement> place;
  double tf = 1, ti = 1, tw = 1, tcomm = 0;
  std::optional<double> tb;
  bool per_stage = false;
  bool lowered = false;
  bool help = false;  // --help / -h / the command "help": print usage(), exit 0
  std::string out_path;
  std::string title;
  std::string costs_path;
  std::optional<double> memory_cap;
};

int to_int(const std::string& flag, const std::string& text) {
  try {
    std::size_t used = 0;
    const int value = std::stoi(text, &used);
    if (used == text.size()) return value;
  } catch (const std::exception&) {
  }
  throw usage_error(flag + " expects an integer, got '" + text + "'");
}

// A count flag (--ranks, --microbatches, --stages-per-rank): an integer >= 1.
int to_count(const std::string& flag, const std::string& text) {
  const int value = to_int(flag, text);
  if (value < 1) {
    throw usage_error(flag + " must be at least 1, got " + text +
                      (flag == "--stages-per-rank" ? " (leave it out for the policy's default)" : ""));
  }
  return value;
}

// A cost flag (--tf, --tb, --ti, --tw, --tcomm): a finite number >= 0.
double to_cost(const std::string& flag, const std::string& text) {
  try {
    std::size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size() && std::isfinite(value) && value >= 0) return value;
    if (used == text.size()) throw usage_error(flag + " must be a finite time >= 0, got '" + text + "'");
  } catch (const usage_error&) {
    throw;
  } catch (const std::exception&) {
  }
  throw usage_error(flag + " expects a number, got '" + text + "'");
}

options parse(int argc, char** argv) {
  if (argc < 2) throw usage_error("missing COMMAND");
  options o;
  o.command = argv[1];
  if (o.command == "--help" || o.command == "-h" || o.command == "help") {
    o.help = true;
    return o;
  }
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw usage_error(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--policy") o.policy = value();
    else if (arg == "--csv") o.csv_path = value();
    else if (arg == "--ranks") o.ranks = to_count(arg, value());
    else if (arg == "--microbatches") o.microbatches = to_count(arg, value());
    else if (arg == "--stages-per-rank") o.stages_per_rank = to_count(arg, value());
    else if (arg == "--placement") {
      const std::string p = value();
      if (p == "loop") o.place = baton::placement::loop;
      else if (p == "v") o.place = baton::placement::v;
      else throw usage_error("--placement is loop or v, got '" + p + "'");
    } else if (arg == "--tf") o.tf = to_cost(arg, value());
    else if (arg == "--tb") o.tb = to_cost(arg, value());
    else if (arg == "--ti") o.ti = to_cost(arg, value());
    else if (arg == "--tw") o.tw = to_cost(arg, value());
    else if (arg == "--tcomm") o.tcomm = to_cost(arg, value());
    else if (arg == "--costs-per-stage") o.per_stage = true;
    else if (arg == "--costs") o.costs_path = value();
    else if (arg == "--memory-cap") o.memory_cap = to_cost(arg, value());
    else if (arg == "--lowered") o.lowered = true;
    else if (arg == "--out") o.out_path = value();
    else if (arg == "--title") o.title = value();
    else if (arg == "--help" || arg == "-h") {
      o.help = true;
      return o;
    }
    else if (!arg.empty() && arg[0] != '-' && o.csv_path.empty()) o.csv_path = arg;
    else throw usage_error("unknown option '" + arg + "'");
  }
  return o;
}

struct loaded {
  std::string name;
  baton::program prog;
};

loaded load_policy(const options& o, const baton::policy_info& info) {
  if (!o.ranks || !o.microbatches) throw usage_error("--policy needs --ranks and --microbatches");
  baton::schedule_shape shape = info.shape(*o.ranks, *o.microbatches, o.stages_per_rank.value_or(0));
  if (o.place) shape.place = *o.place;
  return {std::string(info.name), info.generate(shape)};
}

loaded load(const options& o) {
  if (!o.csv_path.empty()) {
    const auto schedule = baton::csv_schedule::from_file(o.csv_path);
    baton::schedule_shape shape = schedule.shape();
    if (o.ranks) shape.ranks = *o.ranks;
    if (o.microbatches) shape.microbatches = *o.microbatches;
    if (o.stages_per_rank) shape.stages_per_rank = *o.stages_per_rank;
    if (o.place) shape.place = *o.place;
    return {o.csv_path, schedule.generate(shape)};
  }
  if (o.policy.empty()) throw usage_error("give a schedule: --policy NAME or a CSV file");
  return load_policy(o, baton::policy_by_name(o.policy));
}

baton::cost_model costs_for(const options& o, const baton::schedule_shape& shape) {
  baton::cost_model c = baton::cost_model::uniform(o.tf, o.ti, o.tw, o.tcomm);
  if (o.tb) c.backward = {*o.tb};
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
  if (!o.ranks || !o.microbatches) throw usage_error("synthesize needs --ranks and --microbatches");
  if (!o.memory_cap) throw usage_error("synthesize needs --memory-cap (use a large number for no cap)");
  baton::schedule_shape shape{*o.ranks, o.stages_per_rank.value_or(1), *o.microbatches, baton::placement::loop};
  shape.place = o.place.value_or(shape.stages_per_rank == 2 ? baton::placement::v : baton::placement::loop);
  baton::cost_model costs;
  if (!o.costs_path.empty()) {
    costs = baton::load_cost_file(o.costs_path).costs;
  } else {
    costs = costs_for(o, shape);
  }
  const baton::synthesis_result plan = baton::synthesize(shape, costs, *o.memory_cap);
  if (!o.csv_path.empty()) {
    std::ofstream out(o.csv_path, std::ios::binary);
    if (!out) throw baton::schedule_error("cannot open '" + o.csv_path + "' for writing");
    out << baton::to_csv(plan.prog);
    if (!out) throw baton::schedule_error("writing '" + o.csv_path + "' failed");
  }
  std::string text = "schedule:       synthesized: " + plan.method + "\n";
  text += "shape:          " + shape_text(shape) + "\n";
  text += "memory cap:     " + fixed(*o.memory_cap, 4) + "\n";
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
  } else {
    throw usage_error("unknown command '" + o.command + "'");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const options o = parse(argc, argv);
    if (o.help) {
      std::cout << usage();
      return std::cout.good() ? 0 : 1;
    }
    return run(o);
  } catch (const usage_error& e) {
    if (*e.what()) std::cerr << "baton-schedule: " << e.what() << "\n\n";
    std::cerr << usage();
    return 2;
  } catch (const baton::schedule_error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "baton-schedule: " << e.what() << "\n";
    return 1;
  }
}
