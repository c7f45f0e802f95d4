// cuda_attention's backward kernels for every storage type, compiled once for all the GPU test
// programs (baton_test_cuda_kernels in tests/CMakeLists.txt) instead of once in each.
#include <baton/attention/cuda/instantiate.cuh>

BATON_CUDA_ATTENTION_INSTANTIATE_BACKWARD(float)
BATON_CUDA_ATTENTION_INSTANTIATE_BACKWARD(baton::bfloat16)
BATON_CUDA_ATTENTION_INSTANTIATE_BACKWARD(baton::float16)
