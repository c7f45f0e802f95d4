// baton/cp.hpp — context parallelism: one long sequence sharded across ranks, attention
// computed by passing K/V blocks around a ring, by all-to-all head exchange (Ulysses), or
// both (hybrid). Gradients match attention over the whole sequence on one rank.
//
//   sequence_sharding, shard_layout, shard_sequence / unshard_sequence   (cp/sharding.hpp)
//   balanced_sharding, block_costs, attention_cost, zigzag_positions       (cp/balance.hpp)
//   merge_attention_partial, cp_accumulator_t                             (cp/merge.hpp)
//   ring_attention                                                        (cp/ring.hpp)
//   ulysses_attention                                                     (cp/ulysses.hpp)
//   hybrid_attention, cp_mesh, make_cp_mesh                               (cp/hybrid.hpp)
//   kv_sharding (cross-attention: the keys' own sharding)                 (cp/cross.hpp)
//   cp_params                                                             (cp/params.hpp)
//   cp::choose, cp::calibrate, cp_costs (which split is fastest here)     (cp/choose.hpp, cp/choose_calibrate.hpp)
//   cp::refine (near ties measured, where each rank has a core)           (cp/choose_refine.hpp)
//   host_memory, cp_memory_space, cp_memory_space_of (memory spaces)       (cp/memory.hpp)
//   cuda_device_memory (device buffers; include it yourself: needs CUDA)  (cp/cuda.hpp)
//   cp_error                                                              (cp/error.hpp)
#pragma once

#include <baton/cp/balance.hpp>
#include <baton/cp/choose.hpp>
#include <baton/cp/choose_calibrate.hpp>
#include <baton/cp/choose_refine.hpp>
#include <baton/cp/cross.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/hybrid.hpp>
#include <baton/cp/memory.hpp>
#include <baton/cp/merge.hpp>
#include <baton/cp/params.hpp>
#include <baton/cp/ring.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/cp/ulysses.hpp>
