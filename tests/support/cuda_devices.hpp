// What a GPU test asks of CUDA before it runs: how many devices this process sees (a test
// case tagged [can-skip] skips with "no CUDA device" at 0; see skip.hpp).
#pragma once

#include <cuda_runtime.h>

namespace baton_test {

/// The CUDA devices visible to this process: 0 without a driver or a device. The error such a
/// machine reports is cleared, so that the next CUDA call does not return it.
inline int visible_cuda_devices() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

}  // namespace baton_test
