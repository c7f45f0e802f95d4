// baton/attention/cuda/detail/mma.hpp — warp-level tensor-core products: fragment layouts
// and their exact host emulation.
//
// The kernels use three PTX instructions (PTX ISA, "Warp-level matrix fragments"):
//   mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32   (bfloat16 storage)
//   mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32     (float16 storage)
//   mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32    (float storage, used as 3xTF32)
// Each lane of a warp holds some elements of A, B and C/D; which ones is written below as
// functions (lane, register) -> (row, col), taken from the ISA's figures. The device side
// (mma.cuh) issues the instruction; the host side here rebuilds A, B and C of every warp
// from its lanes with those same functions, multiplies in fp32 and scatters D back. A layout
// error therefore shows up in the CPU tests, which compare kernels against the reference.
//
// Free functions are overloaded on the lane count: lanes<T, N> with N > 1 is the host
// emulation (here), N == 1 the device (mma.cuh); a kernel body calls them unqualified.
#pragma once

#include <cstdint>
#include <type_traits>

#include <baton/attention/cuda/detail/simt.hpp>
#include <baton/attention/cuda/storage.hpp>

namespace baton::detail::attention::cuda {

/// Where a fragment element sits in its matrix.
struct element_at {
  int row = 0, col = 0;
  friend constexpr bool operator==(const element_at&, const element_at&) = default;
};

namespace frag {
// lane = 4 * group + thread_in_group (the ISA's groupID and threadID_in_group).
[[nodiscard]] BATON_HD constexpr int group_of(int lane) noexcept { return lane >> 2; }
[[nodiscard]] BATON_HD constexpr int thread_in_group(int lane) noexcept { return lane & 3; }

/// m16n8k16 16-bit A (16 x 16, row-major): register r (0..3), half h (0 low, 1 high).
[[nodiscard]] BATON_HD constexpr element_at a16(int lane, int r, int h) noexcept {
  return {group_of(lane) + 8 * (r & 1), 2 * thread_in_group(lane) + h + 8 * (r >> 1)};
}
/// m16n8k16 16-bit B (16 x 8, k x n, "col"): register r (0..1), half h. row = k, col = n.
[[nodiscard]] BATON_HD constexpr element_at b16(int lane, int r, int h) noexcept {
  return {2 * thread_in_group(lane) + h + 8 * r, group_of(lane)};
}
/// C and D (16 x 8, fp32) of both shapes: element i (0..3).
[[nodiscard]] BATON_HD constexpr element_at c(int lane, int i) noexcept {
  return {group_of(lane) + 8 * (i >> 1), 2 * thread_in_group(lane) + (i & 1)};
}
/// m16n8k8 tf32 A (16 x 8): register r (0..3).
[[nodiscard]] BATON_HD constexpr element_at a_tf32(int lane, int r) noexcept {
  return {group_of(lane) + 8 * (r & 1), thread_in_group(lane) + 4 * (r >> 1)};
}
/// m16n8k8 tf32 B (8 x 8, k x n): register r (0..1).
[[nodiscard]] BATON_HD constexpr element_at b_tf32(int lane, int r) noexcept {
  return {thread_in_group(lane) + 4 * r, group_of(lane)};
}
}  // namespace frag

/// The 16-bit element type of a storage type (how the host reads a fragment's halves).
template <class S>
[[nodiscard]] BATON_HD inline float half_to_float(std::uint16_t bits) noexcept {
  if constexpr (std::is_same_v<S, bfloat16>)
    return bf16_bits_to_float(bits);
  else
    return f16_bits_to_float(bits);
}
template <class S>
[[nodiscard]] BATON_HD inline std::uint16_t float_to_half(float f) noexcept {
  if constexpr (std::is_same_v<S, bfloat16>)
    return float_to_bf16_bits(f);
  else
    return float_to_f16_bits(f);
}

/// Rounds a float to tf32 (10 mantissa bits) as cvt.rna.tf32.f32 does: to nearest, ties away
/// from zero; the result is a float whose low 13 bits are 0. Finite inputs only (the kernels
/// never hand a non-finite value to the tensor cores).
[[nodiscard]] BATON_HD inline float round_tf32(float x) noexcept {
  return bits_float((float_bits(x) + 0x1000u) & 0xffffe000u);
}

namespace simt {

/// Two floats -> one register of two 16-bit storage values (lo in the low half), RNE.
template <class S, int N>
  requires(N > 1)
[[nodiscard]] inline lanes<std::uint32_t, N> pack2(const lanes<float, N>& lo, const lanes<float, N>& hi) noexcept {
  lanes<std::uint32_t, N> r;
  for (int i = 0; i < N; ++i)
    r.v[i] = static_cast<std::uint32_t>(float_to_half<S>(lo.v[i])) |
             (static_cast<std::uint32_t>(float_to_half<S>(hi.v[i])) << 16);
  return r;
}

/// x -> (big, small) with big = tf32(x), small = tf32(x - big), as tf32 bit patterns: the
/// 3xTF32 split. big*big' + big*small' + small*big' then matches an fp32 product to ~1e-6.
template <int N>
  requires(N > 1)
inline void split_tf32(const lanes<float, N>& x, lanes<std::uint32_t, N>& big, lanes<std::uint32_t, N>& small) noexcept {
  for (int i = 0; i < N; ++i) {
    const float b = round_tf32(x.v[i]);
    big.v[i] = float_bits(b);
    small.v[i] = float_bits(round_tf32(x.v[i] - b));
  }
}

/// One tensor-core product per warp, emulated: for each warp (lanes w .. w + 31),
/// gather(w, A, B) rebuilds the 16 x K operand A and the K x 8 operand B from the warp's
/// fragments, and d (the C fragment) += A B, summed in fp32 in k order.
template <int K, int N, class Gather>
inline void warp_products(lanes<float, N> (&d)[4], const Gather& gather) noexcept {
  static_assert(N % warp_size == 0, "baton simt: the host emulation runs whole warps");
  for (int w = 0; w < N; w += warp_size) {
    float A[16][K], B[K][8], C[16][8];
    gather(w, A, B);
    for (int l = 0; l < warp_size; ++l)
      for (int i = 0; i < 4; ++i) {
        const element_at e = frag::c(l, i);
        C[e.row][e.col] = d[i].v[w + l];
      }
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 8; ++j) {
        float acc = C[i][j];
        for (int k = 0; k < K; ++k) acc += A[i][k] * B[k][j];
        C[i][j] = acc;
      }
    for (int l = 0; l < warp_size; ++l)
      for (int i = 0; i < 4; ++i) {
        const element_at e = frag::c(l, i);
        d[i].v[w + l] = C[e.row][e.col];
      }
  }
}

/// d += a b for one m16n8k16 per warp (host emulation): a, b hold S = bfloat16 or float16.
template <class S, int N>
  requires(N > 1)
inline void mma_m16n8k16(lanes<float, N> (&d)[4], const lanes<std::uint32_t, N> (&a)[4],
                         const lanes<std::uint32_t, N> (&b)[2]) noexcept {
  warp_products<16>(d, [&](int w, float (&A)[16][16], float (&B)[16][8]) {
    for (int l = 0; l < warp_size; ++l) {
      for (int r = 0; r < 4; ++r)
        for (int h = 0; h < 2; ++h) {
          const element_at e = frag::a16(l, r, h);
          A[e.row][e.col] = half_to_float<S>(static_cast<std::uint16_t>(a[r].v[w + l] >> (16 * h)));
        }
      for (int r = 0; r < 2; ++r)
        for (int h = 0; h < 2; ++h) {
          const element_at e = frag::b16(l, r, h);
          B[e.row][e.col] = half_to_float<S>(static_cast<std::uint16_t>(b[r].v[w + l] >> (16 * h)));
        }
    }
  });
}

/// d += a b for one m16n8k8 tf32 per warp (host emulation). As the hardware, reads only the
/// tf32 bits of each operand (the low 13 bits are ignored).
template <int N>
  requires(N > 1)
inline void mma_m16n8k8_tf32(lanes<float, N> (&d)[4], const lanes<std::uint32_t, N> (&a)[4],
                             const lanes<std::uint32_t, N> (&b)[2]) noexcept {
  warp_products<8>(d, [&](int w, float (&A)[16][8], float (&B)[8][8]) {
    for (int l = 0; l < warp_size; ++l) {
      for (int r = 0; r < 4; ++r) {
        const element_at e = frag::a_tf32(l, r);
        A[e.row][e.col] = bits_float(a[r].v[w + l] & 0xffffe000u);
      }
      for (int r = 0; r < 2; ++r) {
        const element_at e = frag::b_tf32(l, r);
        B[e.row][e.col] = bits_float(b[r].v[w + l] & 0xffffe000u);
      }
    }
  });
}

/// d += a b in ~fp32 accuracy from three tf32 products (a, b split by split_tf32): the
/// small*small term is below fp32 resolution and dropped.
template <int N>
BATON_HD inline void mma_3xtf32(lanes<float, N> (&d)[4], const lanes<std::uint32_t, N> (&a_big)[4],
                                const lanes<std::uint32_t, N> (&a_small)[4], const lanes<std::uint32_t, N> (&b_big)[2],
                                const lanes<std::uint32_t, N> (&b_small)[2]) noexcept {
  mma_m16n8k8_tf32(d, a_small, b_big);
  mma_m16n8k8_tf32(d, a_big, b_small);
  mma_m16n8k8_tf32(d, a_big, b_big);
}

}  // namespace simt
}  // namespace baton::detail::attention::cuda
