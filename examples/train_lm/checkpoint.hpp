// Where checkpoints plug into baton-train (issue 28): the flags --save DIR, --save-every N,
// --keep K and --resume DIR are parsed and checked with the others (options.cpp), and run.hpp
// calls the three hooks below at the right moments. The checkpoint library itself (baton::train:
// save, load and reshard a model, its AdamW state, the step and the random states) is built
// apart; until it is wired in here, check_flags refuses --save and --resume before any rank
// starts, and the hooks do nothing.
#pragma once

#include "options.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace train_lm::checkpoint {

/// Called by parse() once every flag is read: refuses the checkpoint flags the hooks cannot
/// honour. HOOK: accept --save / --resume (and check DIR: creatable, or holding a checkpoint)
/// once save and load exist.
inline void check_flags(const options& o) {
  if (!o.save.empty() || !o.resume.empty())
    throw input_error(std::string(o.save.empty() ? "--resume" : "--save") +
                          ": checkpoints are not part of this build of baton-train yet (issue 28)",
                      "--save, --save-every, --keep and --resume (leave them out)");
}

/// HOOK, called by every rank right after the trainer is built and before the first step:
/// with --resume, load the model, the optimizer state (its step count drives the learning
/// rate), and the random states into `trainer`, and return the step to continue from (the
/// data position is the step: batch s is byte_corpus::train_batch(s, ...)). 0 without --resume.
template <class Trainer>
std::int64_t resume(Trainer& trainer, const options& o) {
  (void)trainer;
  (void)o;
  return 0;
}

/// HOOK, called by every rank when --save is given, after step `next_step - 1` has finished:
/// every --save-every steps, after the last step, and when SIGINT / SIGTERM stopped the run
/// (`why`: "every", "end", "signal"). Never after a non-finite step (the guard throws before).
/// Writes the state that continues at `next_step` and keeps the --keep latest; returns the
/// directory written, which rank 0 prints ("" when nothing was written).
template <class Trainer>
std::string save(Trainer& trainer, const options& o, std::int64_t next_step, std::string_view why) {
  (void)trainer;
  (void)o;
  (void)next_step;
  (void)why;
  return {};
}

}  // namespace train_lm::checkpoint
