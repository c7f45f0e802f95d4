// baton/train/lr_schedule.hpp — the learning rate of every step: constant, or a linear warmup
// followed by a cosine or linear decay to a floor (lr_schedule), as lm_config::learning_rate.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <string>
#include <string_view>

namespace baton::train {

/// What the learning rate does after the warmup.
enum class lr_decay {
  constant,  ///< stays at the peak
  cosine,    ///< half a cosine from the peak down to min_lr, reached at step `total`
  linear,    ///< a straight line from the peak down to min_lr, reached at step `total`
};

inline constexpr std::string_view to_string(lr_decay d) noexcept {
  switch (d) {
    case lr_decay::cosine: return "cosine";
    case lr_decay::linear: return "linear";
    default: return "constant";
  }
}

/// The learning rate of step s (0-based: the number of optimizer steps taken before it), for
/// a peak rate P (the optimizer's lr), W = warmup, D = total, m = min_lr:
///
///     s < W:          P (s + 1) / W                      (the first step already moves)
///     constant:       P
///     cosine:         m + (P - m) (1 + cos(pi p)) / 2    p = (s - W) / (D - W), at most 1
///     linear:         P - (P - m) p
///
/// so a decay reaches m at step D and stays there. The trainers ask it with the optimizer's
/// own step count, so a run resumed at step s continues the same curve.
struct lr_schedule {
  lr_decay decay = lr_decay::constant;
  /// Steps of linear warmup (0: none).
  std::int64_t warmup = 0;
  /// The step at which a decay reaches min_lr (a run's length, usually); > warmup for a decay.
  std::int64_t total = 0;
  /// The floor of a decay; 0 <= min_lr <= the peak. Must be 0 for lr_decay::constant.
  double min_lr = 0;

  /// "" when this schedule can run with peak rate `peak`, otherwise what to change.
  std::string problem(double peak) const {
    const auto number = [](double x) {
      char text[32];
      std::snprintf(text, sizeof text, "%g", x);
      return std::string(text);
    };
    if (!(std::isfinite(peak) && peak > 0)) return "the peak learning rate must be a finite number > 0, got " + number(peak);
    if (warmup < 0) return "warmup = " + std::to_string(warmup) + " steps; use 0 (no warmup) or more";
    if (!(std::isfinite(min_lr) && min_lr >= 0)) return "min_lr must be a finite number >= 0, got " + number(min_lr);
    if (decay == lr_decay::constant) {
      if (min_lr != 0) return "min_lr = " + number(min_lr) + " is the floor of a decay, but the decay is constant; choose cosine or linear, or leave min_lr 0";
      return {};
    }
    if (min_lr > peak) return "min_lr = " + number(min_lr) + " is above the peak learning rate " + number(peak) + "; the floor must not exceed the peak";
    if (total <= warmup)
      return "a " + std::string(to_string(decay)) + " decay needs total (" + std::to_string(total) +
             ") > warmup (" + std::to_string(warmup) + "): the decay runs from step warmup to step total";
    return {};
  }

  /// The rate of step `step` (>= 0) for peak rate `peak` (see the struct's comment).
  double at(std::int64_t step, double peak) const noexcept {
    if (step < warmup) return peak * static_cast<double>(step + 1) / static_cast<double>(warmup);
    if (decay == lr_decay::constant) return peak;
    if (step >= total) return min_lr;
    const double p = static_cast<double>(step - warmup) / static_cast<double>(total - warmup);
    if (decay == lr_decay::cosine) return min_lr + (peak - min_lr) * (1 + std::cos(std::numbers::pi * p)) / 2;
    return peak - (peak - min_lr) * p;
  }
};

}  // namespace baton::train
