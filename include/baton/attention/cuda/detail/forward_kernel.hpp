// baton/attention/cuda/detail/forward_kernel.hpp — the bodies of the CUDA backend's forward
// kernels (the key-flag pass and the flash forward), written once over the SIMT layer
// (simt.hpp) and run on the GPU (forward.cuh) and on the CPU (emulate.hpp) from the same
// source. Their arguments are in forward_args.hpp.
//
// Algorithm (FlashAttention-2): a block of 4 warps owns tile_q query rows of one
// (batch, query head); each warp owns m_tiles x 16 of them. Q is copied to shared memory
// once; the non-empty key tiles of the plan (tile_plan_view::q_list) stream through two
// shared-memory stages with cp.async (tile n + 1 loads while tile n computes). Per tile:
//   S = Q K^T on tensor cores (bf16/f16 m16n8k16; float storage: m16n8k8 tf32 as 3xTF32),
//   masking by select (partial tiles: the plan's bits; the last tile: keys past seq_k),
//   an online softmax in the log2 domain (running max m and sum l per row, fp32, replicated
//   over the 4 lanes that hold a row), O = O * alpha + P V with P straight from the S
//   registers (the m16n8k16 C layout is the A layout of the next product).
// At the end out = O / l and lse = (m + log2 l) ln 2, fp32.
//
// Registers (ptxas -v for sm_90; docs/attention.md has the figures): a full tile inside
// seq_k without non-finite keys skips masking; the mask bits and the tile's bad-key word
// live only on the masking path, and a row's "met a non-finite key" is a bit of its shared
// row flag, read at the end, not a register. The scale is applied inside each exponent's
// FFMA, the copies' addresses are one base plus constants per round. The lane index is made
// opaque once per key tile (simt::opaque) so that the swizzled fragment addresses are
// computed inside the loop, not hoisted out of it into ~50 live registers. float at head dim
// 256 runs two blocks per query tile, each with half of O (forward_config::column_splits).
//
// Non-finite rule (docs/attention.md): keys with a non-finite k or v row are flagged by a
// pass over K and V before the forward (key_flag_body); a tile holding one zeroes those rows
// in shared memory, so no arithmetic meets them, and marks the rows that the mask lets see
// them. A query row with a non-finite q is zeroed in shared memory and flagged the same way.
// Marked rows get out = NaN, lse = NaN; a row with no allowed key keeps out 0, lse -inf.
// Masked scores are selected to -inf, never computed from a NaN.
//
// Layout of shared memory (forward_config, plan.hpp): Q [tile_q rows], then per stage
// K [tile_k rows] and V [tile_k rows], each row dim elements with its 16-byte chunks
// XOR-swizzled by row % 8 (ldmatrix and the fragment loads then hit 8 distinct bank groups),
// then one int32 flag per query row, one per key of a tile, and, where registers are short
// (forward_config::row_sums_shared), each lane's running row sums between key tiles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include <baton/attention/cuda/detail/forward_args.hpp>
#include <baton/attention/cuda/detail/mma.hpp>
#include <baton/attention/cuda/detail/simt.hpp>
#include <baton/attention/cuda/plan.hpp>
#include <baton/attention/cuda/storage.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/tensor_view.hpp>

namespace baton::detail::attention::cuda {

namespace kernel_detail {
/// Whether a 32-bit word of storage holds only finite values.
template <class S>
[[nodiscard]] BATON_HD inline bool word_finite(std::uint32_t w) noexcept {
  if constexpr (std::is_same_v<S, float>)
    return (w & 0x7f800000u) != 0x7f800000u;
  else if constexpr (std::is_same_v<S, bfloat16>)
    return (w & 0x7f80u) != 0x7f80u && (w & 0x7f800000u) != 0x7f800000u;
  else
    return (w & 0x7c00u) != 0x7c00u && (w & 0x7c000000u) != 0x7c000000u;
}
struct alignas(8) float_pair {
  float v[2];
};
struct alignas(16) chunk16 {
  std::uint32_t w[4];
};
}  // namespace kernel_detail

/// One thread per key: grid key_flag_launch(seq_k, heads_kv, batch), key_flag_threads threads.
template <class Ctx, class S>
BATON_HD inline void key_flag_body(Ctx& ctx, const key_flag_args<S>& a) {
  using kernel_detail::chunk16;
  using I = typename Ctx::template lanes_of<int>;
  using B = typename Ctx::template lanes_of<bool>;
  using P = typename Ctx::template lanes_of<const chunk16*>;
  const I j = ctx.thread_index() + ctx.block_x() * Ctx::threads;
  const int hk = ctx.block_y(), b = ctx.block_z();
  const B active = j < a.seq_k;
  const I row = simt::select(active, j, I(0));
  const int chunks = a.dim * static_cast<int>(sizeof(S)) / 16;
  P kp, vp;
  for (int t = 0; t < Ctx::width; ++t) {
    kp[t] = reinterpret_cast<const chunk16*>(&a.k(b, row[t], hk, 0));
    vp[t] = reinterpret_cast<const chunk16*>(&a.v(b, row[t], hk, 0));
  }
  B finite(true);
  for (int c = 0; c < chunks; ++c) {
    const auto kc = ctx.load(kp + c, active);
    const auto vc = ctx.load(vp + c, active);
    finite = finite && simt::map(
                           [](const chunk16& x, const chunk16& y) {
                             bool ok = true;
                             for (int w = 0; w < 4; ++w)
                               ok = ok && kernel_detail::word_finite<S>(x.w[w]) && kernel_detail::word_finite<S>(y.w[w]);
                             return ok;
                           },
                           kc, vc);
  }
  using U8P = typename Ctx::template lanes_of<std::uint8_t*>;
  U8P dst;
  for (int t = 0; t < Ctx::width; ++t)
    dst[t] = a.key_bad + (static_cast<std::int64_t>(b) * a.heads_kv + hk) * a.seq_k + row[t];
  ctx.store(dst, simt::cast<std::uint8_t>(!finite), active);
}

/// The forward kernel body for storage S, head dim D, m_tiles MT (16-row tiles per warp),
/// key tile TK. Grid forward_launch(...): blockIdx.x -> query tile (descending), y -> query
/// head, z -> batch entry; 128 threads; config.shared_bytes() of dynamic shared memory.
template <class Ctx, class S, int D, int MT, int TK>
struct forward_body {
  static constexpr int threads = 128, warps = 4;
  static constexpr int TQ = warps * MT * 16;
  static constexpr int ES = static_cast<int>(sizeof(S));
  static constexpr int RB = D * ES;      // bytes per shared row
  static constexpr int CPR = RB / 16;    // 16-byte chunks per row
  static constexpr bool half = ES == 2;  // 16-bit tensor cores; else 3xTF32
  static_assert(cuda_storage<S>, "baton cuda forward: the storage type must be float, baton::bfloat16 or baton::float16");
  static_assert(D == 64 || D == 128 || D == 256, "baton cuda forward: head dims 64, 128 and 256");
  static_assert(MT == 1 || MT == 2, "baton cuda forward: 1 or 2 MMA row tiles (16 rows each) per warp");
  static_assert(Ctx::threads == threads, "baton cuda forward: the kernel runs 128 threads per block");
  static_assert(CPR % 8 == 0, "baton cuda forward: rows must be whole 128-byte lines for the swizzle");
  static_assert(TK % 16 == 0 && TK <= 64, "baton cuda forward: key tiles of 16..64 keys (one bit word per row)");
  static_assert((TQ * CPR) % threads == 0 && (TK * CPR) % threads == 0, "baton cuda forward: tiles copy in whole rounds");

  /// The tiling (and shared-memory layout) of this instantiation.
  static constexpr forward_config config = make_forward_config(ES, D, MT, TK);
  /// O's columns per block (config.column_splits blocks share a query tile).
  static constexpr int DO = D / config.column_splits;

  template <class T>
  using L = typename Ctx::template lanes_of<T>;
  using I = L<int>;
  using U = L<std::uint32_t>;
  using F = L<float>;
  using B = L<bool>;

  /// Byte offset of element col of row in a swizzled region starting at base.
  BATON_HD static U element_offset(std::uint32_t base, const I& row, const I& col) noexcept {
    const I chunk = (col * ES) / 16;
    return simt::cast<std::uint32_t>(row * RB + ((chunk ^ (row & 7)) * 16) + (col * ES) % 16) + base;
  }
  BATON_HD static U chunk_offset(std::uint32_t base, const I& row, const I& chunk) noexcept {
    return simt::cast<std::uint32_t>(row * RB + ((chunk ^ (row & 7)) * 16)) + base;
  }

  /// The offset of chunk c + e of row r, from x = chunk_offset(base, r, c) with c < 2, e even
  /// and base a multiple of RB (every region of the layout is): the swizzle XORs the chunk
  /// index with r % 8, and c + e = c ^ e, so the chunk e further is x ^ 16 e (RB being a power
  /// of two above 16 e, the XOR stays inside the row). One LOP3 per fragment address, from
  /// one register per stream, instead of the swizzle recomputed or a register per chunk.
  BATON_HD static U chunk_step(const U& x, int e) noexcept { return x ^ U(static_cast<std::uint32_t>(16 * e)); }

  /// Issues the copy of rows [row0, row0 + R) of an operand (rows past `valid` zero-filled).
  template <int R>
  BATON_HD static void copy_tile(Ctx& ctx, std::uint32_t base, const tensor_view<const S, 4>& x, int b, int h, int row0,
                                 int valid) {
    // Thread t copies chunk t % CPR of rows t / CPR + r0, r0 stepping by threads / CPR: its
    // chunk is the same in every round and its rows step by a constant, so every round's
    // addresses are the first round's plus a constant (spelled as c / CPR of c = t + c0, the
    // compiler kept one register per round alive across the key loop, and spilled them).
    static_assert(threads % CPR == 0, "baton cuda forward: a round of copies covers whole rows");
    constexpr int rows_per_round = threads / CPR;
    // Where registers are short (config.row_sums_shared()), the thread index is read anew at
    // each copy, so that its offsets are recomputed here (a few integer instructions) and
    // not kept in registers across the key loop; elsewhere keeping them is cheaper.
    const I t = config.row_sums_shared() ? simt::opaque(ctx.thread_index()) : ctx.thread_index();
    const I row_t = t / CPR, chunk = t % CPR;
    const std::int64_t row_stride = x.stride(1);
    const S* const tile = &x(b, row0, h, 0);
    L<std::int64_t> first;  // element offset of this thread's first chunk from the tile's row 0
    for (int i = 0; i < Ctx::width; ++i) first[i] = row_t[i] * row_stride + chunk[i] * (16 / ES);
    const U dst_first = chunk_offset(base, row_t, chunk);
    BATON_UNROLL
    for (int r0 = 0; r0 < R; r0 += rows_per_round) {
      const I row = row_t + r0;
      const B ok = row < valid;
      L<const void*> src;
      for (int i = 0; i < Ctx::width; ++i)
        src[i] = ok[i] ? static_cast<const void*>(tile + first[i] + r0 * row_stride) : static_cast<const void*>(x.data);
      // Rows 8 apart share their swizzle (row % 8).
      if constexpr (rows_per_round % 8 == 0)
        ctx.copy16_async(dst_first + static_cast<std::uint32_t>(r0 * RB), src, ok);
      else
        ctx.copy16_async(chunk_offset(base, row, chunk), src, ok);
    }
  }

  /// Copies rows [0, valid) of the query tile at `base` (rows of D 16-bit elements, swizzled
  /// as copy_tile lays them) to rows row0.. of out: a thread moves the same 16-byte chunk of
  /// rows a round apart, so consecutive threads write consecutive chunks of a row (16-byte
  /// stores, whole rows per group of CPR threads) where each thread's own accumulators would
  /// have been 4-byte stores scattered over 8 rows.
  BATON_HD static void store_tile(Ctx& ctx, std::uint32_t base, const tensor_view<S, 4>& out, int b, int h, int row0,
                                  int valid) {
    constexpr int rows_per_round = threads / CPR;
    const I t = ctx.thread_index();
    const I row_t = t / CPR, chunk = t % CPR;
    BATON_UNROLL
    for (int r0 = 0; r0 < TQ; r0 += rows_per_round) {
      const I row = row_t + r0;
      const B ok = row < valid;
      const L<kernel_detail::chunk16> value = ctx.template shared_load<kernel_detail::chunk16>(chunk_offset(base, row, chunk));
      L<kernel_detail::chunk16*> dst;
      for (int i = 0; i < Ctx::width; ++i)
        dst[i] = reinterpret_cast<kernel_detail::chunk16*>(&out(b, row0 + (ok[i] ? row[i] : 0), h, 0) + chunk[i] * (16 / ES));
      ctx.store(dst, value, ok);
    }
  }

  /// Zeroes the rows of a shared region whose flag is set (thread r handles row r).
  BATON_HD static void zero_rows(Ctx& ctx, std::uint32_t base, const B& flagged, const I& row) {
    const B on = flagged;
    for (int w = 0; w < RB / 4; ++w)
      ctx.template shared_store<std::uint32_t>(simt::cast<std::uint32_t>(row * RB + w * 4) + base, U(0u), on);
  }

  /// acc[m][2 n] and acc[m][2 n + 1] += a[m] times the two n8 halves of b (an ldmatrix_x4
  /// fragment), for each of the warp's row tiles m: one k16 step of a 16-bit product.
  template <int N>
  BATON_HD static void mma_pair(F (&acc)[MT][N][4], int n, const U (&a)[MT][4], const U (&b)[4]) {
    const U b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
    BATON_UNROLL
    for (int m = 0; m < MT; ++m) {
      mma_m16n8k16<S>(acc[m][2 * n], a[m], b0);
      mma_m16n8k16<S>(acc[m][2 * n + 1], a[m], b1);
    }
  }

  /// Masks the scores s of a tile that needs it (selects -inf where a key is not allowed):
  /// a partial tile (its plan bits), the tile that ends at seq_k (only its first `valid`
  /// keys), or one with non-finite keys (bad_keys: a row that allows one gets 2 in its shared
  /// row flag, written by the first of the 4 lanes that hold the row, which agree, and read
  /// by all 4 after the barrier that ends the key loop). Every other tile skips this, and
  /// keeps those registers free.
  template <int N>
  BATON_HD static void mask(Ctx& ctx, const forward_args<S>& a, F (&s)[MT][N][4], std::uint32_t flags_base,
                            const I& wrow, int qt, int kt, bool partial, int valid, const L<std::uint64_t>& bad_keys) {
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    const I g = ctx.lane() >> 2, tg = ctx.lane() & 3;
    BATON_UNROLL
    for (int m = 0; m < MT; ++m)
      BATON_UNROLL
      for (int hh = 0; hh < 2; ++hh) {
        L<std::uint64_t> word(valid < 64 ? (std::uint64_t{1} << valid) - 1 : ~std::uint64_t{0});
        const I r = wrow + 16 * m + g + 8 * hh;
        if (partial) {
          L<const std::uint64_t*> wp;
          for (int i = 0; i < Ctx::width; ++i) wp[i] = a.plan.bit_row(qt, kt, r[i]);
          word = word & ctx.load(wp, B(true));
        }
        ctx.template shared_store<std::int32_t>(simt::cast<std::uint32_t>(r * 4) + flags_base, I(2),
                                                tg == 0 && (word & bad_keys) != std::uint64_t{0});
        word = word >> simt::cast<std::uint64_t>(tg * 2);  // bit 8 j + e: this lane's column
        BATON_UNROLL
        for (int j = 0; j < N; ++j)
          BATON_UNROLL
          for (int e = 0; e < 2; ++e) {
            F& x = s[m][j][2 * hh + e];
            const B allowed = (word & (std::uint64_t{1} << (8 * j + e))) != std::uint64_t{0};
            x = simt::select(allowed, x, F(neg_inf));
          }
      }
  }

  BATON_HD static void run(Ctx& ctx, const forward_args<S>& a) {
    constexpr float neg_inf = -std::numeric_limits<float>::infinity();
    constexpr forward_config cfg = config;
    const tile_plan_view& plan = a.plan;
    const int qt = plan.q_tiles - 1 - ctx.block_x() / cfg.column_splits;
    const int col0 = ctx.block_x() % cfg.column_splits * DO;  // this block's first column of O
    const int h = ctx.block_y(), b = ctx.block_z();
    const int hk = h / (a.heads_q / a.heads_kv);
    const int q0 = qt * TQ;
    const int q_valid = plan.seq_q - q0 < TQ ? plan.seq_q - q0 : TQ;
    const std::int32_t* list = plan.q_list + plan.q_list_begin[qt];
    const int count = plan.q_list_begin[qt + 1] - plan.q_list_begin[qt];
    const std::uint8_t* key_bad = a.key_bad + (static_cast<std::int64_t>(b) * a.heads_kv + hk) * plan.seq_k;

    const I t = ctx.thread_index();
    const I lane = ctx.lane(), warp = ctx.warp();
    const std::uint32_t q_base = static_cast<std::uint32_t>(cfg.q_offset());
    const std::uint32_t flags_base = static_cast<std::uint32_t>(cfg.row_flags_offset());
    const std::uint32_t key_flags_base = static_cast<std::uint32_t>(cfg.key_flags_offset());
    constexpr bool sums_shared = cfg.row_sums_shared();

    // Q and the first key tile.
    copy_tile<TQ>(ctx, q_base, a.q, b, h, q0, q_valid);
    if (count > 0) {
      const int k0 = list[0] * TK;
      copy_tile<TK>(ctx, static_cast<std::uint32_t>(cfg.k_offset(0)), a.k, b, hk, k0, plan.seq_k - k0);
      copy_tile<TK>(ctx, static_cast<std::uint32_t>(cfg.v_offset(0)), a.v, b, hk, k0, plan.seq_k - k0);
    }
    ctx.commit_async();
    ctx.template wait_async<0>();
    ctx.sync_block();

    // Non-finite query rows: thread r checks row r, zeroes it and flags it.
    static_assert(TQ <= threads, "baton cuda forward: one thread per query row checks it");
    {
      const B in_tile = t < TQ;
      const I r = simt::select(in_tile, t, I(0));
      B finite(true);
      for (int w = 0; w < RB / 4; ++w) {
        const U word = ctx.template shared_load<std::uint32_t>(simt::cast<std::uint32_t>(r * RB + w * 4) + q_base);
        finite = finite && simt::map([](std::uint32_t x) { return kernel_detail::word_finite<S>(x); }, word);
      }
      const B bad = !finite && in_tile && r < q_valid;
      // The threads beyond the tile's rows read row 0 above (their stand-in): every read is
      // done before a bad row is zeroed, or thread 0 would race them.
      ctx.sync_block();
      zero_rows(ctx, q_base, bad, r);
      ctx.template shared_store<std::int32_t>(simt::cast<std::uint32_t>(r * 4) + flags_base, simt::cast<std::int32_t>(bad),
                                              in_tile);
      ctx.sync_block();
    }

    // Per thread: rows wrow + 16 m + g + 8 hh of the tile (m < MT, hh < 2).
    const I wrow = warp * (16 * MT);
    F o[MT][DO / 8][4];
    F m_run[MT][2], l_run[MT][2];  // l_run unused where the sums are in shared memory
    // This thread's slot of row wrow + 16 m + g + 8 hh (index 4 row + tg, and 4 g + tg is the
    // lane): sums_slot(lane) + 256 m + 128 hh.
    const auto sums_slot = [&](const I& lane_i) {
      return simt::cast<std::uint32_t>((wrow * 4 + lane_i) * 4) + static_cast<std::uint32_t>(cfg.row_sums_offset());
    };
    BATON_UNROLL
    for (int m = 0; m < MT; ++m) {
      BATON_UNROLL
      for (int n = 0; n < DO / 8; ++n)
        BATON_UNROLL
        for (int i = 0; i < 4; ++i) o[m][n][i] = F(0.0f);
      BATON_UNROLL
      for (int hh = 0; hh < 2; ++hh) {
        m_run[m][hh] = F(neg_inf);
        l_run[m][hh] = F(0.0f);
        if constexpr (sums_shared)  // thread-private words: no barrier
          ctx.template shared_store<float>(sums_slot(lane) + static_cast<std::uint32_t>(256 * m + 128 * hh), F(0.0f), B(true));
      }
    }

    for (int n = 0; n < count; ++n) {
      const int stage = n & 1;
      const I lane_n = simt::opaque(lane);
      const I g_n = lane_n >> 2, tg_n = lane_n & 3;
      const int kt = list[n];
      const int k0 = kt * TK;
      const std::uint32_t k_base = static_cast<std::uint32_t>(cfg.k_offset(stage));
      const std::uint32_t v_base = static_cast<std::uint32_t>(cfg.v_offset(stage));
      // Tile n has landed for every thread, and every thread is done with tile n - 1: its
      // stage may be refilled. The barrier also ORs the tile's key flags.
      ctx.template wait_async<0>();
      const B my_key = t < TK && (t + k0) < plan.seq_k;
      L<const std::uint8_t*> flag_ptr;
      for (int i = 0; i < Ctx::width; ++i) flag_ptr[i] = key_bad + (my_key[i] ? k0 + t[i] : 0);
      const B my_key_bad = ctx.load(flag_ptr, my_key) != std::uint8_t{0};
      const bool tile_bad = ctx.sync_or(my_key_bad);
      if (n + 1 < count) {
        const int k1 = list[n + 1] * TK;
        copy_tile<TK>(ctx, static_cast<std::uint32_t>(cfg.k_offset(stage ^ 1)), a.k, b, hk, k1, plan.seq_k - k1);
        copy_tile<TK>(ctx, static_cast<std::uint32_t>(cfg.v_offset(stage ^ 1)), a.v, b, hk, k1, plan.seq_k - k1);
      }
      ctx.commit_async();
      L<std::uint64_t> bad_keys(std::uint64_t{0});  // bit c: key k0 + c is non-finite
      if (tile_bad) {  // rare: keys with a non-finite k or v never enter the arithmetic
        zero_rows(ctx, k_base, my_key_bad, t);
        zero_rows(ctx, v_base, my_key_bad, t);
        ctx.template shared_store<std::int32_t>(simt::cast<std::uint32_t>(t * 4) + key_flags_base,
                                                simt::cast<std::int32_t>(my_key_bad), t < TK);
        ctx.sync_block();
        for (int c = 0; c < TK; ++c) {
          const I f = ctx.template shared_load<std::int32_t>(key_flags_base + static_cast<std::uint32_t>(4 * c));
          bad_keys = bad_keys | (simt::cast<std::uint64_t>(f != 0) << std::uint64_t(c));
        }
      }

      // S = Q K^T.
      F s[MT][TK / 8][4];
      BATON_UNROLL
      for (int m = 0; m < MT; ++m)
        BATON_UNROLL
        for (int j = 0; j < TK / 8; ++j)
          BATON_UNROLL
          for (int i = 0; i < 4; ++i) s[m][j][i] = F(0.0f);
      if constexpr (half) {
        static_assert((RB & (RB - 1)) == 0 && 2 * (D / 16) * 16 <= RB, "baton cuda forward: chunk_step needs power-of-two rows");
        const U q_frag = chunk_offset(q_base, wrow + (lane_n & 7) + 8 * ((lane_n >> 3) & 1), lane_n >> 4);
        const U k_frag = chunk_offset(k_base, (lane_n & 7) + 8 * (lane_n >> 4), (lane_n >> 3) & 1);
        BATON_UNROLL
        for (int kk = 0; kk < D / 16; ++kk) {
          U qa[MT][4];
          BATON_UNROLL
          for (int m = 0; m < MT; ++m)
            ctx.ldmatrix_x4(qa[m], chunk_step(q_frag, 2 * kk) + static_cast<std::uint32_t>(16 * m * RB), false);
          BATON_UNROLL
          for (int j = 0; j < TK / 16; ++j) {
            U kb[4];
            ctx.ldmatrix_x4(kb, chunk_step(k_frag, 2 * kk) + static_cast<std::uint32_t>(16 * j * RB), false);
            mma_pair(s, j, qa, kb);
          }
        }
      } else {
        BATON_UNROLL
        for (int kk = 0; kk < D / 8; ++kk) {
          U qb[MT][4], qs[MT][4];
          BATON_UNROLL
          for (int m = 0; m < MT; ++m)
            BATON_UNROLL
            for (int r = 0; r < 4; ++r) {
              const F x = ctx.template shared_load<float>(
                  element_offset(q_base, wrow + 16 * m + g_n + 8 * (r & 1), tg_n + 4 * (r >> 1) + 8 * kk));
              split_tf32(x, qb[m][r], qs[m][r]);
            }
          BATON_UNROLL
          for (int j = 0; j < TK / 8; ++j) {
            U kb[2], ks[2];
            BATON_UNROLL
            for (int r = 0; r < 2; ++r) {
              const F x = ctx.template shared_load<float>(element_offset(k_base, g_n + 8 * j, tg_n + 4 * r + 8 * kk));
              split_tf32(x, kb[r], ks[r]);
            }
            BATON_UNROLL
            for (int m = 0; m < MT; ++m) mma_3xtf32(s[m][j], qb[m], qs[m], kb, ks);
          }
        }
      }

      // Mask (select, never arithmetic on a masked score). Most tiles are full, inside seq_k
      // and free of non-finite keys: they skip it.
      const block_kind kind = plan.kind_at(qt, kt);
      const bool edge = k0 + TK > plan.seq_k;
      if (kind == block_kind::partial || edge || tile_bad)
        mask(ctx, a, s, flags_base, wrow, qt, kt, kind == block_kind::partial, edge ? plan.seq_k - k0 : TK, bad_keys);

      // Online softmax in log2 units (scale_log2 = scale log2 e > 0): rows are held by the 4
      // lanes of a group (xor 1, 2). The running max m is of the scaled scores; the raw max
      // times the scale is the max of the scaled ones (rounding is monotonic and the scale
      // positive), so each score is scaled inside its exponent's FFMA. O is rescaled
      // only when some row of the warp raised its maximum: alpha is then exactly 1 on every
      // other row, and x * 1 == x for every float (NaN and infinities too), so skipping the
      // multiply is exact. Past the first tiles a row's maximum rarely rises (about ln n
      // times over n keys), so most tiles skip DO/4 multiplies per thread and row pair.
      // P goes into the A layout of the next product as soon as a row tile's exponents are
      // done: the 16-bit pairs take half the registers of its scores, which are dead from
      // there on (FlashAttention-2 converts P the same way).
      F alpha[MT][2];
      U pa[half ? MT : 1][half ? TK / 16 : 1][4];
      BATON_UNROLL
      for (int m = 0; m < MT; ++m) {
        BATON_UNROLL
        for (int hh = 0; hh < 2; ++hh) {
          F mx = s[m][0][2 * hh];
          BATON_UNROLL
          for (int j = 0; j < TK / 8; ++j) mx = simt::max(mx, simt::max(s[m][j][2 * hh], s[m][j][2 * hh + 1]));
          mx = simt::max(mx, ctx.shfl_xor(mx, 1));
          mx = simt::max(mx, ctx.shfl_xor(mx, 2));
          const F m_new = simt::max(m_run[m][hh], mx * a.scale_log2);
          const F m_use = simt::select(m_new == neg_inf, F(0.0f), m_new);  // no -inf - -inf
          alpha[m][hh] = simt::exp2(m_run[m][hh] - m_use);
          F sum(0.0f);
          BATON_UNROLL
          for (int j = 0; j < TK / 8; ++j)
            BATON_UNROLL
            for (int e = 0; e < 2; ++e) {
              F& x = s[m][j][2 * hh + e];
              x = simt::exp2(simt::fma(x, F(a.scale_log2), -m_use));
              sum = sum + x;
            }
          if constexpr (sums_shared) {
            const U slot = sums_slot(lane_n) + static_cast<std::uint32_t>(256 * m + 128 * hh);
            ctx.template shared_store<float>(slot, ctx.template shared_load<float>(slot) * alpha[m][hh] + sum, B(true));
          } else {
            l_run[m][hh] = l_run[m][hh] * alpha[m][hh] + sum;
          }
          m_run[m][hh] = m_new;
        }
        if constexpr (half) {
          BATON_UNROLL
          for (int kb = 0; kb < TK / 16; ++kb) {
            pa[m][kb][0] = pack2<S>(s[m][2 * kb][0], s[m][2 * kb][1]);
            pa[m][kb][1] = pack2<S>(s[m][2 * kb][2], s[m][2 * kb][3]);
            pa[m][kb][2] = pack2<S>(s[m][2 * kb + 1][0], s[m][2 * kb + 1][1]);
            pa[m][kb][3] = pack2<S>(s[m][2 * kb + 1][2], s[m][2 * kb + 1][3]);
          }
        }
      }
      auto rescale = alpha[0][0] != 1.0f;
      BATON_UNROLL
      for (int m = 0; m < MT; ++m) rescale = rescale || alpha[m][0] != 1.0f || alpha[m][1] != 1.0f;
      if (ctx.warp_any(rescale)) {
        BATON_UNROLL
        for (int m = 0; m < MT; ++m)
          BATON_UNROLL
          for (int d = 0; d < DO / 8; ++d)
            BATON_UNROLL
            for (int e = 0; e < 4; ++e) o[m][d][e] = o[m][d][e] * alpha[m][e >> 1];
      }

      // O += P V.
      if constexpr (half) {
        static_assert(DO == D, "baton cuda forward: 16-bit storage runs one block per query tile");
        const I lane_v = simt::opaque(lane);
        const U v_frag = chunk_offset(v_base, (lane_v & 7) + 8 * ((lane_v >> 3) & 1), lane_v >> 4);
        BATON_UNROLL
        for (int kb = 0; kb < TK / 16; ++kb) {
          U pk[MT][4];
          BATON_UNROLL
          for (int m = 0; m < MT; ++m)
            BATON_UNROLL
            for (int r = 0; r < 4; ++r) pk[m][r] = pa[m][kb][r];
          BATON_UNROLL
          for (int dn = 0; dn < DO / 16; ++dn) {
            U vb[4];
            ctx.ldmatrix_x4(vb, chunk_step(v_frag, 2 * dn) + static_cast<std::uint32_t>(16 * kb * RB), true);
            mma_pair(o, dn, pk, vb);
          }
        }
      } else {
        // tf32 A wants (g, t) and (g, t + 4) where the S registers hold keys 2t and 2t + 1:
        // contract over the keys in the order (2t -> t, 2t + 1 -> t + 4) and read V's rows in
        // that same order. No shuffles.
        BATON_UNROLL
        for (int j = 0; j < TK / 8; ++j) {
          U pb[MT][4], ps[MT][4];
          BATON_UNROLL
          for (int m = 0; m < MT; ++m) {
            split_tf32(s[m][j][0], pb[m][0], ps[m][0]);
            split_tf32(s[m][j][2], pb[m][1], ps[m][1]);
            split_tf32(s[m][j][1], pb[m][2], ps[m][2]);
            split_tf32(s[m][j][3], pb[m][3], ps[m][3]);
          }
          BATON_UNROLL
          for (int dn = 0; dn < DO / 8; ++dn) {
            U vb[2], vs[2];
            BATON_UNROLL
            for (int r = 0; r < 2; ++r) {
              const F x = ctx.template shared_load<float>(element_offset(v_base, 8 * j + 2 * tg_n + r, g_n + 8 * dn + col0));
              split_tf32(x, vb[r], vs[r]);
            }
            BATON_UNROLL
            for (int m = 0; m < MT; ++m) mma_3xtf32(o[m][dn], pb[m], ps[m], vb, vs);
          }
        }
      }
    }

    ctx.sync_block();  // the row flags written while masking are read by every lane of their row
    // The lane's rows from the lane and warp read anew (opaque), not registers kept across
    // the key loop for this (the compiler had spilled two of them).
    const I lane_e = simt::opaque(lane), warp_e = simt::opaque(warp);
    const I g_e = lane_e >> 2, tg_e = lane_e & 3, wrow_e = warp_e * (16 * MT);
    // out = O / l, lse = (m + log2 l) ln 2; no allowed key: 0 and -inf; a poisoned row: NaN.
    // 16-bit storage: each thread's pairs go to the Q tile's shared rows (free now: the
    // barrier above follows every warp's last read of Q), then out by store_tile.
    constexpr float ln2 = 0.693147180559945309f;
    const float nan = std::numeric_limits<float>::quiet_NaN();
    BATON_UNROLL
    for (int m = 0; m < MT; ++m)
      BATON_UNROLL
      for (int hh = 0; hh < 2; ++hh) {
        F l = l_run[m][hh];
        if constexpr (sums_shared)
          l = ctx.template shared_load<float>(sums_slot(lane_e) + static_cast<std::uint32_t>(256 * m + 128 * hh));
        l = l + ctx.shfl_xor(l, 1);
        l = l + ctx.shfl_xor(l, 2);
        // A row with an allowed key has a finite running max (its scores are finite: bad rows
        // and keys were zeroed); a non-finite query row poisons a row that has one.
        const I r = wrow_e + 16 * m + g_e + 8 * hh;
        // Its flag: 1 for a non-finite query row, 2 once it allowed a non-finite key.
        const B row_bad = ctx.template shared_load<std::int32_t>(simt::cast<std::uint32_t>(r * 4) + flags_base) != 0;
        const B none = m_run[m][hh] == neg_inf;
        const B poisoned = row_bad && !none;
        const F inv = simt::select(none, F(0.0f), F(1.0f) / simt::select(none, F(1.0f), l));
        const F lse = simt::select(none, F(neg_inf),
                                   simt::select(poisoned, F(nan),
                                                (m_run[m][hh] + simt::map([](float x) { return simt::log2_fast(x); },
                                                                          simt::select(none, F(1.0f), l))) *
                                                    ln2));
        const B live = (r + q0) < plan.seq_q;
        L<float*> lse_ptr;
        for (int i = 0; i < Ctx::width; ++i) lse_ptr[i] = &a.lse(b, h, live[i] ? q0 + r[i] : 0);
        ctx.store(lse_ptr, lse, live && tg_e == 0 && col0 == 0);
        BATON_UNROLL
        for (int d = 0; d < DO / 8; ++d) {
          const F x0 = simt::select(poisoned, F(nan), o[m][d][2 * hh] * inv);
          const F x1 = simt::select(poisoned, F(nan), o[m][d][2 * hh + 1] * inv);
          const I col = tg_e * 2 + 8 * d + col0;
          if constexpr (half) {
            ctx.template shared_store<std::uint32_t>(element_offset(q_base, r, col), pack2<S>(x0, x1));
          } else {  // one 8-byte store of the two columns
            L<kernel_detail::float_pair*> p;
            for (int i = 0; i < Ctx::width; ++i)
              p[i] = reinterpret_cast<kernel_detail::float_pair*>(&a.out(b, live[i] ? q0 + r[i] : 0, h, 0) + col[i]);
            L<kernel_detail::float_pair> x;
            for (int i = 0; i < Ctx::width; ++i) x[i] = {{x0[i], x1[i]}};
            ctx.store(p, x, live);
          }
        }
      }
    if constexpr (half) {
      ctx.sync_block();  // every row of the tile is in shared memory
      store_tile(ctx, q_base, a.out, b, h, q0, q_valid);
    }
  }
};

}  // namespace baton::detail::attention::cuda
