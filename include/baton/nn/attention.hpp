// baton/nn/attention.hpp — self-attention with grouped-query heads, RoPE from global
// positions, and the attention itself computed by a strategy chosen as a template argument:
// no_cp<Backend> on one rank, or ring / Ulysses / hybrid attention across a context-parallel
// group. The same block type thereby runs unsharded or sharded, with any backend.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/core/float16.hpp>
#include <baton/core/sizes.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/params.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/nn/config.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/detail/storage.hpp>
#include <baton/nn/linear.hpp>
#include <baton/nn/parameter.hpp>
#include <baton/nn/rotary.hpp>
#include <baton/nn/sequence.hpp>
#include <baton/payload/host_tensor.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton::nn {

/// The attention strategy "no context parallelism": this rank holds whole sequences and runs
/// `Backend` (reference_attention, kokkos_attention, ...) on them, with the positions of the
/// side input.
template <class Backend>
class no_cp {
 public:
  using backend_type = Backend;

  no_cp() = default;
  explicit no_cp(Backend backend) : backend_(std::move(backend)) {}

  Backend& backend() noexcept { return backend_; }

  template <class T, class Mask>
  void forward(tensor_view<const T, 4> q, tensor_view<const T, 4> k, tensor_view<const T, 4> v, const Mask& mask,
               tensor_view<T, 4> out, tensor_view<lse_t<T>, 3> lse, std::span<const std::int64_t> positions,
               double softmax_scale) {
    backend_.forward(q, k, v, mask, out, lse, params(positions, softmax_scale));
  }

  template <class T, class Mask>
  void backward(tensor_view<const T, 4> q, tensor_view<const T, 4> k, tensor_view<const T, 4> v,
                tensor_view<const T, 4> out, tensor_view<const lse_t<T>, 3> lse, tensor_view<const T, 4> dout,
                const Mask& mask, tensor_view<T, 4> dq, tensor_view<T, 4> dk, tensor_view<T, 4> dv,
                std::span<const std::int64_t> positions, double softmax_scale) {
    backend_.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, params(positions, softmax_scale));
  }

 private:
  static attention_params params(std::span<const std::int64_t> positions, double softmax_scale) {
    attention_params p;
    p.q_pos = p.k_pos = baton::positions::list(positions);
    p.softmax_scale = softmax_scale;
    return p;
  }

  Backend backend_{};
};

/// A context-parallel attention object (ring_attention, ulysses_attention, hybrid_attention):
/// it knows its sequence_sharding and which shard this rank holds.
template <class S>
concept sharded_attention = requires(const S& s) {
  { s.sharding() } -> std::convertible_to<const sequence_sharding&>;
  { s.shard_index() } -> std::convertible_to<int>;
};

/// A strategy that decides at run time whether it is sharded (baton::nn::cp_attention):
/// `s.sharding()` returns a `const sequence_sharding*` (null when this rank holds whole
/// sequences), and forward / backward take the side input's positions and the cp_params.
template <class S>
concept runtime_attention_strategy = requires(const S& s) {
  { s.sharding() } -> std::same_as<const sequence_sharding*>;
  { s.shard_index() } -> std::convertible_to<int>;
};

}  // namespace baton::nn

namespace baton::detail::nn {

template <class S>
using is_no_cp = is_instance_of<S, baton::nn::no_cp>;

template <class S, class T>
constexpr bool no_cp_backend_fits() {
  if constexpr (is_no_cp<S>::value) {
    return attention_backend<typename S::backend_type, T>;
  } else {
    return true;
  }
}

// The sharding a strategy computes over; null when this rank holds whole sequences.
template <class S>
const sequence_sharding* sharding_of(const S& s) {
  if constexpr (is_no_cp<S>::value) {
    return nullptr;
  } else if constexpr (baton::nn::sharded_attention<S>) {
    return &s.sharding();
  } else {
    return s.sharding();
  }
}

// Whether a strategy's backend takes bf16 storage (attention_backend<Backend, bfloat16>): the
// condition of activation_storage::bf16, whose attention runs in bf16.
template <class S>
constexpr bool strategy_takes_bf16() {
  if constexpr (requires { typename S::backend_type; }) {
    return backend_stores_bfloat16<typename S::backend_type>;
  } else {
    return false;
  }
}

template <class S>
int shard_index_of(const S& s) {
  if constexpr (is_no_cp<S>::value) {
    return 0;
  } else {
    return s.shard_index();
  }
}

}  // namespace baton::detail::nn

namespace baton::nn {

/// What the attention layers accept as their Strategy: no_cp<Backend>, a context-parallel
/// attention object, or a strategy chosen at run time (cp_attention).
template <class S>
concept attention_strategy = detail::nn::is_no_cp<S>::value || sharded_attention<S> || runtime_attention_strategy<S>;

/// Self-attention on x [batch, seq, d_model] (already normalised): q = x Wq, k = x Wk,
/// v = x Wv (heads, kv_heads and head_dim of the config; kv_heads < heads is GQA), RoPE on q
/// and k by the side input's global positions, attention under `Mask` (and, when the side
/// input carries document ids, only within each query's document), y = o Wo.
/// Parameters "wq", "wk", "wv", "wo" (linear layers; biases on q, k, v with qkv_bias).
///
/// `Strategy` computes the attention: `no_cp<Backend>`, or `ring_attention<Comm, Backend>`,
/// `ulysses_attention<Comm, Backend>`, `hybrid_attention<...>` built for this rank. Under
/// context parallelism x holds this rank's shard of the sequence, the side input its global
/// positions (sequence_info::shard(attention.sharding(), attention.shard_index())), and every
/// rank of the group calls forward / backward together; weight gradients are this shard's
/// part (sum them over the group: all_reduce_gradients).
///
/// As a piece: forward(x, info, saved), backward_input(saved, dy) -> dx (it runs the
/// attention backward), backward_weight(saved) (the four projections' weight gradients).
template <class T, class Strategy, class Mask = causal_mask>
class self_attention : public detail::nn::piece<self_attention<T, Strategy, Mask>, T, "baton::nn::self_attention"> {
  static_assert(attention_strategy<Strategy>,
                "baton::nn::self_attention<T, Strategy>: Strategy must be baton::nn::no_cp<Backend> (one rank "
                "holds whole sequences), a context-parallel attention object built for this rank "
                "(baton::ring_attention, baton::ulysses_attention, baton::hybrid_attention) or a "
                "baton::nn::cp_attention choosing one of them at run time");
  static_assert(!detail::nn::is_no_cp<Strategy>::value || detail::nn::no_cp_backend_fits<Strategy, T>(),
                "baton::nn::no_cp<Backend>: Backend must model baton::attention_backend<Backend, T> for the "
                "block's element type (baton::reference_attention, baton::kokkos_attention, ...)");
  static_assert(attention_mask<Mask>,
                "baton::nn::self_attention<T, Strategy, Mask>: Mask must model baton::attention_mask "
                "(allowed(q_pos, k_pos) and classify(q_block, k_block); see baton/attention/masks.hpp)");

 public:
  using tensor = host_tensor<T>;
  using lse_tensor = host_tensor<lse_t<T>>;
  using strategy_type = Strategy;
  using mask_type = Mask;

  struct saved : detail::nn::saved_state {
    tensor x, q, k, v, out, dy, dq, dk, dv;
    lse_tensor lse;
    /// activation_storage::bf16: q, k, v and O in bf16 (q, k, v and out above stay empty).
    host_tensor<bfloat16> q16, k16, v16, out16;
    std::vector<std::int64_t> positions;
    std::shared_ptr<const host_tensor<std::int64_t>> documents;
    std::size_t bytes() const {
      return static_cast<std::size_t>(x.size() + q.size() + k.size() + v.size() + out.size() + dy.size() +
                                      dq.size() + dk.size() + dv.size()) *
                 sizeof(T) +
             static_cast<std::size_t>(q16.size() + k16.size() + v16.size() + out16.size()) * sizeof(bfloat16) +
             static_cast<std::size_t>(lse.size()) * sizeof(lse_t<T>) + positions.size() * sizeof(std::int64_t);
    }
  };

  /// Whether this attention can keep its activations in bf16 (activation_storage::bf16): float
  /// blocks over a backend that takes bfloat16 storage.
  static constexpr bool takes_bf16 = std::is_same_v<T, float> && detail::nn::strategy_takes_bf16<Strategy>();

  self_attention(const transformer_config& config, const initializer& init, Strategy strategy, Mask mask = {})
      : config_(config.resolved()),
        wq_(config_.d_model, config_.heads * config_.head_dim, config_.qkv_bias, init / "wq"),
        wk_(config_.d_model, config_.kv_heads * config_.head_dim, config_.qkv_bias, init / "wk"),
        wv_(config_.d_model, config_.kv_heads * config_.head_dim, config_.qkv_bias, init / "wv"),
        wo_(config_.heads * config_.head_dim, config_.d_model, false, init / "wo"),
        rope_(config_.head_dim, config_.rope_base),
        strategy_(std::move(strategy)),
        mask_(std::move(mask)) {
    check_storage(config_.storage);
  }

  /// nn_error unless this attention can keep its activations in `storage`.
  static void check_storage(activation_storage storage) {
    if (storage == activation_storage::bf16 && !takes_bf16)
      throw nn_error(std::string(self_attention::name) +
                     ": storage bf16 keeps q, k, v and O in baton::bfloat16 and runs the attention on them, which "
                     "needs float blocks and an attention backend that takes bfloat16 (baton::kokkos_attention); " +
                     (std::is_same_v<T, float> ? "this strategy's backend computes in float or double only"
                                               : "this block's element type is not float") +
                     ": use activation_storage::native, or a bf16 backend");
  }
  /// The operands of the four projections from now on (matmul_precision; the attention's own
  /// products are the strategy's).
  void set_matmul(matmul_precision precision) {
    for (linear<T>* l : {&wq_, &wk_, &wv_, &wo_}) l->set_matmul(precision);
  }
  /// The storage of the next forwards (states already kept are backpropagated as they were kept).
  void set_storage(activation_storage storage) {
    check_storage(storage);
    config_.storage = storage;
  }

  const transformer_config& config() const noexcept { return config_; }
  Strategy& strategy() noexcept { return strategy_; }
  const Mask& mask() const noexcept { return mask_; }
  linear<T>& wq() noexcept { return wq_; }
  linear<T>& wk() noexcept { return wk_; }
  linear<T>& wv() noexcept { return wv_; }
  linear<T>& wo() noexcept { return wo_; }

  template <class Visit>
  void visit_parameters(Visit&& visit) {
    visit("wq", wq_);
    visit("wk", wk_);
    visit("wv", wv_);
    visit("wo", wo_);
  }

  /// Empty when x [batch, seq, d_model] and the side input are a valid input of forward on
  /// this rank; otherwise the message of the error, naming `who` (the piece it belongs to).
  std::string input_problem(const tensor& x, const sequence_info& info, std::string_view who) const {
    const std::int64_t d_model = config_.d_model;
    if (x.rank() != 3 || x.shape()[2] != d_model)
      return problem_text(who, "input has shape " + detail::core::shape_text(x.shape()) + " but expected [batch, seq, " +
                                   std::to_string(d_model) + "] (d_model = " + std::to_string(d_model) + ")");
    const std::int64_t batch = x.shape()[0], seq = x.shape()[1];
    std::string shard_hint;
    const sequence_sharding* sharded = detail::nn::sharding_of(strategy_);
    if (sharded) {
      const sequence_sharding& sharding = *sharded;
      const int shard = detail::nn::shard_index_of(strategy_);
      const std::int64_t local_len = sharding.local_len(shard);
      if (seq != local_len)
        return problem_text(who, "the input holds " + std::to_string(seq) + " tokens of the sequence but the "
                                 "context-parallel sharding (" + std::string(to_string(sharding.layout())) + ", " +
                                 std::to_string(sharding.seq_len()) + " tokens over " + std::to_string(sharding.ranks()) +
                                 " ranks) gives this rank (shard " + std::to_string(shard) + ") " + std::to_string(local_len) + " tokens" +
                                 "; expected input [batch, " + std::to_string(local_len) + ", " +
                                 std::to_string(d_model) + "], this rank's shard of the sequence");
      shard_hint = "; build it with sequence_info::shard(sharding, " + std::to_string(shard) + ")";
    } else {
      shard_hint = " (sequence_info::whole(" + std::to_string(seq) + ") for a whole sequence)";
    }
    const auto n = static_cast<std::int64_t>(info.positions.size());
    if (n == 0)
      return problem_text(who, "the side input holds no positions; expected [" + std::to_string(seq) +
                                   "] global positions, one per row of the input's sequence axis" + shard_hint);
    if (n != seq)
      return problem_text(who, "the side input holds " + std::to_string(n) + " positions but the input's sequence axis has " +
                                   std::to_string(seq) + " rows; expected positions of shape [" + std::to_string(seq) + "]" +
                                   shard_hint);
    std::int64_t seq_len = 0;  // the global length the document ids must cover
    if (sharded) {
      const sequence_sharding& sharding = *sharded;
      const int shard = detail::nn::shard_index_of(strategy_);
      const std::vector<std::int64_t> mine = sharding.global_positions(shard);
      for (std::size_t i = 0; i < mine.size(); ++i)
        if (mine[i] != info.positions[i])
          return problem_text(who, "the side input's position " + std::to_string(i) + " is " +
                                       std::to_string(info.positions[i]) + " but this rank's shard (" +
                                       std::to_string(shard) + " of the " +
                                       std::string(to_string(sharding.layout())) + " sharding) holds position " +
                                       std::to_string(mine[i]) + " there" + shard_hint);
      seq_len = sharding.seq_len();
    } else {
      for (std::int64_t p : info.positions) {
        if (p < 0) return problem_text(who, "the side input holds the negative position " + std::to_string(p));
        seq_len = std::max(seq_len, p + 1);
      }
    }
    if (info.documents) {
      const auto& ids = *info.documents;
      if (ids.rank() != 2 || ids.shape()[0] != batch || ids.shape()[1] < seq_len)
        return problem_text(who, "the side input's document ids have shape " + detail::core::shape_text(ids.shape()) +
                                     " but expected [" + std::to_string(batch) + ", " + std::to_string(seq_len) +
                                     "] (one row per batch row, one id per global position of the sequence)");
    }
    return {};
  }

  /// Fails a call whose input has `problem` on this rank. With no_cp it throws nn_error; with
  /// a context-parallel strategy it is collective: it takes part in the attention call the
  /// other ranks of the group are making (forward or backward) and every rank throws the same
  /// cp_error carrying the problem, so no peer is left waiting for this rank's data.
  [[noreturn]] void reject(const std::string& problem, bool backward) {
    if (detail::nn::sharding_of(strategy_) != nullptr) {
      cp_params params;
      params.caller_problem = problem;
      const tensor_view<T, 4> none{};
      const tensor_view<lse_t<T>, 3> no_lse{};
      if (backward) {
        strategy_backward<Mask, T>(none, none, none, none, no_lse, none, mask_, none, none, none, {}, params);
      } else {
        strategy_forward<Mask, T>(none, none, none, mask_, none, no_lse, {}, params);
      }
    }
    throw nn_error(problem);  // no_cp, or (never) a strategy that accepted a caller problem
  }

  /// Empty when dy is a valid output gradient for the saved state st; else the message.
  std::string grad_problem(const saved& st, const tensor& dy, std::string_view who) const {
    const std::int64_t q_size = st.x.rank() == 3 ? st.x.shape()[0] * st.x.shape()[1] * config_.heads * config_.head_dim : -1;
    if (st.q.size() + st.q16.size() != q_size || q_size < 0)
      return problem_text(who, "backward_input needs the saved state of a forward that has not been backpropagated yet");
    if (dy.shape() != st.x.shape())
      return problem_text(who, "dy has shape " + detail::core::shape_text(dy.shape()) + " but expected " +
                                   detail::core::shape_text(st.x.shape()) + " (the output gradient has the input's shape)");
    return {};
  }

  tensor forward(const tensor& x, const sequence_info& info, saved& st) { return forward(tensor(x), info, st); }

  tensor forward(tensor&& x, const sequence_info& info, saved& st) {
    if (std::string problem = input_problem(x, info, self_attention::name); !problem.empty()) reject(problem, false);
    const std::int64_t batch = x.shape()[0], seq = x.shape()[1];
    const std::int64_t hq = config_.heads, hkv = config_.kv_heads, d = config_.head_dim;

    st.q = wq_.apply(x);
    st.k = wk_.apply(x);
    st.v = wv_.apply(x);
    const std::vector<T>& rotation = rope_.table(info.positions);  // one table for q and k
    st.lse = lse_tensor::for_overwrite({batch, hq, seq});
    st.positions = info.positions;
    st.documents = info.documents;
    if constexpr (takes_bf16) {
      if (config_.storage == activation_storage::bf16) return forward_bf16(std::move(x), st, rotation);
    }
    rope_.apply(st.q.data(), batch, seq, hq, rotation, false);
    rope_.apply(st.k.data(), batch, seq, hkv, rotation, false);
    st.out = tensor::for_overwrite({batch, seq, hq * d});

    for_each_mask(st, batch, [&](std::int64_t b0, std::int64_t rows, const auto& mask) {
      strategy_forward(view(st.q, b0, rows, seq, hq), view(st.k, b0, rows, seq, hkv), view(st.v, b0, rows, seq, hkv),
                       mask, mutable_view(st.out, b0, rows, seq, hq), lse_view(st.lse, b0, rows, seq), st.positions);
    });
    st.x = std::move(x);
    return wo_.apply(st.out);
  }

  tensor backward_input(saved& st, const tensor& dy) {
    if (std::string problem = grad_problem(st, dy, self_attention::name); !problem.empty()) reject(problem, true);
    const std::int64_t hq = config_.heads, hkv = config_.kv_heads, d = config_.head_dim;
    const std::int64_t batch = st.x.shape()[0], seq = st.x.shape()[1];
    const tensor dout = wo_.input_grad(dy);
    if constexpr (takes_bf16) {
      if (st.q16.size() > 0) return backward_input_bf16(st, dy, dout);
    }
    st.dq = tensor::for_overwrite({batch, seq, hq * d});
    st.dk = tensor::for_overwrite({batch, seq, hkv * d});
    st.dv = tensor::for_overwrite({batch, seq, hkv * d});
    for_each_mask(st, batch, [&](std::int64_t b0, std::int64_t rows, const auto& mask) {
      strategy_backward(view(st.q, b0, rows, seq, hq), view(st.k, b0, rows, seq, hkv), view(st.v, b0, rows, seq, hkv),
                        view(st.out, b0, rows, seq, hq), const_lse_view(st.lse, b0, rows, seq),
                        view(dout, b0, rows, seq, hq), mask, mutable_view(st.dq, b0, rows, seq, hq),
                        mutable_view(st.dk, b0, rows, seq, hkv), mutable_view(st.dv, b0, rows, seq, hkv),
                        st.positions);
    });
    return finish_backward_input(st, dy);
  }

  void backward_weight(saved& st) {
    this->expect_input_done(st);
    wq_.add_weight_grad(st.x, st.dq);
    wk_.add_weight_grad(st.x, st.dk);
    wv_.add_weight_grad(st.x, st.dv);
    if (st.out16.size() > 0)
      wo_.add_weight_grad(detail::nn::widened<T>(st.out16), st.dy);
    else
      wo_.add_weight_grad(st.out, st.dy);
    st = saved{};
  }

 private:
  // bf16 storage: q and k rotated by RoPE straight into bf16, v rounded, the attention on them
  // (bf16 K/V blocks around a ring), O kept in bf16 and widened for the output projection.
  tensor forward_bf16(tensor&& x, saved& st, const std::vector<T>& rotation) {
    const std::int64_t batch = x.shape()[0], seq = x.shape()[1];
    const std::int64_t hq = config_.heads, hkv = config_.kv_heads;
    st.q16 = host_tensor<bfloat16>::for_overwrite(st.q.shape());
    st.k16 = host_tensor<bfloat16>::for_overwrite(st.k.shape());
    rope_.apply(std::as_const(st.q).data(), st.q16.data(), batch, seq, hq, rotation, false);
    rope_.apply(std::as_const(st.k).data(), st.k16.data(), batch, seq, hkv, rotation, false);
    st.v16 = detail::nn::to_bf16(st.v);
    st.q = tensor();
    st.k = tensor();
    st.v = tensor();
    st.out16 = host_tensor<bfloat16>::for_overwrite({batch, seq, hq * config_.head_dim});
    for_each_mask(st, batch, [&](std::int64_t b0, std::int64_t rows, const auto& mask) {
      strategy_forward(view(st.q16, b0, rows, seq, hq), view(st.k16, b0, rows, seq, hkv),
                       view(st.v16, b0, rows, seq, hkv), mask, mutable_view(st.out16, b0, rows, seq, hq),
                       lse_view(st.lse, b0, rows, seq), st.positions);
    });
    st.x = std::move(x);
    return wo_.apply(detail::nn::widened<T>(st.out16));
  }

  // bf16 storage: dO rounded to bf16, the attention backward in bf16 storage (fp32 sums inside),
  // dq and dk widened by RoPE's backward as it rotates them back, dv widened, for the
  // projections' gradients.
  tensor backward_input_bf16(saved& st, const tensor& dy, const tensor& dout) {
    const std::int64_t hq = config_.heads, hkv = config_.kv_heads, d = config_.head_dim;
    const std::int64_t batch = st.x.shape()[0], seq = st.x.shape()[1];
    const host_tensor<bfloat16> dout16 = detail::nn::to_bf16(dout);
    auto dq16 = host_tensor<bfloat16>::for_overwrite({batch, seq, hq * d});
    auto dk16 = host_tensor<bfloat16>::for_overwrite({batch, seq, hkv * d});
    auto dv16 = host_tensor<bfloat16>::for_overwrite({batch, seq, hkv * d});
    for_each_mask(st, batch, [&](std::int64_t b0, std::int64_t rows, const auto& mask) {
      strategy_backward(view(st.q16, b0, rows, seq, hq), view(st.k16, b0, rows, seq, hkv),
                        view(st.v16, b0, rows, seq, hkv), view(st.out16, b0, rows, seq, hq),
                        const_lse_view(st.lse, b0, rows, seq), view(dout16, b0, rows, seq, hq), mask,
                        mutable_view(dq16, b0, rows, seq, hq), mutable_view(dk16, b0, rows, seq, hkv),
                        mutable_view(dv16, b0, rows, seq, hkv), st.positions);
    });
    {
      const std::vector<T>& rotation = rope_.table(st.positions);
      st.dq = tensor::for_overwrite(dq16.shape());
      st.dk = tensor::for_overwrite(dk16.shape());
      rope_.apply(std::as_const(dq16).data(), st.dq.data(), batch, seq, hq, rotation, true);
      rope_.apply(std::as_const(dk16).data(), st.dk.data(), batch, seq, hkv, rotation, true);
    }
    st.dv = detail::nn::widened<T>(dv16);
    st.q16 = host_tensor<bfloat16>();
    st.k16 = host_tensor<bfloat16>();
    st.v16 = host_tensor<bfloat16>();
    return finish_backward_input(st, dy, true);
  }

  // RoPE's backward (unless `rotated`: done already) and the projections' input gradients,
  // from st.dq, st.dk, st.dv.
  tensor finish_backward_input(saved& st, const tensor& dy, bool rotated = false) {
    const std::int64_t hq = config_.heads, hkv = config_.kv_heads;
    const std::int64_t batch = st.x.shape()[0], seq = st.x.shape()[1];
    // RoPE is a rotation: its backward rotates the gradient back.
    if (!rotated) {
      const std::vector<T>& rotation = rope_.table(st.positions);
      rope_.apply(st.dq.data(), batch, seq, hq, rotation, true);
      rope_.apply(st.dk.data(), batch, seq, hkv, rotation, true);
    }
    tensor dx = wq_.input_grad(st.dq);
    wk_.add_input_grad(st.dk, dx, true);
    wv_.add_input_grad(st.dv, dx, true);
    st.dy = dy;
    st.q = tensor();  // the weight gradients need x, out and the gradients only
    st.k = tensor();
    st.v = tensor();
    st.lse = lse_tensor();
    this->mark_input_done(st);
    return dx;
  }


  static std::string problem_text(std::string_view who, const std::string& what) {
    std::string text(who);
    text += ": ";
    text += what;
    return text;
  }

  // Calls f(first_row, rows, mask): once for the whole batch, or once per batch row with that
  // row's documents intersected with Mask.
  template <class F>
  void for_each_mask(const saved& st, std::int64_t batch, F&& f) const {
    if (!st.documents) {
      f(std::int64_t{0}, batch, mask_);
      return;
    }
    const auto& ids = *st.documents;
    const std::int64_t len = ids.shape()[1];
    for (std::int64_t b = 0; b < batch; ++b) {
      const auto mask = intersect(document_mask(std::vector<std::int64_t>(ids.data() + b * len, ids.data() + (b + 1) * len)), mask_);
      f(b, std::int64_t{1}, mask);
    }
  }

  template <class Mask2, class E = T>
  void strategy_forward(tensor_view<const E, 4> q, tensor_view<const E, 4> k, tensor_view<const E, 4> v,
                        const Mask2& mask, tensor_view<E, 4> out, tensor_view<lse_t<E>, 3> lse,
                        std::span<const std::int64_t> positions, const cp_params& params = {}) {
    if constexpr (detail::nn::is_no_cp<Strategy>::value) {
      strategy_.forward(q, k, v, mask, out, lse, positions, params.softmax_scale);
    } else if constexpr (sharded_attention<Strategy>) {
      strategy_.forward(q, k, v, mask, out, lse, params);
    } else {
      strategy_.forward(q, k, v, mask, out, lse, positions, params);
    }
  }

  template <class Mask2, class E = T>
  void strategy_backward(tensor_view<const E, 4> q, tensor_view<const E, 4> k, tensor_view<const E, 4> v,
                         tensor_view<const E, 4> out, tensor_view<const lse_t<E>, 3> lse, tensor_view<const E, 4> dout,
                         const Mask2& mask, tensor_view<E, 4> dq, tensor_view<E, 4> dk, tensor_view<E, 4> dv,
                         std::span<const std::int64_t> positions, const cp_params& params = {}) {
    if constexpr (detail::nn::is_no_cp<Strategy>::value) {
      strategy_.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, positions, params.softmax_scale);
    } else if constexpr (sharded_attention<Strategy>) {
      strategy_.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, params);
    } else {
      strategy_.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, positions, params);
    }
  }

  // Rows [b0, b0 + rows) of a [batch, seq, heads * head_dim] tensor as [rows, seq, heads, head_dim].
  template <class E>
  tensor_view<const E, 4> view(const host_tensor<E>& t, std::int64_t b0, std::int64_t rows, std::int64_t seq,
                               std::int64_t heads) const {
    return make_tensor_view(t.data() + b0 * seq * heads * config_.head_dim,
                            std::array<std::int64_t, 4>{rows, seq, heads, config_.head_dim});
  }
  template <class E>
  tensor_view<E, 4> mutable_view(host_tensor<E>& t, std::int64_t b0, std::int64_t rows, std::int64_t seq,
                                 std::int64_t heads) const {
    return make_tensor_view(t.data() + b0 * seq * heads * config_.head_dim,
                            std::array<std::int64_t, 4>{rows, seq, heads, config_.head_dim});
  }
  tensor_view<lse_t<T>, 3> lse_view(lse_tensor& t, std::int64_t b0, std::int64_t rows, std::int64_t seq) const {
    return make_tensor_view(t.data() + b0 * config_.heads * seq, std::array<std::int64_t, 3>{rows, config_.heads, seq});
  }
  tensor_view<const lse_t<T>, 3> const_lse_view(const lse_tensor& t, std::int64_t b0, std::int64_t rows,
                                                std::int64_t seq) const {
    return make_tensor_view(t.data() + b0 * config_.heads * seq, std::array<std::int64_t, 3>{rows, config_.heads, seq});
  }

  transformer_config config_;
  linear<T> wq_, wk_, wv_, wo_;
  rotary_embedding<T> rope_;
  Strategy strategy_;
  Mask mask_;
};

/// Causal self-attention: self_attention under baton::causal_mask.
template <class T, class Strategy>
using causal_self_attention = self_attention<T, Strategy, causal_mask>;

}  // namespace baton::nn
