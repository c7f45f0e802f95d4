// baton/train/json/lm_checkpoint.hpp — checkpoints of lm_trainer and lm_reference: every
// parameter by its global name, AdamW's moments ("<name>.exp_avg", "<name>.exp_avg_sq") and
// step count, the data position and the random states, written by one replica of each pipeline
// stage; loaded on any mesh, or on one rank.
//
// ```cpp
//   baton::train::checkpoint_directory dir(path, /*keep=*/3);
//   for (std::int64_t step = 0; step < steps; ++step) {
//     trainer.step(corpus.train_batch(step, config.batch, config.seq, false));
//     if ((step + 1) % every == 0) baton::train::save_checkpoint(trainer, dir);  // collective
//   }
//   // Later, in a new process, on the same mesh or another: the checkpoint `latest` names.
//   const auto resumed = baton::train::load_checkpoint(other_trainer, path);
//   for (std::int64_t step = resumed.data_position; step < steps + more; ++step)
//     other_trainer.step(corpus.train_batch(step, config.batch, config.seq, false));
// ```
#pragma once

#include <baton/train/checkpoint_state.hpp>
#include <baton/train/config.hpp>
#include <baton/train/lr_schedule.hpp>
#include <baton/train/json/checkpoint.hpp>
#include <baton/train/lm_trainer.hpp>
#include <baton/train/reference.hpp>

#include <charconv>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace baton::detail::train {
// A setting's text: the shortest that reads back as the same double ("0.9", "1e-08"), so
// that two settings compare equal exactly when their values do.
inline std::string number_text(double x) {
  char s[40];
  const auto end = std::to_chars(s, s + sizeof s, x).ptr;
  return std::string(s, end);
}
}  // namespace baton::detail::train

namespace baton::train {

/// What a program adds to an lm checkpoint.
struct checkpoint_progress {
  /// Where the data continue; unset: the trainer's step count (byte_corpus::train_batch(step,
  /// ...) reads batch number `step`, so after N steps the next batch is N).
  std::optional<std::int64_t> data_position{};
  /// The program's own random generators (random_state_text) and notes, kept as given.
  std::map<std::string, std::string> random_states{};
  std::map<std::string, std::string> metadata{};
};

/// What loading told: the checkpoint, where the data continue, and what changed.
struct lm_checkpoint_info {
  std::filesystem::path path;
  std::int64_t step = 0;
  std::int64_t data_position = 0;
  std::map<std::string, std::string> random_states;
  std::map<std::string, std::string> metadata;
  /// Training settings that differ from the checkpoint's, "lr: 0.003 in the checkpoint, 0.001
  /// now" (allowed: a resumed run may change them; a program may warn).
  std::vector<std::string> changed;
  /// How the checkpoint was written (mesh, CP mode, schedule).
  checkpoint_settings mesh;
};

/// The settings an lm checkpoint must match to load: the model's sizes and element type.
template <class T>
checkpoint_settings lm_model_settings(const lm_config& c) {
  const nn::transformer_config m = c.model.resolved();
  const auto number = detail::train::number_text;
  return {{"layers", std::to_string(c.layers)},    {"d_model", std::to_string(m.d_model)},
          {"heads", std::to_string(m.heads)},      {"kv_heads", std::to_string(m.kv_heads)},
          {"head_dim", std::to_string(m.head_dim)}, {"ffn_hidden", std::to_string(m.ffn_hidden)},
          {"vocab", std::to_string(m.vocab)},      {"qkv_bias", m.qkv_bias ? "true" : "false"},
          {"rope_base", number(m.rope_base)},      {"norm_eps", number(m.norm_eps)},
          {"dtype", std::string(to_string(dtype_of<T>()))}};
}

/// The settings an lm checkpoint records about its training (compared, never refused).
inline checkpoint_settings lm_training_settings(const lm_config& c) {
  const auto number = detail::train::number_text;
  checkpoint_settings settings{{"seq", std::to_string(c.seq)},
          {"batch", std::to_string(c.batch)},
          {"lr", number(c.optimizer.lr)},
          {"beta1", number(c.optimizer.beta1)},
          {"beta2", number(c.optimizer.beta2)},
          {"eps", number(c.optimizer.eps)},
          {"weight_decay", number(c.optimizer.weight_decay)},
          {"clip_norm", number(c.clip_norm)},
          {"lr_decay", std::string(to_string(c.learning_rate.decay))},
          {"lr_warmup", std::to_string(c.learning_rate.warmup)}};
  // A decay's end and floor (a constant rate has neither, whatever total says).
  if (c.learning_rate.decay != lr_decay::constant) {
    settings.emplace_back("lr_total", std::to_string(c.learning_rate.total));
    settings.emplace_back("lr_min", number(c.learning_rate.min_lr));
  }
  return settings;
}

}  // namespace baton::train

namespace baton::detail::train {

template <class Trainer>
std::vector<baton::train::checkpoint_tensor> lm_tensors(Trainer& t) {
  std::vector<baton::train::checkpoint_tensor> out;
  baton::train::add_parameters(out, t.local_parameters(), "model");
  baton::train::add_adamw_state(out, t.optimizer(), "optimizer");
  return out;
}

template <class T, class Trainer>
baton::train::checkpoint_record lm_record(Trainer& t, const baton::train::checkpoint_progress& p,
                                          baton::train::checkpoint_settings mesh) {
  baton::train::checkpoint_record r;
  r.step = t.steps();
  r.data_position = p.data_position.value_or(t.steps());
  // The initializer is counter-based (a function of the seed, a parameter's name and an
  // element's index): its seed is all its state. Batches of byte_corpus are a function of the
  // data position, greedy generation draws nothing.
  r.random_states = p.random_states;
  r.random_states.emplace("nn.initializer.seed", std::to_string(t.config().seed));
  r.metadata = p.metadata;
  r.model = baton::train::lm_model_settings<T>(t.config());
  r.training = baton::train::lm_training_settings(t.config());
  r.mesh = std::move(mesh);
  return r;
}

template <class Trainer>
baton::train::lm_checkpoint_info lm_info(Trainer& t, baton::train::loaded_checkpoint&& loaded) {
  t.optimizer().set_steps(loaded.record.step);
  baton::train::lm_checkpoint_info info{std::move(loaded.path),        loaded.record.step,
                                        loaded.record.data_position,   std::move(loaded.record.random_states),
                                        std::move(loaded.record.metadata), {},
                                        std::move(loaded.record.mesh)};
  for (const auto& [key, now] : baton::train::lm_training_settings(t.config()))
    for (const auto& [k, then] : loaded.record.training)
      if (k == key && then != now) info.changed.push_back(key + ": " + then + " in the checkpoint, " + now + " now");
  return info;
}

}  // namespace baton::detail::train

namespace baton::train {

/// Saves the trainer's state into `dir` as step steps() (collective over the trainer's world):
/// returns the checkpoint's directory once it is complete and `latest` names it.
template <class T, class Comm, class Backend, class Mask>
std::filesystem::path save_checkpoint(lm_trainer<T, Comm, Backend, Mask>& trainer, const checkpoint_directory& dir,
                                      const checkpoint_progress& progress = {}) {
  const auto& shape = trainer.executor().lowered_program().shape;
  const lm_parallelism& p = trainer.parallelism();
  checkpoint_settings mesh{{"pp", std::to_string(p.mesh.pp)},
                           {"dp", std::to_string(p.mesh.dp)},
                           {"cp_ring", std::to_string(p.mesh.cp_ring)},
                           {"cp_ulysses", std::to_string(p.mesh.cp_ulysses)},
                           {"cp_mode", std::string(nn::to_string(p.cp))},
                           {"layout", std::string(to_string(p.layout))},
                           {"stages", std::to_string(shape.num_stages())},
                           {"microbatches", std::to_string(shape.microbatches)}};
  const auto tensors = detail::train::lm_tensors(trainer);
  return save_checkpoint(trainer.mesh().world(), dir, detail::train::lm_record<T>(trainer, progress, std::move(mesh)),
                         tensors, trainer.writes_checkpoint());
}

/// Saves the one-rank model's state (the same names and files as a mesh's checkpoint).
template <class T, class Backend, class Mask>
std::filesystem::path save_checkpoint(lm_reference<T, Backend, Mask>& reference, const checkpoint_directory& dir,
                                      const checkpoint_progress& progress = {}) {
  const auto tensors = detail::train::lm_tensors(reference);
  return save_checkpoint(dir, detail::train::lm_record<T>(reference, progress, {{"ranks", "1 (lm_reference)"}}), tensors);
}

/// What a program checks before it builds a trainer or starts a thread: that the checkpoint
/// `where` names (a checkpoint, or a directory whose `latest` names one) can resume a run of
/// `config` in T — its manifest intact, every file there with its size, the model settings
/// equal (the first difference named). Throws checkpoint_error; returns the record (the step
/// to continue from). Loading checks all of it again, and every file's checksum.
template <class T>
loaded_checkpoint check_lm_checkpoint(const std::filesystem::path& where, const lm_config& config) {
  loaded_checkpoint found = read_checkpoint(where);
  detail::train::check_settings(found.path, found.record.model, lm_model_settings<T>(config));
  return found;
}

/// Restores the trainer from the checkpoint `where` names (a checkpoint, or a directory whose
/// `latest` names one), written on any mesh: this rank's parameters and their AdamW moments by
/// name, and the step count (collective). Throws checkpoint_error on every rank when it cannot
/// (checkpoint.hpp); the trainer is then not to be trained on.
template <class T, class Comm, class Backend, class Mask>
lm_checkpoint_info load_checkpoint(lm_trainer<T, Comm, Backend, Mask>& trainer, const std::filesystem::path& where) {
  const auto tensors = detail::train::lm_tensors(trainer);
  return detail::train::lm_info(trainer, load_checkpoint(trainer.mesh().world(), where,
                                                         lm_model_settings<T>(trainer.config()), tensors));
}

/// Restores the one-rank model from any lm checkpoint.
template <class T, class Backend, class Mask>
lm_checkpoint_info load_checkpoint(lm_reference<T, Backend, Mask>& reference, const std::filesystem::path& where) {
  const auto tensors = detail::train::lm_tensors(reference);
  return detail::train::lm_info(reference, load_checkpoint(where, lm_model_settings<T>(reference.config()), tensors));
}

}  // namespace baton::train
