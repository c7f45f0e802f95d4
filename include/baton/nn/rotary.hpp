// baton/nn/rotary.hpp — rotary position embedding (RoPE) from global token positions.
//
// The rotation of a token depends only on its global position, which the caller passes
// explicitly: a context-parallel shard (contiguous, zigzag, striped) therefore rotates each
// of its tokens exactly as the unsharded sequence would.
#pragma once

#include <baton/nn/detail/checks.hpp>
#include <baton/nn/detail/piece.hpp>
#include <baton/nn/detail/storage.hpp>
#include <baton/nn/error.hpp>
#include <baton/payload/host_tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace baton::nn {

/// RoPE on tensors [batch, seq, heads, head_dim], "rotate half" pairing (GPT-NeoX / Llama):
/// for i < D/2, with θ = position · base^(-2i/D),
///   y_i       = x_i cos θ - x_{i+D/2} sin θ,
///   y_{i+D/2} = x_{i+D/2} cos θ + x_i sin θ.
/// The backward is the inverse rotation (by -θ). No parameters. Angles and their sines are
/// computed in double.
///
/// As a piece: forward(x, positions, saved) keeps the positions; backward_input(saved, dy)
/// returns dx; backward_weight(saved) has no weight to update and only frees the state.
template <class T>
class rotary_embedding : public detail::nn::piece<rotary_embedding<T>, T, "baton::nn::rotary_embedding"> {
 public:
  using tensor = host_tensor<T>;

  struct saved : detail::nn::saved_state {
    std::vector<std::int64_t> positions;
    std::size_t bytes() const { return positions.size() * sizeof(std::int64_t); }
  };

  explicit rotary_embedding(std::int64_t head_dim, double base = 10000.0) : head_dim_(head_dim), base_(base) {
    if (head_dim < 2 || head_dim % 2 != 0)
      throw nn_error("baton::nn::rotary_embedding: head_dim " + std::to_string(head_dim) +
                     " must be even and at least 2 (RoPE rotates pairs of features)");
    if (!(base > 1)) throw nn_error("baton::nn::rotary_embedding: base must be > 1, got " + std::to_string(base));
  }

  std::int64_t head_dim() const noexcept { return head_dim_; }
  double base() const noexcept { return base_; }

  /// Rotates x [batch, seq, heads, head_dim] in place: row s of every batch by
  /// positions[s] (inverse: by -positions[s]).
  void rotate(T* x, std::int64_t batch, std::int64_t seq, std::int64_t heads, std::span<const std::int64_t> positions,
              bool inverse) const {
    if (static_cast<std::int64_t>(positions.size()) != seq)
      throw nn_error("baton::nn::rotary_embedding: " + std::to_string(positions.size()) +
                     " positions for a sequence axis of " + std::to_string(seq) +
                     " rows; give one global position per row");
    apply(x, batch, seq, heads, table(positions), inverse);
  }

  /// cos θ and sin θ of every position and frequency: row s is [cos θ_0 .. cos θ_{D/2-1},
  /// sin θ_0 .. sin θ_{D/2-1}] for positions[s] (computed in double, rounded to T). One table
  /// serves every tensor rotated by the same positions (q and k, forward and backward, every
  /// microbatch): the last one is kept and returned again while the positions do not change,
  /// so an object is for one thread at a time (as every piece is).
  const std::vector<T>& table(std::span<const std::int64_t> positions) const {
    if (!cached_table_.empty() && std::equal(positions.begin(), positions.end(), cached_positions_.begin(),
                                             cached_positions_.end()))
      return cached_table_;
    cached_positions_.assign(positions.begin(), positions.end());
    cached_table_ = compute_table(positions);
    return cached_table_;
  }

 private:
  std::vector<T> compute_table(std::span<const std::int64_t> positions) const {
    const std::int64_t half = head_dim_ / 2;
    std::vector<double> inv_freq(static_cast<std::size_t>(half));
    for (std::int64_t i = 0; i < half; ++i)
      inv_freq[static_cast<std::size_t>(i)] =
          std::pow(base_, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim_));
    std::vector<T> t(positions.size() * static_cast<std::size_t>(head_dim_));
    for (std::size_t s = 0; s < positions.size(); ++s) {
      const double pos = static_cast<double>(positions[s]);
      T* row = t.data() + s * static_cast<std::size_t>(head_dim_);
      for (std::int64_t i = 0; i < half; ++i) {
        const double theta = pos * inv_freq[static_cast<std::size_t>(i)];
        row[i] = static_cast<T>(std::cos(theta));
        row[half + i] = static_cast<T>(std::sin(theta));
      }
    }
    return t;
  }

 public:
  /// rotate() by a table() of the sequence axis's positions.
  void apply(T* x, std::int64_t batch, std::int64_t seq, std::int64_t heads, const std::vector<T>& table,
             bool inverse) const {
    apply(static_cast<const T*>(x), x, batch, seq, heads, table, inverse);
  }
  /// apply() from `in` into `out` (which may be `in`), each holding T or, for float,
  /// baton::bfloat16: read widened (exactly), written rounded to nearest even. bf16 storage
  /// rounds q and k here, and widens dq and dk here, instead of in passes of their own: the
  /// bits of rotating in float and converting before or after.
  template <class In, class Out>
  void apply(const In* in, Out* out, std::int64_t batch, std::int64_t seq, std::int64_t heads,
             const std::vector<T>& table, bool inverse) const {
    constexpr bool bf16_allowed = std::is_same_v<T, float>;
    static_assert((std::is_same_v<In, T> || (bf16_allowed && std::is_same_v<In, bfloat16>)) &&
                      (std::is_same_v<Out, T> || (bf16_allowed && std::is_same_v<Out, bfloat16>)),
                  "baton::nn::rotary_embedding::apply: rotates T, or baton::bfloat16 in and out of float");
    if (static_cast<std::int64_t>(table.size()) != seq * head_dim_)
      throw nn_error("baton::nn::rotary_embedding: a table of " +
                     std::to_string(table.size() / static_cast<std::size_t>(head_dim_)) +
                     " positions for a sequence axis of " + std::to_string(seq) + " rows");
    const std::int64_t half = head_dim_ / 2;
    const T sign = inverse ? T(-1) : T(1);
    for (std::int64_t b = 0; b < batch; ++b)
      for (std::int64_t s = 0; s < seq; ++s) {
        const T* c = table.data() + s * head_dim_;
        const T* sn = c + half;
        for (std::int64_t h = 0; h < heads; ++h) {
          const std::int64_t row = ((b * seq + s) * heads + h) * head_dim_;
          const In* v = in + row;
          Out* w = out + row;
          for (std::int64_t i = 0; i < half; ++i) {
            const T lo = detail::nn::widen_value<T>(v[i]), hi = detail::nn::widen_value<T>(v[i + half]);
            const T si = sign * sn[i];
            w[i] = static_cast<Out>(lo * c[i] - hi * si);
            w[i + half] = static_cast<Out>(hi * c[i] + lo * si);
          }
        }
      }
  }

  // ---- the piece ----

  tensor forward(const tensor& x, std::span<const std::int64_t> positions, saved& st) const {
    check(x, "input");
    tensor y = x;
    rotate(y.data(), x.shape()[0], x.shape()[1], x.shape()[2], positions, false);
    st.positions.assign(positions.begin(), positions.end());
    return y;
  }
  tensor backward_input(saved& st, const tensor& dy) const {
    check(dy, "dy");
    tensor dx = dy;
    rotate(dx.data(), dy.shape()[0], dy.shape()[1], dy.shape()[2], st.positions, true);
    this->mark_input_done(st);
    return dx;
  }
  void backward_weight(saved& st) const {
    this->expect_input_done(st);
    st = saved{};
  }

 private:
  void check(const tensor& x, const char* tensor_name) const {
    if (x.rank() != 4 || x.shape()[3] != head_dim_)
      detail::nn::shape_mismatch(rotary_embedding::name, tensor_name, x.shape(),
                                 "[batch, seq, heads, " + std::to_string(head_dim_) + "]",
                                 "head_dim = " + std::to_string(head_dim_));
  }

  std::int64_t head_dim_;
  double base_;
  mutable std::vector<std::int64_t> cached_positions_;
  mutable std::vector<T> cached_table_;
};

}  // namespace baton::nn
