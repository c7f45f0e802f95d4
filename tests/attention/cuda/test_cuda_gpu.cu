// cuda_attention's forward on a device against the reference backend (double): the Kokkos
// backend's shape x mask grid in float (1e-5), bfloat16 (2e-2) and float16 (2.5e-3) storage
// (the tolerances are argued in forward_test_util.hpp), a multi-tile causal problem, the
// non-finite rule, strided views, and bad input. Every case skips without a CUDA device.
#include "catch.hpp"
#include "cuda_devices.hpp"
#include "skip.hpp"

#include "forward_test_util.hpp"

#include <baton/attention.hpp>
#include <baton/attention/cuda.hpp>

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

static_assert(baton::attention_backend<baton::cuda_attention, float>,
              "cuda_attention models attention_backend<..., float> (on device memory)");

namespace {
using attn_test::shape;
using cuda_test::make_problem;
using cuda_test::problem;

void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(rc));
}

/// A device copy of a host vector (and back).
template <class T>
class device_vector {
 public:
  explicit device_vector(std::size_t n) : n_(n) { cuda_check(cudaMalloc(&p_, std::max<std::size_t>(n, 1) * sizeof(T)), "cudaMalloc"); }
  explicit device_vector(const std::vector<T>& host) : device_vector(host.size()) {
    cuda_check(cudaMemcpy(p_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  device_vector(const device_vector&) = delete;
  device_vector& operator=(const device_vector&) = delete;
  ~device_vector() { (void)cudaFree(p_); }
  [[nodiscard]] T* data() const noexcept { return p_; }
  void copy_to(std::vector<T>& host) const {
    cuda_check(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
  }

 private:
  std::size_t n_;
  T* p_ = nullptr;
};

/// The forward on the device through `backend` (a fresh one on its own stream when null).
struct device_run {
  static constexpr attn_test::arithmetic arithmetic = attn_test::arithmetic::tensor_cores;
  const baton::cuda_attention* shared = nullptr;

  template <class S, class Mask>
  void operator()(const problem<S>& p, const Mask& mask, const baton::attention_params& params, std::vector<S>& out,
                  std::vector<float>& lse) const {
    cudaStream_t stream = shared ? shared->stream() : nullptr;
    if (!shared) cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
    {
      const device_vector<S> q(p.q), k(p.k), v(p.v);
      device_vector<S> o(out);
      device_vector<float> l(lse);
      const shape& s = p.s;
      const baton::cuda_attention backend = shared ? *shared : baton::cuda_attention(stream);
      backend.forward(baton::make_tensor_view<const S>(q.data(), {s.batch, s.seq_q, s.heads_q, s.dim}),
                      baton::make_tensor_view<const S>(k.data(), {s.batch, s.seq_k, s.heads_kv, s.dim}),
                      baton::make_tensor_view<const S>(v.data(), {s.batch, s.seq_k, s.heads_kv, s.dim}), mask,
                      baton::make_tensor_view(o.data(), {s.batch, s.seq_q, s.heads_q, s.dim}),
                      baton::make_tensor_view(l.data(), {s.batch, s.heads_q, s.seq_q}), params);
      cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      o.copy_to(out);
      l.copy_to(lse);
    }
    if (!shared) cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
  }
};

// The Kokkos backend's grid (tests/attention/test_kokkos.cpp) at the supported head dims:
// Hq = 8; Hkv 8, 2, 1; odd lengths; Sq != Sk; lengths below, at and above one tile; batch 2.
const struct {
  shape s;
  const char* what;
} grid[] = {
    {{2, 37, 53, 8, 8, 64}, "MHA, D 64, batch 2"},
    {{1, 70, 45, 8, 2, 64}, "GQA 4:1, D 64, Sq > Sk"},
    {{1, 65, 130, 8, 1, 128}, "MQA, D 128, Sk > 2 tiles"},
    {{1, 29, 67, 8, 2, 256}, "GQA, D 256"},
};

template <class S>
void run_grid(unsigned seed) {
  for (const auto& g : grid) cuda_test::check_mask_grid<S>(device_run{}, g.s, ++seed, g.what);
}
}  // namespace

TEST_CASE("cuda_attention forward on the device: the Kokkos grid, float storage", "[cuda][gpu][grid_float][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  run_grid<float>(1000);
}

TEST_CASE("cuda_attention forward on the device: the Kokkos grid, bfloat16 storage", "[cuda][gpu][grid_bf16][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  run_grid<baton::bfloat16>(2000);
}

TEST_CASE("cuda_attention forward on the device: the Kokkos grid, float16 storage", "[cuda][gpu][grid_fp16][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  run_grid<baton::float16>(3000);
}

TEST_CASE("cuda_attention forward on the device: many tiles, causal and documents", "[cuda][gpu][many_tiles][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  for (const int dim : {64, 128, 256}) {
    const shape s{1, 700, 900, 4, 2, dim};
    baton::attention_params params;
    params.q_pos = baton::positions(200, 700);
    const problem<baton::bfloat16> pb = make_problem<baton::bfloat16>(s, 4000u + static_cast<unsigned>(dim));
    cuda_test::check_forward_with(device_run{}, pb, baton::causal_mask{}, params, "causal, many tiles");
    const problem<float> pf = make_problem<float>(s, 4100u + static_cast<unsigned>(dim));
    cuda_test::check_forward_with(device_run{}, pf, baton::no_mask{}, params, "no mask, many tiles");
    std::vector<std::int64_t> docs(900);
    for (std::int64_t p = 0; p < 900; ++p) docs[static_cast<std::size_t>(p)] = p / 170;
    cuda_test::check_forward_with(device_run{}, pf, baton::intersect(baton::document_mask(docs), baton::causal_mask{}),
                                  params, "causal documents, many tiles");
  }
}

TEST_CASE("cuda_attention on the device: one object, changing masks and shapes (workspace and plan reuse)", "[cuda][gpu][reuse][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreate(&stream), "cudaStreamCreate");
  {
    // Copies share the workspace. Reserved for the larger shape, no call allocates; a
    // repeated call finds its plan cached on the device (no build, no upload) and computes
    // the right thing with it; release_workspace frees everything, and the next round
    // starts over.
    const baton::cuda_attention backend(stream);
    const device_run run{&backend};
    const problem<baton::bfloat16> small = make_problem<baton::bfloat16>({1, 100, 100, 2, 1, 64}, 7000);
    const problem<baton::bfloat16> large = make_problem<baton::bfloat16>({2, 600, 600, 2, 2, 64}, 7001);
    for (int round = 0; round < 2; ++round) {
      backend.reserve_workspace({.batch = 2, .heads_q = 2, .heads_kv = 2, .seq_q = 600, .seq_k = 600, .dim = 64});
      const auto reserved = backend.workspace_stats();
      cuda_test::check_forward_with(run, small, baton::causal_mask{}, {}, "reuse: causal");
      cuda_test::check_forward_with(run, small, baton::no_mask{}, {}, "reuse: no mask");
      const auto before = backend.workspace_stats();
      cuda_test::check_forward_with(run, small, baton::causal_mask{}, {}, "reuse: causal again");
      const auto after = backend.workspace_stats();
      CHECK(after.plan_builds == before.plan_builds);
      CHECK(after.plan_uploads == before.plan_uploads);
      CHECK(after.plan_hits == before.plan_hits + 1);
      cuda_test::check_forward_with(run, large, baton::sliding_window_mask{50, 0}, {}, "reuse: larger, window");
      CHECK(backend.workspace_stats().allocations == reserved.allocations);
      backend.release_workspace();
    }
  }
  cuda_check(cudaStreamDestroy(stream), "cudaStreamDestroy");
}

TEST_CASE("cuda_attention forward on the device: the non-finite rule", "[cuda][gpu][nonfinite][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  for (const float bad : {nan, inf, -inf}) {
    problem<float> p = make_problem<float>({1, 150, 150, 2, 1, 64}, 5000);
    problem<baton::bfloat16> pb = make_problem<baton::bfloat16>({1, 150, 150, 2, 1, 128}, 5001);
    cuda_test::poke(p.v, p.vd, 100, 64, 5, bad);            // hidden from rows < 100 under causal
    cuda_test::poke(p.k, p.kd, 7, 64, 0, bad);
    cuda_test::poke(p.q, p.qd, 12 * 2 + 1, 64, 63, bad);
    cuda_test::poke(pb.v, pb.vd, 130, 128, 5, bad);
    cuda_test::poke(pb.q, pb.qd, 3 * 2 + 0, 128, 9, bad);
    cuda_test::check_forward_with(device_run{}, p, baton::causal_mask{}, {}, "non-finite, causal");
    cuda_test::check_forward_with(device_run{}, p, baton::sliding_window_mask{2, 0}, {}, "non-finite, window");
    cuda_test::check_forward_with(device_run{}, pb, baton::causal_mask{}, {}, "non-finite, causal, bf16");
  }
}

TEST_CASE("cuda_attention on the device: head dim 96 and misaligned rows are rejected", "[cuda][gpu][bad_input][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  const shape s{1, 4, 4, 1, 1, 96};
  const problem<float> p = make_problem<float>(s, 6000);
  std::vector<float> out(p.q.size()), lse(4);
  try {
    device_run{}(p, baton::no_mask{}, {}, out, lse);
    FAIL("head dim 96 was accepted");
  } catch (const baton::attention_error& e) {
    CHECK(std::string(e.what()).find("64, 128 and 256") != std::string::npos);
  }
  device_vector<float> buf(4 * 64 + 1);
  const std::array<std::int64_t, 4> ext{1, 4, 1, 64};
  const auto shifted = baton::make_tensor_view<const float>(buf.data() + 1, ext);  // 4 bytes off a 16-byte row
  device_vector<float> o(4 * 64), l(4);
  CHECK_THROWS_AS(baton::cuda_attention{}.forward(shifted, shifted, shifted, baton::no_mask{},
                                                  baton::make_tensor_view(o.data(), ext),
                                                  baton::make_tensor_view(l.data(), std::array<std::int64_t, 3>{1, 1, 4})),
                  baton::attention_error);
}
