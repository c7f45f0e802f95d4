// Pipeline parity with tensors the host cannot touch (host_accessible = false), shared by the
// CPU test (test_device_payload.cpp: a host-backed stand-in over the local world) and the GPU
// test (test_pipeline_nccl_gpu.cu: baton::cuda::device_tensor over nccl_communicator).
//
// The stage is y = tanh(x W + b) per row, with split backward; `Ops` supplies its kernels for
// the tensor type at hand:
//   static void forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y);
//   static void backward_input(const Tensor& y, const Tensor& dy, const Tensor& w, Tensor& dz, Tensor& dx);
//       dz = dy * (1 - y^2), dx = dz W^T
//   static void backward_weight(const Tensor& x, const Tensor& dz, Tensor& dw, Tensor& db);
//       dw += x^T dz, db += column sums of dz (accumulating across microbatches)
// Every kernel is complete when it returns (the executor hands outputs to the communicator).
// The oracle runs the same stages one after another on the whole batch on one rank.
#pragma once

#include <baton/comm.hpp>
#include <baton/payload.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

namespace device_parity {

// A deterministic value in [-scale, scale) from (seed, index).
inline double hashed(std::uint64_t seed, std::uint64_t i, double scale) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return scale * (static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

template <class Tensor>
Tensor random_tensor(std::vector<std::int64_t> shape, std::uint64_t seed, double scale) {
  using T = typename Tensor::value_type;
  std::int64_t n = 1;
  for (auto e : shape) n *= e;
  std::vector<T> values(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<T>(hashed(seed, i, scale));
  return Tensor::from_host(std::move(shape), values);
}

template <class Tensor, class Ops>
struct linear_tanh_stage {
  using input = Tensor;
  using output = Tensor;
  using side = baton::no_side;
  struct saved {
    Tensor x, y, dz;
  };

  std::int64_t width;
  Tensor w, b, dw, db;

  linear_tanh_stage(std::int64_t width_, std::uint64_t seed)
      : width(width_),
        w(random_tensor<Tensor>({width_, width_}, seed, 1.2 / std::sqrt(static_cast<double>(width_)))),
        b(random_tensor<Tensor>({width_}, seed + 1000, 0.1)),
        dw(std::vector<std::int64_t>{width_, width_}),
        db(std::vector<std::int64_t>{width_}) {}

  output forward(const input& x, const side&, saved& st) {
    Tensor y = Tensor::for_overwrite(x.shape());
    Ops::forward(x, w, b, y);
    st.x = x.clone();
    st.y = y.clone();
    return y;
  }
  baton::grad_t<input> backward_input(saved& st, const baton::grad_t<output>& dy) {
    st.dz = Tensor::for_overwrite(st.y.shape());
    Tensor dx = Tensor::for_overwrite(st.x.shape());
    Ops::backward_input(st.y, dy, w, st.dz, dx);
    return dx;
  }
  void backward_weight(saved& st) { Ops::backward_weight(st.x, st.dz, dw, db); }
  baton::grad_t<input> backward(saved& st, const baton::grad_t<output>& dy) {
    auto dx = backward_input(st, dy);
    backward_weight(st);
    return dx;
  }
};

// 0.5 * mean over rows of the squared error summed over the last dimension; computed on the
// host from copies (a test's loss: what matters is that the gradient goes back as a Tensor).
template <class Tensor>
struct mse_loss {
  baton::loss_result<Tensor> operator()(const Tensor& y, const Tensor& target) const {
    using T = typename Tensor::value_type;
    const auto yv = y.to_host();
    const auto tv = target.to_host();
    const auto rows = static_cast<double>(y.size() / y.shape().back());
    std::vector<T> grad(yv.size());
    double value = 0;
    for (std::size_t i = 0; i < yv.size(); ++i) {
      const double d = static_cast<double>(yv[i]) - static_cast<double>(tv[i]);
      value += 0.5 * d * d / rows;
      grad[i] = static_cast<T>(d / rows);
    }
    return {value, Tensor::from_host(y.shape(), grad)};
  }
};

// What one run produced: the loss (on the last stage's rank) and every stage's dW and db.
struct outcome {
  std::optional<double> loss;
  std::vector<std::optional<std::vector<double>>> dw, db;  // by stage
};

template <class Tensor>
std::vector<double> host_doubles(const Tensor& t) {
  const auto v = t.to_host();
  return std::vector<double>(v.begin(), v.end());
}

// This rank's part of one step of `prog` (every rank passes the whole batch and target).
template <class Tensor, class Ops, class Comm>
outcome run_rank(Comm& comm, const baton::program& prog, std::int64_t width, const Tensor& batch, const Tensor& target,
                 std::uint64_t seed = 300) {
  using S = linear_tanh_stage<Tensor, Ops>;
  auto exec = baton::make_pipeline<baton::uniform_stages<S>>(
      comm, prog, [&](int s) { return S(width, seed + static_cast<std::uint64_t>(s)); }, mse_loss<Tensor>{});
  const baton::step_report r = exec.step(batch, target);
  outcome out;
  out.dw.resize(static_cast<std::size_t>(prog.shape.num_stages()));
  out.db.resize(out.dw.size());
  out.loss = r.loss;
  exec.for_each_local_stage([&](int s, S& st) {
    out.dw[static_cast<std::size_t>(s)] = host_doubles(st.dw);
    out.db[static_cast<std::size_t>(s)] = host_doubles(st.db);
  });
  return out;
}

// The oracle: the same stages, one after another, on the whole batch.
template <class Tensor, class Ops>
outcome sequential(int stages, std::int64_t width, const Tensor& batch, const Tensor& target, std::uint64_t seed = 300) {
  using S = linear_tanh_stage<Tensor, Ops>;
  std::vector<S> st;
  for (int s = 0; s < stages; ++s) st.emplace_back(width, seed + static_cast<std::uint64_t>(s));
  std::vector<typename S::saved> saved(static_cast<std::size_t>(stages));
  Tensor x = batch.clone();
  for (std::size_t s = 0; s < st.size(); ++s) x = st[s].forward(x, baton::no_side{}, saved[s]);
  auto loss = mse_loss<Tensor>{}(x, target);
  Tensor g = std::move(loss.grad);
  for (std::size_t s = st.size(); s-- > 0;) g = st[s].backward(saved[s], g);
  outcome out;
  out.loss = loss.value;
  for (auto& s : st) {
    out.dw.emplace_back(host_doubles(s.dw));
    out.db.emplace_back(host_doubles(s.db));
  }
  return out;
}

// Merges the ranks' outcomes (each stage's gradients come from the rank that holds it).
inline outcome merge(const std::vector<outcome>& ranks, int stages) {
  outcome out;
  out.dw.resize(static_cast<std::size_t>(stages));
  out.db.resize(out.dw.size());
  for (const auto& r : ranks) {
    if (r.loss) out.loss = r.loss;
    for (std::size_t s = 0; s < r.dw.size() && s < out.dw.size(); ++s) {
      if (r.dw[s]) out.dw[s] = r.dw[s];
      if (r.db[s]) out.db[s] = r.db[s];
    }
  }
  return out;
}

// max |a - b| / max |b|: normwise, meaningful for entries near zero.
inline double rel_err(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return 1e300;
  double diff = 0, ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    ref = std::max(ref, std::abs(b[i]));
  }
  return ref == 0 ? diff : diff / ref;
}

// The largest relative error of the loss and of every weight gradient; 1e300 when one is missing.
inline double parity_error(const outcome& got, const outcome& oracle) {
  if (!got.loss || !oracle.loss) return 1e300;
  double err = std::abs(*got.loss - *oracle.loss) / std::max(std::abs(*oracle.loss), 1e-300);
  for (std::size_t s = 0; s < oracle.dw.size(); ++s) {
    if (s >= got.dw.size() || !got.dw[s] || !got.db[s]) return 1e300;
    err = std::max({err, rel_err(*got.dw[s], *oracle.dw[s]), rel_err(*got.db[s], *oracle.db[s])});
  }
  return err;
}

}  // namespace device_parity
