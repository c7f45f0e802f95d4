// Pipeline parity over NCCL with device-memory stages: 1F1B and ZBV of a linear+tanh stage
// whose tensors are baton::cuda::device_tensor<double>, run by the executor over
// nccl_communicator, against the same stages run one after another (device_parity.hpp; the
// CPU test test_device_payload.cpp runs the same harness with a host stand-in).
//
// One rank per visible GPU (at most 8), ranks as threads of a local world that bootstraps
// NCCL. NCCL does not support two ranks of one communicator on the same device ("Using the
// same CUDA device multiple times as different ranks of the same NCCL communicator is not
// supported and may lead to hangs", NCCL user guide, Creating a Communicator), so with ONE
// GPU the pipeline has one rank: 1F1B runs one stage and ZBV two stages on it, and nothing
// crosses NCCL but the device payload path of the executor is exercised end to end (split,
// receive pools stay empty, loss scaling, merge). Two GPUs or more exercise NCCL transfers of
// device payloads and of the executor's host headers (staged by nccl_communicator). To run
// the multi-rank device path on one GPU all the same, a further case runs 2 and 3 ranks on
// device 0 over the local world with device spans staged through host memory.
//
// The kernels are in nccl_gpu_kernels.cu (nvcc); this file is compiled by the host compiler.
// Without a CUDA device every case reports itself skipped ("no CUDA device").
#include "catch.hpp"
#include "device_parity.hpp"
#include "nccl_gpu_kernels.hpp"
#include "cuda_devices.hpp"
#include "skip.hpp"

#include <baton/comm/local.hpp>
#include <baton/comm/nccl.hpp>
#include <baton/payload/cuda.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using tensor = baton::cuda::device_tensor<double>;

// The stage's kernels on the payload stream (complete when each returns: the executor hands
// a stage's output to NCCL on the communicator's stream).
struct cuda_ops {
  static void forward(const tensor& x, const tensor& w, const tensor& b, tensor& y) {
    const long long width = w.shape()[0];
    nccl_gpu_kernels::forward(x.data(), w.data(), b.data(), y.data(), x.size() / width, width,
                              baton::cuda::payload_stream());
  }
  static void backward_input(const tensor& y, const tensor& dy, const tensor& w, tensor& dz, tensor& dx) {
    const long long width = w.shape()[0];
    nccl_gpu_kernels::backward_input(y.data(), dy.data(), w.data(), dz.data(), dx.data(), y.size() / width, width,
                                     baton::cuda::payload_stream());
  }
  static void backward_weight(const tensor& x, const tensor& dz, tensor& dw, tensor& db) {
    const long long width = dw.shape()[0];
    nccl_gpu_kernels::backward_weight(x.data(), dz.data(), dw.data(), db.data(), x.size() / width, width,
                                      baton::cuda::payload_stream());
  }
};

// Several ranks on ONE device, which NCCL cannot do: the local world, with device spans
// staged through host memory (a device send is copied to the host when posted, a device
// receive copied to the device when complete; host spans - the executor's headers - go
// straight). It runs the executor's multi-rank device path (device receive buffers and pools,
// message headers, gradients travelling back) on a machine with one GPU.
class staged_local_comm {
 public:
  struct request {
    baton::local_request inner;
    std::unique_ptr<std::vector<std::byte>> staged;  // the host copy of a device buffer
    std::byte* device_destination = nullptr;         // a device receive: staged goes here when complete

    void wait() {
      inner.wait();
      finish();
    }
    bool test() {
      if (!inner.test()) return false;
      finish();
      return true;
    }
    void finish() {
      if (device_destination == nullptr) return;
      copy(device_destination, staged->data(), staged->size(), cudaMemcpyHostToDevice);
      device_destination = nullptr;
    }
  };

  explicit staged_local_comm(baton::local_communicator& host) : host_(&host) {}
  int rank() const { return host_->rank(); }
  int size() const { return host_->size(); }

  request isend(std::span<const std::byte> data, int dest, int tag) {
    if (!on_device(data.data())) return {host_->isend(data, dest, tag), nullptr, nullptr};
    auto staged = std::make_unique<std::vector<std::byte>>(data.size());
    copy(staged->data(), data.data(), data.size(), cudaMemcpyDeviceToHost);
    auto inner = host_->isend(std::span<const std::byte>(*staged), dest, tag);
    return {std::move(inner), std::move(staged), nullptr};
  }
  request irecv(std::span<std::byte> data, int source, int tag) {
    if (!on_device(data.data())) return {host_->irecv(data, source, tag), nullptr, nullptr};
    auto staged = std::make_unique<std::vector<std::byte>>(data.size());
    auto inner = host_->irecv(std::span<std::byte>(*staged), source, tag);
    return {std::move(inner), std::move(staged), data.data()};
  }

 private:
  static bool on_device(const void* p) {
    if (p == nullptr) return false;
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }
  static void copy(void* to, const void* from, std::size_t n, cudaMemcpyKind kind) {
    if (n == 0) return;
    cudaError_t rc = cudaMemcpyAsync(to, from, n, kind, baton::cuda::payload_stream());
    if (rc == cudaSuccess) rc = cudaStreamSynchronize(baton::cuda::payload_stream());
    if (rc != cudaSuccess) throw std::runtime_error(std::string("staged_local_comm: cudaMemcpyAsync: ") + cudaGetErrorString(rc));
  }
  baton::local_communicator* host_;
};

static_assert(baton::point_to_point_communicator<staged_local_comm>);

// One step of `Policy` on `ranks` ranks of the local world, all on device 0, against the oracle.
template <class Policy>
void check_policy_staged_on_one_device(int ranks) {
  const int m = 4;
  const baton::program prog = Policy::generate(baton::shape_for<Policy>(ranks, m));
  const std::int64_t width = 16, rows = 24;
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  device_parity::outcome oracle;
  {
    const auto batch = device_parity::random_tensor<tensor>({rows, width}, 11, 1.0);
    const auto target = device_parity::random_tensor<tensor>({rows, width}, 12, 0.5);
    oracle = device_parity::sequential<tensor, cuda_ops>(prog.shape.num_stages(), width, batch, target);
  }
  std::vector<device_parity::outcome> by_rank(static_cast<std::size_t>(ranks));
  std::mutex mutex;
  baton::run_local(
      ranks,
      [&](baton::local_communicator& host) {
        if (cudaSetDevice(0) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
        staged_local_comm comm(host);
        const auto batch = device_parity::random_tensor<tensor>({rows, width}, 11, 1.0);
        const auto target = device_parity::random_tensor<tensor>({rows, width}, 12, 0.5);
        auto mine = device_parity::run_rank<tensor, cuda_ops>(comm, prog, width, batch, target);
        std::lock_guard lock(mutex);
        by_rank[static_cast<std::size_t>(host.rank())] = std::move(mine);
      },
      baton::local_options{.timeout = std::chrono::seconds(120)});
  const auto got = device_parity::merge(by_rank, prog.shape.num_stages());
  INFO(ranks << " ranks on one device, " << prog.shape.num_stages() << " stages");
  CHECK(device_parity::parity_error(got, oracle) < 1e-11);  // as over NCCL, below
}

template <class Policy>
void check_policy_over_nccl(int ranks) {
  const int m = 4;
  const baton::program prog = Policy::generate(baton::shape_for<Policy>(ranks, m));
  const std::int64_t width = 16, rows = 24;
  device_parity::outcome oracle;
  {
    REQUIRE(cudaSetDevice(0) == cudaSuccess);
    const auto batch = device_parity::random_tensor<tensor>({rows, width}, 11, 1.0);
    const auto target = device_parity::random_tensor<tensor>({rows, width}, 12, 0.5);
    oracle = device_parity::sequential<tensor, cuda_ops>(prog.shape.num_stages(), width, batch, target);
  }
  std::vector<device_parity::outcome> by_rank(static_cast<std::size_t>(ranks));
  std::mutex mutex;
  baton::run_local(
      ranks,
      [&](baton::local_communicator& host) {
        if (cudaSetDevice(host.rank()) != cudaSuccess) throw std::runtime_error("cudaSetDevice failed");
        auto comm = baton::nccl_communicator::bootstrap(host, host.rank());
        const auto batch = device_parity::random_tensor<tensor>({rows, width}, 11, 1.0);
        const auto target = device_parity::random_tensor<tensor>({rows, width}, 12, 0.5);
        auto mine = device_parity::run_rank<tensor, cuda_ops>(comm, prog, width, batch, target);
        std::lock_guard lock(mutex);
        by_rank[static_cast<std::size_t>(host.rank())] = std::move(mine);
      },
      baton::local_options{.timeout = std::chrono::seconds(120)});
  const auto got = device_parity::merge(by_rank, prog.shape.num_stages());
  // Double precision and the same kernels on both sides: only the order of dW/db's sums over
  // rows differs (m microbatches of rows / m rows vs all rows), a few ulps per sum.
  INFO(ranks << " rank(s), " << prog.shape.num_stages() << " stages");
  CHECK(device_parity::parity_error(got, oracle) < 1e-11);
}

}  // namespace

TEST_CASE("nccl pipeline: device_tensor is a device payload the executor can send", "[pipeline][nccl]") {
  STATIC_REQUIRE(baton::activation_tensor<tensor>);
  STATIC_REQUIRE_FALSE(baton::host_accessible_v<tensor>);
  STATIC_REQUIRE_FALSE(std::is_copy_constructible_v<tensor>);
  STATIC_REQUIRE(baton::point_to_point_communicator<baton::nccl_communicator>);
  STATIC_REQUIRE(baton::split_backward_stage<device_parity::linear_tanh_stage<tensor, cuda_ops>>);
}

TEST_CASE("nccl pipeline: device tensors copy, split and merge", "[pipeline][nccl][gpu][device][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  std::vector<double> values(6 * 5);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i) - 3.5;
  const auto t = tensor::from_host({6, 5}, values);
  CHECK(t.to_host() == values);
  CHECK(tensor(std::vector<std::int64_t>{3, 2}).to_host() == std::vector<double>(6, 0.0));
  auto parts = baton::split_microbatches(t, 4);  // rows 2, 2, 1, 1
  REQUIRE(parts.size() == 4);
  CHECK(parts[1].to_host() == std::vector<double>(values.begin() + 10, values.begin() + 20));
  const auto merged = baton::merge_microbatches(std::span<const tensor>(parts));
  CHECK(merged.to_host() == values);
  const auto columns = baton::tensor_slice(t, 1, 1, 3);  // a strided slice: 6 rows of 3
  std::vector<double> expected_columns;
  for (std::size_t row = 0; row < 6; ++row)
    for (std::size_t col = 1; col < 4; ++col) expected_columns.push_back(values[row * 5 + col]);
  CHECK(columns.shape() == std::vector<std::int64_t>{6, 3});
  CHECK(columns.to_host() == expected_columns);
  // A concat along dim 1: pitched copies into the middle of every row.
  std::vector<tensor> column_parts;
  column_parts.push_back(baton::tensor_slice(t, 1, 0, 1));
  column_parts.push_back(baton::tensor_slice(t, 1, 1, 4));
  const auto rejoined = baton::payload_traits<tensor>::concat(std::span<const tensor>(column_parts), 1);
  CHECK(rejoined.to_host() == values);
  auto g = t.clone();
  baton::detail::pipeline::scale_payload(g, 0.5);
  std::vector<double> halves = values;
  for (auto& x : halves) x *= 0.5;
  CHECK(g.to_host() == halves);  // exact: scaling by a power of two
  CHECK(t.to_host() == values);  // the clone was deep
}

TEST_CASE("pipeline on one GPU: 1F1B and ZBV on 2, 3 ranks, staged local world", "[pipeline][gpu][staged_local][can-skip]") {
  if (baton_test::visible_cuda_devices() == 0) BATON_SKIP("no CUDA device");
  for (const int ranks : {2, 3}) {
    check_policy_staged_on_one_device<baton::one_f_one_b>(ranks);
    check_policy_staged_on_one_device<baton::zbv>(ranks);
  }
}

TEST_CASE("nccl pipeline: 1F1B with device stages matches the sequential run", "[pipeline][nccl][gpu][one_f_one_b][can-skip]") {
  const int devices = baton_test::visible_cuda_devices();
  if (devices == 0) BATON_SKIP("no CUDA device");
  check_policy_over_nccl<baton::one_f_one_b>(std::min(devices, 8));
}

TEST_CASE("nccl pipeline: ZBV with device stages matches the sequential run", "[pipeline][nccl][gpu][zbv][can-skip]") {
  const int devices = baton_test::visible_cuda_devices();
  if (devices == 0) BATON_SKIP("no CUDA device");
  check_policy_over_nccl<baton::zbv>(std::min(devices, 8));
}
