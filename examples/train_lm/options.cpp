#include "options.hpp"

#include "checkpoint.hpp"
#include "cli.hpp"

#include <baton/config.hpp>
#include <baton/schedule.hpp>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <string>
#include <utility>
#include <vector>

namespace train_lm {

namespace cli = example_support::cli;

namespace {

// The largest sizes a flag takes: beyond them a product of sizes could overflow before the
// memory estimate refuses it. Each is far above what a machine holds.
constexpr int max_ranks = 1 << 16;
constexpr std::int64_t max_size = std::int64_t{1} << 40;

std::string version_text() {
  return "baton-train " + std::to_string(BATON_VERSION_MAJOR) + "." + std::to_string(BATON_VERSION_MINOR) + "." +
         std::to_string(BATON_VERSION_PATCH) + " (baton " + std::to_string(BATON_VERSION_MAJOR) + "." +
         std::to_string(BATON_VERSION_MINOR) + "." + std::to_string(BATON_VERSION_PATCH) + ", CLI11 " + CLI11_VERSION + ")";
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

baton::mesh_shape options::mesh() const {
  baton::mesh_shape m{pp, dp, cp, 1};
  if (cp_mode == baton::nn::cp_mode::ulysses) {
    m.cp_ring = 1;
    m.cp_ulysses = cp;
  } else if (cp_mode == baton::nn::cp_mode::hybrid) {
    m.cp_ulysses = ulysses;
    m.cp_ring = cp / ulysses;  // parse() made sure ulysses divides cp
  }
  return m;
}

baton::train::lm_config options::config() const {
  baton::train::lm_config c;
  c.model.d_model = d_model;
  c.model.heads = heads;
  c.model.kv_heads = kv_heads;
  c.model.vocab = baton::train::byte_corpus::vocab;
  c.model.recompute = recompute;
  c.layers = layers;
  c.seq = seq;
  c.batch = batch;
  c.optimizer.lr = lr;
  c.optimizer.weight_decay = weight_decay;
  c.optimizer.beta1 = beta1;
  c.optimizer.beta2 = beta2;
  c.optimizer.eps = adamw_eps();
  c.learning_rate = lr_schedule;
  c.learning_rate.total = steps;
  c.clip_norm = clip;  // 0: off (parse() refuses a negative value)
  c.seed = seed;
  if (dtype == "bf16") c.model.storage = baton::nn::activation_storage::bf16;
  if (bf16_matmul()) c.model.matmul = baton::nn::matmul_precision::bf16;
  return c;
}

bool parse(int argc, char** argv, options& o) {
  CLI::App app("baton-train: train a byte-level transformer LM under pipeline x data x context parallelism, on ranks "
               "that are threads of this process or MPI processes.",
               "baton-train");
  app.set_version_flag("--version", version_text(), "print the version and exit");
  app.footer("Exit codes: 0 trained; 1 an error while running; 2 bad input (flags, configuration, data, memory); 3 "
             "stopped at a non-finite loss or gradient norm; 4 --check beyond its tolerance; 130 / 143 stopped by "
             "SIGINT / SIGTERM after finishing the step. See docs/training.md.");
  app.get_formatter()->column_width(40);

  std::string cp_mode = "ring", layout = "zigzag", decay = "constant", betas = "0.9,0.999", recompute = "none";
  // Mesh and parallelism.
  auto* pp = cli::add_integer(app, "--pp", o.pp, 1, max_ranks, "pipeline ranks")->group("Mesh");
  cli::add_integer(app, "--dp", o.dp, 1, max_ranks, "data-parallel replicas")->group("Mesh");
  auto* cp = cli::add_integer(app, "--cp", o.cp, 1, max_ranks, "context-parallel ranks (1: none)")->group("Mesh");
  auto* cp_mode_opt = cli::add_choice(app, "--cp-mode", cp_mode, {"ring", "ulysses", "hybrid", "auto"},
                                      "how attention spreads over the cp ranks (auto: the split baton::cp::choose "
                                      "predicts fastest here, after a brief calibration)")->group("Mesh");
  auto* ulysses = cli::add_integer(app, "--ulysses", o.ulysses, 2, max_ranks,
                                   "hybrid: the Ulysses degree inside each ring group (default: the smallest divisor "
                                   "of --cp above 1 that leaves a ring of 2 or more)")->group("Mesh");
  ulysses->default_str("");
  auto* layout_opt = cli::add_choice(app, "--layout", layout, {"contiguous", "zigzag", "striped"},
                                     "how the sequence is sharded over the cp ranks")->group("Mesh");
  auto* schedule = cli::add_text(app, "--schedule", o.schedule, "NAME|FILE.csv",
                                 "a built-in training schedule (zbv, 1f1b, interleaved_1f1b, zb1p, "
                                 "interleaved_zero_bubble, dual_pipe_v, gpipe, looped_bfs) or a CSV file")->group("Mesh");
  auto* ranks = cli::add_integer(app, "--ranks", o.ranks, 1, max_ranks, "local world size (default pp x dp x cp)")
                    ->group("Mesh");
  ranks->default_str("");
  cli::add_choice(app, "--comm", o.comm, {"local", "mpi"},
                  "ranks as threads of this process, or MPI processes (mpirun -np N)")->group("Mesh");
  // Model.
  cli::add_integer<std::int64_t>(app, "--layers", o.layers, 1, max_size, "transformer blocks")->group("Model");
  cli::add_integer<std::int64_t>(app, "--d-model", o.d_model, 1, max_size, "model width")->group("Model");
  cli::add_integer<std::int64_t>(app, "--heads", o.heads, 1, max_size, "attention heads")->group("Model");
  cli::add_integer<std::int64_t>(app, "--kv-heads", o.kv_heads, 1, max_size, "key/value heads (dividing --heads)")
      ->group("Model");
  cli::add_integer<std::int64_t>(app, "--seq", o.seq, 1, max_size, "sequence length (tokens = bytes)")->group("Model");
  cli::add_choice(app, "--dtype", o.dtype, {"float", "double", "bf16"},
                  "element type (bf16: float master weights, activations kept and sent in bf16, the blocks' "
                  "projections on bf16 operands with float sums)")->group("Model");
  cli::add_choice(app, "--matmul", o.matmul, {"native", "bf16"},
                  "the blocks' projections: on the element type, or on operands rounded to bf16 with float sums "
                  "(the default with --dtype bf16). docs/nn.md")->group("Model");
  cli::add_choice(app, "--backend", o.backend, {"kokkos", "reference"}, "attention kernels")->group("Model");
  auto* recompute_opt = cli::add_choice(app, "--recompute", recompute, {"none", "selective", "full", "auto"},
                  "what every block keeps for its backward: everything; the matrix products' outputs (the norms "
                  "and SwiGLU's product are recomputed); its input only (the forward is recomputed); auto: a "
                  "policy per stage and the schedule planned under --memory-cap. docs/memory.md")->group("Model");
  std::string memory_cap;
  auto* memory_cap_opt = cli::add_text(app, "--memory-cap", memory_cap, "SIZE",
                                       "bytes per rank (512MiB, 8GiB, 1.5GB, or plain bytes): --recompute auto (the "
                                       "default with a cap) plans under it; an explicit --recompute is checked "
                                       "against it")->group("Model");
  // Training.
  cli::add_integer<std::int64_t>(app, "--batch", o.batch, 1, max_size, "rows per step and data-parallel replica")
      ->group("Training");
  auto* microbatches = cli::add_integer(app, "--microbatches", o.microbatches, 1, max_ranks, "microbatches per step")
                           ->group("Training");
  cli::add_integer(app, "--steps", o.steps, 1, std::numeric_limits<int>::max(), "optimizer steps")->group("Training");
  cli::add_number(app, "--lr", o.lr, "a finite number > 0", [](double x) { return x > 0; },
                  "peak learning rate")->group("Training");
  auto* warmup = cli::add_integer<std::int64_t>(app, "--warmup", o.lr_schedule.warmup, 0, max_size,
                                                "steps of linear warmup to --lr")->group("Training");
  auto* decay_opt = cli::add_choice(app, "--decay", decay, {"constant", "cosine", "linear"},
                                    "after the warmup: stay at --lr, or decay to --lr-min at the last step")
                        ->group("Training");
  auto* lr_min = cli::add_number(app, "--lr-min", o.lr_schedule.min_lr, "a finite number >= 0",
                                 [](double x) { return x >= 0; }, "the floor of --decay cosine|linear")
                     ->group("Training");
  cli::add_number(app, "--weight-decay", o.weight_decay, "a finite number >= 0", [](double x) { return x >= 0; },
                  "AdamW's decoupled weight decay")->group("Training");
  cli::add_text(app, "--betas", betas, "B1,B2", "AdamW's betas, each in [0, 1)")->group("Training")->default_str(betas);
  auto* eps = cli::add_number(app, "--eps", o.eps, "a finite number > 0", [](double x) { return x > 0; },
                              "AdamW's eps (default: 1e-5 in float, 1e-8 in double; docs/training.md)")
                  ->group("Training");
  eps->default_str("");
  cli::add_number(app, "--clip", o.clip, "a finite number >= 0 (0 turns clipping off)",
                  [](double x) { return x >= 0; }, "gradient-norm clipping threshold; 0: off")->group("Training");
  cli::add_integer<std::uint64_t>(app, "--seed", o.seed, 0, std::numeric_limits<std::uint64_t>::max(),
                                  "initial weights")->group("Training");
  cli::add_text(app, "--data", o.data, "FILE", "training text (the last 10 % is held out)")->group("Training");
  app.add_flag("--packed", o.packed, "packed documents (paragraphs) with a document mask")->group("Training");
  // Checking and reporting.
  auto* plan_memory = app.add_flag("--plan-memory", o.plan_memory,
                                   "print each rank's predicted peak memory by category, then exit without "
                                   "training (docs/memory.md)")->group("Reporting");
  app.add_flag("--check", o.check, "first compare one step with the same model on one rank; exit 4 beyond the "
                                   "tolerance")->group("Reporting");
  auto* check_tolerance = cli::add_number(app, "--check-tolerance", o.check_tolerance, "a finite number > 0",
                                          [](double x) { return x > 0; },
                                          "--check's bound on the worst parameter difference relative to the largest "
                                          "parameter, and on the loss's (default: 1e-10 in double, 1e-5 in float)")
                              ->group("Reporting");
  check_tolerance->default_str("");
  cli::add_integer(app, "--log-every", o.log_every, 1, std::numeric_limits<int>::max(), "print every N-th step")
      ->group("Reporting");
  cli::add_integer(app, "--loss-digits", o.loss_digits, 1, 17, "digits after the point of printed losses (17: exact)")
      ->group("Reporting");
  auto* eval_every = cli::add_integer(app, "--eval-every", o.eval_every, 1, std::numeric_limits<int>::max(),
                                      "held-out loss every N steps (always at the end)")->group("Reporting");
  eval_every->default_str("");
  cli::add_text(app, "--metrics", o.metrics, "FILE.jsonl", "one JSON line per step (docs/training.md); appended to with --resume")
      ->group("Reporting");
  auto* trace = cli::add_text(app, "--trace", o.trace, "FILE.json|FILE.svg",
                              "the measured timeline of one step on every rank beside the simulated one: a "
                              "Chrome/Perfetto trace (.json) or a picture (.svg)")->group("Reporting");
  auto* trace_step = cli::add_integer(app, "--trace-step", o.trace_step, 0, std::numeric_limits<int>::max(),
                                      "the step --trace draws (default: the last)")->group("Reporting");
  trace_step->default_str("");
  cli::add_integer(app, "--generate", o.generate, 0, 1 << 20, "bytes generated greedily at the end (0: none)")
      ->group("Reporting");
  // Checkpoints: parsed and checked here; examples/train_lm/checkpoint.hpp says where they act.
  auto* save = cli::add_text(app, "--save", o.save, "DIR", "write checkpoints there (at the end, every --save-every "
                                                          "steps, and on SIGINT/SIGTERM)")->group("Checkpoints");
  auto* save_every = cli::add_integer(app, "--save-every", o.save_every, 1, std::numeric_limits<int>::max(),
                                      "steps between checkpoints")->group("Checkpoints");
  save_every->default_str("");
  auto* keep = cli::add_integer(app, "--keep", o.keep, 1, std::numeric_limits<int>::max(),
                                "checkpoints kept (older ones removed)")->group("Checkpoints");
  keep->default_str("");
  auto* resume = cli::add_text(app, "--resume", o.resume, "DIR", "continue from the latest checkpoint there")
                     ->group("Checkpoints");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return false;
  } catch (const CLI::CallForVersion&) {
    std::printf("%s\n", version_text().c_str());
    return false;
  } catch (const CLI::ParseError& e) {
    throw input_error(cli::explain(e, app, [](const std::string&) { return std::string(); }), "see baton-train --help");
  }

  // Values whose meaning depends on others, and flags the chosen mode would ignore: refused.
  const auto refuse = [](const std::string& what, const std::string& fix) { throw input_error(what, fix); };
  o.pp_given = pp->count() > 0;
  o.microbatches_given = microbatches->count() > 0;
  {
    const auto comma = betas.find(',');
    if (comma == std::string::npos)
      refuse("--betas takes two numbers B1,B2, got '" + betas + "'", "--betas (e.g. 0.9,0.95)");
    const auto in_range = [](double x) { return x >= 0 && x < 1; };
    try {
      o.beta1 = cli::parse_number("--betas", betas.substr(0, comma), "two numbers in [0, 1), B1,B2", in_range);
      o.beta2 = cli::parse_number("--betas", betas.substr(comma + 1), "two numbers in [0, 1), B1,B2", in_range);
    } catch (const CLI::ValidationError& e) {
      refuse(std::string(e.what()) + " (got '" + betas + "')", "--betas");
    }
  }
  if (o.cp == 1) {
    if (cp_mode_opt->count() > 0)
      refuse("--cp-mode " + cp_mode + " needs context parallelism, but --cp is 1", "--cp (2 or more), or leave --cp-mode out");
    if (layout_opt->count() > 0)
      refuse("--layout " + layout + " shards the sequence over the cp ranks, but --cp is 1", "--cp (2 or more), or leave --layout out");
    o.cp_mode = baton::nn::cp_mode::none;
  } else if (cp_mode == "auto") {
    if (ulysses->count() > 0)
      refuse("--ulysses fixes the hybrid's Ulysses degree, but --cp-mode auto chooses it", "--cp-mode hybrid, or leave --ulysses out");
    if (o.comm != "local")
      refuse("--cp-mode auto calibrates on thread ranks of this process, not on --comm " + o.comm,
             "--cp-mode ring, ulysses or hybrid (or --comm local)");
    o.cp_mode_auto = true;
    o.cp_mode = baton::nn::cp_mode::ring;  // until main() has chosen
  } else {
    o.cp_mode = cp_mode == "ulysses" ? baton::nn::cp_mode::ulysses
                : cp_mode == "hybrid" ? baton::nn::cp_mode::hybrid
                                      : baton::nn::cp_mode::ring;
  }
  if (ulysses->count() > 0 && o.cp_mode != baton::nn::cp_mode::hybrid)
    refuse("--ulysses sets the Ulysses degree of --cp-mode hybrid, but the cp mode is " +
               std::string(baton::nn::to_string(o.cp_mode)),
           "--cp-mode hybrid, or leave --ulysses out (--cp-mode ulysses uses all --cp ranks)");
  if (o.cp_mode == baton::nn::cp_mode::hybrid) {
    if (ulysses->count() == 0) {
      for (int u = 2; u <= o.cp / 2 && o.ulysses == 0; ++u)
        if (o.cp % u == 0 && o.cp / u >= 2) o.ulysses = u;
      if (o.ulysses == 0)
        refuse("--cp-mode hybrid needs --cp = ring x ulysses with both 2 or more, but --cp " + std::to_string(o.cp) +
                   " has no such split",
               "--cp (e.g. 4), or --cp-mode ring or ulysses");
    } else if (o.cp % o.ulysses != 0 || o.cp / o.ulysses < 2) {
      refuse("--ulysses " + std::to_string(o.ulysses) + " must divide --cp " + std::to_string(o.cp) +
                 " and leave a ring of 2 or more (hybrid = ring x ulysses)",
             "--ulysses or --cp");
    }
  }
  o.layout = layout == "contiguous" ? baton::shard_layout::contiguous
             : layout == "striped"  ? baton::shard_layout::striped
                                    : baton::shard_layout::zigzag;
  o.lr_schedule.decay = decay == "cosine" ? baton::train::lr_decay::cosine
                        : decay == "linear" ? baton::train::lr_decay::linear
                                            : baton::train::lr_decay::constant;
  if (lr_min->count() > 0 && o.lr_schedule.decay == baton::train::lr_decay::constant)
    refuse("--lr-min is the floor of a decay, but --decay is constant", "--decay cosine|linear, or leave --lr-min out");
  if (o.lr_schedule.min_lr > o.lr)
    refuse("--lr-min " + cli::number_text(o.lr_schedule.min_lr) + " is above --lr " + cli::number_text(o.lr),
           "--lr-min or --lr");
  if (warmup->count() > 0 && o.lr_schedule.warmup >= o.steps)
    refuse("--warmup " + std::to_string(o.lr_schedule.warmup) + " is not below --steps " + std::to_string(o.steps) +
               ": the run would end before reaching --lr",
           "--warmup or --steps");
  (void)decay_opt;
  if (o.eval_every > o.steps)
    refuse("--eval-every " + std::to_string(o.eval_every) + " is above --steps " + std::to_string(o.steps) +
               ": it would never evaluate (the held-out loss is printed at the end anyway)",
           "--eval-every or --steps");
  if (trace_step->count() > 0 && trace->count() == 0)
    refuse("--trace-step chooses the step --trace draws, but there is no --trace", "--trace FILE.json|FILE.svg");
  if (trace->count() > 0 && !ends_with(o.trace, ".json") && !ends_with(o.trace, ".svg"))
    refuse("--trace writes a Chrome/Perfetto trace (FILE.json) or a picture (FILE.svg), got '" + o.trace + "'",
           "--trace (a name ending in .json or .svg)");
  if (o.trace_step >= o.steps)
    refuse("--trace-step " + std::to_string(o.trace_step) + " is not a step of the run (0 to " +
               std::to_string(o.steps - 1) + ")",
           "--trace-step or --steps");
  if (o.check && o.trace_step == 0 && trace_step->count() > 0)
    refuse("--trace-step 0 is --check's step, which runs once on the mesh and once on one rank",
           "--trace-step (1 or more)");
  if (check_tolerance->count() > 0 && !o.check)
    refuse("--check-tolerance is --check's bound, but there is no --check", "--check, or leave --check-tolerance out");
  if ((save_every->count() > 0 || keep->count() > 0) && save->count() == 0)
    refuse(std::string(save_every->count() > 0 ? "--save-every" : "--keep") + " needs --save DIR",
           "--save DIR (or leave " + std::string(save_every->count() > 0 ? "--save-every" : "--keep") + " out)");
  if (memory_cap_opt->count() > 0) o.memory_cap = parse_memory_size(memory_cap);
  o.recompute_auto = recompute == "auto" || (memory_cap_opt->count() > 0 && recompute_opt->count() == 0);
  if (o.recompute_auto && o.memory_cap <= 0)
    refuse("--recompute auto plans a policy per stage under a memory cap, but there is no --memory-cap",
           "--memory-cap SIZE (e.g. 8GiB), or --recompute none|selective|full");
  if (o.recompute_auto && ends_with(o.schedule, ".csv"))
    refuse("--recompute auto plans the order of the schedule's actions with the policies, which --schedule " + o.schedule +
               " fixes (the planner chooses among schedules of a shape; it does not plan policies for one given "
               "order)",
           "a built-in --schedule (its shape is planned), or --recompute none|selective|full to check the file "
           "against --memory-cap");
  // (CLI11 allowed only the four names; auto keeps none for the parts the plan does not set)
  o.recompute = o.recompute_auto ? baton::nn::recompute_policy::none : baton::nn::parse_recompute_policy(recompute);
  if (plan_memory->count() > 0) {
    // Flags that act during or after training would be silently ignored: refused.
    const std::pair<const char*, bool> acting[] = {
        {"--check", o.check},         {"--metrics", !o.metrics.empty()}, {"--trace", !o.trace.empty()},
        {"--save", !o.save.empty()}, {"--resume", !o.resume.empty()},   {"--eval-every", o.eval_every > 0}};
    for (const auto& [flag, given] : acting)
      if (given)
        refuse(std::string("--plan-memory prints the memory plan and exits without training, so ") + flag +
                   " would do nothing",
               std::string(flag) + " (leave it out), or leave --plan-memory out to train");
  }
  (void)resume;
  (void)schedule;
  (void)ranks;
  (void)cp;
  checkpoint::check_flags(o);  // refuses what the checkpoint hooks cannot do (yet)
  return true;
}

double parse_memory_size(const std::string& text) {
  // The number, then an optional unit: decimal (kB, MB, GB, TB) or binary (KiB, MiB, GiB, TiB).
  static const std::pair<const char*, double> units[] = {
      {"", 1},          {"B", 1},          {"kB", 1e3},      {"KB", 1e3},         {"MB", 1e6},
      {"GB", 1e9},      {"TB", 1e12},      {"KiB", 1024.0},  {"MiB", 1048576.0},  {"GiB", 1073741824.0},
      {"TiB", 1099511627776.0}};
  std::size_t end = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) ++end;
  const std::string number = text.substr(0, end), unit = text.substr(end);
  const auto bad = [&](const std::string& why) -> double {
    throw input_error("--memory-cap must be a size in bytes per rank, a number with an optional unit (B, kB, MB, GB, "
                      "TB, KiB, MiB, GiB, TiB), got '" + text + "'" + why,
                      "--memory-cap (e.g. 512MiB, 8GiB, 1.5GB or 1000000)");
  };
  if (number.empty() || std::count(number.begin(), number.end(), '.') > 1 || number == ".") return bad("");
  for (const auto& [name, scale] : units)
    if (unit == name) {
      const double bytes = std::strtod(number.c_str(), nullptr) * scale;
      if (!(bytes >= 1) || !std::isfinite(bytes)) return bad(": it must be at least 1 byte");
      return bytes;
    }
  return bad(" (unknown unit '" + unit + "')");
}

std::string flags_for(const std::string& setting) {
  if (setting == "mesh") return "--pp, --dp, --cp (and --ranks, or mpirun -np)";
  if (setting == "cp") return "--cp-mode, --cp or --ulysses";
  if (setting == "schedule") return "--schedule or --pp";
  if (setting == "model") return "--d-model, --heads or --kv-heads";
  if (setting == "heads") return "--heads, --kv-heads or --cp (--ulysses)";
  if (setting == "layers") return "--layers";
  if (setting == "seq") return "--seq, --cp or --layout";
  if (setting == "batch") return "--batch or --microbatches";
  if (setting == "microbatches") return "--microbatches";
  if (setting == "optimizer") return "--lr, --betas, --eps, --weight-decay or --clip";
  if (setting == "learning_rate") return "--lr, --warmup, --decay, --lr-min or --steps";
  if (setting == "memory_cap") return "--memory-cap (at least the least cap named), or --microbatches, --seq, --d-model or --layers";
  return "the configuration";
}

namespace {

// The program for the options: a built-in policy (a training one) or a CSV file, whose ranks
// and microbatches become --pp and --microbatches unless given (and must match when given).
baton::program make_schedule(const options& o) {
  if (ends_with(o.schedule, ".csv")) {
    baton::program p;
    try {
      p = baton::read_csv_file(o.schedule);
    } catch (const baton::schedule_error& e) {
      throw input_error(e.what(), "--schedule (the CSV file)");
    }
    if (o.pp_given && p.shape.ranks != o.pp)
      throw input_error("the CSV schedule " + o.schedule + " is for " + std::to_string(p.shape.ranks) +
                            " pipeline ranks but --pp is " + std::to_string(o.pp),
                        "--pp (or leave it out: the file's is used)");
    if (o.microbatches_given && p.shape.microbatches != o.microbatches)
      throw input_error("the CSV schedule " + o.schedule + " runs " + std::to_string(p.shape.microbatches) +
                            " microbatches but --microbatches is " + std::to_string(o.microbatches),
                        "--microbatches (or leave it out: the file's is used)");
    return p;
  }
  const baton::policy_info* policy = baton::find_policy(o.schedule);
  if (policy == nullptr || policy->name == "forward_only") {
    std::string known;
    for (const auto& info : baton::builtin_policies)
      if (info.name != "forward_only") known += (known.empty() ? "" : ", ") + std::string(info.name);
    throw input_error(policy ? "--schedule forward_only has no backward: it evaluates, it cannot train"
                             : "--schedule '" + o.schedule + "' is neither a built-in schedule nor a .csv file",
                      "--schedule (one of " + known + ", or FILE.csv)");
  }
  return policy->generate(policy->shape(o.pp, o.microbatches));
}

std::string gib(double bytes) {
  char text[40];
  if (bytes >= 1024.0 * 1024 * 1024 * 1024 * 10)
    std::snprintf(text, sizeof text, "%.3g TiB", bytes / (1024.0 * 1024 * 1024 * 1024));
  else
    std::snprintf(text, sizeof text, "%.3g GiB", bytes / (1024.0 * 1024 * 1024));
  return text;
}

// --recompute auto: the policies per stage and the program under --memory-cap
// (plan_under_memory_cap), for the named schedule's shape; `config` takes the policies.
void plan_under_cap(const options& o, baton::train::lm_config& config, const baton::train::lm_parallelism& parallelism,
                    std::size_t element, prepared& out) {
  const baton::schedule_shape shape = out.schedule.shape;
  baton::train::memory_plan plan;
  try {
    plan = baton::train::plan_under_memory_cap(config, parallelism, shape, o.memory_cap, {.element_bytes = element});
  } catch (const baton::train::config_error& e) {
    throw input_error(e.what(), flags_for(e.setting()));
  }
  out.schedule = plan.prog;
  out.stage_recompute = config.stage_recompute = plan.stage_policies;
  using baton::detail::train::bytes_text;
  std::string text = "memory cap: " + bytes_text(o.memory_cap) + " per rank, --recompute auto: a policy per stage and "
                     "the order of " + o.schedule + "'s shape (" + std::to_string(shape.num_stages()) + " stages on " +
                     std::to_string(shape.ranks) + " ranks, " + std::to_string(shape.microbatches) +
                     " microbatches) planned\n  policies:";
  for (std::size_t s = 0; s < plan.stage_policies.size(); ++s)
    text += " stage " + std::to_string(s) + " " + std::string(baton::nn::to_string(plan.stage_policies[s])) +
            (s + 1 < plan.stage_policies.size() ? "," : "");
  char line[300];
  std::snprintf(line, sizeof line, "\n  makespan %.4g FLOPs, lower bound %.4g, gap %.3f (%s)\n", plan.makespan,
                plan.lower_bound, plan.gap, plan.bound_method.c_str());
  text += line;
  text += "  how: " + plan.method + (plan.replans > 0 ? "; " + std::to_string(plan.replans) + " replans" : "") + "\n";
  text += "  predicted peak per pp rank vs the cap:";
  for (std::size_t r = 0; r < plan.predicted.size(); ++r) {
    std::snprintf(line, sizeof line, " %zu: %.2f MiB (%.1f %%)%s", r, plan.predicted[r].total() / 1048576.0,
                  100 * plan.predicted[r].total() / o.memory_cap, r + 1 < plan.predicted.size() ? "," : "\n");
    text += line;
  }
  out.plan_text = text;
}

}  // namespace

prepared prepare(const options& o_in, int world_size, int ranks_here) {
  options o = o_in;
  prepared out;
#if !BATON_HAS_KOKKOS()
  if (o.backend == "kokkos")
    throw input_error("--backend kokkos: this baton-train was built without Kokkos", "--backend reference");
#endif
  if (o.dtype == "bf16" && o.backend != "kokkos")
    throw input_error("--dtype bf16 runs the attention on bf16 storage, which --backend " + o.backend + " does not take",
                      "--backend kokkos");
  if (o.dtype == "double" && o.bf16_matmul())
    throw input_error("--matmul bf16 rounds float operands to bf16 and sums in float; --dtype double has none",
                      "--dtype float or bf16, or --matmul native");
  if (o.dtype != "bf16" && o.bf16_matmul() && o.check)
    throw input_error("--check --matmul bf16: --check's one-rank model and tolerance are float's or double's",
                      "--check --matmul native");
  if (o.dtype == "bf16" && o.check)
    throw input_error("--check --dtype bf16: --check's one-rank model and tolerance are float's or double's",
                      "--check --dtype float (bf16 is tested against the float64 model in test_train_recompute)");
  try {
    out.schedule = make_schedule(o);
  } catch (const baton::schedule_error& e) {
    throw input_error(e.what(), "--schedule, --pp or --microbatches");
  }
  o.pp = out.schedule.shape.ranks;
  o.microbatches = out.schedule.shape.microbatches;
  if (baton::is_forward_only(out.schedule))
    throw input_error("the schedule " + o.schedule + " has no backward: it evaluates, it cannot train",
                      "--schedule (a training schedule)");
  try {
    baton::validate(out.schedule);
  } catch (const baton::schedule_error& e) {
    throw input_error(e.what(), "--schedule");
  }
  baton::train::lm_config config = o.config();
  const baton::train::lm_parallelism parallelism = o.parallelism();
  try {
    baton::train::check_config(config, parallelism, world_size, out.schedule.shape);
  } catch (const baton::train::config_error& e) {
    throw input_error(e.what(), flags_for(e.setting()));
  }

  // The text: long enough for a training window and a held-out window of seq + 1 bytes.
  try {
    out.corpus = std::make_shared<const baton::train::byte_corpus>(baton::train::byte_corpus::from_file(o.data));
  } catch (const std::exception& e) {
    throw input_error(std::string(e.what()) + (errno ? std::string(": ") + std::strerror(errno) : ""), "--data");
  }
  const baton::train::byte_corpus& text = *out.corpus;
  const std::int64_t held_out = text.size() - text.train_size();
  if (text.train_size() < o.seq + 2 || held_out < o.seq + 2)
    throw input_error("--data " + o.data + " holds " + std::to_string(text.size()) + " bytes: " +
                          std::to_string(text.train_size()) + " for training and " + std::to_string(held_out) +
                          " held out (the last 10 %), but each part needs at least seq + 2 = " +
                          std::to_string(o.seq + 2) + " bytes",
                      "--data (a longer text) or --seq");

  // Memory, before anything is allocated: every rank on this machine, the text, and what the
  // end of the run adds (the gathered model for --generate, the one-rank model of --check).
  const std::size_t element = o.dtype == "double" ? sizeof(double) : sizeof(float);
  if (o.recompute_auto) plan_under_cap(o, config, parallelism, element, out);
  const auto per_pp = baton::train::estimate_memory(config, parallelism, out.schedule, element);
  out.memory = per_pp;
  if (o.memory_cap > 0 && !o.recompute_auto)  // an explicit policy: checked against the cap
    for (std::size_t r = 0; r < per_pp.size(); ++r)
      if (per_pp[r].total() > o.memory_cap)
        throw input_error("--recompute " + std::string(baton::nn::to_string(o.recompute)) + " under --schedule " +
                              o.schedule + ": pp rank " + std::to_string(r) + "'s predicted peak, " +
                              baton::detail::train::bytes_text(per_pp[r].total()) + ", is above --memory-cap " +
                              baton::detail::train::bytes_text(o.memory_cap),
                          "--recompute auto (plans a policy per stage and the schedule under the cap; leave "
                          "--recompute out), a stronger --recompute, or a larger --memory-cap");
  baton::train::memory_estimate total;
  if (ranks_here >= world_size) {  // every rank is here: each pipeline rank's, once per replica
    const double replicas = parallelism.mesh.dp * parallelism.mesh.cp_ring * parallelism.mesh.cp_ulysses;
    for (const auto& e : per_pp) {
      total.parameters += e.parameters * replicas;
      total.gradients += e.gradients * replicas;
      total.optimizer += e.optimizer * replicas;
      total.activations += e.activations * replicas;
      total.messages += e.messages * replicas;
      total.logits += e.logits * replicas;
      total.workspace += e.workspace * replicas;
    }
  } else {  // some ranks are here (MPI on several machines): count the largest for each
    total = *std::max_element(per_pp.begin(), per_pp.end(),
                              [](const auto& a, const auto& b) { return a.total() < b.total(); });
    for (double* x : {&total.parameters, &total.gradients, &total.optimizer, &total.activations, &total.messages,
                      &total.logits, &total.workspace})
      *x *= ranks_here;
  }
  double whole_model = 0;
  baton::train::lm_config one_stage = config;  // its parameters only: no policy per stage
  one_stage.stage_recompute.clear();
  for (const auto& e : baton::train::estimate_memory(one_stage, parallelism,
                                                     baton::gpipe::generate(baton::shape_for<baton::gpipe>(1, 1)),
                                                     element))
    whole_model += e.parameters;
  double extra = 9.0 * static_cast<double>(text.size());  // the bytes and their document ids
  if (o.generate > 0) extra += 2 * whole_model * ranks_here;  // gather_model: weights and gradients, every rank
  if (o.check) extra += 4 * whole_model;                       // lm_reference on rank 0
  total.workspace += extra;
  const std::optional<double> available = baton::train::available_memory();
  char line[400];
  std::snprintf(line, sizeof line, "memory: estimated %s for the %d rank%s here%s", gib(total.total()).c_str(),
                ranks_here, ranks_here == 1 ? "" : "s",
                available ? (" of " + gib(*available) + " available").c_str() : " (available memory unknown)");
  out.memory_line = line;
  if (o.plan_memory && available && total.total() > *available) out.memory_line += " (more than available: training would be refused)";
  if (available && total.total() > *available && !o.plan_memory)  // a plan is printed whether it fits or not
    throw input_error("this run needs an estimated " + total.text() + " for the " + std::to_string(ranks_here) +
                          " ranks on this machine, but it has " + gib(*available) +
                          " available (MemAvailable, /proc/meminfo)",
                      "--d-model, --layers, --seq or --batch (or more --microbatches: fewer activations in "
                      "flight), or spread the ranks over more machines (--comm mpi)");
  return out;
}

std::string memory_plan_text(const options& o, const prepared& p) {
  const baton::mesh_shape m = o.mesh();
  const baton::schedule_shape& shape = p.schedule.shape;
  double largest = 0;
  for (const auto& e : p.memory) largest = std::max(largest, e.total());
  const bool in_gib = largest >= 1024.0 * 1024 * 1024;
  const double unit = in_gib ? 1024.0 * 1024 * 1024 : 1024.0 * 1024;
  const int cp = m.cp_ring * m.cp_ulysses;
  const std::int64_t rows = (o.batch + shape.microbatches - 1) / shape.microbatches;
  const std::int64_t shard = (o.seq + cp - 1) / cp;
  std::string text;
  char line[400];
  std::snprintf(line, sizeof line,
                "memory plan: %s, schedule %s (%d stages on %d ranks, %d microbatches), %s, recompute %s\n"
                "model: %lld layers, d_model %lld, %lld heads / %lld kv heads, seq %lld (%lld per cp rank), %lld rows "
                "per microbatch\n",
                m.text().c_str(), o.schedule.c_str(), shape.num_stages(), shape.ranks, shape.microbatches,
                o.dtype.c_str(), o.recompute_auto ? "auto" : std::string(baton::nn::to_string(o.recompute)).c_str(),
                static_cast<long long>(o.layers), static_cast<long long>(o.d_model), static_cast<long long>(o.heads),
                static_cast<long long>(o.kv_heads), static_cast<long long>(o.seq), static_cast<long long>(shard),
                static_cast<long long>(rows));
  text += line;
  std::snprintf(line, sizeof line, "%-8s %10s %10s %10s %11s %10s %10s %10s %10s  (%s at each rank's peak)\n", "pp rank",
                "parameters", "gradients", "AdamW", "activations", "messages", "logits", "workspace", "total",
                in_gib ? "GiB" : "MiB");
  text += line;
  for (std::size_t r = 0; r < p.memory.size(); ++r) {
    const auto& e = p.memory[r];
    std::snprintf(line, sizeof line, "%-8zu %10.3f %10.3f %10.3f %11.3f %10.3f %10.3f %10.3f %10.3f\n", r,
                  e.parameters / unit, e.gradients / unit, e.optimizer / unit, e.activations / unit, e.messages / unit,
                  e.logits / unit, e.workspace / unit, e.total() / unit);
    text += line;
  }
  const int replicas = m.dp * cp;
  if (replicas > 1) {
    std::snprintf(line, sizeof line, "each pp rank's %d dp x cp replicas hold as much\n", replicas);
    text += line;
  }
  return text + p.plan_text + p.memory_line + "\n";
}

}  // namespace train_lm
