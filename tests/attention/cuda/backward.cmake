# The backward kernels (include/baton/attention/cuda/detail/backward_kernel.hpp, backward.cuh).
# test_cuda_backward_cpu (label cuda): the kernel bodies through the host emulation against the
# reference backend; plain g++, built in every configuration (the sanitizer builds too), a few
# seconds. test_cuda_backward_gpu (labels cuda gpu): the same problems through launch_backward
# on a device; built where nvcc exists, and without a device each case reports itself skipped.
baton_add_test(NAME test_cuda_backward_cpu SOURCES test_cuda_backward_cpu.cpp LABELS cuda ASAN_OPTIMIZED)

if(BATON_HAVE_NVCC AND TARGET baton::cuda)
  baton_add_test(NAME test_cuda_backward_gpu SOURCES test_cuda_backward_gpu.cu LIBS baton_test_cuda_kernels LABELS cuda gpu)
  baton_cuda_target(test_cuda_backward_gpu)
endif()
