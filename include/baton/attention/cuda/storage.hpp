// baton/attention/cuda/storage.hpp — the element types the CUDA attention backend stores,
// and the storage helpers its kernels use.
//
// The 16-bit types themselves (baton::bfloat16, baton::float16) are the core's
// (core/float16.hpp): context parallelism and the tests use them on the host too. They are
// storage only: the kernels compute in fp32 (tensor cores accumulate in fp32) and the LSE is
// fp32 (lse_type maps both to float).
//
// Plain C++ (g++-compilable): the CPU tests run the kernels' source in emulation.
#pragma once

#include <baton/core/cuda_annotations.hpp>
#include <baton/core/float16.hpp>

#include <type_traits>

namespace baton {

/// The element types the CUDA backend stores: float (computed as 3xTF32 on tensor cores),
/// bfloat16 and float16 (computed with bf16/f16 tensor cores, fp32 accumulation).
template <class T>
concept cuda_storage = std::is_same_v<T, float> || std::is_same_v<T, bfloat16> || std::is_same_v<T, float16>;

namespace detail::attention::cuda {
// The kernels convert and test storage with the core's helpers.
using core::bf16_bits_to_float;
using core::bits_float;
using core::f16_bits_to_float;
using core::float_bits;
using core::float_to_bf16_bits;
using core::float_to_f16_bits;
using core::from_float;
using core::storage_finite;
using core::to_float;
}  // namespace detail::attention::cuda

}  // namespace baton
