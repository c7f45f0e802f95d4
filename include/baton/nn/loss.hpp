// baton/nn/loss.hpp — cross-entropy over a vocabulary, as the pipeline's loss, counting tokens
// and optionally summing over a context-parallel group.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/core/sizes.hpp>
#include <baton/nn/error.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/pipeline/stage.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace baton::nn {

template <class T, all_reduce_communicator Comm>
class group_cross_entropy;

/// Cross-entropy of logits [..., vocab] against integer targets [...]: the mean over counted
/// tokens of logsumexp(logits) - logits[target], computed with the row maximum subtracted and
/// summed in double. Targets equal to ignore_index (default -100, torch's) are not counted
/// and get no gradient; any other target outside [0, vocab) is an nn_error.
///
/// It is a pipeline loss: `loss(logits, targets)` returns baton::loss_result (the mean and its
/// gradient), `loss.tokens(targets)` the counted tokens (loss_scaling::by_token_count). Under
/// context parallelism each rank holds a shard of the sequence: `loss.over(cp_group)` sums the
/// loss and the token count over the group, so every rank gets the mean over the whole
/// sequence and the gradient of that mean.
template <class T>
class cross_entropy {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "baton::nn::cross_entropy<T>: T is float or double");

 public:
  using tensor = host_tensor<T>;
  using targets_type = host_tensor<std::int64_t>;

  /// A sum of per-token losses and the number of tokens in it.
  struct totals {
    double loss = 0;
    std::int64_t tokens = 0;
  };

  explicit cross_entropy(std::int64_t ignore_index = -100) : ignore_index_(ignore_index) {}

  std::int64_t ignore_index() const noexcept { return ignore_index_; }

  /// Counted tokens: targets that are not ignore_index.
  std::int64_t tokens(const targets_type& targets) const {
    return static_cast<std::int64_t>(
        std::count_if(targets.values().begin(), targets.values().end(), [&](std::int64_t t) { return t != ignore_index_; }));
  }

  /// Empty when logits [..., vocab] and targets [...] fit together and every target is in the
  /// vocabulary or ignore_index; otherwise the message of the error.
  std::string input_problem(const tensor& logits, const targets_type& targets) const {
    if (logits.rank() != targets.rank() + 1 ||
        !std::equal(targets.shape().begin(), targets.shape().end(), logits.shape().begin()))
      return "baton::nn::cross_entropy: logits has shape " + detail::core::shape_text(logits.shape()) +
             " but expected [" + shape_prefix(targets) + "vocab] (the targets' shape plus the vocabulary axis)";
    const std::int64_t vocab = logits.shape().back();
    if (vocab < 1) return "baton::nn::cross_entropy: the logits have an empty vocabulary axis";
    for (std::int64_t r = 0; r < targets.size(); ++r) {
      const std::int64_t t = targets[r];
      if (t != ignore_index_ && (t < 0 || t >= vocab))
        return "baton::nn::cross_entropy: target " + std::to_string(t) + " at flat index " + std::to_string(r) +
               " is outside the vocabulary [0, " + std::to_string(vocab) + ") and is not the ignore_index " +
               std::to_string(ignore_index_);
    }
    return {};
  }

  /// The sum of the per-token losses; when `grad` is given, writes grad_scale times the
  /// gradient of that sum into it (allocated with the logits' shape).
  totals sum(const tensor& logits, const targets_type& targets, tensor* grad, double grad_scale) const {
    if (std::string problem = input_problem(logits, targets); !problem.empty()) throw nn_error(problem);
    const std::int64_t vocab = logits.shape().back();
    if (grad) *grad = tensor::for_overwrite(logits.shape());
    totals t;
    std::vector<double> e(static_cast<std::size_t>(vocab));
    for (std::int64_t r = 0; r < targets.size(); ++r) {
      const T* z = logits.data() + r * vocab;
      const std::int64_t target = targets[r];
      if (target == ignore_index_) {
        if (grad) std::fill_n(grad->data() + r * vocab, vocab, T(0));
        continue;
      }
      double max = static_cast<double>(z[0]);
      for (std::int64_t j = 1; j < vocab; ++j) max = std::max(max, static_cast<double>(z[j]));
      double denominator = 0;
      for (std::int64_t j = 0; j < vocab; ++j) {
        e[static_cast<std::size_t>(j)] = std::exp(static_cast<double>(z[j]) - max);
        denominator += e[static_cast<std::size_t>(j)];
      }
      t.loss += std::log(denominator) + max - static_cast<double>(z[target]);
      ++t.tokens;
      if (grad) {
        T* g = grad->data() + r * vocab;
        for (std::int64_t j = 0; j < vocab; ++j)
          g[j] = static_cast<T>(grad_scale * (e[static_cast<std::size_t>(j)] / denominator - (j == target ? 1.0 : 0.0)));
      }
    }
    return t;
  }

  /// The mean over counted tokens and its gradient (0 and a zero gradient when none counts).
  loss_result<tensor> operator()(const tensor& logits, const targets_type& targets) const {
    const std::int64_t n = tokens(targets);
    loss_result<tensor> r;
    const totals t = sum(logits, targets, &r.grad, n > 0 ? 1.0 / static_cast<double>(n) : 0.0);
    r.value = n > 0 ? t.loss / static_cast<double>(n) : 0.0;
    return r;
  }

  /// This loss summed over `group` (a context-parallel group): see group_cross_entropy.
  template <all_reduce_communicator Comm>
  group_cross_entropy<T, Comm> over(Comm& group) const {
    return group_cross_entropy<T, Comm>(*this, group);
  }

 private:
  static std::string shape_prefix(const targets_type& targets) {
    std::string s;
    for (auto e : targets.shape()) s += std::to_string(e) + ", ";
    return s;
  }

  std::int64_t ignore_index_;
};

/// cross_entropy summed over a group of ranks that each hold a shard of the same sequences
/// (a context-parallel group). Every rank of the group must call it together, in the same
/// order (the ranks of a cp group run the same pipeline row, so they do). Each rank gets the
/// mean over all the group's tokens and the gradient of that mean for its own logits.
template <class T, all_reduce_communicator Comm>
class group_cross_entropy {
 public:
  using tensor = host_tensor<T>;
  using targets_type = host_tensor<std::int64_t>;

  group_cross_entropy(cross_entropy<T> loss, Comm& group) : loss_(loss), group_(&group) {}

  /// Counted tokens over the group.
  std::int64_t tokens(const targets_type& targets) const {
    std::array<std::int64_t, 1> n{loss_.tokens(targets)};
    group_->all_reduce(std::span<std::int64_t>(n), reduce_op::sum);
    return n[0];
  }

  /// Collective over the group. A rank whose logits or targets are wrong makes every rank
  /// throw nn_error (the problem travels with the token count), so none waits for it.
  loss_result<tensor> operator()(const tensor& logits, const targets_type& targets) const {
    const std::string problem = loss_.input_problem(logits, targets);
    std::array<std::int64_t, 2> counts{problem.empty() ? loss_.tokens(targets) : 0, problem.empty() ? 0 : 1};
    group_->all_reduce(std::span<std::int64_t>(counts), reduce_op::sum);
    if (counts[1] > 0)
      throw nn_error(problem.empty() ? "baton::nn::group_cross_entropy: " + std::to_string(counts[1]) +
                                           " other rank(s) of the loss group rejected their logits or targets"
                                     : problem);
    const std::int64_t n = counts[0];
    loss_result<tensor> r;
    std::array<double, 1> sum{loss_.sum(logits, targets, &r.grad, n > 0 ? 1.0 / static_cast<double>(n) : 0.0).loss};
    group_->all_reduce(std::span<double>(sum), reduce_op::sum);
    r.value = n > 0 ? sum[0] / static_cast<double>(n) : 0.0;
    return r;
  }

 private:
  cross_entropy<T> loss_;
  Comm* group_;
};

}  // namespace baton::nn
