# The CUDA attention backend's benchmark (included by bench/gpu/CMakeLists.txt): forward
# (and backward) TFLOP/s of cuda_attention at S = 8192, D = 128, and their ratio to the
# H100/H200 dense bf16 peak; prints a SKIPPED line without a device.
baton_add_gpu_bench(NAME bench_cuda_attention SOURCES bench_cuda_attention.cu TIMEOUT 600)
