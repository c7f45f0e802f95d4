// baton/pipeline/detail/loss.hpp — the loss of one executor call: each microbatch's weight
// (pipeline_options::scaling), its loss gradient scaled by that weight, and the step's loss
// sent from the last stage's rank to every other (pipeline_options::loss_on_every_rank).
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/core/float16.hpp>
#include <baton/payload/traits.hpp>
#include <baton/payload/visit.hpp>
#include <baton/pipeline/error.hpp>
#include <baton/pipeline/options.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace baton::detail::pipeline {

// Each microbatch's share of the step's loss: 1/m, or its tokens over all the targets' tokens
// with loss_scaling::by_token_count (then the loss must count them: loss.tokens(target)).
template <class Loss, class Target>
std::vector<double> loss_weights(Loss& loss, loss_scaling scaling, const std::vector<Target>& targets) {
  const auto m = targets.size();
  std::vector<double> w(m, 1.0 / static_cast<double>(m));
  if (scaling == loss_scaling::by_token_count) {
    if constexpr (requires(Loss& l, const Target& t) {
                    { l.tokens(t) } -> std::convertible_to<std::int64_t>;
                  }) {
      std::int64_t total = 0;
      std::vector<std::int64_t> tokens(m);
      for (std::size_t i = 0; i < m; ++i) total += tokens[i] = static_cast<std::int64_t>(loss.tokens(targets[i]));
      if (total <= 0) {
        throw pipeline_error("loss_scaling::by_token_count: the targets hold no tokens (loss.tokens() summed to " +
                             std::to_string(total) + ")");
      }
      for (std::size_t i = 0; i < m; ++i) w[i] = static_cast<double>(tokens[i]) / static_cast<double>(total);
    } else {
      throw pipeline_error("pipeline_options::scaling is loss_scaling::by_token_count, but the loss has no "
                           "`std::int64_t tokens(const target&)`: add it (the number of tokens of a target "
                           "microbatch) or use loss_scaling::mean_over_microbatches");
    }
  }
  return w;
}

// Multiplies every tensor of p by `factor` (the loss scaling applied to a loss gradient).
template <class P>
void scale_payload(P& p, double factor) {
  for_each_tensor(p, [&](auto& t) {
    using leaf = std::remove_cvref_t<decltype(t)>;
    if constexpr (requires { payload_traits<leaf>::scale(t, factor); }) {
      payload_traits<leaf>::scale(t, factor);
    } else if constexpr (static_element_type<leaf>) {
      static_assert(host_accessible_v<leaf>,
                    "baton pipeline: a loss gradient in memory the host cannot touch (a device tensor) needs "
                    "`static void scale(T&, double)` in its payload_traits (the loss scaling)");
      using value = typename payload_traits<leaf>::value_type;
      static_assert(std::is_floating_point_v<value> || std::is_same_v<value, bfloat16>,
                    "baton pipeline: the loss gradient must hold floating-point tensors");
      auto bytes = tensor_mutable_bytes(t);
      auto* v = reinterpret_cast<value*>(bytes.data());
      const std::size_t count = bytes.size() / sizeof(value);
      if constexpr (std::is_same_v<value, bfloat16>) {  // storage: scaled in float, rounded once
        const auto f = static_cast<float>(factor);
        for (std::size_t i = 0; i < count; ++i) v[i] = bfloat16(v[i].to_float() * f);
      } else {
        const auto f = static_cast<value>(factor);
        for (std::size_t i = 0; i < count; ++i) v[i] *= f;
      }
    } else {
      static_assert(static_element_type<leaf>,
                    "baton pipeline: a loss gradient whose element type is known only at run time needs "
                    "`static void scale(T&, double)` in its payload_traits (the loss scaling)");
    }
  });
}

// The step's loss on every rank: rank `last` (the last stage's) sends its `value` to every
// other rank on `tag`, which returns it. Throws what the communicator throws.
template <point_to_point_communicator Comm>
double share_loss(Comm& comm, int last, int tag, double value) {
  double v = value;
  if (comm.rank() == last) {
    std::vector<comm_request_t<Comm>> requests;
    for (int r = 0; r < comm.size(); ++r) {
      if (r != comm.rank()) requests.push_back(comm.isend(std::as_bytes(std::span(&v, 1)), r, tag));
    }
    wait_all(requests);
  } else {
    auto request = comm.irecv(std::as_writable_bytes(std::span(&v, 1)), last, tag);
    request.wait();
  }
  return v;
}

}  // namespace baton::detail::pipeline
