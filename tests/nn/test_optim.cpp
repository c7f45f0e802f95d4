// AdamW and SGD against their closed forms.
#include <baton/nn.hpp>

#include "catch.hpp"

#include "nn_test_util.hpp"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace nn = baton::nn;

namespace {

// A module with one decayed matrix and one gain without decay.
template <class T>
struct two_parameters {
  nn::parameter<T> matrix{baton::host_tensor<T>({1, 2}, {T(1.0), T(-2.0)}), true};
  nn::parameter<T> gain{baton::host_tensor<T>({1}, {T(0.5)}), false};
  template <class V>
  void visit_parameters(V&& visit) {
    visit("matrix", matrix);
    visit("gain", gain);
  }
};

}  // namespace

TEST_CASE("nn adamw: three steps equal the closed form, weight decay only where asked", "[nn][optim]") {
  two_parameters<double> m;
  const nn::adamw_options o{.lr = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01};
  nn::adamw<double> opt(nn::parameters_of<double>(m), o);
  const double grads[3][3] = {{0.5, 0.25, -1.0}, {-0.25, 0.0, 2.0}, {1.0, -0.75, 0.125}};  // step x (m0, m1, gain)

  // The first step by hand for matrix[0]: p = 1 (1 - 0.1 * 0.01) = 0.999; m = 0.05,
  // v = 0.00025; m̂ = 0.5, sqrt(v̂) = 0.5; p -= 0.1 * 0.5 / (0.5 + 1e-8).
  m.matrix.grad[0] = grads[0][0];
  m.matrix.grad[1] = grads[0][1];
  m.gain.grad[0] = grads[0][2];
  opt.step();
  CHECK(std::abs(m.matrix.value[0] - (0.999 - 0.05 / (0.5 + 1e-8))) <= 1e-15);
  // The gain has no weight decay: one step of plain Adam moves it by lr against its gradient.
  CHECK(std::abs(m.gain.value[0] - (0.5 + 0.1 * 1.0 / (1.0 + 1e-8))) <= 1e-15);

  // Steps 2 and 3 against the formula written out per scalar.
  double p[3] = {1.0, -2.0, 0.5}, mom[3] = {0, 0, 0}, vel[3] = {0, 0, 0};
  const bool decays[3] = {true, true, false};
  for (int t = 1; t <= 3; ++t) {
    for (int i = 0; i < 3; ++i) {
      const double g = grads[t - 1][i];
      if (decays[i]) p[i] *= 1 - o.lr * o.weight_decay;
      mom[i] = o.beta1 * mom[i] + (1 - o.beta1) * g;
      vel[i] = o.beta2 * vel[i] + (1 - o.beta2) * g * g;
      const double m_hat = mom[i] / (1 - std::pow(o.beta1, t));
      const double v_hat = vel[i] / (1 - std::pow(o.beta2, t));
      p[i] -= o.lr * m_hat / (std::sqrt(v_hat) + o.eps);
    }
    if (t == 1) continue;  // already stepped
    m.matrix.grad[0] = grads[t - 1][0];
    m.matrix.grad[1] = grads[t - 1][1];
    m.gain.grad[0] = grads[t - 1][2];
    opt.step();
  }
  CHECK(opt.steps() == 3);
  // The optimizer computes lr / (1 - β1^t) · m / (sqrt(v) / sqrt(1 - β2^t) + ε) (torch's order),
  // the loop above lr · m̂ / (sqrt(v̂) + ε): equal up to a few roundings of O(1) values.
  CHECK(std::abs(m.matrix.value[0] - p[0]) <= 1e-13);
  CHECK(std::abs(m.matrix.value[1] - p[1]) <= 1e-13);
  CHECK(std::abs(m.gain.value[0] - p[2]) <= 1e-13);
  // A zero gradient still moves the weight through momentum and decay (step 2 of matrix[1]).
  CHECK(m.matrix.value[1] != -2.0);
}

TEST_CASE("nn adamw: float parameters follow the double closed form to float rounding", "[nn][optim]") {
  two_parameters<float> m;
  nn::adamw<float> opt(nn::parameters_of<float>(m), {.lr = 0.01, .weight_decay = 0.1});
  double p = 1.0, mom = 0, vel = 0;
  for (int t = 1; t <= 5; ++t) {
    const double g = 0.3 * t - 0.7;
    m.matrix.grad[0] = static_cast<float>(g);
    opt.step();
    p *= 1 - 0.01 * 0.1;
    mom = 0.9 * mom + 0.1 * g;
    vel = 0.999 * vel + 0.001 * g * g;
    p -= 0.01 * (mom / (1 - std::pow(0.9, t))) / (std::sqrt(vel / (1 - std::pow(0.999, t))) + 1e-8);
  }
  CHECK(std::abs(static_cast<double>(m.matrix.value[0]) - p) <= 1e-6);
}

TEST_CASE("nn sgd: plain, momentum and nesterov steps equal torch's definition", "[nn][optim]") {
  two_parameters<double> m;
  nn::sgd<double> opt(nn::parameters_of<double>(m), {.lr = 0.5, .momentum = 0.9, .weight_decay = 0.1});
  m.matrix.grad[0] = 1.0;
  opt.step();  // g = 1 + 0.1 * 1 = 1.1, b = 1.1, p = 1 - 0.55
  CHECK(std::abs(m.matrix.value[0] - 0.45) <= 1e-15);
  m.matrix.grad[0] = -2.0;
  opt.step();  // g = -2 + 0.045 = -1.955, b = 0.99 - 1.955 = -0.965, p = 0.45 + 0.4825
  CHECK(std::abs(m.matrix.value[0] - 0.9325) <= 1e-15);
  CHECK(m.gain.value[0] == 0.5);  // zero gradient, no decay for a gain: unchanged

  two_parameters<double> n;
  nn::sgd<double> nesterov(nn::parameters_of<double>(n), {.lr = 1.0, .momentum = 0.5, .nesterov = true});
  n.matrix.grad[0] = 2.0;
  nesterov.step();  // b = 2, g = 2 + 0.5 * 2 = 3
  CHECK(n.matrix.value[0] == -2.0);
  CHECK_THROWS_WITH(nn::sgd<double>(nn::parameters_of<double>(n), {.momentum = 0, .nesterov = true}),
                    Catch::Contains("nesterov momentum needs momentum > 0"));
}
