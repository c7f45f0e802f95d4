// The kernels of test_pipeline_nccl_gpu.cpp's linear+tanh stage (device_parity.hpp), in
// double, one thread per output element, sums in index order, no atomics: deterministic, so
// the pipeline and the sequential run differ only by how rows are grouped into microbatches.
// Kept apart from the test so that the executor is compiled by the host compiler (nvcc's
// front end rejects some of baton's C++20 constexpr code, e.g. schedule/validate.hpp).
#include "nccl_gpu_kernels.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace nccl_gpu_kernels {
namespace {

__global__ void linear_tanh_forward(const double* x, const double* w, const double* b, double* y, long long rows,
                                    long long width) {
  const long long k = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= rows * width) return;
  const long long r = k / width, j = k % width;
  double z = b[j];
  for (long long i = 0; i < width; ++i) z += x[r * width + i] * w[i * width + j];
  y[k] = tanh(z);
}

__global__ void tanh_backward(const double* y, const double* dy, double* dz, long long n) {
  const long long k = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k < n) dz[k] = dy[k] * (1.0 - y[k] * y[k]);
}

__global__ void linear_backward_input(const double* dz, const double* w, double* dx, long long rows, long long width) {
  const long long k = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= rows * width) return;
  const long long r = k / width, i = k % width;
  double acc = 0;
  for (long long j = 0; j < width; ++j) acc += dz[r * width + j] * w[i * width + j];
  dx[k] = acc;
}

// Deterministic (no atomics): one thread per weight, summing over rows in order.
__global__ void linear_backward_weight(const double* x, const double* dz, double* dw, double* db, long long rows,
                                       long long width) {
  const long long k = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= width * width) return;
  const long long i = k / width, j = k % width;
  double acc = 0;
  for (long long r = 0; r < rows; ++r) acc += x[r * width + i] * dz[r * width + j];
  dw[k] += acc;
  if (i == 0) {
    double bias = 0;
    for (long long r = 0; r < rows; ++r) bias += dz[r * width + j];
    db[j] += bias;
  }
}

unsigned blocks_for(long long n) { return static_cast<unsigned>((n + 127) / 128); }

void launched(const char* kernel, cudaStream_t stream) {
  cudaError_t rc = cudaGetLastError();
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(stream);
  if (rc != cudaSuccess) throw std::runtime_error(std::string(kernel) + ": " + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc));
}

}  // namespace

void forward(const double* x, const double* w, const double* b, double* y, long long rows, long long width,
             cudaStream_t stream) {
  linear_tanh_forward<<<blocks_for(rows * width), 128, 0, stream>>>(x, w, b, y, rows, width);
  launched("linear_tanh_forward", stream);
}

void backward_input(const double* y, const double* dy, const double* w, double* dz, double* dx, long long rows,
                    long long width, cudaStream_t stream) {
  tanh_backward<<<blocks_for(rows * width), 128, 0, stream>>>(y, dy, dz, rows * width);
  launched("tanh_backward", stream);
  linear_backward_input<<<blocks_for(rows * width), 128, 0, stream>>>(dz, w, dx, rows, width);
  launched("linear_backward_input", stream);
}

void backward_weight(const double* x, const double* dz, double* dw, double* db, long long rows, long long width,
                     cudaStream_t stream) {
  linear_backward_weight<<<blocks_for(width * width), 128, 0, stream>>>(x, dz, dw, db, rows, width);
  launched("linear_backward_weight", stream);
}

}  // namespace nccl_gpu_kernels
