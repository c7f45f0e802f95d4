// baton/config.hpp — the one place that says which optional backends are compiled in.
//
// Each backend's CMake target (baton::kokkos, baton::mpi, baton::blas, baton::json, baton::torch,
// baton::cuda, baton::nccl) defines BATON_ENABLE_<NAME>=1. Code tests the function-like macros
// below, never the raw defines, so a misspelt backend name is a compile error rather than a
// silent 0.
//
// BATON_HAS_CUDA() says that baton::cuda (the CUDA runtime) is linked, as baton::nccl links
// it. It says nothing about the compiler: whether a translation unit is compiled by nvcc, and
// which pass, is BATON_CUDA_COMPILATION() / BATON_CUDA_DEVICE_PASS() of
// baton/core/cuda_annotations.hpp, beside the one host/device annotation, BATON_HD. The CUDA
// code (attention kernels, context parallelism on device memory, the NCCL communicator) is
// compiled here, and the kernels' source is tested on the CPU in an emulation of the GPU,
// but none of it has yet run on a GPU.
#pragma once

#define BATON_VERSION_MAJOR 0
#define BATON_VERSION_MINOR 1
#define BATON_VERSION_PATCH 0

#if defined(BATON_ENABLE_KOKKOS) && BATON_ENABLE_KOKKOS
#define BATON_HAS_KOKKOS() 1
#else
#define BATON_HAS_KOKKOS() 0
#endif

#if defined(BATON_ENABLE_MPI) && BATON_ENABLE_MPI
#define BATON_HAS_MPI() 1
#else
#define BATON_HAS_MPI() 0
#endif

#if defined(BATON_ENABLE_CUDA) && BATON_ENABLE_CUDA
#define BATON_HAS_CUDA() 1
#else
#define BATON_HAS_CUDA() 0
#endif

#if defined(BATON_ENABLE_BLAS) && BATON_ENABLE_BLAS
#define BATON_HAS_BLAS() 1
#else
#define BATON_HAS_BLAS() 0
#endif

// nlohmann-json: checkpoints (baton/train/json/: safetensors files and their manifest).
#if defined(BATON_ENABLE_JSON) && BATON_ENABLE_JSON
#define BATON_HAS_JSON() 1
#else
#define BATON_HAS_JSON() 0
#endif

#if defined(BATON_ENABLE_TORCH) && BATON_ENABLE_TORCH
#define BATON_HAS_TORCH() 1
#else
#define BATON_HAS_TORCH() 0
#endif

#if defined(BATON_ENABLE_NCCL) && BATON_ENABLE_NCCL
#define BATON_HAS_NCCL() 1
#else
#define BATON_HAS_NCCL() 0
#endif
