// baton/torch/cp_attention.hpp — baton's attention (ring, Ulysses, hybrid, or one backend on
// whole sequences) as a LibTorch autograd function, so that a torch::nn module's attention is
// context-parallel and autograd still does the rest of the model's gradients.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/cp/params.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/torch/payload.hpp>

#include <torch/torch.h>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

namespace detail::torch_adapter {

template <class T, std::size_t N>
tensor_view<T, N> view_of(const at::Tensor& t) {
  std::array<std::int64_t, N> extents{};
  for (std::size_t i = 0; i < N; ++i) extents[i] = t.size(static_cast<std::int64_t>(i));
  return make_tensor_view(static_cast<T*>(t.data_ptr()), extents);
}

}  // namespace detail::torch_adapter

/// Attention over torch tensors q, k, v of shape [batch, seq, heads, head_dim] (this rank's
/// shard of the sequence under context parallelism), differentiable by LibTorch's autograd.
///
/// - `Strategy`: `baton::ring_attention`, `baton::ulysses_attention`,
///   `baton::hybrid_attention` (every rank of the group calls together, in the same order),
///   or an attention backend such as `baton::reference_attention` or
///   `baton::kokkos_attention` for whole sequences on one rank;
/// - `Mask`: any baton mask; it sees global positions (the sharding's, under CP).
///
/// The forward keeps q, k, v, out and the log-sum-exp for backward, which calls the
/// strategy's backward (a second ring pass, or the Ulysses exchange again): every rank of
/// the group must run its backward too, in the same order. float and double tensors on the
/// CPU; k and v may have fewer heads than q (grouped-query attention). The object must
/// outlive the backward of every call (it cannot be copied or moved).
///
/// ```cpp
///   baton::ring_attention ring(cp_comm, baton::reference_attention{}, sharding);
///   baton::torch_cp_attention attention(ring, baton::causal_mask{});
///   torch::Tensor out = attention(q, k, v);  // [batch, seq / cp, heads, head_dim]
/// ```
template <class Strategy, class Mask = causal_mask>
class torch_cp_attention {
 public:
  explicit torch_cp_attention(Strategy& strategy, Mask mask = {}, cp_params params = {})
      : strategy_(&strategy), mask_(std::move(mask)), params_(std::move(params)) {}

  // The autograd graph of every call refers to this object until its backward has run, so it
  // stays where it was built (hold it in a std::unique_ptr to move it around).
  torch_cp_attention(const torch_cp_attention&) = delete;
  torch_cp_attention& operator=(const torch_cp_attention&) = delete;

  Strategy& strategy() noexcept { return *strategy_; }

  /// out = softmax(q k^T * scale + mask) v over the whole sequence, for this rank's queries.
  at::Tensor operator()(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    check(q, k, v);
    return function::apply(q, k, v, static_cast<std::int64_t>(reinterpret_cast<std::intptr_t>(this)));
  }

 private:
  struct function : ::torch::autograd::Function<function> {
    static at::Tensor forward(::torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                              const at::Tensor& v, std::int64_t self_address) {
      auto* self = reinterpret_cast<torch_cp_attention*>(static_cast<std::intptr_t>(self_address));
      const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
      at::Tensor out = at::zeros_like(qc, at::MemoryFormat::Contiguous);
      const auto lse_dtype = qc.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
      at::Tensor lse = at::zeros({qc.size(0), qc.size(2), qc.size(1)}, qc.options().dtype(lse_dtype));
      self->dispatch(qc, [&]<class T>(std::type_identity<T>) {
        self->template run_forward<T>(qc, kc, vc, out, lse);
      });
      ctx->save_for_backward({qc, kc, vc, out, lse});
      ctx->saved_data["self"] = self_address;
      return out;
    }

    static ::torch::autograd::variable_list backward(::torch::autograd::AutogradContext* ctx,
                                                     ::torch::autograd::variable_list grads) {
      auto* self = reinterpret_cast<torch_cp_attention*>(static_cast<std::intptr_t>(ctx->saved_data["self"].toInt()));
      const auto saved = ctx->get_saved_variables();
      const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
      const at::Tensor dout = grads[0].defined() ? grads[0].contiguous() : at::zeros_like(out);
      at::Tensor dq = at::zeros_like(q, at::MemoryFormat::Contiguous);
      at::Tensor dk = at::zeros_like(k, at::MemoryFormat::Contiguous);
      at::Tensor dv = at::zeros_like(v, at::MemoryFormat::Contiguous);
      self->dispatch(q, [&]<class T>(std::type_identity<T>) {
        self->template run_backward<T>(q, k, v, out, lse, dout, dq, dk, dv);
      });
      return {dq, dk, dv, at::Tensor()};
    }
  };

  static void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
    const auto fail = [](const std::string& what) {
      throw std::invalid_argument("baton::torch_cp_attention: " + what);
    };
    for (const auto* t : {&q, &k, &v}) {
      if (!t->defined()) fail("q, k and v must be defined tensors");
      if (t->dim() != 4) {
        fail("q, k and v are [batch, seq, heads, head_dim]; got a tensor of shape " +
             detail::torch_adapter::sizes_text(*t) + " (reshape it: x.view({batch, seq, heads, head_dim}))");
      }
      if (!t->device().is_cpu()) fail("the tensors are on " + t->device().str() + "; baton's attention here runs on the CPU");
      if (t->scalar_type() != q.scalar_type()) fail("q, k and v must share one dtype");
    }
    if (q.scalar_type() != at::kFloat && q.scalar_type() != at::kDouble) {
      fail("dtype " + detail::torch_adapter::dtype_name(q) + " is not supported: use float or double");
    }
  }

  template <class F>
  void dispatch(const at::Tensor& q, F&& f) {
    if (q.scalar_type() == at::kDouble) {
      f(std::type_identity<double>{});
    } else {
      f(std::type_identity<float>{});
    }
  }

  template <class T>
  void run_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse) {
    using namespace detail::torch_adapter;
    const auto qv = view_of<const T, 4>(q), kv = view_of<const T, 4>(k), vv = view_of<const T, 4>(v);
    const auto ov = view_of<T, 4>(out);
    const auto lv = view_of<lse_t<T>, 3>(lse);
    if constexpr (requires { strategy_->forward(qv, kv, vv, mask_, ov, lv, params_); }) {
      strategy_->forward(qv, kv, vv, mask_, ov, lv, params_);
    } else {
      strategy_->forward(qv, kv, vv, mask_, ov, lv, backend_params());
    }
  }

  template <class T>
  void run_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                    const at::Tensor& lse, const at::Tensor& dout, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv) {
    using namespace detail::torch_adapter;
    const auto qv = view_of<const T, 4>(q), kv = view_of<const T, 4>(k), vv = view_of<const T, 4>(v);
    const auto ov = view_of<const T, 4>(out), dov = view_of<const T, 4>(dout);
    const auto lv = view_of<const lse_t<T>, 3>(lse);
    const auto dqv = view_of<T, 4>(dq), dkv = view_of<T, 4>(dk), dvv = view_of<T, 4>(dv);
    if constexpr (requires { strategy_->backward(qv, kv, vv, ov, lv, dov, mask_, dqv, dkv, dvv, params_); }) {
      strategy_->backward(qv, kv, vv, ov, lv, dov, mask_, dqv, dkv, dvv, params_);
    } else {
      strategy_->backward(qv, kv, vv, ov, lv, dov, mask_, dqv, dkv, dvv, backend_params());
    }
  }

  attention_params backend_params() const {
    attention_params p;
    p.softmax_scale = params_.softmax_scale;
    return p;
  }

  Strategy* strategy_;
  Mask mask_;
  cp_params params_;
};

/// This rank's shard of a tensor along its sequence dimension (`seq_dim`, 1 for [batch, seq,
/// ...]): the rows sharding.pieces(shard) names, in order — what every CP strategy expects.
inline at::Tensor torch_shard_sequence(const at::Tensor& full, const sequence_sharding& sharding, int shard,
                                       int seq_dim = 1) {
  if (full.size(seq_dim) != sharding.seq_len()) {
    throw std::invalid_argument("baton::torch_shard_sequence: the tensor's dim " + std::to_string(seq_dim) + " has " +
                                std::to_string(full.size(seq_dim)) + " positions but the sharding is of " +
                                std::to_string(sharding.seq_len()));
  }
  const auto positions = sharding.global_positions(shard);
  const at::Tensor index = at::tensor(std::vector<std::int64_t>(positions.begin(), positions.end()), at::kLong);
  return full.index_select(seq_dim, index);
}

}  // namespace baton
