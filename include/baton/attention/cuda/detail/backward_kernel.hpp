// baton/attention/cuda/detail/backward_kernel.hpp — one job: the bodies of the three backward
// passes of the CUDA backend (their arguments and grids are in backward_args.hpp), written
// once over the SIMT layer (simt.hpp): the device runs them per thread (backward.cuh), the
// CPU tests run them per block in lockstep (emulate.hpp), with the same tensor-core fragment
// layouts (mma.hpp).
//
// The tile passes are one body, KeyPass choosing the roles (FlashAttention-2's backward):
//
//                     key pass (dK, dV)                 query pass (dQ)
//   owned tile        K, V rows of tile_k keys          Q, dO rows of tile_q queries
//   visited tiles     Q, dO of each query head of the   K, V of the query tile's
//                     group, each non-empty query tile  non-empty key tiles
//   phase 1           S^T = K Q^T, dP^T = V dO^T        S = Q K^T, dP = dO V^T
//   elementwise       P = exp2(S scale log2e - lse log2e), dS = P (dP - D), into shared memory
//   phase 2           dV += P^T dO, dK += dS^T Q        dQ += dS K
//   epilogue          dK *= scale; store (or add) dK, dV; dQ likewise
//
// Warp (r, s) of a block (r = warp % row_blocks, s = warp / row_blocks) computes phase 1 for
// owned rows 16r..16r+15 and visited columns s * slice_cols.., then, after a barrier, phase
// 2 for the same rows and head-dim columns 64 s..64 s + 63, whose accumulators it keeps in
// registers for the whole block. Every sum runs in one fixed order (heads of the group
// ascending, tiles ascending, columns ascending inside the mma): bit-identical reruns.
// Visited tiles move by cp.async; where two fit in shared memory (backward_pass_layout::
// stages) the next visit's rows and per-row facts are loaded while this one is computed.
//
// Tensor cores: 16-bit storage uses mma.m16n8k16 with ldmatrix fragments (P and dS rounded to
// the storage type, as FlashAttention-2); float storage uses m16n8k8 tf32 as 3xTF32 with
// fragments read element by element, P and dS kept in fp32.
//
// Non-finite rule (docs/attention.md): the pre-pass marks each query row without gradient
// (lse -inf), live, or poisoning (lse NaN/+inf, q/out/dout non-finite) and each key whose k or
// v is non-finite. A row or key that is not live-and-finite is zero-filled in shared memory
// and its P forced to 0, so no NaN enters any product; an allowed pair of a row with
// gradient and a poisoning row or bad key marks the owned row, whose gradient is written NaN.
// A visit whose tile is full and whose every staged row and key is live and usable (the
// barrier before phase 1 ORs each thread's flag) skips those per-element tests: P and dS
// from lse and D alone (backward_pass_layout::plain_path: 256 threads or fewer).
#pragma once

#include <baton/attention/cuda/detail/backward_args.hpp>
#include <baton/attention/cuda/detail/mma.hpp>
#include <baton/attention/cuda/detail/simt.hpp>
#include <baton/attention/cuda/plan.hpp>
#include <baton/attention/cuda/storage.hpp>
#include <baton/attention/masks.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace baton::detail::attention::cuda {

namespace backward_detail {
inline constexpr float log2e = 1.4426950408889634f;
}  // namespace backward_detail

/// Shared-memory row pitch (elements) of a tile row of `columns` elements: 16 bytes more, so
/// the 8 rows one ldmatrix (or one fragment load) reads fall in different banks, while every
/// row still starts 16-byte aligned (cp.async and ldmatrix need it).
template <class S>
[[nodiscard]] constexpr int smem_pitch(int columns) noexcept {
  return columns + static_cast<int>(16 / sizeof(S));
}

/// The shape of one tile pass for (storage, head dim): threads, per-warp slices, and the
/// byte offsets of its shared memory.
template <class S, int Dim, bool KeyPass>
struct backward_pass_layout {
  static_assert(cuda_storage<S>, "baton cuda attention: the storage type must be float, bfloat16 or float16");
  static_assert(Dim == 64 || Dim == 128 || Dim == 256, "baton cuda attention: head dims 64, 128, 256");
  static constexpr bool tf32 = std::is_same_v<S, float>;
  static constexpr backward_shape shape = backward_shape_for<S>(Dim);
  static constexpr int owned = KeyPass ? shape.tile_k : shape.tile_q;
  static constexpr int visited = KeyPass ? shape.tile_q : shape.tile_k;
  static constexpr int splits = shape.splits;
  static constexpr int row_blocks = owned / 16;
  static constexpr int warps = row_blocks * splits;
  static constexpr int threads = warps * simt::warp_size;
  /// Whether the pass has a plain elementwise path for ordinary tiles (backward_tile_block):
  /// where a thread may hold 255 registers (256 threads or fewer).
  static constexpr bool plain_path = threads <= 256;
  static constexpr int slice_cols = visited / splits;  // phase-1 columns per warp
  static constexpr int slice_tiles = slice_cols / 8;   // n8 tiles of phase 1
  static constexpr int dim_cols = Dim / splits;        // phase-2 head-dim columns per warp
  static constexpr int dim_tiles = dim_cols / 8;       // n8 tiles of phase 2 (8)
  static_assert(slice_cols % 8 == 0 && (tf32 || slice_tiles % 2 == 0),
                "each warp's visited columns must be whole n8 tiles (pairs of them for ldmatrix)");
  static_assert(dim_cols == 64, "each warp accumulates 64 head-dim columns");
  static_assert(visited % (tf32 ? 8 : 16) == 0, "the visited tile is whole mma k-steps");

  static constexpr std::uint32_t element = sizeof(S);
  static constexpr std::uint32_t pitch_d = static_cast<std::uint32_t>(smem_pitch<S>(Dim));      // elements
  static constexpr std::uint32_t pitch_v = static_cast<std::uint32_t>(smem_pitch<S>(visited));  // elements
  static constexpr int queries = KeyPass ? visited : owned;  // rows whose lse, D, state are staged
  static constexpr int keys = KeyPass ? owned : visited;     // keys whose flags are staged

  // Visited tiles are double-buffered (the next one's cp.async copies run during this one's
  // products) where two fit an A100's 163 KiB; otherwise single.
  static constexpr std::uint32_t tile_bytes(int rows) { return static_cast<std::uint32_t>(rows) * pitch_d * element; }
  static constexpr std::uint32_t single_stage_bytes =
      2 * tile_bytes(owned) + 2 * tile_bytes(visited) + 2 * owned * pitch_v * element + 12 * queries + 4 * keys +
      4 * owned * splits;
  static constexpr int stages =
      single_stage_bytes + 2 * tile_bytes(visited) + 12 * queries + 4 * keys <= 163 * 1024 ? 2 : 1;

  // Byte offsets, each 16-byte aligned.
  static constexpr std::uint32_t owned1 = 0;                        // K or Q
  static constexpr std::uint32_t owned2 = owned1 + tile_bytes(owned);  // V or dO
  static constexpr std::uint32_t visited_base = owned2 + tile_bytes(owned);
  /// Stage st's visited tiles: Q or K (visited1), dO or V (visited2).
  static constexpr std::uint32_t visited1(int st) { return visited_base + 2 * static_cast<std::uint32_t>(st) * tile_bytes(visited); }
  static constexpr std::uint32_t visited2(int st) { return visited1(st) + tile_bytes(visited); }
  static constexpr std::uint32_t p = visited_base + 2 * stages * tile_bytes(visited);  // P, [owned][visited]
  static constexpr std::uint32_t ds = p + owned * pitch_v * element;                 // dS, [owned][visited]
  // Per-row facts, one set per stage (the owned tile's facts live in stage 0): per query lse
  // log2e (+inf: P = 0), D and row_state; per key 0 usable, 1 non-finite, 2 past the end.
  static constexpr std::uint32_t facts = ds + owned * pitch_v * element;
  static constexpr std::uint32_t facts_bytes = 12 * queries + 4 * keys;
  static constexpr std::uint32_t lse2(int st) { return facts + static_cast<std::uint32_t>(st) * facts_bytes; }
  static constexpr std::uint32_t delta(int st) { return lse2(st) + 4 * queries; }
  static constexpr std::uint32_t state(int st) { return delta(st) + 4 * queries; }
  static constexpr std::uint32_t key_code(int st) { return state(st) + 4 * queries; }
  static constexpr std::uint32_t poison = facts + stages * facts_bytes;  // [owned][splits]: a poisoned pair seen
  static constexpr std::uint32_t bytes = poison + 4 * owned * splits;
  static_assert(owned2 % 16 == 0 && visited_base % 16 == 0 && tile_bytes(visited) % 16 == 0 && p % 16 == 0 &&
                ds % 16 == 0 && facts % 16 == 0);
  static_assert(bytes <= 163 * 1024, "a backward block must fit an A100's 163 KiB of shared memory");
  // Row loads: whole 16-byte chunks, the same count for every thread.
  static_assert(owned * Dim * static_cast<int>(sizeof(S)) / 16 % threads == 0 &&
                    visited * Dim * static_cast<int>(sizeof(S)) / 16 % threads == 0,
                "tile loads must split evenly over the block's threads");
  static_assert(threads >= visited && threads >= owned, "one thread per staged row");
};

/// Dynamic shared memory of the larger of the two tile passes for (storage, head dim).
template <class S>
[[nodiscard]] constexpr std::size_t backward_smem_bytes(int dim) noexcept {
  const auto larger = [](std::uint32_t x, std::uint32_t y) { return x > y ? x : y; };
  switch (dim) {
    case 64: return larger(backward_pass_layout<S, 64, true>::bytes, backward_pass_layout<S, 64, false>::bytes);
    case 128: return larger(backward_pass_layout<S, 128, true>::bytes, backward_pass_layout<S, 128, false>::bytes);
    case 256: return larger(backward_pass_layout<S, 256, true>::bytes, backward_pass_layout<S, 256, false>::bytes);
    default: return 0;
  }
}

namespace backward_detail {

template <class Ctx, class T>
using lanes_t = typename Ctx::template lanes_of<T>;

/// Per thread, base + offset: the pointers the context's loads and stores take.
template <class T, class Offsets>
[[nodiscard]] BATON_HD auto pointers(T* base, const Offsets& offsets) {
  return simt::map([base](std::int64_t off) { return base + off; }, offsets);
}

/// Per thread, the index of row first + r of head h, batch b, in a flattened [batch, heads,
/// seq] array (the workspace's), or 0 where !on.
template <class LI, class LB>
[[nodiscard]] BATON_HD auto flat_rows(int b, std::int64_t heads, int h, std::int64_t seq, int first, const LI& r,
                                      const LB& on) {
  return simt::map([=](int rr, bool o) { return o ? (std::int64_t{b} * heads + h) * seq + rr + first : std::int64_t{0}; },
                   r, on);
}

/// The rows of one pre-pass block: thread t takes row block_number * prepass_threads + t of the
/// flattened [batch, heads, seq] (query rows, or keys), `active` where that row exists.
template <class Ctx>
struct prepass_rows {
  lanes_t<Ctx, std::int64_t> index;
  lanes_t<Ctx, bool> active;
  std::int64_t heads, seq;

  BATON_HD prepass_rows(Ctx& ctx, std::int64_t block_number, std::int64_t batch, std::int64_t heads_, std::int64_t seq_)
      : heads(heads_), seq(seq_) {
    const std::int64_t count = batch * heads * seq;
    index = simt::map([](int t, std::int64_t first) { return first + t; }, ctx.thread_index(),
                      lanes_t<Ctx, std::int64_t>(block_number * prepass_threads));
    active = simt::map([count](std::int64_t r) { return r < count; }, index);
  }

  /// Where each thread's row (b, s, h) starts in a tensor of layout l; 0 on inactive lanes
  /// (never read through: loads are predicated).
  template <class Layout>
  [[nodiscard]] BATON_HD auto at(const Layout& l) const {
    return simt::map(
        [l, heads = heads, seq = seq](std::int64_t r, bool on) {
          if (!on) return std::int64_t{0};
          const std::int64_t i = r % seq, h = r / seq % heads, b = r / seq / heads;
          return row_at(l, b, i, h);
        },
        index, active);
  }
};

/// Pre-pass block (prepass_threads threads): block x < row_blocks handles query rows
/// [x * threads, ...) of the flattened [batch, heads_q, seq_q]; the remaining blocks handle
/// keys of [batch, heads_kv, seq_k]. One thread per row: D summed in a fixed order.
template <class S, class Ctx>
BATON_HD void prepass_block(Ctx& ctx, const backward_args<S>& a, int row_blocks) {
  using namespace simt;
  using lb = lanes_t<Ctx, bool>;
  using lf = lanes_t<Ctx, float>;
  using lu8 = lanes_t<Ctx, std::uint8_t>;
  if (ctx.block_x() < row_blocks) {
    const prepass_rows<Ctx> rows(ctx, ctx.block_x(), a.batch, a.heads_q, a.plan.seq_q);
    const auto q_at = rows.at(a.q.layout), o_at = rows.at(a.out.layout), g_at = rows.at(a.dout.layout);
    // fp32: summing in double changed no gradient's error measurably in the CPU tests (the
    // fp32 accumulations of the tile passes dominate).
    lf sum = 0.f;
    lb finite = true;
    for (int d = 0; d < a.dim; ++d) {
      const auto q = ctx.template load<S>(pointers(a.q.data + d, q_at), rows.active);
      const auto o = ctx.template load<S>(pointers(a.out.data + d, o_at), rows.active);
      const auto g = ctx.template load<S>(pointers(a.dout.data + d, g_at), rows.active);
      finite = finite && map([](S x, S y, S z) { return storage_finite(x) && storage_finite(y) && storage_finite(z); }, q, o, g);
      sum = sum + map([](S x, S y) { return to_float(x) * to_float(y); }, g, o);
    }
    const lf lse = ctx.template load<float>(pointers(a.lse.data, rows.at(a.lse.layout)), rows.active);
    const lb no_gradient = map([](float l) { return l == -std::numeric_limits<float>::infinity(); }, lse);
    const lb lse_ok = map([](float l) { return l < std::numeric_limits<float>::infinity(); }, lse);  // not NaN, not +inf
    const auto state = select(no_gradient, lu8(row_without_gradient),
                              select(finite && lse_ok, lu8(row_live), lu8(row_poisoning)));
    const lf delta = select(state == std::uint8_t{row_live}, sum, lf(0.f));
    ctx.template store<float>(pointers(a.workspace.delta, rows.index), delta, rows.active);
    ctx.template store<std::uint8_t>(pointers(a.workspace.row, rows.index), state, rows.active);
  } else {
    const prepass_rows<Ctx> keys(ctx, ctx.block_x() - row_blocks, a.batch, a.heads_kv, a.plan.seq_k);
    const auto k_at = keys.at(a.k.layout), v_at = keys.at(a.v.layout);
    lb finite = true;
    for (int d = 0; d < a.dim; ++d) {
      const auto k = ctx.template load<S>(pointers(a.k.data + d, k_at), keys.active);
      const auto v = ctx.template load<S>(pointers(a.v.data + d, v_at), keys.active);
      finite = finite && map([](S x, S y) { return storage_finite(x) && storage_finite(y); }, k, v);
    }
    ctx.template store<std::uint8_t>(pointers(a.workspace.key_bad, keys.index), select(finite, lu8(0), lu8(1)), keys.active);
  }
}

/// Copies rows [first, first + Rows) of a [batch, seq, heads, dim] tensor (batch b, head h)
/// into shared memory at `dst` (pitch smem_pitch<S>(Dim)), as 16-byte cp.async chunks; rows
/// past `seq` or for which good(local row) is false are zero-filled instead.
template <class S, int Dim, int Rows, int Threads, class Ctx, class Good>
BATON_HD void load_rows(Ctx& ctx, std::uint32_t dst, const tensor_view<const S, 4>& x, int b, int h, int first,
                        int seq, const Good& good) {
  using namespace simt;
  constexpr int per_row = Dim * static_cast<int>(sizeof(S)) / 16;
  constexpr std::uint32_t pitch = static_cast<std::uint32_t>(smem_pitch<S>(Dim)) * sizeof(S);
  const auto tid = ctx.thread_index();
  BATON_UNROLL
  for (int it = 0; it < Rows * per_row / Threads; ++it) {
    const auto chunk = tid + it * Threads;
    const auto r = chunk / per_row, c = chunk % per_row;
    const auto valid = (r + first < seq) && good(r);
    const auto src = map(
        [=](int rr, int cc) {
          const int row = rr + first < seq ? rr + first : seq - 1;  // in bounds even where not read
          return static_cast<const void*>(reinterpret_cast<const std::byte*>(&x(b, row, h, 0)) + 16 * cc);
        },
        r, c);
    ctx.copy16_async(cast<std::uint32_t>(r) * pitch + cast<std::uint32_t>(c) * 16u + dst, src, valid);
  }
}

/// Stages lse log2e, D and the state of query rows [first, first + Rows) of head h (stage st).
/// Returns, per thread, whether its row is not an ordinary one (not live, or past the end).
template <class S, class L, class Ctx>
BATON_HD auto stage_queries(Ctx& ctx, const backward_args<S>& a, int b, int h, int first, int st) {
  using namespace simt;
  const auto i = ctx.thread_index();
  const auto active = i < L::queries;
  const auto in = active && (i + first < a.plan.seq_q);
  const auto index = flat_rows(b, a.heads_q, h, a.plan.seq_q, first, i, in);
  const auto lse_at = map([=](int r, bool on) { return on ? row_at(a.lse.layout, b, r + first, h) : std::int64_t{0}; }, i, in);
  const auto state = cast<std::uint32_t>(ctx.template load<std::uint8_t>(pointers<const std::uint8_t>(a.workspace.row, index), in));
  const auto lse = ctx.template load<float>(pointers(a.lse.data, lse_at), in);
  const auto delta = ctx.template load<float>(pointers<const float>(a.workspace.delta, index), in);
  const auto live = state == std::uint32_t{row_live};
  const auto slot = cast<std::uint32_t>(i) * 4u;
  ctx.template shared_store<float>(slot + L::lse2(st),
                                   select(live, lse * log2e, lanes_t<Ctx, float>(std::numeric_limits<float>::infinity())),
                                   active);
  ctx.template shared_store<float>(slot + L::delta(st), select(live, delta, lanes_t<Ctx, float>(0.f)), active);
  ctx.template shared_store<std::uint32_t>(slot + L::state(st), state, active);
  return active && !live;
}

/// Stages the flags of keys [first, first + Rows) of kv head hk (stage st): 0 usable, 1
/// non-finite, 2 past the end of the sequence. Returns, per thread, whether its key is not
/// usable.
template <class S, class L, class Ctx>
BATON_HD auto stage_keys(Ctx& ctx, const backward_args<S>& a, int b, int hk, int first, int st) {
  using namespace simt;
  using lu = lanes_t<Ctx, std::uint32_t>;
  const auto j = ctx.thread_index();
  const auto active = j < L::keys;
  const auto in = active && (j + first < a.plan.seq_k);
  const auto index = flat_rows(b, a.heads_kv, hk, a.plan.seq_k, first, j, in);
  const auto bad = ctx.template load<std::uint8_t>(pointers<const std::uint8_t>(a.workspace.key_bad, index), in);
  const auto code = select(in, select(bad != std::uint8_t{0}, lu(1u), lu(0u)), lu(2u));
  ctx.template shared_store<std::uint32_t>(cast<std::uint32_t>(j) * 4u + L::key_code(st), code, active);
  return active && code != 0u;
}

/// Per thread, whether row first + r of head h (of `heads`, batch b) exists and its byte in
/// the workspace array `flags` ([batch, heads, seq]) is `wanted`.
template <class Ctx>
BATON_HD auto row_flag_is(Ctx& ctx, const std::uint8_t* flags, std::uint8_t wanted, int b, std::int64_t heads, int h,
                          int seq, int first, const lanes_t<Ctx, int>& r) {
  const auto in = (r + first) < seq;
  const auto flag = ctx.template load<std::uint8_t>(pointers(flags, flat_rows(b, heads, h, seq, first, r, in)), in);
  return in && (flag == wanted);
}

/// Whether query row r of the tile starting at `first` is usable as a Q/dO row (live).
template <class S, class Ctx>
BATON_HD auto query_row_live(Ctx& ctx, const backward_args<S>& a, int b, int h, int first, const lanes_t<Ctx, int>& r) {
  return row_flag_is(ctx, a.workspace.row, std::uint8_t{row_live}, b, a.heads_q, h, a.plan.seq_q, first, r);
}

/// Whether key r of the tile starting at `first` has finite k and v.
template <class S, class Ctx>
BATON_HD auto key_row_finite(Ctx& ctx, const backward_args<S>& a, int b, int hk, int first, const lanes_t<Ctx, int>& r) {
  return row_flag_is(ctx, a.workspace.key_bad, std::uint8_t{0}, b, a.heads_kv, hk, a.plan.seq_k, first, r);
}

/// acc[n][.] += A B for one warp: A = the 16 rows from row0 of the tile at `a_at` (pitch
/// APitch elements), its first K columns; B = K x (8 NTiles), columns from n0, read from the
/// tile at `b_at` (pitch BPitch), stored [n][k] when BByRows (phase 1: S = K Q^T or Q K^T and
/// dP from the visited tile's rows) and [k][n] otherwise (phase 2: the score tile times the
/// visited tile's head-dim columns). Tensor cores as mma.hpp says: m16n8k16 with ldmatrix
/// fragments for 16-bit storage, 3xTF32 with element-wise fragments for float.
template <class S, int K, int NTiles, std::uint32_t APitch, std::uint32_t BPitch, bool BByRows, class Ctx, class LF>
BATON_HD void warp_product(Ctx& ctx, LF (&acc)[NTiles][4], std::uint32_t a_at, std::uint32_t b_at,
                           const lanes_t<Ctx, int>& row0, const lanes_t<Ctx, int>& n0) {
  using namespace simt;
  using lu = lanes_t<Ctx, std::uint32_t>;
  const auto lane = ctx.lane();
  // Element (k, n) of B: its offset in the tile, in elements.
  const auto b_element = [](const auto& k, const auto& n) {
    if constexpr (BByRows)
      return cast<std::uint32_t>(n) * BPitch + cast<std::uint32_t>(k);
    else
      return cast<std::uint32_t>(k) * BPitch + cast<std::uint32_t>(n);
  };
  if constexpr (std::is_same_v<S, float>) {
    const auto g = lane / 4, t = lane % 4;
    BATON_UNROLL
    for (int kk = 0; kk < K / 8; ++kk) {
      lu a_big[4], a_small[4];
      BATON_UNROLL
      for (int r = 0; r < 4; ++r) {
        const auto row = row0 + g + 8 * (r & 1), col = t + 4 * (r >> 1) + kk * 8;
        const auto x = ctx.template shared_load<float>((cast<std::uint32_t>(row) * APitch + cast<std::uint32_t>(col)) * 4u + a_at);
        split_tf32(x, a_big[r], a_small[r]);
      }
      BATON_UNROLL
      for (int n = 0; n < NTiles; ++n) {
        lu b_big[2], b_small[2];
        BATON_UNROLL
        for (int r = 0; r < 2; ++r) {
          const auto x = ctx.template shared_load<float>(b_element(t + 4 * r + kk * 8, n0 + n * 8 + g) * 4u + b_at);
          split_tf32(x, b_big[r], b_small[r]);
        }
        mma_3xtf32(acc[n], a_big, a_small, b_big, b_small);
      }
    }
  } else {
    // ldmatrix: lane l addresses row l % 8 of 8 x 8 matrix l / 8; for B that row is n (BByRows)
    // or k (read transposed).
    const auto a_row = row0 + lane % 8 + 8 * ((lane / 8) % 2);
    const auto a_col = 8 * (lane / 16);
    const auto b_k = BByRows ? 8 * ((lane / 8) % 2) : lane % 8 + 8 * ((lane / 8) % 2);
    const auto b_n = BByRows ? n0 + lane % 8 + 8 * (lane / 16) : n0 + 8 * (lane / 16);
    BATON_UNROLL
    for (int kk = 0; kk < K / 16; ++kk) {
      lu af[4];
      ctx.ldmatrix_x4(af, (cast<std::uint32_t>(a_row) * APitch + cast<std::uint32_t>(a_col + kk * 16)) * 2u + a_at, false);
      BATON_UNROLL
      for (int n = 0; n < NTiles; n += 2) {
        lu bf[4];
        ctx.ldmatrix_x4(bf, b_element(b_k + kk * 16, b_n + n * 8) * 2u + b_at, !BByRows);
        const lu lo[2] = {bf[0], bf[1]}, hi[2] = {bf[2], bf[3]};
        mma_m16n8k16<S>(acc[n], af, lo);
        mma_m16n8k16<S>(acc[n + 1], af, hi);
      }
    }
  }
}

}  // namespace backward_detail

/// One block of a tile pass: block (x, y, z) = (owned tile, head, batch entry); the head is a
/// kv head in the key pass and a query head in the query pass.
template <class S, int Dim, bool KeyPass, class Ctx>
BATON_HD void backward_tile_block(Ctx& ctx, const backward_args<S>& a) {
  using namespace simt;
  using namespace backward_detail;
  using L = backward_pass_layout<S, Dim, KeyPass>;
  using li = lanes_t<Ctx, int>;
  using lu = lanes_t<Ctx, std::uint32_t>;
  using lf = lanes_t<Ctx, float>;
  using lb = lanes_t<Ctx, bool>;
  static_assert(Ctx::threads == L::threads, "launch the pass with backward_pass_layout<S, Dim, KeyPass>::threads threads");

  const tile_plan_view& plan = a.plan;
  const int tile = ctx.block_x(), head = ctx.block_y(), b = ctx.block_z();
  const int seq_owned = KeyPass ? plan.seq_k : plan.seq_q;
  const int first = tile * L::owned;
  const li tid = ctx.thread_index();
  const li lane = tid % warp_size, warp = tid / warp_size;
  const li g = lane / 4, t = lane % 4;
  const li row0 = (warp % L::row_blocks) * 16;
  const li split = warp / L::row_blocks;
  const li col0 = split * L::slice_cols;
  const li dcol0 = split * L::dim_cols;

  // The owned tile and its per-row facts, once. A thread's `unusual` flags say whether the
  // row or key it staged is anything but live and usable (owned: once; visited: per visit).
  lb owned_unusual(false);
  if constexpr (KeyPass) {
    const auto good = [&](const li& r) { return key_row_finite(ctx, a, b, head, first, r); };
    load_rows<S, Dim, L::owned, L::threads>(ctx, L::owned1, a.k, b, head, first, seq_owned, good);
    load_rows<S, Dim, L::owned, L::threads>(ctx, L::owned2, a.v, b, head, first, seq_owned, good);
    owned_unusual = stage_keys<S, L>(ctx, a, b, head, first, 0);
  } else {
    const auto good = [&](const li& r) { return query_row_live(ctx, a, b, head, first, r); };
    load_rows<S, Dim, L::owned, L::threads>(ctx, L::owned1, a.q, b, head, first, seq_owned, good);
    load_rows<S, Dim, L::owned, L::threads>(ctx, L::owned2, a.dout, b, head, first, seq_owned, good);
    owned_unusual = stage_queries<S, L>(ctx, a, b, head, first, 0);
  }
  ctx.commit_async();

  lf acc1[L::dim_tiles][4], acc2[L::dim_tiles][4];  // dK, dV (key pass) or dQ (query pass, acc1 only)
  BATON_UNROLL
  for (int n = 0; n < L::dim_tiles; ++n)
    BATON_UNROLL
    for (int i = 0; i < 4; ++i) acc1[n][i] = acc2[n][i] = 0.f;
  lb poisoned[2] = {lb(false), lb(false)};  // owned rows row0 + g and row0 + g + 8
  const float c = a.scale * log2e;

  // The visited tiles in order: the group's query heads ascending (key pass), each over the
  // owned tile's list of non-empty tiles ascending.
  const int list_begin = KeyPass ? plan.k_list_begin[tile] : plan.q_list_begin[tile];
  const int per_head = (KeyPass ? plan.k_list_begin[tile + 1] : plan.q_list_begin[tile + 1]) - list_begin;
  const int visits = (KeyPass ? a.group() : 1) * per_head;
  const auto query_head = [&](int it) { return KeyPass ? head * a.group() + it / per_head : head; };
  const auto other_tile = [&](int it) {
    return KeyPass ? plan.k_list[list_begin + it % per_head] : plan.q_list[list_begin + it % per_head];
  };
  // Issues the cp.async copies of visit `it`'s rows into stage st (one commit group) and
  // stores the rows' facts there (plain stores, read after the next barrier).
  const auto load_visit = [&](int it, int st) {
    const int vfirst = other_tile(it) * L::visited;
    lb unusual(false);
    if constexpr (KeyPass) {
      const int h = query_head(it);
      const auto good = [&](const li& r) { return query_row_live(ctx, a, b, h, vfirst, r); };
      load_rows<S, Dim, L::visited, L::threads>(ctx, L::visited1(st), a.q, b, h, vfirst, plan.seq_q, good);
      load_rows<S, Dim, L::visited, L::threads>(ctx, L::visited2(st), a.dout, b, h, vfirst, plan.seq_q,
                                                good);
      unusual = stage_queries<S, L>(ctx, a, b, h, vfirst, st);
    } else {
      const int hk = head / a.group();
      const auto good = [&](const li& r) { return key_row_finite(ctx, a, b, hk, vfirst, r); };
      load_rows<S, Dim, L::visited, L::threads>(ctx, L::visited1(st), a.k, b, hk, vfirst, plan.seq_k, good);
      load_rows<S, Dim, L::visited, L::threads>(ctx, L::visited2(st), a.v, b, hk, vfirst, plan.seq_k, good);
      unusual = stage_keys<S, L>(ctx, a, b, hk, vfirst, st);
    }
    ctx.commit_async();
    return unusual;
  };
  lb next_unusual(false);  // of the visit staged ahead (two stages)
  if (visits > 0) next_unusual = load_visit(0, 0);
  for (int it = 0; it < visits; ++it) {
    const int st = L::stages == 2 ? it % 2 : 0;
    const int other = other_tile(it);
    const int qt = KeyPass ? other : tile, kt = KeyPass ? tile : other;
    const block_kind kind = plan.kind_at(qt, kt);
    // The next visit's copies go to the other stage, which phase 2 of the previous visit read
    // before the barrier that ended it; with one stage this visit's copies go there now.
    lb unusual = next_unusual;  // this visit's staged rows or keys
    if (L::stages == 1) {
      if (it > 0) unusual = load_visit(it, 0);
      ctx.template wait_async<0>();
    } else if (it + 1 < visits) {
      next_unusual = load_visit(it + 1, (it + 1) % 2);
      ctx.template wait_async<1>();  // every group but that newest one has landed
    } else {
      ctx.template wait_async<0>();
    }
    // The barrier also ORs the flags: an ordinary tile (full, every query row live, every key
    // usable) takes the plain elementwise path below, with no per-element facts but lse and D
    // (about half the instructions of a visit). Not at 512 threads (16-bit D 256), where a
    // thread has 128 registers and the second path made ptxas spill.
    bool ordinary = false;
    if constexpr (L::plain_path)
      ordinary = !ctx.sync_or(unusual || owned_unusual) && kind != block_kind::partial;
    else
      ctx.sync_block();

    // Phase 1: S and dP for this warp's rows and column slice.
    lf s[L::slice_tiles][4], dp[L::slice_tiles][4];
    BATON_UNROLL
    for (int n = 0; n < L::slice_tiles; ++n)
      BATON_UNROLL
      for (int i = 0; i < 4; ++i) s[n][i] = dp[n][i] = 0.f;
    warp_product<S, Dim, L::slice_tiles, L::pitch_d, L::pitch_d, true>(ctx, s, L::owned1, L::visited1(st), row0, col0);
    warp_product<S, Dim, L::slice_tiles, L::pitch_d, L::pitch_d, true>(ctx, dp, L::owned2, L::visited2(st), row0, col0);

    // Elementwise: P and dS into shared memory, poisoned pairs into flags. A partial tile's
    // bits: one word per query row (tiles of at most 64 keys); the key pass, whose elements
    // each have their own query row, finds the tile's words once per visit (computing the
    // address per element spilled at head dim 256, where 512 threads leave 128 registers).
    static_assert(L::keys <= 64, "baton cuda backward: one mask word per query row of a tile");
    const std::uint64_t* tile_bits = nullptr;
    if (KeyPass && kind == block_kind::partial)
      tile_bits = plan.bits + std::int64_t{plan.partial_slot[qt * plan.k_tiles + kt]} * plan.tile_q;
    // pv, dsv: P and dS of the 4 elements of n8 tile n this thread holds.
    const auto store_pair = [&](int n, const lf (&pv)[4], const lf (&dsv)[4]) {
      BATON_UNROLL
      for (int half = 0; half < 2; ++half) {
        const li o = row0 + g + 8 * half;
        const li v = col0 + n * 8 + 2 * t;
        const lu at = (cast<std::uint32_t>(o) * L::pitch_v + cast<std::uint32_t>(v)) * L::element;
        if constexpr (L::tf32) {
          ctx.template shared_store<float>(at + L::p, pv[2 * half]);
          ctx.template shared_store<float>(at + L::p + 4u, pv[2 * half + 1]);
          ctx.template shared_store<float>(at + L::ds, dsv[2 * half]);
          ctx.template shared_store<float>(at + L::ds + 4u, dsv[2 * half + 1]);
        } else {
          ctx.template shared_store<std::uint32_t>(at + L::p, pack2<S>(pv[2 * half], pv[2 * half + 1]));
          ctx.template shared_store<std::uint32_t>(at + L::ds, pack2<S>(dsv[2 * half], dsv[2 * half + 1]));
        }
      }
    };
    if (L::plain_path && ordinary) {  // every pair allowed and live, none poisons
      // The query pass's two query rows are the thread's owned rows: their lse and D once.
      lf row_lse2[2], row_delta[2];
      if constexpr (!KeyPass) {
        BATON_UNROLL
        for (int half = 0; half < 2; ++half) {
          const auto q4 = cast<std::uint32_t>(row0 + g + 8 * half) * 4u;
          row_lse2[half] = ctx.template shared_load<float>(q4 + L::lse2(0));
          row_delta[half] = ctx.template shared_load<float>(q4 + L::delta(0));
        }
      }
      BATON_UNROLL
      for (int n = 0; n < L::slice_tiles; ++n) {
        lf pv[4], dsv[4];
        BATON_UNROLL
        for (int i = 0; i < 4; ++i) {
          lf lse2, delta;
          if constexpr (KeyPass) {
            const auto q4 = cast<std::uint32_t>(col0 + n * 8 + 2 * t + (i & 1)) * 4u;
            lse2 = ctx.template shared_load<float>(q4 + L::lse2(st));
            delta = ctx.template shared_load<float>(q4 + L::delta(st));
          } else {
            lse2 = row_lse2[i >> 1], delta = row_delta[i >> 1];
          }
          pv[i] = exp2(s[n][i] * c - lse2);
          dsv[i] = pv[i] * (dp[n][i] - delta);
        }
        store_pair(n, pv, dsv);
      }
    } else {
      BATON_UNROLL
      for (int n = 0; n < L::slice_tiles; ++n) {
        lf pv[4], dsv[4];
        BATON_UNROLL
        for (int i = 0; i < 4; ++i) {
          const li o = row0 + g + 8 * (i >> 1);         // owned row
          const li v = col0 + n * 8 + 2 * t + (i & 1);  // visited column
          const li qi = KeyPass ? v : o, kj = KeyPass ? o : v;  // query, key within their tiles
          const auto q4 = cast<std::uint32_t>(qi) * 4u;
          const int qst = KeyPass ? st : 0, kst = KeyPass ? 0 : st;  // visited facts by stage, owned in 0
          const lf lse2 = ctx.template shared_load<float>(q4 + L::lse2(qst));
          const lf delta = ctx.template shared_load<float>(q4 + L::delta(qst));
          const lu state = ctx.template shared_load<std::uint32_t>(q4 + L::state(qst));
          const lu code = ctx.template shared_load<std::uint32_t>(cast<std::uint32_t>(kj) * 4u + L::key_code(kst));
          lb allowed = code != 2u && (qi + qt * plan.tile_q < plan.seq_q);
          if (KeyPass && kind == block_kind::partial) {
            const auto word = ctx.template load<std::uint64_t>(map([=](int r) { return tile_bits + r; }, qi), allowed);
            allowed = allowed && ((word >> cast<std::uint64_t>(kj)) & std::uint64_t{1}) != std::uint64_t{0};
          } else if (kind == block_kind::partial) {
            const std::int64_t slot = plan.partial_slot[qt * plan.k_tiles + kt];
            const auto word = ctx.template load<std::uint64_t>(
                map([=](int r, int col) { return plan.bits + (slot * plan.tile_q + r) * plan.words_per_row + col / 64; }, qi,
                    kj),
                allowed);
            allowed = allowed && map([](std::uint64_t w, int col) { return ((w >> (col % 64)) & 1u) != 0; }, word, kj);
          }
          const lb live = allowed && state == std::uint32_t{row_live} && code == 0u;
          pv[i] = select(live, exp2(s[n][i] * c - lse2), lf(0.f));
          dsv[i] = select(live, pv[i] * (dp[n][i] - delta), lf(0.f));
          const lb poisons = allowed && state != std::uint32_t{row_without_gradient} &&
                             (state == std::uint32_t{row_poisoning} || code == 1u);
          poisoned[i >> 1] = poisoned[i >> 1] || poisons;
        }
        store_pair(n, pv, dsv);
      }
    }
    ctx.sync_block();

    // Phase 2: accumulate over the visited tile.
    constexpr int K = L::visited;
    warp_product<S, K, L::dim_tiles, L::pitch_v, L::pitch_d, false>(ctx, acc1, L::ds, L::visited1(st), row0, dcol0);  // dK += dS^T Q, dQ += dS K
    if constexpr (KeyPass)  // dV += P^T dO
      warp_product<S, K, L::dim_tiles, L::pitch_v, L::pitch_d, false>(ctx, acc2, L::p, L::visited2(st), row0, dcol0);
    ctx.sync_block();  // later copies and stores overwrite what phase 2 read
  }
  ctx.template wait_async<0>();  // the owned tile's copies, when no tile was visited

  // The thread's rows and columns for the epilogue. sm_80's compiler, at D 256 (512 threads,
  // 128 registers each), spilled one of them across the visit loop (4 B): there they are
  // computed anew from the thread index read through simt::opaque. sm_90's keeps them without
  // spilling, and recomputing them there made its key pass spill 8 B instead.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  const li tid_e = simt::opaque(ctx.thread_index());
  const li lane_e = tid_e % warp_size, warp_e = tid_e / warp_size;
  const li g_e = lane_e / 4, t_e = lane_e % 4;
  const li row0_e = (warp_e % L::row_blocks) * 16;
  const li split_e = warp_e / L::row_blocks;
  const li dcol0_e = split_e * L::dim_cols;
#else
  const li g_e = g, t_e = t, row0_e = row0, split_e = split, dcol0_e = dcol0;
#endif

  // Poisoned rows: OR over the 4 threads of a row group, then over the splits.
  BATON_UNROLL
  for (int half = 0; half < 2; ++half) {
    lu flag = cast<std::uint32_t>(poisoned[half]);
    flag = flag | ctx.shfl_xor(flag, 1);
    flag = flag | ctx.shfl_xor(flag, 2);
    const li o = row0_e + g_e + 8 * half;
    ctx.template shared_store<std::uint32_t>((cast<std::uint32_t>(o) * L::splits + cast<std::uint32_t>(split_e)) * 4u + L::poison,
                                             flag, t_e == 0);
  }
  ctx.sync_block();

  // Epilogue: each thread stores its accumulator elements (scaled, added when accumulating).
  BATON_UNROLL
  for (int half = 0; half < 2; ++half) {
    const li o = row0_e + g_e + 8 * half;
    lu flag = 0u;
    BATON_UNROLL
    for (int sp = 0; sp < L::splits; ++sp)
      flag = flag | ctx.template shared_load<std::uint32_t>((cast<std::uint32_t>(o) * L::splits + std::uint32_t(sp)) * 4u +
                                                             L::poison);
    const lb row_poisoned = flag != 0u;
    const lb in = (o + first) < seq_owned;
    const auto store = [&](const tensor_view<S, 4>& target, int hd, const lf (&acc)[L::dim_tiles][4], float factor) {
      BATON_UNROLL
      for (int n = 0; n < L::dim_tiles; ++n)
        BATON_UNROLL
        for (int i = 0; i < 2; ++i) {
          const li d = dcol0_e + n * 8 + 2 * t_e + i;
          const auto ptr = map(
              [=](int row, int col, bool on) { return target.data + (on ? row_at(target.layout, b, row + first, hd) + col : std::int64_t{0}); }, o,
              d, in);
          lf value = acc[n][2 * half + i] * factor;
          if (a.accumulate) {
            const auto old = ctx.template load<S>(map([](S* x) { return static_cast<const S*>(x); }, ptr), in);
            value = value + map([](S x) { return to_float(x); }, old);
          }
          value = select(row_poisoned, lf(std::numeric_limits<float>::quiet_NaN()), value);
          ctx.template store<S>(ptr, map([](float x) { return from_float<S>(x); }, value), in);
        }
    };
    if constexpr (KeyPass) {
      store(a.dk, head, acc1, a.scale);
      store(a.dv, head, acc2, 1.f);
    } else {
      store(a.dq, head, acc1, a.scale);
    }
  }
}

}  // namespace baton::detail::attention::cuda
