// Where checkpoints plug into baton-train (issue 28): the flags --save DIR, --save-every N,
// --keep K and --resume DIR are parsed and checked with the others (options.cpp), and run.hpp
// calls the hooks below at the right moments. The checkpoints themselves are the library's
// (baton/train/json/: safetensors files and a manifest, atomic, verified, loadable on any
// mesh); a baton-train built without nlohmann-json (baton::json) refuses the flags.
#pragma once

#include "options.hpp"

#include <baton/config.hpp>
#include <baton/train.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>

namespace train_lm::checkpoint {

/// Called by parse() once every flag is read, before any rank starts: --save names a
/// directory that exists or can be made; --resume names a checkpoint (or a --save directory
/// holding one) that this model can continue from, intact and from before --steps.
inline void check_flags(const options& o) {
#if BATON_HAS_JSON()
  if (!o.save.empty()) {
    std::error_code ec;
    const std::filesystem::path dir(o.save);
    if (std::filesystem::exists(dir, ec) ? !std::filesystem::is_directory(dir, ec)
                                          : !std::filesystem::create_directories(dir, ec) || ec)
      throw input_error("--save " + o.save + ": not a directory, and one cannot be made there" +
                            (ec ? " (" + ec.message() + ")" : std::string()),
                        "--save (a directory this user can write)");
  }
  if (!o.resume.empty()) {
    const baton::train::lm_config config = o.config();
    baton::train::loaded_checkpoint found;
    try {
      found = o.dtype == "double" ? baton::train::check_lm_checkpoint<double>(o.resume, config)
                                  : baton::train::check_lm_checkpoint<float>(o.resume, config);
    } catch (const baton::train::checkpoint_error& e) {
      throw input_error(std::string("--resume: ") + e.what(), "--resume (or the model flags, to match the checkpoint)");
    }
    if (found.record.data_position >= o.steps)
      throw input_error("--resume " + o.resume + ": the checkpoint continues at step " +
                            std::to_string(found.record.data_position) + ", and --steps " + std::to_string(o.steps) +
                            " (the total, counted from step 0) asks for no more",
                        "--steps (more than " + std::to_string(found.record.data_position) + ")");
  }
#else
  if (!o.save.empty() || !o.resume.empty())
    throw input_error(std::string(o.save.empty() ? "--resume" : "--save") +
                          ": this baton-train was built without nlohmann-json, which checkpoints need",
                      "the build (install nlohmann-json3-dev: scripts/install-deps.sh) or leave --save and --resume out");
#endif
}

/// Called by every rank right after the trainer is built and before the first step: with
/// --resume, loads this rank's parameters and AdamW state (its step count drives the
/// learning rate) into `trainer`, whatever mesh wrote them, and returns the step to continue
/// from (batch s is byte_corpus::train_batch(s, ...)). 0 without --resume.
template <class Trainer>
std::int64_t resume(Trainer& trainer, const options& o) {
#if BATON_HAS_JSON()
  if (o.resume.empty()) return 0;
  const baton::train::lm_checkpoint_info info = baton::train::load_checkpoint(trainer, o.resume);  // collective
  if (trainer.mesh().world().rank() == 0) {
    std::string written;
    for (const auto& [key, value] : info.mesh) written += (written.empty() ? "" : ", ") + key + " " + value;
    std::printf("resumed: %s (after %lld steps; written on %s)\n", info.path.string().c_str(),
                static_cast<long long>(info.step), written.c_str());
    for (const std::string& change : info.changed) std::printf("resumed: changed since the checkpoint: %s\n", change.c_str());
    std::fflush(stdout);
  }
  return info.data_position;
#else
  (void)trainer;
  (void)o;
  return 0;
#endif
}

/// Called by every rank when --save is given, after step `next_step - 1` has finished: every
/// --save-every steps, after the last step, and when SIGINT / SIGTERM stopped the run (`why`:
/// "every", "end", "signal"). Never after a non-finite step (the guard ends the run first).
/// Writes the state that continues at `next_step`, keeps the --keep latest (0: all), and
/// returns the checkpoint's directory (rank 0 prints it).
template <class Trainer>
std::string save(Trainer& trainer, const options& o, std::int64_t next_step, std::string_view why) {
#if BATON_HAS_JSON()
  return baton::train::save_checkpoint(trainer, baton::train::checkpoint_directory(o.save, o.keep),
                                       {.data_position = next_step, .metadata = {{"reason", std::string(why)}}})
      .string();
#else
  (void)trainer;
  (void)o;
  (void)next_step;
  (void)why;
  return {};
#endif
}

}  // namespace train_lm::checkpoint
