// baton/train/config.hpp — what a training run is configured with (lm_config: the model and
// the optimisation; lm_parallelism: the mesh, CP mode and sequence layout) and the check that
// rejects, on every rank alike and before any work, a configuration that cannot run.
#pragma once

#include <baton/comm/mesh.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/nn/config.hpp>
#include <baton/nn/cp_attention.hpp>
#include <baton/nn/error.hpp>
#include <baton/nn/optim.hpp>
#include <baton/schedule/program.hpp>
#include <baton/train/lr_schedule.hpp>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace baton::train {

/// A configuration that cannot run: `setting()` names what to change ("mesh", "cp",
/// "schedule", "model", "layers", "seq", "batch", "microbatches", "optimizer",
/// "learning_rate", "memory_cap"), the message says
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
  /// The learning rate of each step, whose peak is optimizer.lr (constant by default).
  lr_schedule learning_rate{};
  /// Throw non_finite_error (train/guard.hpp) on every rank at the first step whose loss or
  /// gradient norm is NaN or infinite, before its optimizer update.
  bool stop_on_non_finite = true;
  /// One recompute policy per pipeline stage of the schedule (stage s's blocks keep what
  /// stage_recompute[s] says), overriding model.recompute; empty: model.recompute on every
  /// stage. plan_under_memory_cap (train/memory_plan.hpp) chooses them under a memory cap.
  std::vector<nn::recompute_policy> stage_recompute{};
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
  if (!c.stage_recompute.empty()) {
    if (static_cast<int>(c.stage_recompute.size()) != stages)
      throw config_error("model", std::to_string(c.stage_recompute.size()) + " stage_recompute policies for the schedule's " +
                                      std::to_string(stages) + " stages; give one per stage, or none (model.recompute on every stage)");
    for (std::size_t s = 0; s < c.stage_recompute.size(); ++s) {
      nn::transformer_config stage_model = c.model;
      stage_model.recompute = c.stage_recompute[s];
      try {
        (void)stage_model.resolved();
      } catch (const nn::nn_error& e) {
        throw config_error("model", "stage_recompute[" + std::to_string(s) + "]: " + e.what());
      }
    }
  }
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
  if (p.cp != nn::cp_mode::none) {
    // Every rank of a cp group needs at least one token of the sequence: an empty shard has
    // no positions for its blocks (found here, not in the first forward).
    const int inner = p.cp == nn::cp_mode::hybrid ? m.cp_ulysses : 1;
    const int outer = p.cp == nn::cp_mode::ulysses ? m.cp_ulysses : m.cp_ring;
    const auto empty_rank = [&](std::int64_t seq) {
      const sequence_sharding s(p.layout, seq, outer, inner);
      for (int r = 0; r < s.ranks(); ++r)
        if (s.local_len(r) == 0) return r;
      return -1;
    };
    if (const int r = empty_rank(c.seq); r >= 0) {
      std::int64_t enough = c.seq + 1;
      while (empty_rank(enough) >= 0) ++enough;
      throw config_error("seq", "sequence length " + std::to_string(c.seq) + " leaves cp rank " + std::to_string(r) +
                                    " of " + std::to_string(outer * inner) + " (" + std::string(to_string(p.layout)) +
                                    " layout) without a token; every rank needs at least one: use a sequence of at "
                                    "least " + std::to_string(enough) + " tokens or a smaller cp degree");
    }
  }
  // Any head count splits over the Ulysses degree (unevenly where it must; baton/cp/ulysses.hpp).
  if (c.batch < schedule.microbatches)
    throw config_error("batch", "a batch of " + std::to_string(c.batch) + " rows per replica cannot be cut into " +
                                    std::to_string(schedule.microbatches) +
                                    " microbatches; use at least as many rows as microbatches");
  if (schedule.microbatches < 1) throw config_error("microbatches", "the schedule has no microbatches");
  const nn::adamw_options& o = c.optimizer;
  if (!(o.lr >= 0 && std::isfinite(o.lr)) || !(o.beta1 >= 0 && o.beta1 < 1) || !(o.beta2 >= 0 && o.beta2 < 1) ||
      !(o.eps > 0 && std::isfinite(o.eps)) || !(o.weight_decay >= 0 && std::isfinite(o.weight_decay)))
    throw config_error("optimizer", "AdamW needs a finite lr >= 0, 0 <= beta1, beta2 < 1, a finite eps > 0 and weight "
                                    "decay >= 0; got " + nn::adamw_options_text(o));
  if (!std::isfinite(c.clip_norm))
    throw config_error("optimizer", "clip_norm must be finite (<= 0 turns clipping off), got " + std::to_string(c.clip_norm));
  if (std::string problem = c.learning_rate.problem(o.lr); !problem.empty())
    throw config_error("learning_rate", "learning-rate schedule: " + problem);
}

}  // namespace baton::train
