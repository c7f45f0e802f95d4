// baton/nn/cross_attention.hpp — cross-attention as a piece with split backward: queries from
// the decoder stream x, keys and values from a second sequence (an encoder's output, image
// tokens), one rank holding whole sequences or a context-parallel attention built for
// cross-attention (cp/cross.hpp) sharding each by its own layout.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/cp/cross.hpp>
#include <baton/cp/params.hpp>
#include <baton/nn/attention.hpp>
#include <baton/nn/config.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/error.hpp>
#include <baton/nn/linear.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/payload/host_tensor.hpp>

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace baton::nn {

/// A context-parallel attention object built for cross-attention: it knows the queries'
/// sharding, the keys' (kv()), and which shard this rank holds.
template <class S>
concept sharded_cross_attention = sharded_attention<S> && requires(const S& s) {
  { s.kv() } -> std::convertible_to<const kv_sharding&>;
};

/// Cross-attention: q = x Wq (x [batch, seq_q, d_model]), k = m Wk and v = m Wv (m the
/// memory, [batch, seq_k, memory_features]), attention of the queries to the memory's keys
/// under `Mask`, y = o Wo. No rotary embedding: queries and keys come from different
/// sequences, so their relative position means nothing (T5, Whisper). heads, kv_heads,
/// head_dim and qkv_bias come from the config. Parameters "wq", "wk", "wv", "wo".
///
/// `Strategy`: `no_cp<Backend>` (this rank holds whole sequences; masks see query i at
/// position i and key j at `kv_position_offset + j`), or ring_attention, ulysses_attention,
/// hybrid_attention built with a kv_sharding: x then holds this rank's query shard and m its
/// key shard, every rank of the group calls together, and the weight gradients are this
/// shard's part (sum them over the group).
///
/// As a piece: forward(x, memory, saved) -> y; backward_input(saved, dy) -> {dx, dmemory}
/// (it runs the attention backward); backward_weight(saved) (the four projections).
template <class T, class Strategy, class Mask = no_mask>
class cross_attention : public detail::nn::piece<cross_attention<T, Strategy, Mask>, T, "baton::nn::cross_attention"> {
  static_assert(detail::nn::is_no_cp<Strategy>::value || sharded_cross_attention<Strategy>,
                "baton::nn::cross_attention<T, Strategy>: Strategy must be baton::nn::no_cp<Backend> (whole "
                "sequences on this rank) or a context-parallel attention built for cross-attention "
                "(baton::ring_attention / ulysses_attention / hybrid_attention constructed with a baton::kv_sharding)");
  static_assert(attention_mask<Mask>,
                "baton::nn::cross_attention<T, Strategy, Mask>: Mask must model baton::attention_mask");

 public:
  using tensor = host_tensor<T>;
  using lse_tensor = host_tensor<lse_t<T>>;

  struct saved : detail::nn::saved_state {
    tensor x, memory, q, k, v, out, dy, dq, dk, dv;
    lse_tensor lse;
  };
  /// What backward_input returns: the gradients of x and of the memory.
  struct input_grads {
    tensor dx, dmemory;
  };

  /// `memory_features`: the memory's width (0: d_model). `kv_position_offset`: with no_cp,
  /// where the keys' positions start for the mask (a CP strategy takes it from its kv()).
  cross_attention(const transformer_config& config, const initializer& init, Strategy strategy, Mask mask = {},
                  std::int64_t memory_features = 0, std::int64_t kv_position_offset = 0)
      : config_(config.resolved()),
        mem_features_(memory_features > 0 ? memory_features : config_.d_model),
        wq_(config_.d_model, config_.heads * config_.head_dim, config_.qkv_bias, init / "wq"),
        wk_(mem_features_, config_.kv_heads * config_.head_dim, config_.qkv_bias, init / "wk"),
        wv_(mem_features_, config_.kv_heads * config_.head_dim, config_.qkv_bias, init / "wv"),
        wo_(config_.heads * config_.head_dim, config_.d_model, false, init / "wo"),
        strategy_(std::move(strategy)),
        mask_(std::move(mask)),
        kv_offset_(kv_position_offset) {}

  const transformer_config& config() const noexcept { return config_; }
  Strategy& strategy() noexcept { return strategy_; }
  linear<T>& wq() noexcept { return wq_; }
  linear<T>& wk() noexcept { return wk_; }
  linear<T>& wv() noexcept { return wv_; }
  linear<T>& wo() noexcept { return wo_; }
  /// The operands of the four projections from now on (matmul_precision).
  void set_matmul(matmul_precision precision) {
    for (linear<T>* l : {&wq_, &wk_, &wv_, &wo_}) l->set_matmul(precision);
  }

  template <class Visit>
  void visit_parameters(Visit&& visit) {
    visit("wq", wq_);
    visit("wk", wk_);
    visit("wv", wv_);
    visit("wo", wo_);
  }

  /// Empty when x and memory are a valid input on this rank; else the error's message.
  std::string input_problem(const tensor& x, const tensor& memory) const {
    const auto text = [](const std::string& what) { return std::string(cross_attention::name) + ": " + what; };
    if (x.rank() != 3 || x.shape()[2] != config_.d_model)
      return text("x has shape " + detail::core::shape_text(x.shape()) + " but expected [batch, seq_q, " +
                  std::to_string(config_.d_model) + "] (d_model)");
    if (memory.rank() != 3 || memory.shape()[0] != x.shape()[0] || memory.shape()[2] != mem_features_)
      return text("memory has shape " + detail::core::shape_text(memory.shape()) + " but expected [" +
                  std::to_string(x.shape()[0]) + ", seq_k, " + std::to_string(mem_features_) +
                  "] (x's batch, memory_features)");
    if constexpr (!detail::nn::is_no_cp<Strategy>::value) {
      const int shard = strategy_.shard_index();
      const std::int64_t nq = strategy_.sharding().local_len(shard), nk = strategy_.kv().sharding.local_len(shard);
      if (x.shape()[1] != nq || memory.shape()[1] != nk)
        return text("this rank (shard " + std::to_string(shard) + ") holds " + std::to_string(nq) + " queries and " +
                    std::to_string(nk) + " keys of the shardings, but x has " + std::to_string(x.shape()[1]) +
                    " rows and memory " + std::to_string(memory.shape()[1]) +
                    "; pass this rank's shards (shard_sequence with each sharding)");
    }
    return {};
  }

  tensor forward(const tensor& x, const tensor& memory, saved& st) {
    if (std::string problem = input_problem(x, memory); !problem.empty()) reject(problem, false);
    const std::int64_t b = x.shape()[0], nq = x.shape()[1], nk = memory.shape()[1];
    st.q = wq_.apply(x);
    st.k = wk_.apply(memory);
    st.v = wv_.apply(memory);
    st.out = tensor::for_overwrite({b, nq, config_.heads * config_.head_dim});
    st.lse = lse_tensor::for_overwrite({b, config_.heads, nq});
    attend_forward(view(st.q, b, nq, config_.heads), view(st.k, b, nk, config_.kv_heads),
                   view(st.v, b, nk, config_.kv_heads), mutable_view(st.out, b, nq, config_.heads),
                   make_tensor_view(st.lse.data(), std::array<std::int64_t, 3>{b, config_.heads, nq}), {});
    st.x = x;
    st.memory = memory;
    return wo_.apply(st.out);
  }

  input_grads backward_input(saved& st, const tensor& dy) {
    if (st.q.rank() != 3 || dy.shape() != st.x.shape())
      reject(std::string(cross_attention::name) + ": backward_input needs the saved state of a forward not yet "
                 "backpropagated and dy of x's shape " + detail::core::shape_text(st.x.shape()) + " (dy has " +
                 detail::core::shape_text(dy.shape()) + ")",
             true);
    const std::int64_t b = st.x.shape()[0], nq = st.x.shape()[1], nk = st.memory.shape()[1];
    const std::int64_t hq = config_.heads, hkv = config_.kv_heads;
    const tensor dout = wo_.input_grad(dy);
    st.dq = tensor::for_overwrite({b, nq, hq * config_.head_dim});
    st.dk = tensor::for_overwrite({b, nk, hkv * config_.head_dim});
    st.dv = tensor::for_overwrite({b, nk, hkv * config_.head_dim});
    attend_backward(view(st.q, b, nq, hq), view(st.k, b, nk, hkv), view(st.v, b, nk, hkv), view(st.out, b, nq, hq),
                    make_tensor_view(static_cast<const lse_t<T>*>(st.lse.data()), std::array<std::int64_t, 3>{b, hq, nq}),
                    view(dout, b, nq, hq), mutable_view(st.dq, b, nq, hq), mutable_view(st.dk, b, nk, hkv),
                    mutable_view(st.dv, b, nk, hkv), {});
    input_grads g{wq_.input_grad(st.dq), wk_.input_grad(st.dk)};
    wv_.add_input_grad(st.dv, g.dmemory, true);
    st.dy = dy;
    st.q = tensor();
    st.k = tensor();
    st.v = tensor();
    st.lse = lse_tensor();
    this->mark_input_done(st);
    return g;
  }

  void backward_weight(saved& st) {
    this->expect_input_done(st);
    wq_.add_weight_grad(st.x, st.dq);
    wk_.add_weight_grad(st.memory, st.dk);
    wv_.add_weight_grad(st.memory, st.dv);
    wo_.add_weight_grad(st.out, st.dy);
    st = saved{};
  }

 private:
  // A bad input: nn_error with no_cp; with a CP strategy, collective (the attention call the
  // other ranks are making carries the problem, and every rank throws the same cp_error).
  [[noreturn]] void reject(const std::string& problem, bool backward) {
    if constexpr (!detail::nn::is_no_cp<Strategy>::value) {
      cp_params params;
      params.caller_problem = problem;
      const tensor_view<T, 4> none{};
      const tensor_view<lse_t<T>, 3> no_lse{};
      if (backward)
        attend_backward(none, none, none, none, no_lse, none, none, none, none, params);
      else
        attend_forward(none, none, none, none, no_lse, params);
    }
    throw nn_error(problem);
  }

  attention_params one_rank_params(std::int64_t nk) const {
    attention_params p;
    p.k_pos = positions(kv_offset_, nk);
    return p;
  }

  void attend_forward(tensor_view<const T, 4> q, tensor_view<const T, 4> k, tensor_view<const T, 4> v,
                      tensor_view<T, 4> out, tensor_view<lse_t<T>, 3> lse, const cp_params& params) {
    if constexpr (detail::nn::is_no_cp<Strategy>::value)
      strategy_.backend().forward(q, k, v, mask_, out, lse, one_rank_params(k.extent(1)));
    else
      strategy_.forward(q, k, v, mask_, out, lse, params);
  }
  void attend_backward(tensor_view<const T, 4> q, tensor_view<const T, 4> k, tensor_view<const T, 4> v,
                       tensor_view<const T, 4> out, tensor_view<const lse_t<T>, 3> lse, tensor_view<const T, 4> dout,
                       tensor_view<T, 4> dq, tensor_view<T, 4> dk, tensor_view<T, 4> dv, const cp_params& params) {
    if constexpr (detail::nn::is_no_cp<Strategy>::value)
      strategy_.backend().backward(q, k, v, out, lse, dout, mask_, dq, dk, dv, one_rank_params(k.extent(1)));
    else
      strategy_.backward(q, k, v, out, lse, dout, mask_, dq, dk, dv, params);
  }

  // A [batch, seq, heads * head_dim] tensor as [batch, seq, heads, head_dim].
  tensor_view<const T, 4> view(const tensor& t, std::int64_t b, std::int64_t n, std::int64_t heads) const {
    return make_tensor_view(t.data(), std::array<std::int64_t, 4>{b, n, heads, config_.head_dim});
  }
  tensor_view<T, 4> mutable_view(tensor& t, std::int64_t b, std::int64_t n, std::int64_t heads) const {
    return make_tensor_view(t.data(), std::array<std::int64_t, 4>{b, n, heads, config_.head_dim});
  }

  transformer_config config_;
  std::int64_t mem_features_;
  linear<T> wq_, wk_, wv_, wo_;
  Strategy strategy_;
  Mask mask_;
  std::int64_t kv_offset_;
};

}  // namespace baton::nn
