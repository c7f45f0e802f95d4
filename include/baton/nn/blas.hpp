// baton/nn/blas.hpp — which OpenBLAS kernel the model layer's matrix products run on, and how
// many threads each product uses.
//
// OpenBLAS chooses its kernel from CPUID when it is loaded, and a CPU newer than the library
// gets its generic "Prescott" kernel (see docs/nn.md): blas_kernel() tells a program which
// one it got, so it can print it next to its figures. Getting a better one is the program's
// business (it must re-execute itself before OpenBLAS loads; examples/support/native_blas.hpp).
#pragma once

#include <baton/config.hpp>
#include <baton/nn/detail/gemm_bf16.hpp>

#if BATON_HAS_BLAS()
#include <cblas.h>
#endif

#include <string>

namespace baton::nn {

/// The OpenBLAS kernel the matrix products run on ("SkylakeX", "Haswell", "Prescott", ...),
/// or "blocked fallback" without baton::blas.
inline std::string blas_kernel() {
#if BATON_HAS_BLAS()
  const char* name = openblas_get_corename();
  return name ? std::string(name) : std::string("unknown");
#else
  return "blocked fallback";
#endif
}

/// What matmul_precision::bf16's products run on here: "amx_bf16" (TDPBF16PS, Intel's tile
/// unit), "avx512_bf16" (VDPBF16PS, on an AMD CPU with AVX512_BF16) or "widened sgemm" (the
/// operands rounded, widened and multiplied by the products' usual kernel).
inline std::string bf16_matmul_kernel() { return detail::nn::bf16_gemm_implementation(); }

/// Sets the number of threads OpenBLAS runs each call on (no effect without baton::blas).
/// When ranks are threads of one process they already occupy the cores: one BLAS thread per
/// rank avoids oversubscription, which otherwise costs several times the run time in context
/// switches.
inline void set_blas_threads([[maybe_unused]] int threads) {
#if BATON_HAS_BLAS()
  openblas_set_num_threads(threads);
#endif
}

}  // namespace baton::nn
