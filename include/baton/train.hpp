// baton/train.hpp — training a transformer LM under pipeline x data x context parallelism:
// the composition of the schedule, pipeline, cp and nn layers on a device mesh.
//
//   lm_trainer (one rank's part of training on a mesh)                    (train/lm_trainer.hpp)
//   lm_config, lm_parallelism, check_config, config_error                 (train/config.hpp)
//   lr_schedule, lr_decay (the learning rate of each step)                (train/lr_schedule.hpp)
//   non_finite_guard, non_finite_error (stop at a NaN/Inf loss or norm)   (train/guard.hpp)
//   estimate_memory, available_memory (memory before allocating)          (train/memory.hpp)
//   plan_under_memory_cap (policies per stage and schedule under a cap)   (train/memory_plan.hpp)
//   step_metrics, to_json_line (one JSON line per step)                    (train/metrics.hpp)
//   gather_action_events, measured_timeline, ... (the measured timeline)  (train/timeline.hpp)
//   lm_step_report (what a step or eval reports)                          (train/report.hpp)
//   lm_reference (the same model on one rank)                             (train/reference.hpp)
//   greedy_generate (a one-stage model's greedy continuation)             (train/generate.hpp)
//   byte_corpus, lm_batch (byte-level text data, packed documents)        (train/text_data.hpp)
//   checkpoint_record, checkpoint_tensor, any_rank (what a checkpoint     (train/checkpoint_state.hpp)
//     holds), checkpoint_error                                            (train/checkpoint_error.hpp)
// With baton::json (nlohmann-json) linked, checkpoints:
//   save_checkpoint, load_checkpoint, checkpoint_directory,               (train/json/checkpoint.hpp)
//     latest_checkpoint, read_checkpoint (any trainer)
//   save_checkpoint, load_checkpoint of lm_trainer and lm_reference,      (train/json/lm_checkpoint.hpp)
//     check_lm_checkpoint
//   write_safetensors, safetensors_file                                   (train/json/safetensors.hpp)
#pragma once

#include <baton/config.hpp>

#include <baton/train/checkpoint_error.hpp>
#include <baton/train/checkpoint_state.hpp>
#include <baton/train/config.hpp>
#include <baton/train/generate.hpp>
#include <baton/train/guard.hpp>
#include <baton/train/lm_trainer.hpp>
#include <baton/train/lr_schedule.hpp>
#include <baton/train/memory.hpp>
#include <baton/train/memory_plan.hpp>
#include <baton/train/metrics.hpp>
#include <baton/train/reference.hpp>
#include <baton/train/report.hpp>
#include <baton/train/text_data.hpp>
#include <baton/train/timeline.hpp>

#if BATON_HAS_JSON()
#include <baton/train/json/checkpoint.hpp>
#include <baton/train/json/lm_checkpoint.hpp>
#include <baton/train/json/safetensors.hpp>
#endif
