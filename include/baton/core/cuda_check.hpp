// baton/core/cuda_check.hpp — the one way baton reports a failed CUDA runtime call: every
// layer throws its own error type (comm_error, cuda_error, cp_error, attention_error) with
// the same words, "<who>: <call> failed: <cudaErrorName> (<description>)".
// A CUDA backend header: include it only where baton::cuda is linked.
#pragma once

#if !__has_include(<cuda_runtime.h>)
#error "baton/core/cuda_check.hpp needs the CUDA runtime: link baton::cuda (CMake: find_package(baton COMPONENTS cuda)), which the CUDA toolkit provides"
#endif

#include <cuda_runtime.h>

#include <string>
#include <string_view>

namespace baton::detail::core {

/// "<who>: <call> failed: cudaErrorMemoryAllocation (out of memory)".
inline std::string cuda_failure(std::string_view who, std::string_view call, cudaError_t rc) {
  return std::string(who) + ": " + std::string(call) + " failed: " + cudaGetErrorName(rc) + " (" +
         cudaGetErrorString(rc) + ")";
}

/// Throws Error(cuda_failure(...)) unless rc is cudaSuccess.
template <class Error>
void check_cuda(cudaError_t rc, std::string_view who, std::string_view call) {
  if (rc != cudaSuccess) throw Error(cuda_failure(who, call, rc));
}

}  // namespace baton::detail::core
