// baton/train/lm_trainer.hpp — lm_trainer: training a decoder-only LM on a device mesh of
// pp x dp x cp_ring x cp_ulysses ranks, the composition baton exists for.
//
// Every rank runs the pipeline executor over its pp group (the ranks that differ only in
// pp); the stages it holds are lm_stage's whose attention uses its context-parallel group;
// the messages between stages carry this rank's shard of the sequence; the side input gives
// each microbatch its global positions (and documents); the last stage's loss sums loss and
// tokens over the data- and context-parallel replicas; weight gradients are summed over the
// same replicas; clipping reduces over the pp group only (each parameter counted once); then
// AdamW steps. Any schedule (a built-in policy, a custom program, a CSV file), any CP mode
// (chosen at run time), any attention backend, any communicator with the collectives.
//
// Its configuration is train/config.hpp, its report train/report.hpp; the same model on one
// rank is train/reference.hpp, generation train/generate.hpp (all behind baton/train.hpp).
#pragma once

#include <baton/attention/masks.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/comm/mesh.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/nn/cp_attention.hpp>
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
#include <baton/schedule/program.hpp>
#include <baton/train/config.hpp>
#include <baton/train/detail/global_batch.hpp>
#include <baton/train/detail/parameter_values.hpp>
#include <baton/train/detail/thread_usage.hpp>
#include <baton/train/guard.hpp>
#include <baton/train/report.hpp>
#include <baton/train/text_data.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace baton::train {

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

  // What a checkpoint saves and restores (baton/train/json/lm_checkpoint.hpp): the parameters
  // above, the optimizer's state, the step count; and which rank writes them.
  const lm_config& config() const noexcept { return state_->config; }
  const lm_parallelism& parallelism() const noexcept { return state_->parallelism; }
  /// AdamW over local_parameters().
  nn::adamw<T>& optimizer() noexcept { return *state_->optimizer; }
  /// Optimizer steps taken: since construction, plus those of a checkpoint loaded.
  std::int64_t steps() const noexcept { return state_->optimizer->steps(); }
  /// Whether this rank writes its stages' tensors into a checkpoint: the first of the ranks that
  /// hold the same stages (data- and context-parallel replicas), so each is written once.
  bool writes_checkpoint() const noexcept { return state_->replicas.rank() == 0; }

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
    non_finite_guard guard;

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
                   [&](int s) {
                     nn::transformer_config model = c.model;  // config.stage_recompute: a policy per stage
                     if (!c.stage_recompute.empty()) model.recompute = c.stage_recompute[static_cast<std::size_t>(s)];
                     return stage_type(model, nn::lm_stage_layout::of(s, stages, c.layers), init, make_strategy, mask);
                   },
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
      host_tensor_memory_reset_peak();
      const std::int64_t faults_before = detail::train::thread_minor_faults();
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
      using clock = std::chrono::steady_clock;
      const auto seconds = [](clock::time_point a, clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
      clock::time_point ready, piped, updated;  // the step's parts end to end (lm_step_report's times)
      if (train) {
        nn::zero_grad(params);
        ready = clock::now();
        pipe = exec->step(nn::lm_input<T>(tokens), info, targets);
        const auto synced = piped = clock::now();
        if (replicas.size() > 1) nn::all_reduce_gradients(params, replicas);
        const auto clipped = std::chrono::steady_clock::now();
        // After the replicas' sum every replica holds the same gradients: the norm counts each
        // parameter once by reducing over the pp group alone.
        r.grad_norm = clip_grad_norm(nn::gradient_spans(params),
                                     config.clip_norm > 0 ? config.clip_norm : std::numeric_limits<double>::infinity(),
                                     2.0, mesh.along(mesh_dim::pp));
        // Learning-rate schedule and non-finite guard (train/lr_schedule.hpp, train/guard.hpp):
        // the loss and the norm are the same on every rank, so every rank stops here alike.
        const std::int64_t taken = optimizer->steps();
        if (config.stop_on_non_finite) guard.check(taken, pipe.loss.value_or(0.0), r.grad_norm);
        r.lr = config.learning_rate.at(taken, config.optimizer.lr);
        optimizer->set_lr(r.lr);
        optimizer->step();
        updated = clock::now();
        r.sync_seconds = seconds(synced, clipped);
        r.optimizer_seconds = seconds(clipped, updated);
      } else {
        ready = clock::now();
        pipe = exec->eval(nn::lm_input<T>(tokens), info, targets);
        piped = updated = clock::now();
      }
      r.loss = pipe.loss.value_or(0.0);
      r.action_times = pipe.action_times;
      r.action_events = std::move(pipe.action_events);
      // Pipeline figures over the pp group: the longest call, the mean busy share, the peak memory.
      std::array<double, 2> sums{pipe.wall_seconds > 0 ? pipe.compute_seconds / pipe.wall_seconds : 1.0, 0.0};
      std::array<double, 2> maxima{pipe.wall_seconds, static_cast<double>(pipe.peak_saved_bytes)};
      Comm& pp = mesh.along(mesh_dim::pp);
      pp.all_reduce(std::span<double>(sums), reduce_op::sum);
      pp.all_reduce(std::span<double>(maxima), reduce_op::max);
      r.bubble_fraction = std::max(0.0, 1.0 - sums[0] / pp.size());
      r.pipeline_seconds = maxima[0];
      r.own_pipeline_seconds = seconds(ready, piped);
      r.peak_saved_bytes = static_cast<std::size_t>(maxima[1]);
      r.peak_host_bytes = host_tensor_memory().peak;
      r.minor_faults = detail::train::thread_minor_faults() - faults_before;
      const auto end = clock::now();
      r.data_seconds = seconds(start, ready);
      r.report_seconds = seconds(updated, end);
      r.seconds = seconds(start, end);
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

}  // namespace baton::train
