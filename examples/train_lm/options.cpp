#include "options.hpp"

#include <baton/schedule.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace train_lm {

namespace {

const char* const usage = R"(baton-train: train a byte-level transformer LM under pipeline x data x context parallelism

  --pp N --dp N --cp N        mesh (default pp 2 x cp 2); ranks = pp x dp x cp
  --cp-mode ring|ulysses|hybrid   how attention spreads over the cp ranks (default ring)
  --ulysses U                 hybrid: Ulysses degree inside each ring group (default 2 when cp is even)
  --layout contiguous|zigzag|striped   sequence sharding (default zigzag)
  --schedule NAME|FILE.csv    a built-in schedule (zbv, 1f1b, interleaved_1f1b, zb1p,
                              interleaved_zero_bubble, dual_pipe_v, gpipe, looped_bfs) or a CSV file
  --layers --d-model --heads --kv-heads    model (default 4 x 128, 4 heads, 2 kv heads)
  --seq --batch --microbatches             sequence length, rows per dp replica, microbatches
  --steps N --lr X --clip X --seed N       training (default 240 steps, lr 3e-3, clip 1)
  --backend kokkos|reference  attention kernels (default kokkos)
  --dtype float|double        element type (default float)
  --comm local|mpi            ranks as threads of this process, or MPI processes (mpirun -np N)
  --ranks N                   local world size (default pp x dp x cp)
  --data FILE                 training text (default /usr/share/common-licenses/GPL-3)
  --packed                    packed documents (paragraphs) with a document mask
  --check                     first compare one step with the same model on one rank
  --generate N                bytes to generate greedily at the end (default 200; 0: none)
  --log-every N               print every N-th step (default 10)
  --loss-digits N             digits after the point of the printed losses (default 4; 17: exact)
)";

long long to_int(std::string_view flag, const std::string& v) {
  try {
    std::size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(std::string(flag) + " needs an integer, got '" + v + "'");
}

double to_double(std::string_view flag, const std::string& v) {
  try {
    std::size_t used = 0;
    const double x = std::stod(v, &used);
    if (used == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw std::invalid_argument(std::string(flag) + " needs a number, got '" + v + "'");
}

}  // namespace

baton::mesh_shape options::mesh() const {
  baton::mesh_shape m{pp, dp, cp, 1};
  if (cp_mode == baton::nn::cp_mode::ulysses) {
    m.cp_ring = 1;
    m.cp_ulysses = cp;
  } else if (cp_mode == baton::nn::cp_mode::hybrid) {
    const int u = ulysses > 0 ? ulysses : (cp % 2 == 0 ? 2 : 1);
    m.cp_ulysses = u;
    m.cp_ring = cp % u == 0 ? cp / u : 0;  // 0: the trainer names --cp / --ulysses
  } else if (cp == 1) {
    // --cp 1: no context parallelism, whatever the mode says
  }
  return m;
}

baton::train::lm_config options::config() const {
  baton::train::lm_config c;
  c.model.d_model = d_model;
  c.model.heads = heads;
  c.model.kv_heads = kv_heads;
  c.model.vocab = baton::train::byte_corpus::vocab;
  c.layers = layers;
  c.seq = seq;
  c.batch = batch;
  c.optimizer.lr = lr;
  c.optimizer.weight_decay = 0.01;
  c.clip_norm = clip;
  c.seed = seed;
  return c;
}

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage, stdout);
      return false;
    }
    if (flag == "--packed") { o.packed = true; continue; }
    if (flag == "--check") { o.check = true; continue; }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value (see --help)");
    const std::string v = argv[++i];
    if (flag == "--pp") o.pp = static_cast<int>(to_int(flag, v));
    else if (flag == "--dp") o.dp = static_cast<int>(to_int(flag, v));
    else if (flag == "--cp") o.cp = static_cast<int>(to_int(flag, v));
    else if (flag == "--ulysses") o.ulysses = static_cast<int>(to_int(flag, v));
    else if (flag == "--ranks") o.ranks = static_cast<int>(to_int(flag, v));
    else if (flag == "--cp-mode") {
      if (v == "ring") o.cp_mode = baton::nn::cp_mode::ring;
      else if (v == "ulysses") o.cp_mode = baton::nn::cp_mode::ulysses;
      else if (v == "hybrid") o.cp_mode = baton::nn::cp_mode::hybrid;
      else throw std::invalid_argument("--cp-mode is ring, ulysses or hybrid, got '" + v + "'");
    } else if (flag == "--layout") {
      if (v == "contiguous") o.layout = baton::shard_layout::contiguous;
      else if (v == "zigzag") o.layout = baton::shard_layout::zigzag;
      else if (v == "striped") o.layout = baton::shard_layout::striped;
      else throw std::invalid_argument("--layout is contiguous, zigzag or striped, got '" + v + "'");
    } else if (flag == "--schedule") o.schedule = v;
    else if (flag == "--layers") o.layers = to_int(flag, v);
    else if (flag == "--d-model") o.d_model = to_int(flag, v);
    else if (flag == "--heads") o.heads = to_int(flag, v);
    else if (flag == "--kv-heads") o.kv_heads = to_int(flag, v);
    else if (flag == "--seq") o.seq = to_int(flag, v);
    else if (flag == "--batch") o.batch = to_int(flag, v);
    else if (flag == "--microbatches") o.microbatches = static_cast<int>(to_int(flag, v));
    else if (flag == "--steps") o.steps = static_cast<int>(to_int(flag, v));
    else if (flag == "--lr") o.lr = to_double(flag, v);
    else if (flag == "--clip") o.clip = to_double(flag, v);
    else if (flag == "--seed") o.seed = static_cast<std::uint64_t>(to_int(flag, v));
    else if (flag == "--backend") {
      if (v != "kokkos" && v != "reference") throw std::invalid_argument("--backend is kokkos or reference, got '" + v + "'");
      o.backend = v;
    } else if (flag == "--comm") {
      if (v != "local" && v != "mpi") throw std::invalid_argument("--comm is local or mpi, got '" + v + "'");
      o.comm = v;
    } else if (flag == "--dtype") {
      if (v != "float" && v != "double") throw std::invalid_argument("--dtype is float or double, got '" + v + "'");
      o.dtype = v;
    } else if (flag == "--data") o.data = v;
    else if (flag == "--generate") o.generate = static_cast<int>(to_int(flag, v));
    else if (flag == "--log-every") o.log_every = std::max(1, static_cast<int>(to_int(flag, v)));
    else if (flag == "--loss-digits") o.loss_digits = std::clamp(static_cast<int>(to_int(flag, v)), 1, 17);
    else throw std::invalid_argument("unknown option " + flag + " (see --help)");
  }
  if (o.pp < 1 || o.dp < 1 || o.cp < 1) throw std::invalid_argument("--pp, --dp and --cp must be at least 1");
  if (o.cp == 1) o.cp_mode = baton::nn::cp_mode::none;
  if (o.steps < 0) throw std::invalid_argument("--steps must be >= 0");
  if (o.microbatches < 1) throw std::invalid_argument("--microbatches must be at least 1");
  return true;
}

std::string flags_for(const std::string& setting) {
  if (setting == "mesh") return "--pp, --dp, --cp (and --ranks, or mpirun -np)";
  if (setting == "cp") return "--cp-mode, --cp or --ulysses";
  if (setting == "schedule") return "--schedule or --pp";
  if (setting == "model") return "--d-model, --heads or --kv-heads";
  if (setting == "heads") return "--heads, --kv-heads or --cp (--ulysses)";
  if (setting == "layers") return "--layers";
  if (setting == "seq") return "--seq or --layout";
  if (setting == "batch") return "--batch or --microbatches";
  if (setting == "microbatches") return "--microbatches";
  return "the configuration";
}

baton::program make_schedule(const options& o) {
  if (o.schedule.size() > 4 && o.schedule.substr(o.schedule.size() - 4) == ".csv") {
    baton::program p = baton::read_csv_file(o.schedule);
    if (p.shape.ranks != o.pp)
      throw baton::train::config_error("schedule", "the CSV schedule " + o.schedule + " is for " +
                                                       std::to_string(p.shape.ranks) + " ranks but --pp is " +
                                                       std::to_string(o.pp));
    if (p.shape.microbatches != o.microbatches)
      throw baton::train::config_error("microbatches", "the CSV schedule " + o.schedule + " runs " +
                                                           std::to_string(p.shape.microbatches) +
                                                           " microbatches but --microbatches is " +
                                                           std::to_string(o.microbatches));
    return p;
  }
  const baton::policy_info& policy = baton::policy_by_name(o.schedule);
  return policy.generate(policy.shape(o.pp, o.microbatches));
}

}  // namespace train_lm
