// baton/attention/cuda/instantiate.cuh — compiling cuda_attention's kernels once per
// program instead of once per .cu file. nvcc only.
//
// Every .cu file that calls cuda_attention makes nvcc compile the kernels it may launch: for
// each storage type used, every head dim (64, 128, 256), for every target architecture. That
// is most of nvcc's time (a minute or more per storage type and direction for sm_80 + sm_90).
// A program with several such files can compile them once:
//
//  1. define BATON_CUDA_ATTENTION_EXTERN_KERNELS for every CUDA file of the program (e.g.
//     target_compile_definitions(app PRIVATE BATON_CUDA_ATTENTION_EXTERN_KERNELS)); the
//     kernel headers (through <baton/attention/cuda.hpp>) then declare the launches of all
//     three storage types extern;
//  2. in one or more .cu files of the program (several let the build run them in parallel),
//     instantiate them, for each storage type the program uses:
//
//         #include <baton/attention/cuda/instantiate.cuh>
//         BATON_CUDA_ATTENTION_INSTANTIATE_FORWARD(baton::bfloat16)
//         BATON_CUDA_ATTENTION_INSTANTIATE_BACKWARD(baton::bfloat16)
//
// A storage type used but not instantiated is a link error naming
// baton::detail::attention::cuda::launch_forward<S> (or launch_key_flags, launch_backward).
// Write the macros at namespace scope outside any namespace.
#pragma once

#include <baton/core/cuda_annotations.hpp>

#if !BATON_CUDA_COMPILATION()
#error "baton/attention/cuda/instantiate.cuh instantiates CUDA kernels: include it from a .cu file compiled by nvcc"
#endif

#include <cuda_runtime.h>

#include <baton/attention/cuda/detail/backward.cuh>
#include <baton/attention/cuda/detail/forward.cuh>
#include <baton/attention/cuda/detail/launches.cuh>
#include <baton/attention/cuda/storage.hpp>

/// The forward kernels (and the key-flag pass) of storage type S, for every head dim.
#define BATON_CUDA_ATTENTION_INSTANTIATE_FORWARD(S) BATON_DETAIL_CUDA_ATTENTION_FORWARD_LAUNCHES(, S)
/// The backward kernels (pre-pass, key pass, query pass) of storage type S, for every head dim.
#define BATON_CUDA_ATTENTION_INSTANTIATE_BACKWARD(S) BATON_DETAIL_CUDA_ATTENTION_BACKWARD_LAUNCHES(, S)
