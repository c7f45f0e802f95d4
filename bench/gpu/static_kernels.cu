// Every cuda_attention kernel, instantiated for every storage type: what bench_cuda_static
// reads ptxas's statistics and the PTX of (bench/gpu/compile_static.sh compiles it for sm_90;
// nothing here runs).
#include <baton/attention/cuda/instantiate.cuh>

BATON_CUDA_ATTENTION_INSTANTIATE_FORWARD(float)
BATON_CUDA_ATTENTION_INSTANTIATE_FORWARD(baton::bfloat16)
BATON_CUDA_ATTENTION_INSTANTIATE_FORWARD(baton::float16)
BATON_CUDA_ATTENTION_INSTANTIATE_BACKWARD(float)
BATON_CUDA_ATTENTION_INSTANTIATE_BACKWARD(baton::bfloat16)
BATON_CUDA_ATTENTION_INSTANTIATE_BACKWARD(baton::float16)
