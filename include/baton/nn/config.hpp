// baton/nn/config.hpp — the sizes of a decoder-only transformer, checked once.
#pragma once

#include <baton/nn/error.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace baton::nn {

/// What a transformer block keeps between its forward and its backward (docs/nn.md,
/// "Recomputation"); the rest, backward_input computes again:
///  - none: everything its backward uses;
///  - selective: the outputs of the matrix products (q, k, v, the MLP's gate and up) and of
///    attention (O and its LSE), and the RMSNorms' x̂ and 1/rms; the norms' outputs and
///    SwiGLU's product are recomputed (element-wise work, no matrix product, no attention);
///  - full: the block's input only; backward_input runs the forward again (attention
///    included: under context parallelism with the forward's communication).
/// Whatever the policy, backward_input leaves what backward_weight uses, so nothing is
/// computed twice however far apart a schedule puts I and W.
enum class recompute_policy { none, selective, full };

constexpr std::string_view to_string(recompute_policy p) noexcept {
  switch (p) {
    case recompute_policy::none: return "none";
    case recompute_policy::selective: return "selective";
    case recompute_policy::full: return "full";
  }
  return "unknown";
}

/// The policy named `name` ("none", "selective", "full"); nn_error naming the choices otherwise.
inline recompute_policy parse_recompute_policy(std::string_view name) {
  for (recompute_policy p : {recompute_policy::none, recompute_policy::selective, recompute_policy::full})
    if (name == to_string(p)) return p;
  throw nn_error("baton::nn::recompute_policy: '" + std::string(name) +
                 "' is not a recompute policy; choose none, selective or full");
}

/// The element type a block keeps its saved activations in (docs/nn.md, "bf16 storage"):
///  - native: the block's element type (float or double), as always;
///  - bf16: baton::bfloat16 — q, k, v and O are computed in float, rounded to bf16, and the
///    attention (and under context parallelism the K/V blocks sent around the ring) runs in
///    bf16 storage with fp32 accumulation; the other activations a block keeps between its
///    forward and its backward (the norms' x̂, the attention's and the MLP's inputs, gate, up
///    and product, or the block's input under recompute full) are kept in bf16 and widened
///    when backward_input starts. Weights, gradients and every product stay in float.
///    Needs float blocks and an attention backend that takes bfloat16 (kokkos_attention).
enum class activation_storage { native, bf16 };

constexpr std::string_view to_string(activation_storage s) noexcept {
  switch (s) {
    case activation_storage::native: return "native";
    case activation_storage::bf16: return "bf16";
  }
  return "unknown";
}

/// The operands of a block's matrix products (docs/nn.md, "bf16 matrix products"):
///  - native: the block's element type, as always;
///  - bf16: each operand rounded to bf16 and the products summed in float — the float weights
///    (the master copy, which the optimizer updates) and activations enter every projection of
///    attention and the MLP as bf16, as mixed-precision training computes them; on a CPU with
///    AVX512_BF16 this runs at up to twice a float FMA's rate (detail/gemm_bf16.hpp). The
///    embedding, the head and the attention's own products stay in float. Float blocks only.
enum class matmul_precision { native, bf16 };

constexpr std::string_view to_string(matmul_precision p) noexcept {
  switch (p) {
    case matmul_precision::native: return "native";
    case matmul_precision::bf16: return "bf16";
  }
  return "unknown";
}

}  // namespace baton::nn

namespace baton::detail::nn {
// The text of a storage that is none of the enumerators, or empty when it is one.
inline std::string storage_problem(baton::nn::activation_storage s) {
  using baton::nn::activation_storage;
  if (s == activation_storage::native || s == activation_storage::bf16) return {};
  return "storage = " + std::to_string(static_cast<int>(s)) +
         " is not an activation storage; choose activation_storage::native or bf16";
}

// The text of a matmul precision that is none of the enumerators, or empty when it is one.
inline std::string matmul_problem(baton::nn::matmul_precision p) {
  using baton::nn::matmul_precision;
  if (p == matmul_precision::native || p == matmul_precision::bf16) return {};
  return "matmul = " + std::to_string(static_cast<int>(p)) +
         " is not a matmul precision; choose matmul_precision::native or bf16";
}

// The text of a recompute policy that is none of the enumerators (a cast from a bad
// integer), or empty when it is one.
inline std::string recompute_problem(baton::nn::recompute_policy p) {
  using baton::nn::recompute_policy;
  if (p == recompute_policy::none || p == recompute_policy::selective || p == recompute_policy::full) return {};
  return "recompute = " + std::to_string(static_cast<int>(p)) +
         " is not a recompute policy; choose recompute_policy::none, selective or full";
}
}  // namespace baton::detail::nn

namespace baton::nn {

/// The sizes of a Llama-style decoder-only transformer. Zero means "derive":
/// head_dim = d_model / heads; ffn_hidden = 8/3 d_model rounded up to a multiple of 64.
struct transformer_config {
  std::int64_t d_model = 512;
  std::int64_t heads = 8;
  std::int64_t kv_heads = 8;  ///< < heads: grouped-query attention; 1: multi-query
  std::int64_t head_dim = 0;
  std::int64_t ffn_hidden = 0;
  std::int64_t vocab = 256;
  double rope_base = 10000.0;
  double norm_eps = 1e-5;
  bool qkv_bias = false;
  /// What each block keeps for its backward (recompute_policy); one model-wide value here,
  /// per stage with lm_stage::set_recompute.
  recompute_policy recompute = recompute_policy::none;
  /// The element type of the activations each block keeps for its backward (activation_storage).
  activation_storage storage = activation_storage::native;
  /// The operands of the blocks' matrix products (matmul_precision; bf16 needs float blocks).
  matmul_precision matmul = matmul_precision::native;

  /// This config with head_dim and ffn_hidden derived; throws nn_error naming the field to
  /// change when the sizes do not fit together.
  transformer_config resolved() const {
    const auto fail = [](const std::string& what) { throw nn_error("baton::nn::transformer_config: " + what); };
    if (d_model < 1) fail("d_model = " + std::to_string(d_model) + " must be at least 1");
    if (heads < 1) fail("heads = " + std::to_string(heads) + " must be at least 1");
    if (kv_heads < 1) fail("kv_heads = " + std::to_string(kv_heads) + " must be at least 1");
    if (vocab < 1) fail("vocab = " + std::to_string(vocab) + " must be at least 1");
    if (heads % kv_heads != 0)
      fail("heads = " + std::to_string(heads) + " is not a multiple of kv_heads = " + std::to_string(kv_heads) +
           "; each key/value head serves heads / kv_heads query heads (choose kv_heads dividing heads)");
    transformer_config c = *this;
    if (c.head_dim == 0) {
      if (d_model % heads != 0)
        fail("d_model = " + std::to_string(d_model) + " is not divisible by heads = " + std::to_string(heads) +
             "; choose heads dividing d_model, or set head_dim explicitly");
      c.head_dim = d_model / heads;
    }
    if (c.head_dim < 2 || c.head_dim % 2 != 0)
      fail("head_dim = " + std::to_string(c.head_dim) + " must be even (rotary embedding rotates pairs of features)");
    if (c.ffn_hidden == 0) c.ffn_hidden = (8 * d_model / 3 + 63) / 64 * 64;
    if (c.ffn_hidden < 1) fail("ffn_hidden = " + std::to_string(c.ffn_hidden) + " must be at least 1");
    if (!(norm_eps > 0)) fail("norm_eps must be positive");
    if (!(rope_base > 1)) fail("rope_base must be > 1");
    if (std::string problem = detail::nn::recompute_problem(recompute); !problem.empty()) fail(problem);
    if (std::string problem = detail::nn::storage_problem(storage); !problem.empty()) fail(problem);
    if (std::string problem = detail::nn::matmul_problem(matmul); !problem.empty()) fail(problem);
    return c;
  }
};

}  // namespace baton::nn
