// baton/train.hpp — training a transformer LM under pipeline x data x context parallelism:
// the composition of the schedule, pipeline, cp and nn layers on a device mesh.
//
//   lm_trainer, lm_config, lm_parallelism, check_config, config_error   (train/lm_trainer.hpp)
//   lm_reference (the same model on one rank), greedy_generate          (train/lm_trainer.hpp)
//   byte_corpus, lm_batch (byte-level text data, packed documents)       (train/text_data.hpp)
#pragma once

#include <baton/train/lm_trainer.hpp>
#include <baton/train/text_data.hpp>
