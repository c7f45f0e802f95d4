// baton-train's command line: the options and their defaults, the parse (CLI11, every value
// range-checked, every flag the chosen mode would ignore refused), and what is checked before
// the first rank starts: the schedule, the configuration, the data, the memory (prepare).
#pragma once

#include <baton/train.hpp>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace train_lm {

/// Exit codes (docs/training.md): 0 trained; 1 an error while running; 2 bad input (the
/// command line, the configuration, the data, the memory); 3 stopped at a non-finite loss or
/// gradient norm; 4 --check beyond its tolerance; 128 + N stopped by signal N (SIGINT 130,
/// SIGTERM 143) after finishing the step.
enum exit_code : int { ok = 0, failed = 1, bad_input = 2, non_finite = 3, check_failed = 4 };

/// A bad input found before any rank starts: what is wrong, and the flags to change.
class input_error : public std::invalid_argument {
 public:
  input_error(const std::string& what, std::string fix) : std::invalid_argument(what), fix_(std::move(fix)) {}
  const std::string& fix() const noexcept { return fix_; }

 private:
  std::string fix_;
};

struct options {
  int ranks = 0;  // local world size; 0: pp x dp x cp
  int pp = 2, dp = 1, cp = 2, ulysses = 0;
  baton::nn::cp_mode cp_mode = baton::nn::cp_mode::ring;
  bool cp_mode_auto = false;  // --cp-mode auto: main() sets cp_mode (and ulysses) by baton::cp::choose
  baton::shard_layout layout = baton::shard_layout::zigzag;
  std::string schedule = "zbv";
  bool pp_given = false, microbatches_given = false;  // a CSV schedule brings its own otherwise
  std::int64_t layers = 4, d_model = 128, heads = 4, kv_heads = 2, seq = 128, batch = 8;
  int microbatches = 4, steps = 240;
  double lr = 3e-3, clip = 1.0;
  // AdamW. eps 0: the element type's default (float 1e-5, double 1e-8; docs/training.md).
  double weight_decay = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 0;
  baton::train::lr_schedule lr_schedule{};  // total is set to steps
  std::string backend = "kokkos", comm = "local", dtype = "float";
  // --matmul: the blocks' projections on bf16 operands (sums in float) or the element type's;
  // empty: bf16 with --dtype bf16, native otherwise.
  std::string matmul;
  bool bf16_matmul() const { return matmul.empty() ? dtype == "bf16" : matmul == "bf16"; }
  baton::nn::recompute_policy recompute = baton::nn::recompute_policy::none;  // --recompute, every stage
  bool plan_memory = false;  // --plan-memory: print each rank's predicted peak and exit
  // --memory-cap SIZE (bytes per rank; 0: none) and --recompute auto (implied by a cap without
  // --recompute): plan the policy per stage and the schedule under the cap (prepare).
  double memory_cap = 0;
  bool recompute_auto = false;
  std::uint64_t seed = 1;
  std::string data = "/usr/share/common-licenses/GPL-3";
  bool packed = false, check = false;
  double check_tolerance = 0;  // 0: the element type's (run.hpp, check_tolerance)
  int generate = 200, log_every = 10, loss_digits = 4;
  int eval_every = 0;         // 0: the held-out loss at the end only
  std::string metrics;        // --metrics FILE.jsonl
  std::string trace;          // --trace FILE.json | FILE.svg
  int trace_step = -1;        // -1: the last step
  // Checkpoints (examples/train_lm/checkpoint.hpp says where they hook in).
  std::string save, resume;
  int save_every = 0, keep = 0;

  baton::mesh_shape mesh() const;
  int world_size() const { return ranks > 0 ? ranks : pp * dp * cp; }
  double adamw_eps() const { return eps > 0 ? eps : (dtype == "double" ? 1e-8 : 1e-5); }
  baton::train::lm_config config() const;
  baton::train::lm_parallelism parallelism() const { return {mesh(), cp_mode, layout}; }
};

/// Parses argv. Returns false after printing the help (--help) or the version (--version);
/// throws input_error naming the flag for anything it cannot run exactly as given.
bool parse(int argc, char** argv, options& o);

/// The flag(s) to change for a config_error's setting.
std::string flags_for(const std::string& setting);

/// What every rank shares, made once before any rank starts (and, over MPI, by every process
/// alike): the schedule, the text, the memory estimate.
struct prepared {
  baton::program schedule;
  std::shared_ptr<const baton::train::byte_corpus> corpus;
  std::string memory_line;  // "memory: estimated ... of ... available"
  std::vector<baton::train::memory_estimate> memory;  // each pipeline rank's peak (estimate_memory)
  // --recompute auto: the policy per stage (lm_config::stage_recompute; schedule is the planned
  // program) and the plan's report; empty otherwise.
  std::vector<baton::nn::recompute_policy> stage_recompute;
  std::string plan_text;
};

/// "512MiB", "8GiB", "1.5GB", "1000000" (bytes) -> bytes; throws input_error naming --memory-cap.
double parse_memory_size(const std::string& text);

/// --plan-memory's report: each pipeline rank's predicted peak by category, and the machine's.
std::string memory_plan_text(const options& o, const prepared& p);

/// Everything that can be checked before the first rank starts work: the schedule (a training
/// one), the configuration on `world_size` ranks, the data (long enough for the training and
/// the held-out part), the memory of the `ranks_here` ranks on this machine against what it
/// has. Throws input_error.
prepared prepare(const options& o, int world_size, int ranks_here);

/// Runs the whole program on this rank of `world` (templated on the communicator in run.hpp).
/// `metrics` is the open --metrics file on the rank that writes it (world rank 0), else null.
int run_local_world(const options& o, const prepared& p, std::FILE* metrics);
int run_mpi_world(const options& o);

}  // namespace train_lm
