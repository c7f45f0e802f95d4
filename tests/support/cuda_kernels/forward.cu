// cuda_attention's forward kernels for every storage type, compiled once for all the GPU test
// programs (baton_test_cuda_kernels in tests/CMakeLists.txt) instead of once in each.
// [doc:cuda-instantiate]
#include <baton/attention/cuda/instantiate.cuh>

BATON_CUDA_ATTENTION_INSTANTIATE_FORWARD(float)
BATON_CUDA_ATTENTION_INSTANTIATE_FORWARD(baton::bfloat16)
BATON_CUDA_ATTENTION_INSTANTIATE_FORWARD(baton::float16)
// [/doc:cuda-instantiate]
