// baton/attention/cuda/detail/backward_args.hpp — what the CUDA backward kernels are given:
// raw pointers, element strides and sizes of every tensor, the tile plan, and the workspace
// of the D = rowsum(dO * O) pre-pass; the tile shape of each (storage, head dim); and the
// host-side checks that run before a launch. Plain C++ (compiled by g++ and nvcc alike), so
// the emulated kernels of the CPU tests and the device launch read one and the same struct.
//
// The backward runs in three passes, in this order on one stream:
//   1. pre-pass, per query row (b, h, i): D_i = rowsum(dO_i * O_i) in fp32 and the row's
//      state for the non-finite rule; per key (b, hk, j): whether k_j or v_j is non-finite;
//   2. key pass, per (b, hk, key tile): dK, dV of the tile's keys, summed over the query
//      heads of the group (in head order) and their non-empty query tiles (in tile order);
//   3. query pass, per (b, h, query tile): dQ of the tile's rows over its non-empty key tiles.
// Each output element is written by exactly one thread of one block, after sums in a fixed
// order: deterministic, no atomics.
#pragma once

#include <baton/attention/cuda/plan.hpp>
#include <baton/attention/cuda/storage.hpp>
#include <baton/attention/error.hpp>
#include <baton/core/cuda_annotations.hpp>
#include <baton/core/layout.hpp>
#include <baton/core/tensor_view.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace baton::detail::attention::cuda {

/// Where row (b, s, h) of an operand starts: a [batch, seq, heads, dim] tensor, or the LSE
/// [batch, heads, seq], whose "row" is one element.
[[nodiscard]] BATON_HD constexpr std::int64_t row_at(const strided_layout<4>& l, std::int64_t b, std::int64_t s,
                                                     std::int64_t h) noexcept {
  return l.offset(b, s, h, 0);
}
[[nodiscard]] BATON_HD constexpr std::int64_t row_at(const strided_layout<3>& l, std::int64_t b, std::int64_t s,
                                                     std::int64_t h) noexcept {
  return l.offset(b, h, s);
}

/// A row's state for the non-finite rule (docs/attention.md), written by the pre-pass.
enum row_state : std::uint8_t {
  row_without_gradient = 0,  ///< lse = -inf: the row attends to nothing, P = 0 everywhere
  row_live = 1,              ///< finite inputs: the row contributes
  row_poisoning = 2,         ///< lse NaN or +inf, or q, out or dout non-finite: every allowed pair is poisoned
};

/// The pre-pass's results, read by the two tile passes. Carved from one device (or host)
/// allocation of backward_workspace_bytes() bytes by carve_backward_workspace().
struct backward_workspace {
  float* delta = nullptr;           ///< [batch, heads_q, seq_q]: D = rowsum(dO * O), 0 where not live
  std::uint8_t* row = nullptr;      ///< [batch, heads_q, seq_q]: a row_state
  std::uint8_t* key_bad = nullptr;  ///< [batch, heads_kv, seq_k]: k_j or v_j non-finite
};

inline constexpr std::size_t workspace_alignment = 256;  // cudaMalloc's alignment; any carve stays aligned

[[nodiscard]] constexpr std::size_t align_workspace(std::size_t bytes) noexcept {
  return (bytes + workspace_alignment - 1) / workspace_alignment * workspace_alignment;
}

/// Bytes of workspace a backward of these sizes needs (D and the two state arrays).
[[nodiscard]] constexpr std::size_t backward_workspace_bytes(std::int64_t batch, std::int64_t heads_q,
                                                             std::int64_t seq_q, std::int64_t heads_kv,
                                                             std::int64_t seq_k) noexcept {
  const auto rows = static_cast<std::size_t>(batch * heads_q * seq_q);
  const auto keys = static_cast<std::size_t>(batch * heads_kv * seq_k);
  return align_workspace(rows * sizeof(float)) + align_workspace(rows) + align_workspace(keys);
}

/// The workspace's arrays inside `base` (backward_workspace_bytes() bytes, 256-byte aligned).
[[nodiscard]] inline backward_workspace carve_backward_workspace(void* base, std::int64_t batch, std::int64_t heads_q,
                                                                 std::int64_t seq_q) noexcept {
  const auto rows = static_cast<std::size_t>(batch * heads_q * seq_q);
  auto* bytes = static_cast<std::uint8_t*>(base);
  backward_workspace w;
  w.delta = reinterpret_cast<float*>(bytes);
  w.row = bytes + align_workspace(rows * sizeof(float));
  w.key_bad = w.row + align_workspace(rows);
  return w;
}

/// Tile shape and warp layout of the backward for one (storage, head dim).
///
/// The pass owning a tile of `owned` rows (keys in the key pass, queries in the query pass)
/// runs (owned / 16) x splits warps. Warp (r, s) computes the scores of its 16 rows against
/// column slice s of the visited tile (S, dP, then P and dS into shared memory), and after a
/// barrier accumulates its 16 rows times head-dim slice s (dim / splits = 64 columns: 32
/// fp32 registers per accumulator per thread, two in the key pass) over every visited column.
/// So within a pass no score is computed twice, and the accumulators stay in registers at
/// every head dim. (Across passes S and dP are computed twice: the query pass recomputes them
/// so that dQ needs no atomics; 7 tile products per tile pair instead of FlashAttention-2's 5.)
///
/// Shared memory holds the owned tile's two operands (K, V or Q, dO), the visited tile's two
/// (twice, double-buffered, where that fits), and P, dS; tiles are 64 x 64 except for float
/// storage, whose 4-byte elements would exceed the 163 KiB an A100 block may have: 32 query
/// rows (64 keys) up to dim 128, 32 x 32 at 256. backward_pass_layout (backward_kernel.hpp)
/// has the byte offsets.
struct backward_shape {
  int tile_q = 64, tile_k = 64, dim = 64, splits = 1;

  [[nodiscard]] constexpr int key_pass_warps() const noexcept { return tile_k / 16 * splits; }
  [[nodiscard]] constexpr int query_pass_warps() const noexcept { return tile_q / 16 * splits; }
};

template <class Storage>
[[nodiscard]] constexpr backward_shape backward_shape_for(int dim) noexcept {
  backward_shape s;
  s.dim = dim;
  s.splits = dim / 64 > 0 ? dim / 64 : 1;
  if constexpr (std::is_same_v<Storage, float>) {
    s.tile_q = 32;
    s.tile_k = dim >= 256 ? 32 : 64;
  }
  return s;
}

/// Everything the three backward passes read and write. Pointers are device pointers for a
/// launch and host pointers for the emulation; the plan's arrays likewise.
template <class Storage>
struct backward_args {
  static_assert(cuda_storage<Storage>,
                "baton cuda attention: the storage type must be float, baton::bfloat16 or baton::float16");

  tensor_view<const Storage, 4> q;     ///< [batch, seq_q, heads_q, dim]
  tensor_view<const Storage, 4> k;     ///< [batch, seq_k, heads_kv, dim]
  tensor_view<const Storage, 4> v;     ///< [batch, seq_k, heads_kv, dim]
  tensor_view<const Storage, 4> out;   ///< [batch, seq_q, heads_q, dim]: the forward's (or the merged) output
  tensor_view<const Storage, 4> dout;  ///< [batch, seq_q, heads_q, dim]
  tensor_view<const float, 3> lse;     ///< [batch, heads_q, seq_q], natural log, scale included
  tensor_view<Storage, 4> dq;          ///< [batch, seq_q, heads_q, dim]
  tensor_view<Storage, 4> dk;          ///< [batch, seq_k, heads_kv, dim]
  tensor_view<Storage, 4> dv;          ///< [batch, seq_k, heads_kv, dim]

  std::int32_t batch = 0, heads_q = 0, heads_kv = 0, dim = 0;
  float scale = 1;          ///< multiplies q.k before the softmax (already resolved, never 0)
  bool accumulate = false;  ///< add the gradients to dq, dk, dv instead of overwriting them

  /// The tiles of the call, built for backward_shape_for<Storage>(dim): tile_q x tile_k.
  tile_plan_view plan{};
  backward_workspace workspace{};

  [[nodiscard]] constexpr std::int32_t seq_q() const noexcept { return plan.seq_q; }
  [[nodiscard]] constexpr std::int32_t seq_k() const noexcept { return plan.seq_k; }
  [[nodiscard]] constexpr std::int32_t group() const noexcept { return heads_q / heads_kv; }
};

/// Threads of a pre-pass block: one per query row (or key) it checks.
inline constexpr int prepass_threads = 256;

/// Grid sizes of the three passes, (x, y, z); a pass with no work has x = 0.
struct backward_grids {
  std::int64_t prepass_row_blocks = 0, prepass_blocks = 0;
  std::int64_t key_tiles = 0, query_tiles = 0;
};

template <class S>
[[nodiscard]] backward_grids backward_grids_for(const backward_args<S>& a) noexcept {
  backward_grids g;
  const std::int64_t rows = std::int64_t{a.batch} * a.heads_q * a.plan.seq_q;
  const std::int64_t keys = std::int64_t{a.batch} * a.heads_kv * a.plan.seq_k;
  g.prepass_row_blocks = (rows + prepass_threads - 1) / prepass_threads;
  g.prepass_blocks = g.prepass_row_blocks + (keys + prepass_threads - 1) / prepass_threads;
  g.key_tiles = a.batch > 0 ? a.plan.k_tiles : 0;
  g.query_tiles = a.batch > 0 ? a.plan.q_tiles : 0;
  return g;
}

/// Throws attention_error when `a` cannot be run by the kernels (unsupported head dim, a plan
/// built for other tiles or sizes, missing pointers, strides that break 16-byte row loads).
template <class Storage>
void check_backward_args(const backward_args<Storage>& a) {
  const std::string where = "baton cuda attention (backward): ";
  if (!is_supported_head_dim(a.dim))
    throw attention_error(where + "head dim " + std::to_string(a.dim) +
                          " is not supported; the CUDA kernels are compiled for head dims 64, 128 and 256 "
                          "(pad the head dim, or use the kokkos or reference backend)");
  if (a.batch < 0 || a.heads_q <= 0 || a.heads_kv <= 0 || a.heads_q % a.heads_kv != 0)
    throw attention_error(where + "heads_q (" + std::to_string(a.heads_q) + ") must be a positive multiple of heads_kv (" +
                          std::to_string(a.heads_kv) + ")");
  const backward_shape s = backward_shape_for<Storage>(a.dim);
  if (a.plan.tile_q != s.tile_q || a.plan.tile_k != s.tile_k)
    throw attention_error(where + "the tile plan has " + std::to_string(a.plan.tile_q) + " x " +
                          std::to_string(a.plan.tile_k) + " tiles but the backward runs " + std::to_string(s.tile_q) +
                          " x " + std::to_string(s.tile_k) + " tiles at this storage and head dim; build it with "
                          "backward_shape_for<Storage>(dim)");
  if (a.plan.q_tiles != (a.plan.seq_q + s.tile_q - 1) / s.tile_q || a.plan.k_tiles != (a.plan.seq_k + s.tile_k - 1) / s.tile_k)
    throw attention_error(where + "the tile plan's grid (" + std::to_string(a.plan.q_tiles) + " x " +
                          std::to_string(a.plan.k_tiles) + " tiles) does not cover seq_q " + std::to_string(a.plan.seq_q) +
                          " x seq_k " + std::to_string(a.plan.seq_k));
  const bool rows = a.batch > 0 && a.plan.seq_q > 0;
  const bool keys = a.batch > 0 && a.plan.seq_k > 0;
  if (rows && (!a.q.data || !a.out.data || !a.dout.data || !a.lse.data || !a.dq.data || !a.workspace.delta || !a.workspace.row))
    throw attention_error(where + "a null pointer among q, out, dout, lse, dq and the workspace");
  if (keys && (!a.k.data || !a.v.data || !a.dk.data || !a.dv.data || !a.workspace.key_bad))
    throw attention_error(where + "a null pointer among k, v, dk, dv and the workspace");
  if (rows && keys && a.plan.q_tiles * a.plan.k_tiles > 0 && !a.plan.kind)
    throw attention_error(where + "the tile plan has no tile kinds");
  // Rows move as 16-byte vectors: every row start must be 16-byte aligned.
  constexpr std::int64_t per_vector = static_cast<std::int64_t>(16 / sizeof(Storage));
  // (A stride matters only along an axis of more than one row.)
  const auto aligned = [&](const auto& t, std::int64_t seq, std::int64_t heads, const char* name) {
    const bool ok = reinterpret_cast<std::uintptr_t>(t.data) % 16 == 0 && (a.batch <= 1 || t.stride(0) % per_vector == 0) &&
                    (seq <= 1 || t.stride(1) % per_vector == 0) && (heads <= 1 || t.stride(2) % per_vector == 0);
    if (!ok)
      throw attention_error(where + "tensor '" + name + "' has a row that does not start on a 16-byte boundary; "
                            "the CUDA kernels load rows as 16-byte vectors: pass a 16-byte aligned pointer and "
                            "strides that are multiples of " + std::to_string(per_vector) + " elements");
  };
  if (rows) {
    aligned(a.q, a.plan.seq_q, a.heads_q, "q");
    aligned(a.out, a.plan.seq_q, a.heads_q, "out");
    aligned(a.dout, a.plan.seq_q, a.heads_q, "dout");
    aligned(a.dq, a.plan.seq_q, a.heads_q, "dq");
  }
  if (keys) {
    aligned(a.k, a.plan.seq_k, a.heads_kv, "k");
    aligned(a.v, a.plan.seq_k, a.heads_kv, "v");
    aligned(a.dk, a.plan.seq_k, a.heads_kv, "dk");
    aligned(a.dv, a.plan.seq_k, a.heads_kv, "dv");
  }
}

}  // namespace baton::detail::attention::cuda
