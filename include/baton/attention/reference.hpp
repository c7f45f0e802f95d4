// baton/attention/reference.hpp — the oracle: naive attention accumulated in double.
//
// Straight from the definitions, one query row at a time, every sum in double. Slow
// (O(Sq Sk D) with no tiling) and meant to be: it is what every other backend is tested
// against, so it must be obviously right rather than fast.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <baton/attention/backend.hpp>

namespace baton {

/// Naive attention in double precision; any strides, any head dim. Models
/// attention_backend<reference_attention, float> and <..., double>.
struct reference_attention : detail::attention::mask_argument_check {
  // A mask argument that is not an attention_mask: one readable error (mask_argument_check).
  using detail::attention::mask_argument_check::forward;
  using detail::attention::mask_argument_check::backward;

  template <class TQ, class TK, class TV, attention_mask Mask, class TO, class TL>
  void forward(tensor_view<TQ, 4> q, tensor_view<TK, 4> k, tensor_view<TV, 4> v, const Mask& mask,
               tensor_view<TO, 4> out, tensor_view<TL, 3> lse, const attention_params& params = {}) const {
    detail::attention::static_check_forward_types<TQ, TK, TV, TO, TL>();
    const detail::attention::checked_call call = detail::attention::check_inputs(q, k, v, params);
    detail::attention::check_forward_outputs(call, out, lse);
    baton::validate_mask(mask, call.q_pos, call.k_pos);

    const double neg_inf = -std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> score(static_cast<std::size_t>(call.seq_k));
    std::vector<double> acc(static_cast<std::size_t>(call.dim));
    for_each_query_row(call, k, v, [&](std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i,
                                       const std::vector<char>& kv_bad) {
      const bool q_bad = !detail::attention::row_finite(q, b, i, h, call.dim);
      // Non-finite rule (docs/attention.md): a non-finite q, k or v in an allowed pair, or
      // a score that is NaN or +inf, makes the row NaN; masked pairs are never read.
      bool poisoned = false;
      double row_max = neg_inf;
      for (std::int64_t j = 0; j < call.seq_k; ++j) {
        score[j] = neg_inf;
        if (!mask.allowed(call.q_pos[i], call.k_pos[j])) continue;
        if (q_bad || kv_bad[j]) {
          poisoned = true;
          continue;
        }
        double dot = 0;
        for (std::int64_t d = 0; d < call.dim; ++d)
          dot += static_cast<double>(q(b, i, h, d)) * static_cast<double>(k(b, j, hk, d));
        score[j] = dot * call.scale;
        if (!(score[j] < std::numeric_limits<double>::infinity())) {  // NaN or +inf (overflow)
          poisoned = true;
          score[j] = neg_inf;
          continue;
        }
        row_max = std::max(row_max, score[j]);
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      double denominator = 0;
      if (row_max != neg_inf && !poisoned) {
        for (std::int64_t j = 0; j < call.seq_k; ++j) {
          if (score[j] == neg_inf) continue;
          const double w = std::exp(score[j] - row_max);
          denominator += w;
          for (std::int64_t d = 0; d < call.dim; ++d) acc[d] += w * static_cast<double>(v(b, j, hk, d));
        }
      }
      // A query that may attend to nothing: out 0, lse -inf (the sum of no exponentials).
      const bool any = denominator > 0;
      for (std::int64_t d = 0; d < call.dim; ++d)
        out(b, i, h, d) = static_cast<TO>(poisoned ? nan : any ? acc[d] / denominator : 0.0);
      lse(b, h, i) = static_cast<TL>(poisoned ? nan : any ? row_max + std::log(denominator) : neg_inf);
    });
  }

  template <class TQ, class TK, class TV, class TO, class TL, class TD, attention_mask Mask, class TG1, class TG2,
            class TG3>
  void backward(tensor_view<TQ, 4> q, tensor_view<TK, 4> k, tensor_view<TV, 4> v, tensor_view<TO, 4> out,
                tensor_view<TL, 3> lse, tensor_view<TD, 4> dout, const Mask& mask, tensor_view<TG1, 4> dq,
                tensor_view<TG2, 4> dk, tensor_view<TG3, 4> dv, const attention_params& params = {}) const {
    detail::attention::static_check_backward_types<TQ, TK, TV, TO, TL, TD, TG1, TG2, TG3>();
    const detail::attention::checked_call call = detail::attention::check_inputs(q, k, v, params);
    detail::attention::check_backward_tensors(call, out, lse, dout, dq, dk, dv);
    baton::validate_mask(mask, call.q_pos, call.k_pos);

    const auto n_q = static_cast<std::size_t>(call.batch * call.seq_q * call.heads_q * call.dim);
    const auto n_kv = static_cast<std::size_t>(call.batch * call.seq_k * call.heads_kv * call.dim);
    std::vector<double> gq(n_q, 0.0), gk(n_kv, 0.0), gv(n_kv, 0.0);
    const auto q_index = [&](std::int64_t b, std::int64_t i, std::int64_t h, std::int64_t d) {
      return static_cast<std::size_t>(((b * call.seq_q + i) * call.heads_q + h) * call.dim + d);
    };
    const auto kv_index = [&](std::int64_t b, std::int64_t j, std::int64_t h, std::int64_t d) {
      return static_cast<std::size_t>(((b * call.seq_k + j) * call.heads_kv + h) * call.dim + d);
    };

    // Non-finite rule (docs/attention.md): a pair the mask allows, of a row that attends
    // (lse not -inf), is poisoned when lse is NaN or +inf or any of q, out, dout of the row or
    // k, v of the key is non-finite; it makes dq of the row and dk, dv of the key NaN.
    std::vector<char> q_nan(n_q / static_cast<std::size_t>(std::max<std::int64_t>(call.dim, 1)), 0);
    std::vector<char> kv_nan(n_kv / static_cast<std::size_t>(std::max<std::int64_t>(call.dim, 1)), 0);
    for_each_query_row(call, k, v, [&](std::int64_t b, std::int64_t h, std::int64_t hk, std::int64_t i,
                                       const std::vector<char>& kv_bad) {
      const double row_lse = static_cast<double>(lse(b, h, i));
      if (std::isinf(row_lse) && row_lse < 0) return;  // attends to nothing: no gradient
      const bool row_bad = !(row_lse < std::numeric_limits<double>::infinity()) ||
                           !detail::attention::row_finite(q, b, i, h, call.dim) ||
                           !detail::attention::row_finite(out, b, i, h, call.dim) ||
                           !detail::attention::row_finite(dout, b, i, h, call.dim);
      double delta = 0;  // D_i = rowsum(dO * O)
      if (!row_bad)
        for (std::int64_t d = 0; d < call.dim; ++d)
          delta += static_cast<double>(dout(b, i, h, d)) * static_cast<double>(out(b, i, h, d));
      for (std::int64_t j = 0; j < call.seq_k; ++j) {
        if (!mask.allowed(call.q_pos[i], call.k_pos[j])) continue;
        if (row_bad || kv_bad[j]) {
          q_nan[q_index(b, i, h, 0) / static_cast<std::size_t>(std::max<std::int64_t>(call.dim, 1))] = 1;
          kv_nan[kv_index(b, j, hk, 0) / static_cast<std::size_t>(std::max<std::int64_t>(call.dim, 1))] = 1;
          continue;
        }
        double s = 0, dprob = 0;
        for (std::int64_t d = 0; d < call.dim; ++d) {
          s += static_cast<double>(q(b, i, h, d)) * static_cast<double>(k(b, j, hk, d));
          dprob += static_cast<double>(dout(b, i, h, d)) * static_cast<double>(v(b, j, hk, d));
        }
        const double prob = std::exp(s * call.scale - row_lse);
        const double ds = prob * (dprob - delta);
        for (std::int64_t d = 0; d < call.dim; ++d) {
          gq[q_index(b, i, h, d)] += call.scale * ds * static_cast<double>(k(b, j, hk, d));
          gk[kv_index(b, j, hk, d)] += call.scale * ds * static_cast<double>(q(b, i, h, d));
          gv[kv_index(b, j, hk, d)] += prob * static_cast<double>(dout(b, i, h, d));
        }
      }
    });
    const auto poison = [&](std::vector<double>& g, const std::vector<char>& rows) {
      for (std::size_t r = 0; r < rows.size(); ++r)
        if (rows[r])
          std::fill_n(g.begin() + static_cast<std::ptrdiff_t>(r * static_cast<std::size_t>(call.dim)), call.dim,
                      std::numeric_limits<double>::quiet_NaN());
    };
    poison(gq, q_nan);
    poison(gk, kv_nan);
    poison(gv, kv_nan);

    const auto store = [&](auto view, const std::vector<double>& g, std::int64_t seq, std::int64_t heads) {
      using E = typename decltype(view)::value_type;
      for (std::int64_t b = 0; b < call.batch; ++b)
        for (std::int64_t s = 0; s < seq; ++s)
          for (std::int64_t h = 0; h < heads; ++h)
            for (std::int64_t d = 0; d < call.dim; ++d) {
              const double value = g[static_cast<std::size_t>(((b * seq + s) * heads + h) * call.dim + d)];
              E& target = view(b, s, h, d);
              target = params.accumulate ? static_cast<E>(static_cast<double>(target) + value) : static_cast<E>(value);
            }
    };
    store(dq, gq, call.seq_q, call.heads_q);
    store(dk, gk, call.seq_k, call.heads_kv);
    store(dv, gv, call.seq_k, call.heads_kv);
  }

 private:
  /// body(b, h, hk, i, kv_bad) for every query row i of head h (kv head hk) of batch entry b,
  /// in that order, with kv_bad[j] whether key j of (b, hk) has a non-finite k or v.
  template <class TK, class TV, class Body>
  static void for_each_query_row(const detail::attention::checked_call& call, const tensor_view<TK, 4>& k,
                                 const tensor_view<TV, 4>& v, const Body& body) {
    std::vector<char> kv_bad(static_cast<std::size_t>(call.seq_k));
    for (std::int64_t b = 0; b < call.batch; ++b)
      for (std::int64_t h = 0; h < call.heads_q; ++h) {
        const std::int64_t hk = h / call.group();
        detail::attention::mark_non_finite_keys(k, v, b, hk, call.seq_k, call.dim, kv_bad);
        for (std::int64_t i = 0; i < call.seq_q; ++i) body(b, h, hk, i, kv_bad);
      }
  }
};

}  // namespace baton
