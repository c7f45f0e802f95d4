// The CUDA backward kernels on a device: the same problems as test_cuda_backward_cpu.cpp
// (reference out and lse in, reference gradients out; tolerances in backward_test_util.hpp),
// through launch_backward on device memory, plus shapes with many tiles. Without a device
// every case reports itself skipped (tests/support/skip.hpp), never passed.
#include "catch.hpp"
#include "cuda_devices.hpp"
#include "skip.hpp"

#include "backward_test_util.hpp"

#include <baton/attention/cuda/detail/backward.cuh>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace {

using cuda_bwd_test::shape;
namespace bc = baton::detail::attention::cuda;

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
}

/// cudaMalloc'd bytes, freed on scope exit.
class device_buffer {
 public:
  explicit device_buffer(std::size_t bytes) { check(cudaMalloc(&p_, bytes > 0 ? bytes : 1), "cudaMalloc"); }
  device_buffer(device_buffer&& other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  device_buffer(const device_buffer&) = delete;
  device_buffer& operator=(const device_buffer&) = delete;
  device_buffer& operator=(device_buffer&&) = delete;
  ~device_buffer() { cudaFree(p_); }
  template <class T>
  [[nodiscard]] T* as() const noexcept {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
};

template <class T>
device_buffer upload(const std::vector<T>& x) {
  device_buffer d(x.size() * sizeof(T));
  if (!x.empty()) check(cudaMemcpy(d.as<void>(), x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice), "upload");
  return d;
}
template <class T>
void download(std::vector<T>& x, const device_buffer& d) {
  if (!x.empty()) check(cudaMemcpy(x.data(), d.as<void>(), x.size() * sizeof(T), cudaMemcpyDeviceToHost), "download");
}

/// The problem's storage arrays, plan and workspace on the device; launch; gradients back
/// into p.sdq, p.sdk, p.sdv (which held the previous content: accumulate mode reads it).
template <class S>
void run_on_device(cuda_bwd_test::problem<S>& p) {
  const device_buffer q = upload(p.sq), k = upload(p.sk), v = upload(p.sv), out = upload(p.sout), dout = upload(p.sdout);
  const device_buffer lse = upload(p.lse), dq = upload(p.sdq), dk = upload(p.sdk), dv = upload(p.sdv);
  const device_buffer plan(p.plan.size_bytes());
  check(cudaMemcpy(plan.as<void>(), p.plan.blob(), p.plan.size_bytes(), cudaMemcpyHostToDevice), "plan upload");
  const device_buffer workspace(bc::backward_workspace_bytes(p.s.batch, p.s.heads_q, p.s.seq_q, p.s.heads_kv, p.s.seq_k));
  const auto args = cuda_bwd_test::make_args(p, q.as<const S>(), k.as<const S>(), v.as<const S>(), out.as<const S>(),
                                             dout.as<const S>(), lse.as<const float>(), dq.as<S>(), dk.as<S>(), dv.as<S>(),
                                             workspace.as<void>(), p.plan.view(plan.as<const void>()));
  bc::launch_backward(args, cudaStream_t{nullptr});
  check(cudaDeviceSynchronize(), "backward kernels");
  download(p.sdq, dq);
  download(p.sdk, dk);
  download(p.sdv, dv);
}

/// run_on_device as a run functor of the shared checks, which then allow for the tensor
/// cores' truncated sums (attn_test::float_tolerance).
template <class S>
struct device_backward {
  static constexpr attn_test::arithmetic arithmetic = attn_test::arithmetic::tensor_cores;
  void operator()(cuda_bwd_test::problem<S>& p) const { run_on_device(p); }
};

template <class S>
void check_device_gradients(const cuda_bwd_test::problem<S>& p, const std::string& what) {
  cuda_bwd_test::check_gradients(p, what, attn_test::arithmetic::tensor_cores);
}

using cuda_bwd_test::packed_document_ids;

template <class S, class Mask>
void compare_case(const shape& s, const Mask& mask, const baton::attention_params& params, const std::string& what,
                  unsigned seed, bool accumulate = false) {
  cuda_bwd_test::compare_case<S>(device_backward<S>{}, s, mask, params, what, seed, accumulate);
}

template <class S>
void mask_grid(const shape& s, unsigned seed, const std::string& what) {
  cuda_bwd_test::mask_grid<S>(device_backward<S>{}, s, seed, what);
}

}  // namespace

TEST_CASE("cuda backward (device): every mask, tile edges, GQA, float", "[attention][cuda][gpu][bwd-float][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  mask_grid<float>({1, 70, 45, 4, 2, 64}, 10, "GQA 2:1, Sq > Sk");
  mask_grid<float>({2, 33, 65, 2, 2, 64}, 30, "MHA, batch 2, Sk > a tile");
  mask_grid<float>({1, 130, 200, 4, 1, 128}, 40, "MQA, dim 128, many tiles");
  mask_grid<float>({1, 100, 97, 2, 2, 256}, 60, "dim 256, many tiles");
}

TEST_CASE("cuda backward (device): bf16 and fp16 storage", "[attention][cuda][gpu][bwd-16bit][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  mask_grid<baton::bfloat16>({1, 70, 45, 4, 2, 64}, 70, "GQA 2:1");
  mask_grid<baton::bfloat16>({1, 200, 190, 4, 1, 128}, 90, "MQA, dim 128, many tiles");
  mask_grid<baton::bfloat16>({2, 129, 70, 2, 2, 256}, 110, "dim 256, batch 2");
  mask_grid<baton::float16>({1, 70, 45, 4, 2, 64}, 130, "GQA 2:1");
  compare_case<baton::float16>({1, 150, 170, 2, 1, 128}, baton::sliding_window_mask{30, 0}, {}, "dim 128, window", 150);
  compare_case<baton::float16>({1, 65, 65, 2, 2, 256}, baton::prefix_lm_mask{7}, {}, "dim 256, prefix-LM", 151);
}

TEST_CASE("cuda backward (device): accumulate, rows and keys without pairs", "[attention][cuda][gpu][bwd-edges][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  compare_case<float>({1, 50, 70, 4, 2, 64}, baton::causal_mask{}, {}, "accumulate, float", 200, true);
  compare_case<baton::bfloat16>({1, 150, 170, 2, 1, 128}, baton::no_mask{}, {}, "accumulate, bf16", 201, true);
  const baton::block_mask holes([](std::int64_t q, std::int64_t k) { return k <= q && q % 7 != 3; }, 70, 70, 8);
  compare_case<float>({1, 70, 70, 2, 1, 64}, holes, {}, "rows without keys", 202);
  for (const bool accumulate : {true, false}) {
    auto p = cuda_bwd_test::make_problem<float>({1, 10, 70, 1, 1, 64}, baton::causal_mask{}, {}, 203, accumulate);
    run_on_device(p);
    bool untouched = true;
    for (std::size_t e = 10 * 64; e < p.sdk.size(); ++e)
      untouched = untouched && p.sdk[e] == (accumulate ? p.dk0[e] : 0.f) && p.sdv[e] == (accumulate ? p.dv0[e] : 0.f);
    INFO("accumulate " << accumulate);
    CHECK(untouched);
    check_device_gradients(p, "keys no query sees");
  }
}

TEST_CASE("cuda backward (device): the non-finite rule", "[attention][cuda][gpu][bwd-nonfinite][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  const shape s{1, 70, 66, 4, 2, 64};
  const std::vector<std::int64_t> ids = packed_document_ids(140);
  const std::vector<std::pair<std::vector<cuda_bwd_test::poke>, const char*>> cases{
      {{{'q', 0, 3, 1, 0, nan}}, "NaN in one query"},
      {{{'k', 0, 40, 0, 2, inf}}, "+inf in one key"},
      {{{'v', 0, 5, 1, 0, -inf}}, "-inf in one value"},
      {{{'k', 0, 65, 1, 0, nan}}, "NaN in the last key"},
      {{{'o', 0, 10, 2, 4, nan}}, "NaN in dout"},
  };
  unsigned seed = 300;
  for (const auto& [pokes, what] : cases) {
    auto causal = cuda_bwd_test::make_problem<float>(s, baton::causal_mask{}, {}, ++seed, false, pokes);
    run_on_device(causal);
    check_device_gradients(causal, std::string(what) + " (causal)");
    auto docs = cuda_bwd_test::make_problem<baton::bfloat16>(s, baton::document_mask(ids), {}, ++seed, false, pokes);
    run_on_device(docs);
    check_device_gradients(docs, std::string(what) + " (documents)");
  }
}

TEST_CASE("cuda backward (device): two runs are bitwise equal", "[attention][cuda][gpu][bwd-determinism][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  const shape s{2, 300, 257, 8, 2, 128};
  auto a = cuda_bwd_test::make_problem<baton::bfloat16>(s, baton::causal_mask{}, {}, 400);
  auto b = cuda_bwd_test::make_problem<baton::bfloat16>(s, baton::causal_mask{}, {}, 400);
  run_on_device(a);
  run_on_device(b);
  check_device_gradients(a, "large, causal");
  CHECK(std::memcmp(a.sdq.data(), b.sdq.data(), a.sdq.size() * sizeof(a.sdq[0])) == 0);
  CHECK(std::memcmp(a.sdk.data(), b.sdk.data(), a.sdk.size() * sizeof(a.sdk[0])) == 0);
  CHECK(std::memcmp(a.sdv.data(), b.sdv.data(), a.sdv.size() * sizeof(a.sdv[0])) == 0);
}
