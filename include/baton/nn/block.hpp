// baton/nn/block.hpp — the pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.)).
#pragma once

#include <baton/attention/masks.hpp>
#include <baton/core/simd.hpp>
#include <baton/nn/attention.hpp>
#include <baton/nn/config.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/detail/storage.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/nn/rms_norm.hpp>
#include <baton/nn/sequence.hpp>
#include <baton/nn/swiglu.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/host_tensor.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton::detail::nn {
template <class T>
void add_into(host_tensor<T>& target, const host_tensor<T>& addend) {
  T* t = target.data();
  const T* a = addend.data();
  for (std::int64_t i = 0; i < target.size(); ++i) t[i] += a[i];
}
}  // namespace baton::detail::nn

namespace baton::nn {

/// A Llama-style decoder block on x [batch, seq, d_model]:
///   h = x + self_attention(rms_norm(x)),   y = h + swiglu_mlp(rms_norm(h)).
/// Parameters "attention_norm", "attention" (wq, wk, wv, wo), "mlp_norm", "mlp" (gate, up, down).
///
/// It is a pipeline stage as it stands (baton::split_backward_stage): input and output
/// host_tensor<T> [batch, seq, d_model], side input sequence_info, split backward. The attention
/// runs through `Strategy` (no_cp<Backend>, ring / Ulysses / hybrid attention) under `Mask`.
///
/// What forward keeps for the backward is the config's `recompute` (set_recompute changes it
/// for later forwards): none, selective or full (recompute_policy; docs/nn.md,
/// "Recomputation"). backward_input recomputes what the policy dropped and leaves the state
/// that `none` leaves, so backward_weight never recomputes; the gradients are bit for bit
/// those of `none`.
template <class T, class Strategy, class Mask = causal_mask>
class transformer_block
    : public detail::nn::piece<transformer_block<T, Strategy, Mask>, T, "baton::nn::transformer_block"> {
 public:
  using tensor = host_tensor<T>;
  using input = tensor;
  using output = tensor;
  using side = sequence_info;
  using attention_type = self_attention<T, Strategy, Mask>;

  /// One microbatch's state. After forward, by policy (bytes() counts every tensor held: in T,
  /// the LSE in lse_t<T>, positions in int64):
  ///  - none: the four pieces' states (norms: x̂, 1/rms; attention: its input, q, k, v, O,
  ///    LSE, positions; MLP: its input, gate, up, product);
  ///  - selective: the same less the attention's and the MLP's inputs (the norms' outputs)
  ///    and the product: 2 d_model + ffn_hidden values per token fewer;
  ///  - full: `input` and `positions` only (documents are shared with the caller's side
  ///    input, not counted).
  /// After backward_input, whatever the policy: the pieces' states as `none` leaves them
  /// (what backward_weight reads).
  struct saved : detail::nn::saved_state {
    /// The policy the forward kept this state under (the block's may change in between).
    recompute_policy policy = recompute_policy::none;
    /// Whether the forward kept it in bf16 (activation_storage::bf16): a recomputation keeps
    /// what it re-creates the same way.
    bool bf16 = false;
    typename rms_norm<T>::saved attention_norm;
    typename attention_type::saved attention;
    typename rms_norm<T>::saved mlp_norm;
    typename swiglu_mlp<T>::saved mlp;
    /// full: the block's input and side input, from which backward_input runs the forward again.
    tensor input;
    std::vector<std::int64_t> positions;
    std::shared_ptr<const host_tensor<std::int64_t>> documents;
    /// activation_storage::bf16: the float tensors above that the policy keeps (x̂ of both
    /// norms, the attention's and the MLP's inputs, gate, up, product; the input under full),
    /// in bf16 from the forward step that last reads each to the backward step that first
    /// does (slots: the block's `slot` enum). What a recomputation re-creates (full: all of
    /// none's state; selective: the MLP's input and the product) is packed the same way.
    detail::nn::bf16_pack<T, 8> packed;
    std::size_t bytes() const {
      return attention_norm.bytes() + attention.bytes() + mlp_norm.bytes() + mlp.bytes() + packed.bytes() +
             static_cast<std::size_t>(input.size()) * sizeof(T) + positions.size() * sizeof(std::int64_t);
    }
  };

  transformer_block(const transformer_config& config, const initializer& init, Strategy strategy, Mask mask = {})
      : config_(config.resolved()),
        attention_norm_(config_.d_model, config_.norm_eps),
        attention_(config_, init / "attention", std::move(strategy), std::move(mask)),
        mlp_norm_(config_.d_model, config_.norm_eps),
        mlp_(config_.d_model, config_.ffn_hidden, init / "mlp") {
    set_matmul(config_.matmul);
  }

  const transformer_config& config() const noexcept { return config_; }
  rms_norm<T>& attention_norm() noexcept { return attention_norm_; }
  attention_type& attention() noexcept { return attention_; }
  rms_norm<T>& mlp_norm() noexcept { return mlp_norm_; }
  swiglu_mlp<T>& mlp() noexcept { return mlp_; }

  /// The recompute policy of the next forwards.
  recompute_policy recompute() const noexcept { return config_.recompute; }
  /// Sets it for the forwards from now on; states already kept are backpropagated under the
  /// policy they were kept with. nn_error for a value that is no policy. Under context
  /// parallelism every rank of the group must use the same policy (a full recomputation makes
  /// collective calls the others would not).
  void set_recompute(recompute_policy policy) {
    if (std::string problem = detail::nn::recompute_problem(policy); !problem.empty())
      throw nn_error(std::string(transformer_block::name) + ": " + problem);
    config_.recompute = policy;
  }

  /// The element type of the activations the next forwards keep (activation_storage).
  activation_storage storage() const noexcept { return config_.storage; }
  /// Sets it for the forwards from now on; nn_error when the attention cannot take bf16
  /// (double blocks, or a backend without bf16 storage).
  void set_storage(activation_storage storage) {
    if (std::string problem = detail::nn::storage_problem(storage); !problem.empty())
      throw nn_error(std::string(transformer_block::name) + ": " + problem);
    attention_.set_storage(storage);
    config_.storage = storage;
  }

  /// The operands of the block's projections (attention's q, k, v, o; the MLP's gate, up,
  /// down) from now on (matmul_precision); nn_error for bf16 on double blocks.
  matmul_precision matmul() const noexcept { return config_.matmul; }
  void set_matmul(matmul_precision precision) {
    attention_.set_matmul(precision);
    mlp_.set_matmul(precision);
    config_.matmul = precision;
  }

  template <class Visit>
  void visit_parameters(Visit&& visit) {
    visit("attention_norm", attention_norm_);
    visit("attention", attention_);
    visit("mlp_norm", mlp_norm_);
    visit("mlp", mlp_);
  }

  // Every check runs before any computation, and a failure goes through the attention's
  // reject(): under context parallelism every rank of the group throws together instead of
  // one rank throwing while its peers wait inside the attention's collective.
  output forward(const input& x, const side& info, saved& st) {
    if (std::string problem = attention_.input_problem(x, info, transformer_block::name); !problem.empty())
      attention_.reject(problem, false);
    st.policy = config_.recompute;
    const bool bf16 = config_.storage == activation_storage::bf16;
    st.bf16 = bf16;
    if (st.policy == recompute_policy::full) {
      if (bf16)
        st.packed.held[input_slot] = detail::nn::to_bf16(x);
      else
        st.input = x;
      st.positions = info.positions;
      st.documents = info.documents;
    }
    return run_forward(x, info, st, st.policy, true, bf16 && st.policy != recompute_policy::full);
  }

  grad_t<input> backward_input(saved& st, const grad_t<output>& dy) { return backward_pieces(st, dy, false); }

  /// backward_input then backward_weight, one piece at a time (the MLP, its norm, the
  /// attention, its norm): each piece's weight gradients are made and its state freed before
  /// the next piece's backward_input, so the block never holds every piece's backward state at
  /// once — the MLP's (its input, product and the gate's and up's gradients, 3 ffn_hidden + 2
  /// d_model values a token) is gone before the attention's backward and its ring buffers
  /// (docs/memory.md). The same bits as backward_input then backward_weight: no piece reads
  /// another's weight gradients, and each weight gradient gets the same one addition.
  grad_t<input> backward(saved& st, const grad_t<output>& dy) {
    tensor dx = backward_pieces(st, dy, true);
    st = saved{};
    return dx;
  }

  void backward_weight(saved& st) {
    this->expect_input_done(st);
    mlp_weight(st);
    mlp_norm_.backward_weight(st.mlp_norm);
    attention_.backward_weight(st.attention);
    attention_norm_.backward_weight(st.attention_norm);
    st = saved{};
  }

 private:
  // bf16 storage (float blocks only: set_storage refuses it elsewhere).
  static constexpr bool takes_bf16 = std::is_same_v<T, float>;

  // bf16 storage's slots in saved::packed: which tensor each holds.
  enum slot : std::size_t {
    attention_norm_slot,  // attention_norm.x_hat
    attention_slot,       // attention.x
    mlp_norm_slot,        // mlp_norm.x_hat
    mlp_slot,             // mlp.x
    gate_slot,
    up_slot,
    product_slot,
    input_slot,  // the block's input (full)
  };

  // The MLP's weight gradients. bf16 storage keeps the MLP's input and the product packed from
  // the forward to here (they are read by nothing before), so between I and W they hold half
  // the bytes; widening them here or at the end of backward_input gives the same floats.
  void mlp_weight(saved& st) {
    st.packed.unpack(mlp_slot, st.mlp.x);
    st.packed.unpack(product_slot, st.mlp.product);
    mlp_.backward_weight(st.mlp);
  }

  // backward_input, and with `fused` each piece's backward_weight right after its
  // backward_input (backward): one code path, so the fused and the split backward compute the
  // same bits in the same order.
  tensor backward_pieces(saved& st, const tensor& dy, bool fused) {
    st.packed.unpack(input_slot, st.input);
    // Under full the group's first collective here is the recomputed forward: a rank that
    // rejects takes part in that one.
    if (std::string problem = grad_problem(st, dy); !problem.empty())
      attention_.reject(problem, st.policy != recompute_policy::full);
    if (st.policy == recompute_policy::full) {
      sequence_info info;
      info.positions = std::move(st.positions);
      info.documents = std::move(st.documents);
      const tensor x = std::move(st.input);
      st.positions = {};
      st.input = tensor();
      // Kept as none keeps it: under bf16 storage every tensor packed once the recomputation
      // has read it, widened before the step that first reads it, so the MLP's input and the
      // product wait for W in bf16 (and the rounding is the one none's forward makes).
      run_forward(x, info, st, recompute_policy::none, false, st.bf16);
    }
    // bf16 storage: each packed tensor is widened just before the first step that reads it
    // (unpack does nothing for a slot that holds nothing: native storage, or a dropped tensor).
    // Gate and up stay in bf16: the MLP's backward reads them widened.
    auto& p = st.packed;
    const bool gate_packed = p.held[gate_slot].size() > 0;
    if (st.policy == recompute_policy::selective) {
      p.unpack(mlp_norm_slot, st.mlp_norm.x_hat);
      st.mlp.x = mlp_norm_.output(st.mlp_norm);
      if (gate_packed) {  // read by W only: kept in bf16 as none's forward keeps them
        p.pack(mlp_slot, st.mlp.x);
        if constexpr (takes_bf16) p.held[product_slot] = mlp_.restore_product(p.held[gate_slot], p.held[up_slot]);
      } else {
        mlp_.restore_product(st.mlp);
      }
    }
    tensor d_mlp;
    if constexpr (takes_bf16) {
      if (gate_packed) {
        d_mlp = mlp_.backward_input(st.mlp, dy, std::move(p.held[gate_slot]), std::move(p.held[up_slot]));
      }
    }
    if (!gate_packed) d_mlp = mlp_.backward_input(st.mlp, dy);
    if (fused) mlp_weight(st);
    p.unpack(mlp_norm_slot, st.mlp_norm.x_hat);
    tensor dh = mlp_norm_.backward_input(st.mlp_norm, d_mlp);
    d_mlp = tensor();
    if (fused) mlp_norm_.backward_weight(st.mlp_norm);
    detail::nn::add_into(dh, dy);
    p.unpack(attention_norm_slot, st.attention_norm.x_hat);
    if (st.policy == recompute_policy::selective) st.attention.x = attention_norm_.output(st.attention_norm);
    p.unpack(attention_slot, st.attention.x);  // the attention's backward reads its input's shape
    tensor d_attention = attention_.backward_input(st.attention, dh);
    if (fused) attention_.backward_weight(st.attention);
    tensor dx = attention_norm_.backward_input(st.attention_norm, d_attention);
    d_attention = tensor();
    if (fused) attention_norm_.backward_weight(st.attention_norm);
    detail::nn::add_into(dx, dh);
    if (!fused) this->mark_input_done(st);
    return dx;
  }

  // The forward, keeping in `st` what `keep` says; without `with_output` (a recomputation)
  // it stops once the state is complete, before the MLP's output projection. With `pack`
  // (bf16 storage, none or selective) each kept tensor goes to bf16 in the loop that computes
  // it (the norms' x̂ and outputs, the MLP's gate, up and product) or as soon as the forward
  // has read it for the last time (q, k, v: self_attention), while it is in cache. The first
  // forward and the recomputation run this one function (never inlined: one machine code,
  // whatever the compiler fuses), so they compute the same bits.
  BATON_NEVER_INLINE tensor run_forward(const tensor& x, const side& info, saved& st, recompute_policy keep,
                                        bool with_output, bool pack) {
    // bf16 storage: each norm rounds x̂ to bf16 in its row loop (x̂ is never kept in float);
    // its output, where it is kept (the attention's or the MLP's input), is rounded once the
    // attention or the MLP has run: rounded in the row loop, its bf16 copy would be alive beside
    // the float one through the attention's forward, a d-wide tensor more at a recomputation's
    // largest moment (the same bits either way).
    tensor h = attention_.forward(forward_norm(attention_norm_, x, st.attention_norm, pack, attention_norm_slot,
                                               st.packed),
                                  info, st.attention);
    // The attention's input is the norm's output: selective recomputes it from x̂ and 1/rms.
    if (pack && keep == recompute_policy::none) st.packed.pack(attention_slot, st.attention.x);
    if (keep != recompute_policy::none) st.attention.x = tensor();
    if (keep == recompute_policy::full) {
      st.attention_norm = {};
      st.attention = {};
    }
    detail::nn::add_into(h, x);
    tensor normed = forward_norm(mlp_norm_, h, st.mlp_norm, pack, mlp_norm_slot, st.packed);
    // bf16 storage: the MLP writes gate, up and (when kept) the product in bf16 as it computes
    // the product; the float product is dropped once the down projection has read it.
    if (!with_output) {
      forward_mlp(std::move(normed), st, keep, pack, false);
      return tensor();
    }
    tensor y = forward_mlp(std::move(normed), st, keep, pack, true);
    if (keep != recompute_policy::none) {  // the MLP's input (the norm's output) and the product
      st.mlp.x = tensor();
      st.mlp.product = tensor();
    }
    if (keep == recompute_policy::full) {
      st.mlp_norm = {};
      st.mlp = {};
    }
    if (pack) st.packed.pack(mlp_slot, st.mlp.x);
    detail::nn::add_into(y, h);
    return y;
  }

  // A norm's forward; with `pack`, x̂ to bf16 in `x_hat_slot` (rounded in the norm's row loop).
  static tensor forward_norm(const rms_norm<T>& norm, const tensor& x, typename rms_norm<T>::saved& st, bool pack,
                             slot x_hat_slot, detail::nn::bf16_pack<T, 8>& packed) {
    if constexpr (takes_bf16) {
      if (pack) return norm.forward(x, st, {&packed.held[x_hat_slot], nullptr});
    }
    return norm.forward(x, st);
  }

  tensor forward_mlp(tensor&& normed, saved& st, recompute_policy keep, bool pack, bool with_output) const {
    if constexpr (takes_bf16) {
      if (pack) {
        auto& held = st.packed.held;
        const typename swiglu_mlp<T>::bf16_copies copies{
            &held[gate_slot], &held[up_slot], keep == recompute_policy::none ? &held[product_slot] : nullptr};
        tensor y;
        if (with_output)
          y = mlp_.forward(std::move(normed), st.mlp, copies);
        else
          mlp_.forward_state(std::move(normed), st.mlp, copies);
        if (keep == recompute_policy::none) st.mlp.product = tensor();
        if (!with_output) st.packed.pack(mlp_slot, st.mlp.x);
        return y;
      }
    }
    if (with_output) return mlp_.forward(std::move(normed), st.mlp);
    mlp_.forward_state(std::move(normed), st.mlp);
    return tensor();
  }

  // Empty when dy is a valid output gradient for `st`; else the message.
  std::string grad_problem(const saved& st, const tensor& dy) const {
    const std::string who(transformer_block::name);
    const bool full = st.policy == recompute_policy::full;
    // What has the input's shape in each policy's state, and whether it is a forward's state
    // that backward_input has not processed yet (backward_input frees q; full frees the input).
    // bf16 storage: x̂ may still be in its slot (backward_input widens it later).
    const auto& packed_x_hat = st.packed.held[attention_norm_slot];
    const std::vector<std::int64_t>& shape = full                      ? st.input.shape()
                                             : packed_x_hat.size() > 0 ? packed_x_hat.shape()
                                                                       : st.attention_norm.x_hat.shape();
    const bool live =
        full ? st.input.rank() == 3 : st.attention.q.size() + st.attention.q16.size() > 0 && shape.size() == 3;
    if (!live) return who + ": backward_input needs the saved state of a forward that has not been backpropagated yet";
    if (dy.shape() != shape)
      return who + ": dy has shape " + detail::core::shape_text(dy.shape()) + " but expected " +
             detail::core::shape_text(shape) + " (the output gradient has the input's shape)";
    return {};
  }

  transformer_config config_;
  rms_norm<T> attention_norm_;
  attention_type attention_;
  rms_norm<T> mlp_norm_;
  swiglu_mlp<T> mlp_;
};

}  // namespace baton::nn
