// baton/attention/cuda/detail/mma.cuh — the device side of mma.hpp: the tensor-core
// instructions themselves (inline PTX, sm_80 and later), on lanes<T, 1>.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include <baton/attention/cuda/detail/mma.hpp>

namespace baton::detail::attention::cuda::simt {

template <class S, int N>
  requires(N == 1)
__device__ inline lanes<std::uint32_t, N> pack2(const lanes<float, N>& lo, const lanes<float, N>& hi) noexcept {
  std::uint32_t r;
  if constexpr (std::is_same_v<S, bfloat16>) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo.v[0], hi.v[0]);  // .x = lo (low half)
    r = *reinterpret_cast<const std::uint32_t*>(&h);
  } else {
    const __half2 h = __floats2half2_rn(lo.v[0], hi.v[0]);
    r = *reinterpret_cast<const std::uint32_t*>(&h);
  }
  return lanes<std::uint32_t, N>(r);
}

template <int N>
  requires(N == 1)
__device__ inline void split_tf32(const lanes<float, N>& x, lanes<std::uint32_t, N>& big,
                                  lanes<std::uint32_t, N>& small) noexcept {
  std::uint32_t b, s;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(b) : "f"(x.v[0]));
  const float rest = x.v[0] - __uint_as_float(b);
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(s) : "f"(rest));
  big.v[0] = b;
  small.v[0] = s;
}

template <class S, int N>
  requires(N == 1)
__device__ inline void mma_m16n8k16(lanes<float, N> (&d)[4], const lanes<std::uint32_t, N> (&a)[4],
                                    const lanes<std::uint32_t, N> (&b)[2]) noexcept {
  static_assert(std::is_same_v<S, bfloat16> || std::is_same_v<S, float16>,
                "baton mma: m16n8k16 takes bfloat16 or float16 operands");
  if constexpr (std::is_same_v<S, bfloat16>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0].v[0]), "+f"(d[1].v[0]), "+f"(d[2].v[0]), "+f"(d[3].v[0])
        : "r"(a[0].v[0]), "r"(a[1].v[0]), "r"(a[2].v[0]), "r"(a[3].v[0]), "r"(b[0].v[0]), "r"(b[1].v[0]));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0].v[0]), "+f"(d[1].v[0]), "+f"(d[2].v[0]), "+f"(d[3].v[0])
        : "r"(a[0].v[0]), "r"(a[1].v[0]), "r"(a[2].v[0]), "r"(a[3].v[0]), "r"(b[0].v[0]), "r"(b[1].v[0]));
}

template <int N>
  requires(N == 1)
__device__ inline void mma_m16n8k8_tf32(lanes<float, N> (&d)[4], const lanes<std::uint32_t, N> (&a)[4],
                                        const lanes<std::uint32_t, N> (&b)[2]) noexcept {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0].v[0]), "+f"(d[1].v[0]), "+f"(d[2].v[0]), "+f"(d[3].v[0])
      : "r"(a[0].v[0]), "r"(a[1].v[0]), "r"(a[2].v[0]), "r"(a[3].v[0]), "r"(b[0].v[0]), "r"(b[1].v[0]));
}

}  // namespace baton::detail::attention::cuda::simt
