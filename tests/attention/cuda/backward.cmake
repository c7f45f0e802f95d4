# The backward kernels (include/baton/attention/cuda/detail/backward_kernel.hpp, backward.cuh).
# test_cuda_backward_cpu.cpp (the kernel bodies through the host emulation against the reference
# backend) is compiled into test_cuda_cpu (CMakeLists.txt here) and runs as its entry
# test_cuda_cpu.backward. test_cuda_backward_gpu (labels cuda gpu): the same problems through
# launch_backward on a device; built where nvcc exists, and without a device each case reports
# itself skipped.

if(BATON_HAVE_NVCC AND TARGET baton::cuda)
  baton_add_test(NAME test_cuda_backward_gpu SOURCES test_cuda_backward_gpu.cu LIBS baton_test_cuda_kernels LABELS cuda gpu)
  baton_cuda_target(test_cuda_backward_gpu)
endif()
