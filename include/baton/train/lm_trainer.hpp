// baton/train/lm_trainer.hpp — training a decoder-only LM on a device mesh of
// pp x dp x cp_ring x cp_ulysses ranks: the composition baton exists for.
//
// Every rank runs the pipeline executor over its pp group (the ranks that differ only in
// pp); the stages it holds are lm_stage's whose attention uses its context-parallel group;
// the messages between stages carry this rank's shard of the sequence; the side input gives
// each microbatch its global positions (and documents); the last stage's loss sums loss and
// tokens over the data- and context-parallel replicas; weight gradients are summed over the
// same replicas; clipping reduces over the pp group only (each parameter counted once); then
// AdamW steps. Any schedule (a built-in policy, a custom program, a CSV file), any CP mode
// (chosen at run time), any attention backend, any communicator with the collectives.
#pragma once

#include <baton/attention/masks.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/comm/mesh.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/nn/attention.hpp>
#include <baton/nn/config.hpp>
#include <baton/nn/cp_attention.hpp>
#include <baton/nn/error.hpp>
#include <baton/nn/grad_sync.hpp>
#include <baton/nn/lm_stage.hpp>
#include <baton/nn/loss.hpp>
#include <baton/nn/optim.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/nn/sequence.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/pipeline/clip.hpp>
#include <baton/pipeline/executor.hpp>
#include <baton/pipeline/options.hpp>
#include <baton/pipeline/timing.hpp>
#include <baton/schedule/program.hpp>
#include <baton/train/text_data.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace baton::train {

/// A configuration that cannot run: `setting()` names what to change ("mesh", "cp",
/// "schedule", "model", "layers", "seq", "batch", "microbatches"), the message says
/// how. Every rank checks the same configuration the same way, so every rank throws it
/// before any work.
class config_error : public std::invalid_argument {
 public:
  config_error(std::string setting, const std::string& message)
      : std::invalid_argument(message), setting_(std::move(setting)) {}
  const std::string& setting() const noexcept { return setting_; }

 private:
  std::string setting_;
};

/// The model and the optimisation.
struct lm_config {
  nn::transformer_config model{};
  std::int64_t layers = 4;
  /// The global sequence length (every row of a batch).
  std::int64_t seq = 128;
  /// Rows of a step's batch per data-parallel replica (the global batch has dp x batch rows).
  std::int64_t batch = 8;
  nn::adamw_options optimizer{};
  /// Gradient-norm clipping (2-norm over the whole model); <= 0 turns it off.
  double clip_norm = 1.0;
  std::uint64_t seed = 1;
};

/// How the model is spread over the ranks.
struct lm_parallelism {
  mesh_shape mesh{};
  nn::cp_mode cp = nn::cp_mode::none;
  shard_layout layout = shard_layout::zigzag;
};

/// Throws config_error when (config, parallelism, schedule) cannot run on `world_size` ranks:
/// the same answer on every rank, so every rank stops before any work.
inline void check_config(const lm_config& c, const lm_parallelism& p, int world_size, const schedule_shape& schedule) {
  const mesh_shape& m = p.mesh;
  if (m.pp < 1 || m.dp < 1 || m.cp_ring < 1 || m.cp_ulysses < 1 || m.size() != world_size)
    throw config_error("mesh", "the mesh " + m.text() + " has " + std::to_string(m.size()) + " ranks but there are " +
                                   std::to_string(world_size) + "; choose pp x dp x cp whose product is the number of ranks");
  const int cp = m.cp_ring * m.cp_ulysses;
  const auto mode_needs = [&](bool ok, const std::string& what) {
    if (!ok) throw config_error("cp", "cp mode " + std::string(nn::to_string(p.cp)) + " " + what + " (mesh " + m.text() + ")");
  };
  switch (p.cp) {
    case nn::cp_mode::none: mode_needs(cp == 1, "runs without context parallelism: the cp degree must be 1"); break;
    case nn::cp_mode::ring: mode_needs(m.cp_ulysses == 1, "shards over cp_ring only; use hybrid for cp_ring x cp_ulysses"); break;
    case nn::cp_mode::ulysses: mode_needs(m.cp_ring == 1, "shards over cp_ulysses only; use hybrid for cp_ring x cp_ulysses"); break;
    case nn::cp_mode::hybrid: break;
  }
  if (schedule.ranks != m.pp)
    throw config_error("schedule", "the schedule is for " + std::to_string(schedule.ranks) + " pipeline ranks but pp = " +
                                       std::to_string(m.pp));
  nn::transformer_config model;
  try {
    model = c.model.resolved();
  } catch (const nn::nn_error& e) {
    throw config_error("model", e.what());
  }
  const int stages = schedule.num_stages();
  if (c.layers < stages || c.layers % stages != 0)
    throw config_error("layers", std::to_string(c.layers) + " layers cannot be split evenly into the schedule's " +
                                     std::to_string(stages) + " stages (" + std::to_string(schedule.ranks) + " ranks x " +
                                     std::to_string(schedule.stages_per_rank) +
                                     " stages per rank); choose a number of layers divisible by " + std::to_string(stages));
  try {
    if (p.cp != nn::cp_mode::none) {
      const sequence_sharding s(p.layout, c.seq, p.cp == nn::cp_mode::ulysses ? m.cp_ulysses : m.cp_ring,
                                p.cp == nn::cp_mode::hybrid ? m.cp_ulysses : 1);
      (void)s;
    } else if (c.seq < 1) {
      throw cp_error("the sequence length must be positive");
    }
  } catch (const cp_error& e) {
    throw config_error("seq", std::string("sequence length ") + std::to_string(c.seq) + ": " + e.what());
  }
  // Any head count splits over the Ulysses degree (unevenly where it must; baton/cp/ulysses.hpp).
  if (c.batch < schedule.microbatches)
    throw config_error("batch", "a batch of " + std::to_string(c.batch) + " rows per replica cannot be cut into " +
                                    std::to_string(schedule.microbatches) +
                                    " microbatches; use at least as many rows as microbatches");
  if (schedule.microbatches < 1) throw config_error("microbatches", "the schedule has no microbatches");
}

/// What one step (or eval) reports, the same on every rank unless said otherwise.
struct lm_step_report {
  /// Mean loss over the step's counted tokens (the whole global batch).
  double loss = 0;
  /// Tokens counted in the loss, whole mesh.
  std::int64_t tokens = 0;
  /// Gradient 2-norm over the whole model before clipping (step only).
  double grad_norm = 0;
  /// Wall seconds of the whole step on this rank (slicing, pipeline, reductions, optimizer).
  double seconds = 0;
  /// Wall seconds of the pipeline call, its longest over the pp group.
  double pipeline_seconds = 0;
  /// This rank's wall seconds in the gradient all-reduce over the replicas, and in clipping
  /// and the optimizer step (step only).
  double sync_seconds = 0;
  double optimizer_seconds = 0;
  /// 1 - mean over the pp group of (compute seconds / pipeline seconds): the share of the
  /// pipeline call its ranks spent waiting (bubbles and communication).
  double bubble_fraction = 0;
  /// Peak bytes of saved state (activations kept for backward) on any rank of the pp group.
  std::size_t peak_saved_bytes = 0;
  /// This rank's measured compute per stage and action kind (see measured_cost_model).
  std::vector<action_time> action_times;
};

namespace detail::train {

// Rows [row0, row0 + rows) of a [R, S] tensor, and the given sequence positions of each.
inline host_tensor<std::int64_t> take(const host_tensor<std::int64_t>& t, std::int64_t row0, std::int64_t rows,
                                      const std::vector<std::int64_t>& positions) {
  const std::int64_t seq = t.shape()[1];
  host_tensor<std::int64_t> out({rows, static_cast<std::int64_t>(positions.size())});
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::size_t i = 0; i < positions.size(); ++i)
      out(r, static_cast<std::int64_t>(i)) = t[(row0 + r) * seq + positions[i]];
  return out;
}

inline void check_batch(const lm_batch& b, std::int64_t rows, std::int64_t seq) {
  const std::vector<std::int64_t> expected{rows, seq};
  if (b.tokens.shape() != expected || b.targets.shape() != expected)
    throw config_error("batch", "the global batch has tokens " + baton::detail::core::shape_text(b.tokens.shape()) +
                                    " and targets " + baton::detail::core::shape_text(b.targets.shape()) + " but expected " +
                                    baton::detail::core::shape_text(expected) + " (dp x batch rows of seq tokens)");
  if (b.documents && b.documents->shape() != expected)
    throw config_error("batch", "the global batch's document ids have shape " +
                                    baton::detail::core::shape_text(b.documents->shape()) + " but expected " +
                                    baton::detail::core::shape_text(expected));
}

inline std::int64_t counted_tokens(const host_tensor<std::int64_t>& targets) {
  return static_cast<std::int64_t>(
      std::count_if(targets.values().begin(), targets.values().end(), [](std::int64_t t) { return t != ignore_target; }));
}

template <class T>
std::map<std::string, host_tensor<T>> values_of(nn::module_with_parameters auto& model) {
  std::map<std::string, host_tensor<T>> out;
  nn::for_each_parameter(model, [&](const std::string& name, nn::parameter<T>& p) { out[name] = p.value; });
  return out;
}

}  // namespace detail::train

/// The same model trained on one rank: the oracle of the mesh runs, and the model behind
/// --check. One forward and backward of the whole global batch (the loss is the mean over
/// all its tokens, as the mesh's), clipping over every parameter, AdamW.
template <class T, class Backend, class Mask = causal_mask>
class lm_reference {
 public:
  using model_type = nn::lm_stage<T, nn::no_cp<Backend>, Mask>;

  explicit lm_reference(const lm_config& config, Backend backend = {}, Mask mask = {})
      : config_(config),
        model_(config.model, nn::lm_stage_layout::of(0, 1, config.layers), nn::initializer(config.seed),
               [&] { return nn::no_cp<Backend>(backend); }, mask),
        params_(nn::parameters_of<T>(model_)),
        optimizer_(params_, config.optimizer) {}

  lm_step_report step(const lm_batch& batch) { return run(batch, true); }
  lm_step_report eval(const lm_batch& batch) { return run(batch, false); }

  model_type& model() noexcept { return model_; }
  std::map<std::string, host_tensor<T>> parameters() { return detail::train::values_of<T>(model_); }

 private:
  lm_step_report run(const lm_batch& batch, bool train) {
    const auto start = std::chrono::steady_clock::now();
    const std::int64_t seq = batch.tokens.rank() == 2 ? batch.tokens.shape()[1] : 0;
    nn::sequence_info info = nn::sequence_info::whole(seq);
    info.documents = batch.documents;
    typename model_type::saved st;
    const auto out = model_.forward(nn::lm_input<T>(batch.tokens), info, st);
    const auto result = nn::cross_entropy<T>(ignore_target)(get<"hidden">(out), batch.targets);
    lm_step_report r;
    r.loss = result.value;
    r.tokens = detail::train::counted_tokens(batch.targets);
    if (train) {
      nn::zero_grad(params_);
      model_.backward(st, grad_t<nn::lm_activation<T>>(result.grad));
      r.grad_norm = clip_grad_norm(nn::gradient_spans(params_),
                                   config_.clip_norm > 0 ? config_.clip_norm : std::numeric_limits<double>::infinity(), 2.0);
      optimizer_.step();
    }
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    r.pipeline_seconds = r.seconds;
    return r;
  }

  lm_config config_;
  model_type model_;
  std::vector<nn::named_parameter<host_tensor<T>>> params_;
  nn::adamw<T> optimizer_;
};

/// Trains a decoder-only LM on a device mesh (see the file comment). Collective: every rank
/// of `world` constructs it with the same arguments and calls step / eval / gather_model
/// together, with the same global batches.
///
/// ```cpp
///   baton::train::lm_trainer<float, baton::local_communicator, baton::kokkos_attention> trainer(
///       world, config, {.mesh = {.pp = 2, .cp_ring = 2}, .cp = baton::nn::cp_mode::ring},
///       baton::zbv::generate(baton::shape_for<baton::zbv>(2, 4)));
///   for (int step = 0; step < steps; ++step) trainer.step(corpus.train_batch(step, config.batch, config.seq, false));
/// ```
template <class T, class Comm, class Backend, class Mask = causal_mask>
class lm_trainer {
  static_assert(splittable_communicator<Comm> && point_to_point_communicator<Comm> &&
                    all_reduce_communicator<Comm> && broadcast_communicator<Comm> && ring_communicator<Comm> &&
                    all_to_all_communicator<Comm>,
                "baton::train::lm_trainer<T, Comm, ...>: Comm must split, send and receive, shift around a ring, "
                "all-reduce, broadcast and all-to-all (local_communicator and mpi_communicator do)");

 public:
  using strategy_type = nn::cp_attention<Comm, Backend>;
  using stage_type = nn::lm_stage<T, strategy_type, Mask>;
  using loss_type = nn::lm_loss<T, nn::group_cross_entropy<T, Comm>>;
  using executor_type = pipeline_executor<uniform_stages<stage_type>, Comm, loss_type>;
  using model_type = stage_type;  // gather_model's single-stage model (cp mode none)

  /// Checks the configuration (config_error on every rank), splits the world into the mesh,
  /// builds this rank's stages and the optimizer. `schedule` is a program for mesh.pp ranks,
  /// compute-only (validated and lowered here) or lowered.
  lm_trainer(Comm& world, const lm_config& config, const lm_parallelism& parallelism, program schedule,
             Backend backend = {}, Mask mask = {})
      : state_(std::make_unique<state>(world, config, parallelism, std::move(schedule), std::move(backend),
                                       std::move(mask))) {}

  /// One optimizer step on the global batch (tokens and targets [dp x batch, seq]).
  lm_step_report step(const lm_batch& global) { return state_->run(global, true); }
  /// The loss of the global batch under the current weights (forward only, no state touched).
  lm_step_report eval(const lm_batch& global) { return state_->run(global, false); }

  /// The whole model as one stage on every rank (parameters gathered over the pp group; cp
  /// mode none): for generation, checkpoints and comparisons. Collective over the world.
  model_type gather_model() { return state_->gather_model(); }
  /// Every parameter's value by name, gathered as gather_model does.
  std::map<std::string, host_tensor<T>> parameters() {
    auto model = gather_model();
    return detail::train::values_of<T>(model);
  }

  device_mesh<Comm>& mesh() noexcept { return state_->mesh; }
  executor_type& executor() noexcept { return *state_->exec; }
  /// The parameters this rank holds (its pipeline stages'), in the optimizer's order.
  const std::vector<nn::named_parameter<host_tensor<T>>>& local_parameters() const noexcept { return state_->params; }

 private:
  struct state {
    lm_config config;
    lm_parallelism parallelism;
    Backend backend;
    Mask mask;
    device_mesh<Comm> mesh;
    Comm replicas;  // the ranks holding the same stages: dp x cp (same pp coordinate)
    std::optional<executor_type> exec;
    std::vector<nn::named_parameter<host_tensor<T>>> params;
    std::optional<nn::adamw<T>> optimizer;
    std::vector<std::int64_t> positions;  // the global positions this rank's shard holds

    state(Comm& world, const lm_config& c, const lm_parallelism& p, program schedule, Backend b, Mask m)
        : config(c),
          parallelism(p),
          backend(std::move(b)),
          mask(std::move(m)),
          // The configuration is checked before the mesh splits the world (a collective), so
          // a bad one stops every rank before any communication.
          mesh((check_config(c, p, world.size(), schedule.shape), world), p.mesh),
          replicas(world.split(mesh.coord(mesh_dim::pp), world.rank())) {
      const int stages = schedule.shape.num_stages();
      const nn::initializer init(c.seed);
      const auto make_strategy = [this] {
        return strategy_type::from_mesh(mesh, parallelism.cp, backend, parallelism.layout, config.seq);
      };
      pipeline_options options;
      options.scaling = loss_scaling::by_token_count;
      options.loss_on_every_rank = true;
      exec.emplace(mesh.along(mesh_dim::pp), std::move(schedule),
                   [&](int s) { return stage_type(c.model, nn::lm_stage_layout::of(s, stages, c.layers), init, make_strategy, mask); },
                   loss_type(nn::cross_entropy<T>(ignore_target).over(replicas)), options);
      exec->for_each_local_stage([&](int, stage_type& s) { nn::append_parameters(params, s); });
      optimizer.emplace(params, c.optimizer);
      const strategy_type probe = make_strategy();
      if (const sequence_sharding* sh = probe.sharding()) {
        positions = sh->global_positions(probe.shard_index());
      } else {
        positions.resize(static_cast<std::size_t>(c.seq));
        for (std::int64_t i = 0; i < c.seq; ++i) positions[static_cast<std::size_t>(i)] = i;
      }
    }

    lm_step_report run(const lm_batch& global, bool train) {
      const auto start = std::chrono::steady_clock::now();
      const std::int64_t dp = mesh.shape().dp;
      detail::train::check_batch(global, dp * config.batch, config.seq);
      const std::int64_t row0 = mesh.coord(mesh_dim::dp) * config.batch;
      const host_tensor<std::int64_t> tokens = detail::train::take(global.tokens, row0, config.batch, positions);
      const host_tensor<std::int64_t> targets = detail::train::take(global.targets, row0, config.batch, positions);
      nn::sequence_info info;
      info.positions = positions;
      if (global.documents)
        info.documents = std::make_shared<const host_tensor<std::int64_t>>(
            payload_traits<host_tensor<std::int64_t>>::slice(*global.documents, 0, row0, config.batch));

      lm_step_report r;
      r.tokens = detail::train::counted_tokens(global.targets);
      step_report pipe;
      if (train) {
        nn::zero_grad(params);
        pipe = exec->step(nn::lm_input<T>(tokens), info, targets);
        const auto synced = std::chrono::steady_clock::now();
        if (replicas.size() > 1) nn::all_reduce_gradients(params, replicas);
        const auto clipped = std::chrono::steady_clock::now();
        // After the replicas' sum every replica holds the same gradients: the norm counts each
        // parameter once by reducing over the pp group alone.
        r.grad_norm = clip_grad_norm(nn::gradient_spans(params),
                                     config.clip_norm > 0 ? config.clip_norm : std::numeric_limits<double>::infinity(),
                                     2.0, mesh.along(mesh_dim::pp));
        optimizer->step();
        r.sync_seconds = std::chrono::duration<double>(clipped - synced).count();
        r.optimizer_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - clipped).count();
      } else {
        pipe = exec->eval(nn::lm_input<T>(tokens), info, targets);
      }
      r.loss = pipe.loss.value_or(0.0);
      r.action_times = pipe.action_times;
      // Pipeline figures over the pp group: the longest call, the mean busy share, the peak memory.
      std::array<double, 2> sums{pipe.wall_seconds > 0 ? pipe.compute_seconds / pipe.wall_seconds : 1.0, 0.0};
      std::array<double, 2> maxima{pipe.wall_seconds, static_cast<double>(pipe.peak_saved_bytes)};
      Comm& pp = mesh.along(mesh_dim::pp);
      pp.all_reduce(std::span<double>(sums), reduce_op::sum);
      pp.all_reduce(std::span<double>(maxima), reduce_op::max);
      r.bubble_fraction = std::max(0.0, 1.0 - sums[0] / pp.size());
      r.pipeline_seconds = maxima[0];
      r.peak_saved_bytes = static_cast<std::size_t>(maxima[1]);
      r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return r;
    }

    model_type gather_model() {
      const nn::initializer init(config.seed);
      model_type model(config.model, nn::lm_stage_layout::of(0, 1, config.layers), init,
                       [&] { return strategy_type::none(backend); }, mask);
      std::map<std::string, nn::parameter<T>*> local;
      for (const auto& p : params) local[p.name] = p.parameter;
      const program& prog = exec->lowered_program();
      const int stages = prog.shape.num_stages();
      const std::int64_t per_stage = config.layers / stages;
      Comm& pp = mesh.along(mesh_dim::pp);
      nn::for_each_parameter(model, [&](const std::string& name, nn::parameter<T>& p) {
        int stage = stages - 1;  // "head..."
        if (name.rfind("embed", 0) == 0) {
          stage = 0;
        } else if (name.rfind("layers.", 0) == 0) {
          stage = static_cast<int>(std::stoll(name.substr(7)) / per_stage);
        }
        const int owner = stage_rank(prog.shape, stage);
        if (owner == pp.rank()) p.value = local.at(name)->value;
        pp.broadcast(p.value.values(), owner);
      });
      return model;
    }
  };

  std::unique_ptr<state> state_;
};

/// The model's greedy continuation of `prompt`: `count` tokens, each the argmax of the
/// logits after the last `context` tokens (the model sees at most that many). `model` is a
/// one-stage lm_stage (gather_model, lm_reference::model) whose attention needs no peers.
template <class Model>
std::vector<std::int64_t> greedy_generate(Model& model, std::vector<std::int64_t> prompt, std::int64_t count,
                                          std::int64_t context) {
  using T = typename Model::value_type;
  if (prompt.empty()) throw nn::nn_error("baton::train::greedy_generate: the prompt is empty");
  std::vector<std::int64_t> out;
  for (std::int64_t n = 0; n < count; ++n) {
    const auto len = std::min<std::int64_t>(context, static_cast<std::int64_t>(prompt.size()));
    host_tensor<std::int64_t> tokens({1, len});
    std::copy(prompt.end() - len, prompt.end(), tokens.data());
    typename Model::saved st;
    const auto result = model.forward(nn::lm_input<T>(std::move(tokens)), nn::sequence_info::whole(len), st);
    const host_tensor<T>& logits = get<"hidden">(result);
    const std::int64_t vocab = logits.shape()[2];
    const T* last = logits.data() + (len - 1) * vocab;
    const auto next = static_cast<std::int64_t>(std::max_element(last, last + vocab) - last);
    prompt.push_back(next);
    out.push_back(next);
  }
  return out;
}

}  // namespace baton::train
