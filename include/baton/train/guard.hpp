// baton/train/guard.hpp — the non-finite guard: a step whose loss or gradient norm is NaN or
// infinite stops training before its optimizer step, with the step, the last finite loss and
// what to try (non_finite_guard, non_finite_error).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>

namespace baton::train {

/// A step's loss or gradient norm was not finite. The trainers throw it on every rank alike
/// (both numbers are the same on every rank), before the optimizer step: the parameters are
/// still those after the last good step, and nothing has been saved from this one.
class non_finite_error : public std::runtime_error {
 public:
  non_finite_error(std::int64_t step, double loss, double grad_norm, std::optional<std::int64_t> last_finite_step,
                   std::optional<double> last_finite_loss)
      : std::runtime_error(message(step, loss, grad_norm, last_finite_step, last_finite_loss)),
        step_(step),
        loss_(loss),
        grad_norm_(grad_norm),
        last_finite_step_(last_finite_step),
        last_finite_loss_(last_finite_loss) {}

  /// The step (0-based optimizer step count) whose loss or gradient norm was not finite.
  std::int64_t step() const noexcept { return step_; }
  double loss() const noexcept { return loss_; }
  double grad_norm() const noexcept { return grad_norm_; }
  /// The last step that was finite, and its loss (none when the first step was not).
  std::optional<std::int64_t> last_finite_step() const noexcept { return last_finite_step_; }
  std::optional<double> last_finite_loss() const noexcept { return last_finite_loss_; }

 private:
  static std::string number(double x) {
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", x);
    return text;
  }
  static std::string message(std::int64_t step, double loss, double grad_norm, std::optional<std::int64_t> last_step,
                             std::optional<double> last_loss) {
    std::string what = "step " + std::to_string(step) + ": ";
    if (!std::isfinite(loss)) what += "the loss is " + number(loss);
    if (!std::isfinite(grad_norm))
      what += std::string(std::isfinite(loss) ? "the" : " and the") + " gradient norm is " + number(grad_norm);
    what += last_loss ? " (last finite loss " + number(*last_loss) + ", at step " + std::to_string(*last_step) + ")"
                      : " (no step before it was finite)";
    what += "; training stopped before this step's optimizer update, so the parameters are " +
            (last_step ? "those after step " + std::to_string(*last_step) : std::string("the initial ones")) +
            "; lower the learning rate (or add warmup), or check the data for bad tokens or documents";
    return what;
  }

  std::int64_t step_;
  double loss_, grad_norm_;
  std::optional<std::int64_t> last_finite_step_;
  std::optional<double> last_finite_loss_;
};

/// Remembers the last finite loss and throws non_finite_error at the first step whose loss or
/// gradient norm is not finite. A trainer calls check() after the backward pass and before
/// the optimizer step.
class non_finite_guard {
 public:
  void check(std::int64_t step, double loss, double grad_norm) {
    if (!std::isfinite(loss) || !std::isfinite(grad_norm))
      throw non_finite_error(step, loss, grad_norm, last_step_, last_loss_);
    last_step_ = step;
    last_loss_ = loss;
  }
  std::optional<double> last_finite_loss() const noexcept { return last_loss_; }
  std::optional<std::int64_t> last_finite_step() const noexcept { return last_step_; }

 private:
  std::optional<std::int64_t> last_step_;
  std::optional<double> last_loss_;
};

}  // namespace baton::train
