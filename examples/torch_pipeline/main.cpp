// baton-torch-pipeline: a small byte-level transformer language model written with torch::nn
// modules and trained by LibTorch's autograd, under baton's ZBV pipeline (pp) and ring
// attention (cp): the model's causal self-attention is baton::torch_cp_attention over a
// baton::ring_attention on the context-parallel communicator, so each cp rank holds a zigzag
// shard of every sequence. Ranks are threads (--comm local) or MPI processes (--comm mpi).
//
//   baton-torch-pipeline                               # pp 2 x cp 2 on 4 threads, 6 steps
//   mpiexec -n 4 baton-torch-pipeline --comm mpi       # the same run, as 4 processes
//
// The model: ZBV places 2 stages per pipeline rank in a V, so --pp 2 gives 4 stages:
// (embedding + block), block, block, (block + final norm + head). Each block is pre-norm
// attention (4 heads of 16) and a GELU MLP, d_model 64; positions are learned absolute
// embeddings indexed by the global positions of the rank's shard.
#include <baton/attention/masks.hpp>
#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/comm/mesh.hpp>
#include <baton/config.hpp>
#include <baton/cp/ring.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>
#include <baton/torch.hpp>
#if BATON_HAS_MPI()
#include <baton/comm/mpi.hpp>
#endif

#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

// ---- configuration -----------------------------------------------------------------------

constexpr std::int64_t vocab = 256;  // bytes
constexpr std::int64_t d_model = 64;
constexpr std::int64_t heads = 4;
constexpr std::int64_t head_dim = d_model / heads;
constexpr std::int64_t mlp_width = 4 * d_model;
constexpr std::int64_t seq_len = 64;
constexpr std::int64_t rows = 8;  // sequences per step
constexpr int microbatches = 4;
constexpr double learning_rate = 3e-3;
constexpr double max_grad_norm = 1.0;

struct options {
  int steps = 6;
  std::string comm = "local";
  int pp = 2;
  int cp = 2;
  int loss_digits = 4;
  std::string data = "/usr/share/common-licenses/GPL-3";
};

const char* const usage =
    "usage: baton-torch-pipeline [--steps N] [--comm local|mpi] [--pp N] [--cp N] [--loss-digits N] [--data FILE]\n"
    "  --steps N        training steps (default 6)\n"
    "  --comm local     ranks are threads of this process (default); mpi: ranks are MPI processes\n"
    "  --pp N, --cp N   pipeline ranks (2 stages each, ZBV) x context-parallel ranks (default 2 x 2);\n"
    "                   their product is the number of ranks (mpiexec -n must equal it)\n"
    "  --loss-digits N  digits of the printed losses (default 4)\n"
    "  --data FILE      text read as bytes (default /usr/share/common-licenses/GPL-3; a built-in\n"
    "                   sentence when the file cannot be read)\n";

int to_int(const std::string& flag, const std::string& value) {
  std::size_t used = 0;
  int v = 0;
  try {
    v = std::stoi(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != value.size() || value.empty()) throw std::invalid_argument(flag + " needs an integer, got '" + value + "'");
  return v;
}

// false: --help was printed.
bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--help" || flag == "-h") {
      std::fputs(usage, stdout);
      return false;
    }
    if (i + 1 >= argc) throw std::invalid_argument("unknown flag or missing value: " + flag + "\n" + usage);
    const std::string value = argv[++i];
    if (flag == "--steps") {
      o.steps = to_int(flag, value);
    } else if (flag == "--comm") {
      o.comm = value;
    } else if (flag == "--pp") {
      o.pp = to_int(flag, value);
    } else if (flag == "--cp") {
      o.cp = to_int(flag, value);
    } else if (flag == "--loss-digits") {
      o.loss_digits = to_int(flag, value);
    } else if (flag == "--data") {
      o.data = value;
    } else {
      throw std::invalid_argument("unknown flag " + flag + "\n" + usage);
    }
  }
  if (o.comm != "local" && o.comm != "mpi") throw std::invalid_argument("--comm is local or mpi, got " + o.comm);
  if (o.steps < 1) throw std::invalid_argument("--steps must be at least 1");
  if (o.pp < 1 || o.cp < 1) throw std::invalid_argument("--pp and --cp must be at least 1");
  if (o.loss_digits < 0 || o.loss_digits > 17) throw std::invalid_argument("--loss-digits is 0..17");
  return true;
}

// ---- data --------------------------------------------------------------------------------

struct corpus {
  std::vector<std::uint8_t> bytes;
  std::string source;
};

corpus load_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  corpus c;
  if (in) c.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (static_cast<std::int64_t>(c.bytes.size()) > 4 * (seq_len + 1)) {
    c.source = path;
    return c;
  }
  const std::string sentence = "The quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs. ";
  c.bytes.clear();
  for (int i = 0; i < 64; ++i) c.bytes.insert(c.bytes.end(), sentence.begin(), sentence.end());
  c.source = "a repeated sentence (" + path + " could not be read)";
  return c;
}

// Step `step`'s rows of seq_len + 1 bytes ([rows, seq_len + 1], int64), the same on every rank:
// consecutive windows through the text, wrapping at its end.
torch::Tensor batch_windows(const corpus& text, int step) {
  const auto windows = static_cast<std::int64_t>(text.bytes.size()) - seq_len - 1;
  std::vector<std::int64_t> tokens;
  tokens.reserve(static_cast<std::size_t>(rows * (seq_len + 1)));
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::int64_t start = ((step * rows + r) * seq_len) % windows;
    for (std::int64_t i = 0; i <= seq_len; ++i) tokens.push_back(text.bytes[static_cast<std::size_t>(start + i)]);
  }
  return torch::tensor(tokens, torch::kLong).view({rows, seq_len + 1});
}

// ---- the model ---------------------------------------------------------------------------

// The context-parallel attention of this rank: q, k, v [rows, seq_local, heads, head_dim].
using attention_fn = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const torch::Tensor&)>;

// Pre-norm transformer block: x + proj(attention(ln1 x)), then + mlp(ln2 x).
struct blockImpl : torch::nn::Module {
  explicit blockImpl(attention_fn attend) : attend_(std::move(attend)) {
    ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    qkv = register_module("qkv", torch::nn::Linear(d_model, 3 * d_model));
    proj = register_module("proj", torch::nn::Linear(d_model, d_model));
    ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
    fc1 = register_module("fc1", torch::nn::Linear(d_model, mlp_width));
    fc2 = register_module("fc2", torch::nn::Linear(mlp_width, d_model));
  }

  torch::Tensor forward(const torch::Tensor& x) {
    const std::int64_t b = x.size(0), s = x.size(1);
    const torch::Tensor packed = qkv->forward(ln1->forward(x)).view({b, s, 3, heads, head_dim});
    const torch::Tensor q = packed.select(2, 0).contiguous();
    const torch::Tensor k = packed.select(2, 1).contiguous();
    const torch::Tensor v = packed.select(2, 2).contiguous();
    const torch::Tensor h = x + proj->forward(attend_(q, k, v).reshape({b, s, d_model}));
    return h + fc2->forward(torch::gelu(fc1->forward(ln2->forward(h)), "tanh"));
  }

  attention_fn attend_;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc1{nullptr}, fc2{nullptr};
};
TORCH_MODULE(block);

// One pipeline stage: the first adds the token and position embeddings, the last the final
// norm and the head (logits [rows, seq_local, 256]); every stage has one block.
struct lm_stageImpl : torch::nn::Module {
  lm_stageImpl(int stage, int stages, torch::Tensor positions, attention_fn attend)
      : positions_(std::move(positions)) {
    if (stage == 0) {
      tokens = register_module("tokens", torch::nn::Embedding(vocab, d_model));
      places = register_module("places", torch::nn::Embedding(seq_len, d_model));
    }
    body = register_module("block", block(std::move(attend)));
    if (stage + 1 == stages) {
      norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({d_model})));
      head = register_module("head", torch::nn::Linear(d_model, vocab));
    }
  }

  // Stage 0: token ids [rows, seq_local] (int64); the others: hidden [rows, seq_local, d_model].
  torch::Tensor forward(const torch::Tensor& x) {
    // The shard's global positions: position p's embedding, wherever zigzag put p.
    torch::Tensor h = tokens ? tokens->forward(x) + places->forward(positions_) : x;
    h = body->forward(h);
    if (head) h = head->forward(norm->forward(h));
    return h;
  }

  torch::Tensor positions_;  // [seq_local] int64: sharding.global_positions(cp rank)
  torch::nn::Embedding tokens{nullptr}, places{nullptr};
  block body{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(lm_stage);

using stage_type = baton::torch_stage<lm_stage>;

// Every rank creates its stages' modules after seeding LibTorch's global generator with the
// stage's seed, under this lock: thread ranks share the generator, and the cp ranks of one
// stage must get the same weights. So thread and MPI runs start from the same model.
std::mutex init_lock;

// ---- one rank ----------------------------------------------------------------------------

template <class Comm>
int run_rank(Comm& world, const options& o, const corpus& text) {
  at::set_num_threads(1);  // each rank is a thread (or a process on a shared machine) already
  baton::mesh_shape shape;
  shape.pp = o.pp;
  shape.cp_ring = o.cp;
  baton::device_mesh<Comm> mesh(world, shape);
  Comm& pp_comm = mesh.along(baton::mesh_dim::pp);
  Comm& cp_comm = mesh.along(baton::mesh_dim::cp_ring);
  const bool lead = mesh.rank() == 0;
  const int cp_rank = cp_comm.rank();

  // This rank's attention: a ring over the cp group, the sequence in zigzag shards.
  const baton::sequence_sharding sharding(baton::shard_layout::zigzag, seq_len, o.cp);
  baton::ring_attention ring(cp_comm, baton::reference_attention{}, sharding);
  baton::torch_cp_attention attention(ring, baton::causal_mask{});
  const attention_fn attend = [&attention](const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
    return attention(q, k, v);
  };
  const std::vector<std::int64_t> global = sharding.global_positions(cp_rank);
  const torch::Tensor positions = torch::tensor(global, torch::kLong);

  // Cross entropy over this rank's tokens, divided by the cp degree: summed over the cp
  // ranks (equal shards) it is the mean over every token of the microbatch.
  auto loss = baton::torch_loss([cp = o.cp](const torch::Tensor& logits, const torch::Tensor& target) {
    return torch::nn::functional::cross_entropy(logits.reshape({-1, vocab}), target.reshape({-1})) /
           static_cast<double>(cp);
  });
  const baton::schedule_shape schedule = baton::shape_for<baton::zbv>(o.pp, microbatches);
  const int stages = schedule.num_stages();
  baton::pipeline_options pipeline;
  pipeline.loss_on_every_rank = true;
  auto exec = baton::make_pipeline<baton::zbv, baton::uniform_stages<stage_type>>(
      pp_comm, schedule,
      [&](int s) {
        const std::lock_guard guard(init_lock);
        torch::manual_seed(static_cast<std::uint64_t>(1234 + s));
        return stage_type(lm_stage(s, stages, positions, attend));
      },
      loss, pipeline);

  // This rank's parameters (its 2 stages), in stage order: the same on every rank of a cp group.
  std::vector<torch::Tensor> params;
  exec.for_each_local_stage([&](int, stage_type& st) {
    for (torch::Tensor& p : st.parameters()) params.push_back(p);
  });
  std::int64_t count = 0;
  for (const torch::Tensor& p : params) count += p.numel();
  std::vector<std::int64_t> total{count};
  pp_comm.all_reduce(std::span<std::int64_t>(total), baton::reduce_op::sum);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(learning_rate).weight_decay(0.01));

  if (lead) {
    std::printf("baton-torch-pipeline: %d ranks = pp %d x cp %d (ring, zigzag), ZBV: %d stages, %d microbatches\n",
                mesh.size(), o.pp, o.cp, stages, microbatches);
    std::printf("model: torch::nn, %d blocks, d_model %lld, %lld heads x %lld, vocab 256 (bytes), %lld parameters\n",
                stages, static_cast<long long>(d_model), static_cast<long long>(heads),
                static_cast<long long>(head_dim), static_cast<long long>(total[0]));
    std::printf("data: %s (%zu bytes), seq %lld, %lld rows per step\n", text.source.c_str(), text.bytes.size(),
                static_cast<long long>(seq_len), static_cast<long long>(rows));
    std::fflush(stdout);
  }

  double first = 0, last = 0;
  for (int step = 0; step < o.steps; ++step) {
    // Next-token targets come from the full sequence; then each cp rank takes its shard of both.
    const torch::Tensor window = batch_windows(text, step);
    const torch::Tensor input = baton::torch_shard_sequence(window.narrow(1, 0, seq_len), sharding, cp_rank, 1);
    const torch::Tensor target = baton::torch_shard_sequence(window.narrow(1, 1, seq_len), sharding, cp_rank, 1);

    optimizer.zero_grad();
    const baton::step_report report = exec.step(input.contiguous(), target.contiguous());
    baton::torch_all_reduce_gradients(params, cp_comm);  // the cp ranks' shares of each gradient
    const double norm = baton::torch_clip_grad_norm(params, max_grad_norm, 2.0, pp_comm);
    optimizer.step();

    std::vector<double> value{report.loss.value_or(0.0)};
    cp_comm.all_reduce(std::span<double>(value), baton::reduce_op::sum);
    if (step == 0) first = value[0];
    last = value[0];
    if (lead) {
      std::printf("step %d | loss %.*f | grad norm %.4f\n", step, o.loss_digits, value[0], norm);
      std::fflush(stdout);
    }
  }
  if (lead) {
    std::printf("trained %d steps: loss %.4f -> %.4f\n", o.steps, first, last);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    if (!parse(argc, argv, o)) return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton-torch-pipeline: %s\n", e.what());
    return 2;
  }
  const corpus text = load_text(o.data);
  try {
    if (o.comm == "mpi") {
#if BATON_HAS_MPI()
      baton::mpi_session mpi(argc, argv);
      int code = 1;
      try {
        baton::mpi_communicator world(MPI_COMM_WORLD);
        if (world.size() != o.pp * o.cp) {
          if (world.rank() == 0)
            std::fprintf(stderr,
                         "baton-torch-pipeline: the mesh pp %d x cp %d has %d ranks but mpiexec started %d; "
                         "change --pp, --cp or -n\n",
                         o.pp, o.cp, o.pp * o.cp, world.size());
          return 2;
        }
        code = baton::run_mpi(world, [&](baton::mpi_communicator& comm) { return run_rank(comm, o, text); });
      } catch (const std::exception& e) {
        std::fprintf(stderr, "baton-torch-pipeline: %s\n", e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);  // the other processes may be waiting for this one
      }
      return code;
#else
      std::fprintf(stderr, "baton-torch-pipeline: built without MPI; use --comm local\n");
      return 2;
#endif
    }
    const std::vector<int> codes =
        baton::run_local(o.pp * o.cp, [&](baton::local_communicator& world) { return run_rank(world, o, text); });
    return *std::max_element(codes.begin(), codes.end());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton-torch-pipeline: %s\n", e.what());
    return 1;
  }
}
