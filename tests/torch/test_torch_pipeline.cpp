// torch::nn modules as pipeline stages: every built-in schedule on 2 and 4 local ranks against
// the same LibTorch model trained unpipelined, the seed-000 scenario (an opaque mask object as
// a side input under the split-backward schedules) and the seed-002 one (hooks on a stage's
// input fire exactly once per microbatch per step).
//
// Tolerance: float, 1e-5 of the largest magnitude of each compared tensor. The pipeline adds
// the same products as the unpipelined model, grouped by microbatch and scaled by 1/m instead
// of averaged over all rows at once: a few float roundings apart.
#include "torch_test_util.hpp"  // first: see the comment there
#include "catch.hpp"

#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>
#include <baton/torch.hpp>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

using namespace torch_test;

namespace {

constexpr std::int64_t width = 6;

// One stage of the model: Linear then tanh (the last stage ends with a Linear, no tanh).
torch::nn::Sequential make_stage_module(int stage, int stages) {
  torch::manual_seed(1000 + stage);
  torch::nn::Sequential m(torch::nn::Linear(width, width));
  if (stage + 1 < stages) m->push_back(torch::nn::Functional(torch::tanh));
  return m;
}

using plain_stage = baton::torch_stage<torch::nn::Sequential>;

auto mse = baton::torch_loss([](const torch::Tensor& y, const torch::Tensor& target) {
  return torch::mse_loss(y, target);
});

// One step of `Policy` over the stage types `Stages` on `ranks` local ranks, each stage built by
// make_stage; `step_args` are step()'s (batch, [side,] target). Returns the loss reported on
// the last stage's rank.
template <class Policy, class Stages, class MakeStage, class... StepArgs>
std::optional<double> step_on_ranks(int ranks, const baton::schedule_shape& shape, MakeStage make_stage,
                                    const StepArgs&... step_args) {
  std::optional<double> loss;
  std::mutex lock;
  baton::run_local(ranks, [&](baton::local_communicator& comm) {
    one_torch_thread();
    auto exec = baton::make_pipeline<Policy, Stages>(comm, shape, make_stage, mse);
    const auto report = exec.step(step_args...);
    std::lock_guard guard(lock);
    if (report.loss) loss = report.loss;
  });
  return loss;
}

// The largest difference between the .grad() of `mine` and `theirs` (two modules of one
// architecture), relative to the largest gradient magnitude of `theirs`; 1e300 when a
// gradient is missing.
template <class Module>
double gradient_error(Module& mine, Module& theirs) {
  const auto a = mine->parameters(), b = theirs->parameters();
  double largest = 0;
  for (const auto& p : b) largest = std::max(largest, p.grad().abs().max().template item<double>());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].grad().defined()) return 1e300;
    worst = std::max(worst, error_relative_to(a[i].grad(), b[i].grad(), largest));
  }
  return worst;
}

// The unpipelined model: every stage in order on the whole batch, one backward.
struct unpipelined {
  double loss = 0;
  std::vector<std::vector<torch::Tensor>> grads;  // per stage, per parameter
};

unpipelined train_unpipelined(std::vector<torch::nn::Sequential>& modules, const torch::Tensor& batch,
                              const torch::Tensor& target) {
  torch::Tensor h = batch;
  for (auto& m : modules) h = m->forward(h);
  torch::Tensor loss = torch::mse_loss(h, target);
  loss.backward();
  unpipelined out;
  out.loss = loss.item<double>();
  for (auto& m : modules) {
    std::vector<torch::Tensor> g;
    for (auto& p : m->parameters()) g.push_back(p.grad().clone());
    out.grads.push_back(std::move(g));
  }
  return out;
}

struct pipelined {
  std::optional<double> loss;
  std::map<int, std::vector<torch::Tensor>> grads;  // per stage
};

template <class Policy>
pipelined train_pipelined(int ranks, int microbatches, const std::vector<torch::nn::Sequential>& modules,
                          const torch::Tensor& batch, const torch::Tensor& target) {
  const auto shape = baton::shape_for<Policy>(ranks, microbatches);
  // Each rank's stages are copies of the unpipelined model's, made before the ranks start.
  std::vector<torch::nn::Sequential> copies;
  for (const auto& m : modules) copies.push_back(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(m->clone()));
  pipelined out;
  std::mutex lock;
  baton::run_local(ranks, [&](baton::local_communicator& comm) {
    one_torch_thread();
    auto exec = baton::make_pipeline<Policy, baton::uniform_stages<plain_stage>>(
        comm, shape, [&](int s) { return plain_stage(copies[static_cast<std::size_t>(s)]); }, mse);
    const auto report = exec.step(batch, target);
    std::lock_guard guard(lock);
    if (report.loss) out.loss = report.loss;
    exec.for_each_local_stage([&](int s, plain_stage& st) {
      std::vector<torch::Tensor> g;
      for (auto& p : st.parameters()) g.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
      out.grads[s] = std::move(g);
    });
  });
  return out;
}

template <class Policy>
void check_schedule(int ranks) {
  INFO("ranks " << ranks);
  const int microbatches = 8;
  const auto shape = baton::shape_for<Policy>(ranks, microbatches);
  const int stages = shape.num_stages();
  torch::manual_seed(7);
  const torch::Tensor batch = torch::randn({2 * microbatches, width});
  const torch::Tensor target = torch::randn({2 * microbatches, width});
  std::vector<torch::nn::Sequential> modules;
  for (int s = 0; s < stages; ++s) modules.push_back(make_stage_module(s, stages));
  const auto got = train_pipelined<Policy>(ranks, microbatches, modules, batch, target);
  const auto expected = train_unpipelined(modules, batch, target);
  REQUIRE(got.loss.has_value());
  CHECK(relative_error(*got.loss, expected.loss) <= 1e-5);
  REQUIRE(got.grads.size() == static_cast<std::size_t>(stages));
  double worst = 0;
  for (int s = 0; s < stages; ++s) {
    const auto& mine = got.grads.at(s);
    REQUIRE(mine.size() == expected.grads[static_cast<std::size_t>(s)].size());
    for (std::size_t i = 0; i < mine.size(); ++i) {
      REQUIRE(mine[i].defined());
      worst = std::max(worst, relative_error(mine[i], expected.grads[static_cast<std::size_t>(s)][i]));
    }
  }
  INFO("worst gradient error " << worst << " relative to the largest magnitude");
  CHECK(worst <= 1e-5);
}

}  // namespace

TEST_CASE("torch_stage: every built-in schedule equals the unpipelined LibTorch model", "[torch][pipeline]") {
  const int ranks = GENERATE(2, 4);
  SECTION("gpipe") { check_schedule<baton::gpipe>(ranks); }
  SECTION("1F1B") { check_schedule<baton::one_f_one_b>(ranks); }
  SECTION("interleaved 1F1B") { check_schedule<baton::interleaved_1f1b>(ranks); }
  SECTION("looped BFS") { check_schedule<baton::looped_bfs>(ranks); }
  SECTION("ZB1P") { check_schedule<baton::zb1p>(ranks); }
  SECTION("interleaved zero bubble") { check_schedule<baton::interleaved_zero_bubble>(ranks); }
  SECTION("ZBV") { check_schedule<baton::zbv>(ranks); }
  SECTION("DualPipeV") { check_schedule<baton::dual_pipe_v>(ranks); }
}

// ---- seed 000: an opaque mask object as a side input -------------------------------------

namespace {

// FlexAttention's BlockMask in miniature: a mask object with a tensor inside and a name. It
// is opaque (never sent, never differentiated) and splits itself per microbatch.
struct row_mask {
  torch::Tensor keep;  // [rows, 1] of 0/1
  std::string name;
};

}  // namespace

template <>
struct baton::payload_traits<row_mask> {
  static constexpr payload_role role = payload_role::opaque;
  static row_mask split(const row_mask& m, std::int64_t chunk, std::int64_t chunks) {
    const auto rows = baton::microbatch_bounds(m.keep.size(0), chunks)[static_cast<std::size_t>(chunk)];
    return {m.keep.narrow(0, rows.begin, rows.count), m.name};
  }
};

namespace {

struct masked_blockImpl : torch::nn::Module {
  explicit masked_blockImpl(int seed) {
    torch::manual_seed(seed);
    linear = register_module("linear", torch::nn::Linear(width, width));
  }
  torch::Tensor forward(const torch::Tensor& x, const row_mask& mask) {
    if (mask.name != "rows") throw std::runtime_error("the mask object arrived damaged");
    return torch::tanh(linear->forward(x)) * mask.keep;
  }
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(masked_block);

using masked_stage = baton::torch_stage<masked_block, torch::Tensor, torch::Tensor, row_mask>;

template <class Policy>
void check_masked(int ranks) {
  const int microbatches = 8;
  const auto shape = baton::shape_for<Policy>(ranks, microbatches);
  const int stages = shape.num_stages();
  torch::manual_seed(3);
  const torch::Tensor batch = torch::randn({16, width});
  const torch::Tensor target = torch::randn({16, width});
  const row_mask mask{(torch::rand({16, 1}) > 0.3).to(torch::kFloat), "rows"};

  std::vector<masked_block> reference, copies;
  for (int s = 0; s < stages; ++s) {
    reference.emplace_back(100 + s);
    copies.emplace_back(100 + s);
  }
  torch::Tensor h = batch;
  for (auto& m : reference) h = m->forward(h, mask);
  torch::Tensor loss = torch::mse_loss(h, target);
  loss.backward();

  const auto got = step_on_ranks<Policy, baton::uniform_stages<masked_stage>>(
      ranks, shape, [&](int s) { return masked_stage(copies[static_cast<std::size_t>(s)]); }, batch, mask, target);
  REQUIRE(got.has_value());
  CHECK(relative_error(*got, loss.item<double>()) <= 1e-5);
  for (int s = 0; s < stages; ++s) {
    INFO("stage " << s);
    CHECK(gradient_error(copies[static_cast<std::size_t>(s)], reference[static_cast<std::size_t>(s)]) <= 1e-5);
  }
}

}  // namespace

TEST_CASE("torch_stage: an opaque mask object as a side input under ZB1P and ZBV (seed 000)",
          "[torch][pipeline][seed000]") {
  const int ranks = GENERATE(2, 4);
  SECTION("ZB1P") { check_masked<baton::zb1p>(ranks); }
  SECTION("ZBV") { check_masked<baton::zbv>(ranks); }
}

// ---- seed 002: hooks on a stage's input -------------------------------------------------

namespace {

// Registers a hook on its input at every forward; the hook records which forward it belongs to.
struct hooked_blockImpl : torch::nn::Module {
  explicit hooked_blockImpl(int seed) {
    torch::manual_seed(seed);
    linear = register_module("linear", torch::nn::Linear(width, width));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const int id = forwards++;
    x.register_hook([this, id](torch::Tensor) { ++fired[id]; });
    // An intermediate on the input path whose node also leads to the weights: split backward
    // passes it in I (for dX) and needs its weight outputs in W.
    torch::Tensor h = linear->forward(x);
    h.register_hook([this, id](torch::Tensor) { ++fired_intermediate[id]; });
    return torch::tanh(h);
  }
  torch::nn::Linear linear{nullptr};
  int forwards = 0;
  std::map<int, int> fired, fired_intermediate;  // forward id -> times its hook ran
};
TORCH_MODULE(hooked_block);

using hooked_stage = baton::torch_stage<hooked_block>;

template <class Policy>
void check_hooks_once(int ranks) {
  const int microbatches = 4, steps = 3;
  const auto shape = baton::shape_for<Policy>(ranks, microbatches);
  const torch::Tensor batch = torch::randn({8, width});
  const torch::Tensor target = torch::randn({8, width});
  std::vector<hooked_block> modules;
  for (int s = 0; s < shape.num_stages(); ++s) modules.emplace_back(200 + s);
  std::vector<std::map<int, int>> fired_after_step(static_cast<std::size_t>(steps * shape.num_stages()));
  std::vector<std::map<int, int>> intermediate_after_step(fired_after_step.size());
  baton::run_local(ranks, [&](baton::local_communicator& comm) {
    one_torch_thread();
    auto exec = baton::make_pipeline<Policy, baton::uniform_stages<hooked_stage>>(
        comm, shape, [&](int s) { return hooked_stage(modules[static_cast<std::size_t>(s)]); }, mse);
    for (int step = 0; step < steps; ++step) {
      exec.step(batch, target);
      exec.for_each_local_stage([&](int s, hooked_stage& st) {
        fired_after_step[static_cast<std::size_t>(step * shape.num_stages() + s)] = st.module()->fired;
        intermediate_after_step[static_cast<std::size_t>(step * shape.num_stages() + s)] =
            st.module()->fired_intermediate;
      });
    }
  });
  for (int step = 0; step < steps; ++step) {
    for (int s = 0; s < shape.num_stages(); ++s) {
      INFO("step " << step << ", stage " << s);
      const auto& fired = fired_after_step[static_cast<std::size_t>(step * shape.num_stages() + s)];
      // After step k: forwards 0 .. (k+1)m-1 each fired exactly once, none twice, none later.
      const std::map<int, int>* both[] = {&fired,
                                          &intermediate_after_step[static_cast<std::size_t>(step * shape.num_stages() + s)]};
      for (const auto* hooks : both) {
        CHECK(hooks->size() == static_cast<std::size_t>((step + 1) * microbatches));
        for (const auto& [id, count] : *hooks) {
          INFO("forward " << id << (hooks == &fired ? ", hook on the input" : ", hook on the intermediate"));
          CHECK(count == 1);
        }
      }
    }
  }
}

}  // namespace

TEST_CASE("torch_stage: hooks on a stage's input and intermediates fire exactly once per microbatch per step (seed 002)",
          "[torch][pipeline][seed002]") {
  const int ranks = GENERATE(2, 4);
  SECTION("1F1B (full backward)") { check_hooks_once<baton::one_f_one_b>(ranks); }
  SECTION("ZBV (split backward)") { check_hooks_once<baton::zbv>(ranks); }
}

// ---- the weight half runs only the weights' part of the graph ------------------------------

namespace {

// reference_attention that counts its calls.
struct counting_backend {
  baton::reference_attention inner;
  int forwards = 0, backwards = 0;
  template <class... A>
    requires requires(baton::reference_attention& b, A&&... a) { b.forward(std::forward<A>(a)...); }
  void forward(A&&... a) {
    ++forwards;
    inner.forward(std::forward<A>(a)...);
  }
  template <class... A>
    requires requires(baton::reference_attention& b, A&&... a) { b.backward(std::forward<A>(a)...); }
  void backward(A&&... a) {
    ++backwards;
    inner.backward(std::forward<A>(a)...);
  }
};

constexpr std::int64_t attention_width = 8, attention_heads = 2, attention_seq = 6;

// x + Wo attention(Wq x, Wk x, Wv x): the frontier of the weights is the four projections,
// and the attention node lies on the input path only.
struct attention_blockImpl : torch::nn::Module {
  explicit attention_blockImpl(int seed) {
    torch::manual_seed(seed);
    wq = register_module("wq", torch::nn::Linear(attention_width, attention_width));
    wk = register_module("wk", torch::nn::Linear(attention_width, attention_width));
    wv = register_module("wv", torch::nn::Linear(attention_width, attention_width));
    wo = register_module("wo", torch::nn::Linear(attention_width, attention_width));
    attention = std::make_unique<baton::torch_cp_attention<counting_backend>>(backend);
  }
  torch::Tensor forward(const torch::Tensor& x) {
    const auto heads = [&](const torch::Tensor& t) {
      return t.view({x.size(0), attention_seq, attention_heads, attention_width / attention_heads});
    };
    const torch::Tensor a = (*attention)(heads(wq(x)), heads(wk(x)), heads(wv(x)));
    return x + wo(a.reshape({x.size(0), attention_seq, attention_width}));
  }
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  counting_backend backend;
  std::unique_ptr<baton::torch_cp_attention<counting_backend>> attention;
};
TORCH_MODULE(attention_block);

using attention_stage = baton::torch_stage<attention_block>;

template <class Policy>
void check_attention_stages(int ranks) {
  const int microbatches = 4;
  const auto shape = baton::shape_for<Policy>(ranks, microbatches);
  torch::manual_seed(9);
  const torch::Tensor batch = torch::randn({8, attention_seq, attention_width});
  const torch::Tensor target = torch::randn({8, attention_seq, attention_width});
  std::vector<attention_block> blocks, reference;
  for (int s = 0; s < shape.num_stages(); ++s) {
    blocks.emplace_back(300 + s);
    reference.emplace_back(300 + s);
  }
  const auto got = step_on_ranks<Policy, baton::uniform_stages<attention_stage>>(
      ranks, shape, [&](int s) { return attention_stage(blocks[static_cast<std::size_t>(s)]); }, batch, target);
  torch::Tensor h = batch;
  for (auto& b : reference) h = b->forward(h);
  torch::Tensor loss = torch::mse_loss(h, target);
  loss.backward();
  REQUIRE(got.has_value());
  CHECK(relative_error(*got, loss.item<double>()) <= 1e-5);
  for (std::size_t s = 0; s < blocks.size(); ++s) {
    INFO("stage " << s);
    // Attention ran forward and backward once per microbatch: W did not walk back through it.
    CHECK(blocks[s]->backend.forwards == microbatches);
    CHECK(blocks[s]->backend.backwards == microbatches);
    // Relative to the stage's largest gradient: the key projection's bias has an exactly zero
    // gradient (softmax ignores a shift shared by all keys), which leaves only rounding.
    CHECK(gradient_error(blocks[s], reference[s]) <= 1e-5);
  }
}

}  // namespace

TEST_CASE("torch_stage: split backward runs each node once — attention stages under 1F1B, ZB1P and ZBV",
          "[torch][pipeline]") {
  const int ranks = GENERATE(2, 4);
  SECTION("1F1B") { check_attention_stages<baton::one_f_one_b>(ranks); }
  SECTION("ZB1P") { check_attention_stages<baton::zb1p>(ranks); }
  SECTION("ZBV") { check_attention_stages<baton::zbv>(ranks); }
}

// ---- docs/torch.md's example, verbatim ------------------------------------------------------

namespace {

// [doc:torch_block]
struct blockImpl : torch::nn::Module {
  explicit blockImpl(std::int64_t features) : linear(register_module("linear", torch::nn::Linear(features, features))) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::tanh(linear(x)); }
  torch::nn::Linear linear;
};
TORCH_MODULE(block);

using block_stage = baton::torch_stage<block>;  // input and output: torch::Tensor
// [/doc:torch_block]

}  // namespace

TEST_CASE("docs/torch.md: a ZBV pipeline of torch::nn blocks equals the unpipelined blocks", "[torch][pipeline][docs]") {
  const int ranks = 2;
  torch::manual_seed(21);
  const torch::Tensor batch = torch::randn({8, 16}), target = torch::randn({8, 16});
  // The pipeline's modules and the reference's, built alike (same seeds) before the ranks start.
  std::vector<block> blocks, reference;
  for (int s = 0; s < 2 * ranks; ++s) {
    torch::manual_seed(s);
    blocks.emplace_back(16);
    torch::manual_seed(s);
    reference.emplace_back(16);
  }
  std::optional<double> got;
  std::mutex lock;
  baton::run_local(ranks, [&](baton::local_communicator& comm) {
    one_torch_thread();
    // [doc:torch_pipeline]
    auto loss = baton::torch_loss([](const torch::Tensor& y, const torch::Tensor& expected) {
      return torch::mse_loss(y, expected);
    });
    // ZBV: two stages per rank in a V; stage s is blocks[s].
    auto exec = baton::make_pipeline<baton::zbv, baton::uniform_stages<block_stage>>(
        comm, baton::shape_for<baton::zbv>(comm.size(), /*microbatches=*/4),
        [&](int s) { return block_stage(blocks[static_cast<std::size_t>(s)]); }, loss);
    const baton::step_report report = exec.step(batch, target);  // the loss on the last stage's rank
    // Each stage's parameters now hold their .grad(), summed over the microbatches.
    // [/doc:torch_pipeline]
    std::lock_guard guard(lock);
    if (report.loss) got = report.loss;
  });
  torch::Tensor h = batch;
  for (auto& b : reference) h = b->forward(h);
  torch::Tensor loss = torch::mse_loss(h, target);
  loss.backward();
  REQUIRE(got.has_value());
  CHECK(relative_error(*got, loss.item<double>()) <= 1e-5);
  for (std::size_t s = 0; s < blocks.size(); ++s) {
    INFO("stage " << s);
    CHECK(relative_error(blocks[s]->linear->weight.grad(), reference[s]->linear->weight.grad()) <= 1e-5);
    CHECK(relative_error(blocks[s]->linear->bias.grad(), reference[s]->linear->bias.grad()) <= 1e-5);
  }
}

// ---- records: a named activation and a constant field crossing the boundary -----------------

namespace {

using hidden_and_positions =
    baton::record<baton::field<"hidden", torch::Tensor>, baton::field<"positions", baton::constant<torch::Tensor>>>;

// Adds a term of the (integer) positions to the hidden state and passes them on.
struct positional_blockImpl : torch::nn::Module {
  explicit positional_blockImpl(int seed) {
    torch::manual_seed(seed);
    linear = register_module("linear", torch::nn::Linear(width, width));
  }
  hidden_and_positions forward(const hidden_and_positions& x) {
    const torch::Tensor& positions = baton::get<"positions">(x).value;
    torch::Tensor h = torch::tanh(linear(baton::get<"hidden">(x))) + 0.01 * positions.to(torch::kFloat);
    return hidden_and_positions(h, baton::constant<torch::Tensor>(positions));
  }
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(positional_block);

// The last stage: reads the record, returns the prediction.
struct head_blockImpl : torch::nn::Module {
  explicit head_blockImpl(int seed) {
    torch::manual_seed(seed);
    linear = register_module("linear", torch::nn::Linear(width, width));
  }
  torch::Tensor forward(const hidden_and_positions& x) { return linear(baton::get<"hidden">(x)); }
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(head_block);

using positional_stage = baton::torch_stage<positional_block, hidden_and_positions, hidden_and_positions>;
using head_stage = baton::torch_stage<head_block, hidden_and_positions, torch::Tensor>;

template <class Policy>
void check_records() {
  const int microbatches = 4;
  torch::manual_seed(4);
  const torch::Tensor hidden = torch::randn({8, width});
  const torch::Tensor positions = torch::arange(8 * width, torch::kLong).view({8, width}) % 5;
  const hidden_and_positions batch(hidden, baton::constant<torch::Tensor>(positions));
  const torch::Tensor target = torch::randn({8, width});
  positional_block first(400), first_reference(400);
  head_block last(401), last_reference(401);
  const auto got = step_on_ranks<Policy, baton::stage_list<positional_stage, head_stage>>(
      2, baton::shape_for<Policy>(2, microbatches),
      [&](auto index) {
        if constexpr (decltype(index)::value == 0) {
          return positional_stage(first);
        } else {
          return head_stage(last);
        }
      },
      batch, target);
  torch::Tensor loss = torch::mse_loss(last_reference->forward(first_reference->forward(batch)), target);
  loss.backward();
  REQUIRE(got.has_value());
  CHECK(relative_error(*got, loss.item<double>()) <= 1e-5);
  CHECK(gradient_error(first, first_reference) <= 1e-5);
  CHECK(gradient_error(last, last_reference) <= 1e-5);
}

}  // namespace

TEST_CASE("torch_stage: records with an activation and a constant field cross stages", "[torch][pipeline]") {
  SECTION("1F1B") { check_records<baton::one_f_one_b>(); }
  SECTION("ZB1P") { check_records<baton::zb1p>(); }
}
