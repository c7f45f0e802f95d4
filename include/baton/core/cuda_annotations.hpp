// baton/core/cuda_annotations.hpp — the one host/device annotation, and the two questions code
// compiled by nvcc asks: is this translation unit CUDA, and is this the device pass.
//
// Kernel sources (attention's flash kernels, cp's element-wise kernels) are plain C++ that g++
// compiles for the CPU tests and nvcc for the GPU; BATON_HD marks what both passes compile.
// Code asks BATON_CUDA_COMPILATION() / BATON_CUDA_DEVICE_PASS(), never the raw __CUDACC__ /
// __CUDA_ARCH__, so that a misspelt test is a compile error rather than a silent 0. Which
// backends are linked is a different question, answered by baton/config.hpp.
#pragma once

#if defined(__CUDACC__)
#define BATON_CUDA_COMPILATION() 1
#else
#define BATON_CUDA_COMPILATION() 0
#endif

#if defined(__CUDA_ARCH__)
#define BATON_CUDA_DEVICE_PASS() 1
#else
#define BATON_CUDA_DEVICE_PASS() 0
#endif

#if BATON_CUDA_COMPILATION()
#define BATON_HD __host__ __device__
#else
#define BATON_HD
#endif
