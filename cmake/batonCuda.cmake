# nvcc for baton's own CUDA translation units (tests, benchmarks, the header check). A user
# of the installed package never needs this: baton::cuda links cudart, and the user's own
# project enables CUDA if it compiles .cu files.
#
# Sets BATON_HAVE_NVCC when the CUDA language is enabled. The CUDA targets that use it set
# CUDA_ARCHITECTURES to BATON_CUDA_ARCHITECTURES and pass -std=c++20 themselves, since CMake
# 3.25 does not know nvcc 13's C++20 flag (CUDA_STANDARD 20 fails to generate).
include_guard(GLOBAL)
set(BATON_HAVE_NVCC OFF)
if(TARGET baton::cuda)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES ${BATON_CUDA_ARCHITECTURES})
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(BATON_HAVE_NVCC ON)
  endif()
endif()

# baton_cuda_target(target): nvcc settings for one of baton's own targets with .cu sources.
function(baton_cuda_target target)
  set_target_properties(${target} PROPERTIES CUDA_ARCHITECTURES "${BATON_CUDA_ARCHITECTURES}")
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 --expt-relaxed-constexpr>)
endfunction()
