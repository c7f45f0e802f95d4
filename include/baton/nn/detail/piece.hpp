// baton/nn/detail/piece.hpp — what every piece of the model layer shares: its element type,
// backward(saved, dy) defined once as backward_input then backward_weight, and the mark by
// which backward_weight refuses a saved state that backward_input has not processed.
#pragma once

#include <baton/core/meta.hpp>
#include <baton/nn/error.hpp>
#include <baton/nn/parameter.hpp>

#include <string>
#include <string_view>
#include <type_traits>

namespace baton::detail::nn {

template <class Piece, class T, fixed_string Name>
class piece;

/// The base of every piece's `saved`: whether backward_input has run on it since the forward
/// (backward_weight resets the whole state, `st = saved{}`). Without it, backward_weight
/// before backward_input would read the output gradient it has not been given.
class saved_state {
  template <class Piece, class T, fixed_string Name>
  friend class piece;

  bool input_done_ = false;
};

/// The CRTP base of a piece `Piece` that computes in T and is called `Name` in its errors.
///
/// A piece defines forward, backward_input (ending with mark_input_done(st)) and
/// backward_weight (starting with expect_input_done(st)); this base gives it backward as the
/// two in a row — so the full backward is, by construction, the split one.
template <class Piece, class T, fixed_string Name>
class piece {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                "baton::nn: the pieces of the model layer compute in T = float or double");

 public:
  using value_type = T;
  using parameter_type = baton::nn::parameter<T>;

  /// The piece's name in its error messages ("baton::nn::linear").
  static constexpr std::string_view name = Name;

  /// backward_input(saved, dy), then backward_weight(saved): returns what backward_input
  /// returns (nothing for a piece whose input has no gradient).
  template <class Saved, class Dy>
  auto backward(Saved& st, const Dy& dy) {
    return input_then_weight(static_cast<Piece&>(*this), st, dy);
  }
  /// The same on a const piece, for a piece whose backward_weight changes nothing of it.
  template <class Saved, class Dy>
    requires requires(const Piece& p, Saved& s) { p.backward_weight(s); }
  auto backward(Saved& st, const Dy& dy) const {
    return input_then_weight(static_cast<const Piece&>(*this), st, dy);
  }

 protected:
  /// backward_input's last step: the state now holds what backward_weight needs.
  static void mark_input_done(saved_state& st) noexcept { st.input_done_ = true; }

  /// backward_weight's first step: throws unless backward_input has processed `st` (and no
  /// backward_weight has since).
  static void expect_input_done(const saved_state& st) {
    if (!st.input_done_)
      throw baton::nn::nn_error(std::string(name) +
                                ": backward_weight(saved) on a saved state that backward_input has not processed; "
                                "call backward_input(saved, dy) first (backward(saved, dy) does both), once per "
                                "forward");
  }

 private:
  template <class P, class Saved, class Dy>
  static auto input_then_weight(P& p, Saved& st, const Dy& dy) {
    if constexpr (std::is_void_v<decltype(p.backward_input(st, dy))>) {
      p.backward_input(st, dy);
      p.backward_weight(st);
    } else {
      auto dx = p.backward_input(st, dy);
      p.backward_weight(st);
      return dx;
    }
  }
};

}  // namespace baton::detail::nn
