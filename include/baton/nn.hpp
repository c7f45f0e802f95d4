// baton/nn.hpp — the model layer: the pieces of a decoder-only transformer, each with forward
// and a split backward (backward_input / backward_weight), whose attention runs through any
// context-parallel strategy and any attention backend.
//
//   parameter, initializer, for_each_parameter, parameters_of, zero_grad     (nn/parameter.hpp)
//   transformer_config                                                       (nn/config.hpp)
//   sequence_info (the side input: global positions, document ids)          (nn/sequence.hpp)
//   linear, embedding, rms_norm, rotary_embedding, swiglu_mlp               (nn/linear.hpp ...)
//   no_cp, self_attention, causal_self_attention                             (nn/attention.hpp)
//   cross_attention (queries from x, keys/values from a memory; CP or not)  (nn/cross_attention.hpp)
//   cp_attention, cp_mode (the context-parallel mode chosen at run time)     (nn/cp_attention.hpp)
//   transformer_block                                                        (nn/block.hpp)
//   lm_head, cross_entropy, group_cross_entropy                              (nn/head.hpp, nn/loss.hpp)
//   lm_stage, lm_activation, lm_input, lm_loss (a decoder cut into stages) (nn/lm_stage.hpp)
//   adamw, sgd                                                               (nn/optim.hpp)
//   all_reduce_gradients                                                     (nn/grad_sync.hpp)
//   blas_kernel, set_blas_threads (the OpenBLAS under the matrix products)   (nn/blas.hpp)
//   nn_error                                                                 (nn/error.hpp)
#pragma once

#include <baton/nn/attention.hpp>
#include <baton/nn/blas.hpp>
#include <baton/nn/block.hpp>
#include <baton/nn/config.hpp>
#include <baton/nn/cp_attention.hpp>
#include <baton/nn/cross_attention.hpp>
#include <baton/nn/embedding.hpp>
#include <baton/nn/error.hpp>
#include <baton/nn/grad_sync.hpp>
#include <baton/nn/head.hpp>
#include <baton/nn/linear.hpp>
#include <baton/nn/lm_stage.hpp>
#include <baton/nn/loss.hpp>
#include <baton/nn/optim.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/nn/rms_norm.hpp>
#include <baton/nn/rotary.hpp>
#include <baton/nn/sequence.hpp>
#include <baton/nn/swiglu.hpp>
