// baton/core.hpp — the core layer: what every other layer shares. Std-only; includes
// nothing else of baton.
//   core/layout.hpp, core/tensor_view.hpp   the one strided layout, and views over it
//   core/float16.hpp                        bfloat16 and float16 storage
//   core/agreement.hpp                      the cross-rank agreement descriptors and verdicts
//   core/tags.hpp                           the tag registry: every protocol's range of message tags
//   core/meta.hpp                           fixed_string, dependent_false_v
//   core/cuda_annotations.hpp               BATON_HD, BATON_CUDA_COMPILATION(), BATON_CUDA_DEVICE_PASS()
//   core/cuda_check.hpp                     (CUDA runtime) the one report of a failed CUDA call; not included here
// Internals (baton::detail::core): core/simd.hpp, core/hash.hpp, core/sizes.hpp, core/workspace.hpp,
// core/block_cache.hpp (the per-thread cache of host_tensor memory).
#pragma once

#include <baton/core/agreement.hpp>
#include <baton/core/block_cache.hpp>
#include <baton/core/cuda_annotations.hpp>
#include <baton/core/float16.hpp>
#include <baton/core/hash.hpp>
#include <baton/core/layout.hpp>
#include <baton/core/meta.hpp>
#include <baton/core/sizes.hpp>
#include <baton/core/simd.hpp>
#include <baton/core/tags.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/core/workspace.hpp>
