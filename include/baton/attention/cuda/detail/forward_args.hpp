// baton/attention/cuda/detail/forward_args.hpp — what the CUDA forward kernels are given (the
// key-flag pass and the flash forward), and the host-side check that a plan fits the kernel's
// tiles. Plain C++ (compiled by g++ and nvcc alike), so the emulated kernels of the CPU tests
// and the device launch read one and the same struct.
#pragma once

#include <cstdint>
#include <string>

#include <baton/attention/cuda/plan.hpp>
#include <baton/attention/error.hpp>
#include <baton/core/tensor_view.hpp>

namespace baton::detail::attention::cuda {

/// Everything the forward kernel reads: device pointers on the GPU, host pointers in the
/// emulation. Operands [batch, seq, heads, dim] (dim contiguous) and the LSE [batch, heads,
/// seq] are 16-byte aligned with strides that keep rows 16-byte aligned (the backend checks;
/// cp.async copies 16 bytes).
template <class S>
struct forward_args {
  tensor_view<const S, 4> q, k, v;
  tensor_view<S, 4> out;
  tensor_view<float, 3> lse;
  std::int32_t batch = 0, heads_q = 0, heads_kv = 0, dim = 0;
  float scale_log2 = 0;  // softmax scale * log2(e): scores in log2 units
  tile_plan_view plan;
  const std::uint8_t* key_bad = nullptr;  // [batch][heads_kv][seq_k] (key_flag_body)
};

/// The key-flag pass: key_bad[(b * heads_kv + hk) * seq_k + j] = k or v row j non-finite.
template <class S>
struct key_flag_args {
  tensor_view<const S, 4> k, v;
  std::int32_t batch = 0, heads_kv = 0, seq_k = 0, dim = 0;
  std::uint8_t* key_bad = nullptr;
};

/// The plan must have been made with the kernel's tiles (the bits and lists are per tile).
inline void check_plan_tiles(const tile_plan_view& plan, const forward_config& cfg) {
  if (plan.tile_q != cfg.tile_q || plan.tile_k != cfg.tile_k)
    throw attention_error("baton cuda forward: the plan has " + std::to_string(plan.tile_q) + " x " +
                          std::to_string(plan.tile_k) + " tiles but the kernel runs " + std::to_string(cfg.tile_q) +
                          " x " + std::to_string(cfg.tile_k) + "; make it with forward_config_for's tile sizes");
}

}  // namespace baton::detail::attention::cuda
