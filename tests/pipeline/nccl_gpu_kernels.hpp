// Launchers of the test stage's kernels (nccl_gpu_kernels.cu). Each runs on `stream` and
// has completed when it returns; a launch or kernel error throws std::runtime_error.
#pragma once

#include <cuda_runtime.h>

namespace nccl_gpu_kernels {

// y = tanh(x W + b), x and y rows x width, W width x width (row-major).
void forward(const double* x, const double* w, const double* b, double* y, long long rows, long long width,
             cudaStream_t stream);
// dz = dy * (1 - y^2); dx = dz W^T.
void backward_input(const double* y, const double* dy, const double* w, double* dz, double* dx, long long rows,
                    long long width, cudaStream_t stream);
// dw += x^T dz; db += column sums of dz.
void backward_weight(const double* x, const double* dz, double* dw, double* db, long long rows, long long width,
                     cudaStream_t stream);

}  // namespace nccl_gpu_kernels
