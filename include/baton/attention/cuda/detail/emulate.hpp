// baton/attention/cuda/detail/emulate.hpp — the CUDA kernels' launches run on the CPU: every
// block of the grid the device would run (the grids of forward.cuh and backward.cuh), one
// after another, through the lockstep host reading of the SIMT layer (simt.hpp), each block
// with a fresh shared memory (filled with 0xff) and the race detector on. For
// cuda_attention_emulated and the CPU tests: it is as slow as an emulation of tensor cores
// lane by lane is. Every pointer in the arguments, the plan's arrays included, is host memory.
// Plain C++ (g++-compilable).
#pragma once

#include <cstddef>
#include <cstdint>

#include <baton/attention/cuda/detail/backward_args.hpp>
#include <baton/attention/cuda/detail/backward_kernel.hpp>
#include <baton/attention/cuda/detail/forward_args.hpp>
#include <baton/attention/cuda/detail/forward_kernel.hpp>
#include <baton/attention/cuda/detail/simt.hpp>
#include <baton/attention/cuda/plan.hpp>

namespace baton::detail::attention::cuda {

namespace emulate_detail {
/// body(ctx) for every block of an (x, y, z) grid, x fastest, each on a fresh
/// host_block<Threads> of `shared_bytes` bytes of shared memory.
template <int Threads, class Body>
void run_grid(std::int64_t x_blocks, std::int64_t y_blocks, std::int64_t z_blocks, std::size_t shared_bytes,
              const Body& body) {
  for (std::int64_t z = 0; z < z_blocks; ++z)
    for (std::int64_t y = 0; y < y_blocks; ++y)
      for (std::int64_t x = 0; x < x_blocks; ++x) {
        simt::host_block<Threads> ctx(shared_bytes);
        ctx.block_index = {static_cast<int>(x), static_cast<int>(y), static_cast<int>(z)};
        body(ctx);
      }
}

template <int Threads, class Body>
void run_grid(const launch_shape& shape, const Body& body) {
  run_grid<Threads>(shape.grid[0], shape.grid[1], shape.grid[2], shape.shared_bytes, body);
}
}  // namespace emulate_detail

/// The key-flag pass on the host (grid key_flag_launch).
template <class S>
void emulate_key_flags(const key_flag_args<S>& a) {
  emulate_detail::run_grid<key_flag_threads>(key_flag_launch(a.seq_k, a.heads_kv, a.batch),
                                             [&](auto& ctx) { key_flag_body(ctx, a); });
}

/// The forward on the host with tiling (MT, TK) (grid forward_launch).
template <class S, int D, int MT, int TK>
void emulate_forward_tiled(const forward_args<S>& a) {
  using body = forward_body<simt::host_block<128>, S, D, MT, TK>;
  check_plan_tiles(a.plan, body::config);
  if (a.plan.q_tiles == 0 || a.heads_q == 0 || a.batch == 0) return;
  emulate_detail::run_grid<128>(forward_launch(body::config, a.plan.seq_q, a.heads_q, a.batch),
                                [&](auto& ctx) { body::run(ctx, a); });
}

/// The forward on the host with forward_config_for's tiling (the one the device runs).
template <class S>
void emulate_forward(const forward_args<S>& a) {
  dispatch_head_dim(a.dim, [&](auto dim_constant) {
    constexpr int D = decltype(dim_constant)::value;
    constexpr forward_config cfg = forward_config_for(static_cast<int>(sizeof(S)), D);
    emulate_forward_tiled<S, D, cfg.m_tiles, cfg.tile_k>(a);
  });
}

/// The backward's three passes on the host, in the device's order (grids backward_grids_for).
template <class S>
void emulate_backward(const backward_args<S>& a) {
  check_backward_args(a);
  dispatch_head_dim(a.dim, [&](auto dim_constant) {
    constexpr int D = decltype(dim_constant)::value;
    using key_pass = backward_pass_layout<S, D, true>;
    using query_pass = backward_pass_layout<S, D, false>;
    const backward_grids g = backward_grids_for(a);
    const int row_blocks = static_cast<int>(g.prepass_row_blocks);
    emulate_detail::run_grid<prepass_threads>(g.prepass_blocks, 1, 1, 0, [&](auto& ctx) {
      backward_detail::prepass_block<S>(ctx, a, row_blocks);
    });
    emulate_detail::run_grid<key_pass::threads>(g.key_tiles, a.heads_kv, a.batch, key_pass::bytes,
                                                [&](auto& ctx) { backward_tile_block<S, D, true>(ctx, a); });
    emulate_detail::run_grid<query_pass::threads>(g.query_tiles, a.heads_q, a.batch, query_pass::bytes,
                                                  [&](auto& ctx) { backward_tile_block<S, D, false>(ctx, a); });
  });
}

}  // namespace baton::detail::attention::cuda
