// baton/config.hpp — the one place that says which optional backends are compiled in.
//
// Each backend's CMake target (baton::kokkos, baton::mpi, baton::blas, baton::torch, baton::cuda, baton::nccl) defines
// BATON_ENABLE_<NAME>=1. Code tests the function-like macros below, never the raw defines,
// so a misspelt backend name is a compile error rather than a silent 0.
//
// BATON_HAS_CUDA() says that baton::cuda (the CUDA runtime) is linked, as baton::nccl links
// it. The NCCL communicator is the only CUDA code, and it is compiled only, never run on a
// GPU. baton has no CUDA kernels yet, hence no host/device annotation macro: one comes with
// the first kernel.
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
