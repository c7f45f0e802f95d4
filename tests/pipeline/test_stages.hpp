// Stages, losses and the sequential oracle shared by the pipeline tests.
//
// mlp_stage<T, Side>: y = tanh(x W + b + 0.01 * position) per token (row of the last
// dimension), with an optional opaque mask side input zeroing masked tokens (seed 000). It
// has forward, backward, and split backward_input / backward_weight; weight gradients
// accumulate across microbatches until zero_grad().
//
// The oracle runs the same stages one after another on the full batch on one thread: the
// pipeline must reproduce its loss and every weight gradient.
#pragma once

#include <baton/comm.hpp>
#include <baton/payload.hpp>
#include <baton/pipeline.hpp>
#include <baton/schedule.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <mutex>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace pipeline_test {

template <class T>
using tensor = baton::host_tensor<T>;

// A deterministic value in [-scale, scale) from (seed, index).
inline double hashed(std::uint64_t seed, std::uint64_t i, double scale) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return scale * (static_cast<double>(z >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

template <class T>
tensor<T> random_tensor(std::vector<std::int64_t> shape, std::uint64_t seed, double scale = 1.0) {
  tensor<T> t(std::move(shape));
  for (std::int64_t i = 0; i < t.size(); ++i) t[i] = static_cast<T>(hashed(seed, static_cast<std::uint64_t>(i), scale));
  return t;
}

// ---- the opaque mask of seed 000 ------------------------------------------------------------

// Like FlexAttention's BlockMask: not a tensor, split along the batch by its own hook.
// allowed(b, t) says whether token t of sequence b takes part.
struct token_mask {
  std::int64_t batch = 0;
  std::int64_t seq = 0;
  std::vector<std::uint8_t> bits;  // batch x seq
  std::shared_ptr<int> identity = std::make_shared<int>(0);  // makes it visibly not a tensor

  bool allowed(std::int64_t b, std::int64_t t) const { return bits[static_cast<std::size_t>(b * seq + t)] != 0; }
};

inline token_mask make_mask(std::int64_t batch, std::int64_t seq) {
  token_mask m{batch, seq, std::vector<std::uint8_t>(static_cast<std::size_t>(batch * seq))};
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t t = 0; t < seq; ++t) m.bits[static_cast<std::size_t>(b * seq + t)] = ((b + 2 * t) % 5) != 0;
  return m;
}

}  // namespace pipeline_test

template <>
struct baton::payload_traits<pipeline_test::token_mask> {
  static constexpr payload_role role = payload_role::opaque;
  static pipeline_test::token_mask split(const pipeline_test::token_mask& m, std::int64_t chunk, std::int64_t chunks) {
    const auto part = baton::microbatch_bounds(m.batch, chunks)[static_cast<std::size_t>(chunk)];
    pipeline_test::token_mask out{part.count, m.seq, {}};
    out.bits.assign(m.bits.begin() + part.begin * m.seq, m.bits.begin() + (part.begin + part.count) * m.seq);
    return out;
  }
  static pipeline_test::token_mask merge(std::span<const pipeline_test::token_mask> parts) {
    pipeline_test::token_mask out{0, parts[0].seq, {}};
    for (const auto& p : parts) {
      out.batch += p.batch;
      out.bits.insert(out.bits.end(), p.bits.begin(), p.bits.end());
    }
    return out;
  }
};

namespace pipeline_test {

using masked_side = baton::record<baton::field<"mask", token_mask>,
                                  baton::field<"positions", baton::constant<tensor<std::int64_t>>>>;

// ---- the MLP stage ----------------------------------------------------------------------------

template <class T, class Side = baton::no_side>
struct mlp_stage {
  using input = tensor<T>;
  using output = tensor<T>;
  using side = Side;
  struct saved {
    tensor<T> x, y, dz;
    std::vector<std::uint8_t> keep;  // per token: not masked
    [[nodiscard]] std::size_t bytes() const {
      return static_cast<std::size_t>(x.size() + y.size() + dz.size()) * sizeof(T) + keep.size();
    }
  };

  std::int64_t width;
  tensor<T> w, b, dw, db;
  int forward_calls = 0;

  mlp_stage(std::int64_t width_, std::uint64_t seed)
      : width(width_),
        w(random_tensor<T>({width_, width_}, seed, 1.2 / std::sqrt(static_cast<double>(width_)))),
        b(random_tensor<T>({width_}, seed + 1000, 0.1)),
        dw({width_, width_}),
        db({width_}) {}

  void zero_grad() {
    std::fill(dw.data(), dw.data() + dw.size(), T{});
    std::fill(db.data(), db.data() + db.size(), T{});
  }

  output forward(const input& x, const side& c, saved& st) {
    ++forward_calls;
    const auto shape = x.shape();
    if (shape.back() != width) throw std::invalid_argument("mlp_stage: input width mismatch");
    const std::int64_t rows = x.size() / width;
    st.x = x;
    st.y = tensor<T>(shape);
    st.keep.assign(static_cast<std::size_t>(rows), 1);
    if constexpr (!std::is_same_v<Side, baton::no_side>) {
      const auto& mask = baton::get<"mask">(c);
      const auto& pos = *baton::get<"positions">(c);
      if (mask.batch * mask.seq != rows || pos.size() != rows) {
        throw std::invalid_argument("mlp_stage: side input does not match the microbatch");
      }
      for (std::int64_t r = 0; r < rows; ++r) st.keep[static_cast<std::size_t>(r)] = mask.bits[static_cast<std::size_t>(r)];
    }
    for (std::int64_t r = 0; r < rows; ++r) {
      double shift = 0;
      if constexpr (!std::is_same_v<Side, baton::no_side>) shift = 0.01 * static_cast<double>((*baton::get<"positions">(c))[r]);
      for (std::int64_t j = 0; j < width; ++j) {
        T z = b[j] + static_cast<T>(shift);
        for (std::int64_t i = 0; i < width; ++i) z += x[r * width + i] * w[i * width + j];
        st.y[r * width + j] = st.keep[static_cast<std::size_t>(r)] ? std::tanh(z) : T{};
      }
    }
    return st.y;
  }

  baton::grad_t<input> backward_input(saved& st, const baton::grad_t<output>& dy) {
    const std::int64_t rows = st.x.size() / width;
    st.dz = tensor<T>(st.x.shape());
    tensor<T> dx(st.x.shape());
    for (std::int64_t r = 0; r < rows; ++r) {
      if (!st.keep[static_cast<std::size_t>(r)]) continue;
      for (std::int64_t j = 0; j < width; ++j) {
        const T y = st.y[r * width + j];
        st.dz[r * width + j] = dy[r * width + j] * (T{1} - y * y);
      }
      for (std::int64_t i = 0; i < width; ++i) {
        T acc{};
        for (std::int64_t j = 0; j < width; ++j) acc += st.dz[r * width + j] * w[i * width + j];
        dx[r * width + i] = acc;
      }
    }
    return dx;
  }

  void backward_weight(saved& st) {
    const std::int64_t rows = st.x.size() / width;
    for (std::int64_t r = 0; r < rows; ++r) {
      for (std::int64_t i = 0; i < width; ++i)
        for (std::int64_t j = 0; j < width; ++j) dw[i * width + j] += st.x[r * width + i] * st.dz[r * width + j];
      for (std::int64_t j = 0; j < width; ++j) db[j] += st.dz[r * width + j];
    }
  }

  baton::grad_t<input> backward(saved& st, const baton::grad_t<output>& dy) {
    auto dx = backward_input(st, dy);
    backward_weight(st);
    return dx;
  }
};

// 0.5 * mean over tokens of the squared error summed over the last dimension.
template <class T>
struct mse_loss {
  baton::loss_result<tensor<T>> operator()(const tensor<T>& y, const tensor<T>& target) const {
    const std::int64_t width = y.shape().back();
    const std::int64_t rows = y.size() / width;
    baton::loss_result<tensor<T>> r{0.0, tensor<T>(y.shape())};
    for (std::int64_t i = 0; i < y.size(); ++i) {
      const double d = static_cast<double>(y[i]) - static_cast<double>(target[i]);
      r.value += 0.5 * d * d / static_cast<double>(rows);
      r.grad[i] = static_cast<T>(d / static_cast<double>(rows));
    }
    return r;
  }
  std::int64_t tokens(const tensor<T>& target) const { return target.size() / target.shape().back(); }
};

// ---- the sequential oracle ---------------------------------------------------------------------

template <class Stage>
struct oracle_result {
  double loss = 0;
  std::vector<Stage> stages;
};

// Runs `stages` one after another on the full batch; returns the loss, leaves the weight
// gradients in the stages.
template <class Stage, class Side, class Loss, class Target>
double sequential_step(std::vector<Stage>& stages, const typename Stage::input& batch, const Side& side,
                       const Target& target, Loss loss) {
  std::vector<typename Stage::saved> saved(stages.size());
  typename Stage::input x = batch;
  for (std::size_t s = 0; s < stages.size(); ++s) x = stages[s].forward(x, side, saved[s]);
  auto r = loss(x, target);
  auto g = r.grad;
  for (std::size_t s = stages.size(); s-- > 0;) g = stages[s].backward(saved[s], g);
  return r.value;
}

template <class Stage, class Side, class Loss, class Target>
double sequential_loss(std::vector<Stage>& stages, const typename Stage::input& batch, const Side& side,
                       const Target& target, Loss loss) {
  typename Stage::input x = batch;
  for (auto& s : stages) {
    typename Stage::saved st;
    x = s.forward(x, side, st);
  }
  return loss(x, target).value;
}

// max |a - b| / max |b| over a tensor: a normwise relative error, meaningful for tensors with
// entries near zero (an elementwise ratio would divide by them).
template <class T>
double rel_err(const tensor<T>& a, const tensor<T>& b) {
  if (a.size() != b.size()) return 1e300;
  double diff = 0, ref = 0;
  for (std::int64_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i])));
    ref = std::max(ref, std::abs(static_cast<double>(b[i])));
  }
  return ref == 0 ? diff : diff / ref;
}

inline double rel_err(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-300); }

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

// Appends spans over a stage's weight gradients, dw then db: what clip_grad_norm takes.
template <class T, class Side>
void append_grad_spans(std::vector<std::span<T>>& spans, mlp_stage<T, Side>& st) {
  spans.emplace_back(st.dw.data(), static_cast<std::size_t>(st.dw.size()));
  spans.emplace_back(st.db.data(), static_cast<std::size_t>(st.db.size()));
}

// Runs fn on n ranks of the local world (20 s timeout); returns each rank's pipeline_error
// message ("" when that rank finished without one).
template <class F>
std::vector<std::string> errors_of(int n, F fn) {
  std::mutex m;
  std::vector<std::string> messages(static_cast<std::size_t>(n));
  baton::local_options opts;
  opts.timeout = std::chrono::seconds(20);
  try {
    baton::run_local(
        n,
        [&](baton::local_communicator& comm) {
          try {
            fn(comm);
          } catch (const baton::pipeline_error& e) {
            std::lock_guard lock(m);
            messages[static_cast<std::size_t>(comm.rank())] = e.what();
            throw;
          }
        },
        opts);
  } catch (const std::exception&) {
  }
  return messages;
}

}  // namespace pipeline_test
