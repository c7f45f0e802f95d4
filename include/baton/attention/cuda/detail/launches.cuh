// baton/attention/cuda/detail/launches.cuh — the launch functions of every storage type as
// explicit instantiations: declared extern by forward.cuh and backward.cuh when
// BATON_CUDA_ATTENTION_EXTERN_KERNELS is defined, defined by the macros of
// cuda/instantiate.cuh. Preprocessor only.
#pragma once

// KEYWORD is `extern` (a declaration) or nothing (the definition); written at global scope.
#define BATON_DETAIL_CUDA_ATTENTION_FORWARD_LAUNCHES(KEYWORD, S)                      \
  namespace baton::detail::attention::cuda {                                        \
  KEYWORD template void launch_key_flags<S>(const key_flag_args<S>&, cudaStream_t); \
  KEYWORD template void launch_forward<S>(const forward_args<S>&, cudaStream_t);    \
  }
#define BATON_DETAIL_CUDA_ATTENTION_BACKWARD_LAUNCHES(KEYWORD, S)                    \
  namespace baton::detail::attention::cuda {                                       \
  KEYWORD template void launch_backward<S>(const backward_args<S>&, cudaStream_t); \
  }

// The launches of LAUNCHES (one of the two macros above) declared extern for all three
// storage types.
#define BATON_DETAIL_CUDA_ATTENTION_EXTERN(LAUNCHES) \
  LAUNCHES(extern, float)                            \
  LAUNCHES(extern, ::baton::bfloat16)                \
  LAUNCHES(extern, ::baton::float16)
