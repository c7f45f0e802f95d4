// examples/support/native_blas.hpp — for a program's main (baton-train, the benchmarks): run
// OpenBLAS on the kernel this CPU can run when OpenBLAS did not recognise the CPU.
//
// OpenBLAS chooses its kernel from CPUID when it is loaded. A CPU newer than the library
// (OpenBLAS 0.3.21, Debian 12's, on an Emerald Rapids Xeon for one) gets "Prescott", a
// generic SSE3 kernel several times slower than the AVX-512 one the CPU can run; the
// environment variable OPENBLAS_CORETYPE overrides the choice, but only before the library
// is loaded — so the program re-executes itself with it set. That is a program's decision
// (it changes the environment and replaces the process), not the library's: this header is
// not part of baton's include/.
#pragma once

#include <baton/config.hpp>
#include <baton/nn/blas.hpp>

#include <cstdlib>
#include <string>

#if defined(__linux__)
#include <unistd.h>
#endif

namespace example_support {

/// The OPENBLAS_CORETYPE this CPU can run when OpenBLAS fell back to its generic "Prescott"
/// kernel and nobody chose one ("SkylakeX" with AVX-512, "Haswell" with AVX2); "" otherwise.
inline std::string better_blas_kernel() {
#if BATON_HAS_BLAS() && defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || baton::nn::blas_kernel() != "Prescott") return {};
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return {};
}

/// Call first thing in main(): when OpenBLAS runs its generic kernel on a CPU that has a
/// better one (better_blas_kernel()), re-executes the program with OPENBLAS_CORETYPE set to
/// it (Linux; the same arguments, so argv must be main's). Returns normally otherwise, or
/// when the re-execution is impossible.
inline void use_native_blas_kernel([[maybe_unused]] char** argv) {
#if defined(__linux__)
  const std::string kernel = better_blas_kernel();
  if (kernel.empty()) return;
  ::setenv("OPENBLAS_CORETYPE", kernel.c_str(), 1);
  ::execv("/proc/self/exe", argv);  // returns only on failure: keep running on the old kernel
#endif
}

}  // namespace example_support
