// The device-payload path of the executor, on the CPU. baton::cuda::device_tensor's traits are
// detail::payload::pitched_payload_traits with a CUDA copier; here the same traits run with a
// host copier over `host_backed<T>`, a move-only stand-in whose storage is host memory but
// whose traits say host_accessible = false. What this proves without a GPU:
//  - the pitched-copy plans (what cudaMemcpy2DAsync executes) equal the host slice/concat;
//  - split_microbatches / merge_microbatches and scale work through those traits;
//  - the executor routes such a payload as a device payload (no inline data in the header,
//    loss scaling through the traits) and 1F1B and ZBV still match the sequential run.
#include "catch.hpp"
#include "device_parity.hpp"

#include <baton/comm/local.hpp>
#include <baton/payload/detail/pitched_traits.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/pipeline/detail/buffer_pool.hpp>
#include <baton/pipeline/detail/loss.hpp>
#include <baton/pipeline/detail/receives.hpp>
#include <baton/pipeline/detail/sends.hpp>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace {

namespace pi = baton::detail::payload;

std::atomic<int> copier_runs{0};
std::atomic<int> scale_calls{0};  // the executor's loss scaling, through the traits

// The interface device_tensor offers, over host memory.
template <class T>
class host_backed {
 public:
  using value_type = T;
  host_backed() : shape_{0} {}
  explicit host_backed(std::vector<std::int64_t> shape)
      : shape_(std::move(shape)), values_(static_cast<std::size_t>(pi::checked_element_count(shape_, "host_backed", sizeof(T)))) {}
  static host_backed for_overwrite(std::vector<std::int64_t> shape) {
    host_backed t(std::move(shape));
    std::fill(t.values_.begin(), t.values_.end(), static_cast<T>(-777));  // indeterminate: must be overwritten
    return t;
  }
  // Called on the ranks' threads: a size mismatch throws (the executor carries it out of
  // run_local) rather than asserting, since Catch's assertions are not thread-safe.
  static host_backed from_host(std::vector<std::int64_t> shape, std::span<const T> values) {
    host_backed t(std::move(shape));
    if (values.size() != t.values_.size()) throw std::logic_error("host_backed::from_host: size mismatch");
    std::copy(values.begin(), values.end(), t.values_.begin());
    return t;
  }
  host_backed(const host_backed&) = delete;
  host_backed& operator=(const host_backed&) = delete;
  host_backed(host_backed&&) noexcept = default;
  host_backed& operator=(host_backed&&) noexcept = default;
  ~host_backed() = default;

  host_backed clone() const { return from_host(shape_, values_); }
  std::vector<T> to_host() const { return values_; }
  void copy_from_host(std::span<const T> values) {
    if (values.size() != values_.size()) throw std::logic_error("host_backed::copy_from_host: size mismatch");
    std::copy(values.begin(), values.end(), values_.begin());
  }
  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  std::int64_t size() const noexcept { return static_cast<std::int64_t>(values_.size()); }
  T* data() noexcept { return values_.data(); }
  const T* data() const noexcept { return values_.data(); }
  std::size_t bytes_size() const noexcept { return values_.size() * sizeof(T); }

 private:
  std::vector<std::int64_t> shape_;
  std::vector<T> values_;
};

struct host_copier {
  static void run(std::span<const pi::pitched_copy> copies, std::span<const std::byte* const> sources, std::byte* dst,
                  const std::string&) {
    ++copier_runs;
    for (std::size_t i = 0; i < copies.size(); ++i) pi::run_on_host(copies[i], sources[i], dst);
  }
};

// The kernels of device_parity's stage, on the host, in the order the CUDA kernels use (one
// thread per output element, sums over the inner index in increasing order).
template <class T>
struct host_ops {
  using tensor = host_backed<T>;
  static void forward(const tensor& x, const tensor& w, const tensor& b, tensor& y) {
    const std::int64_t width = w.shape()[0], rows = x.size() / width;
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t j = 0; j < width; ++j) {
        T z = b.data()[j];
        for (std::int64_t i = 0; i < width; ++i) z += x.data()[r * width + i] * w.data()[i * width + j];
        y.data()[r * width + j] = std::tanh(z);
      }
  }
  static void backward_input(const tensor& y, const tensor& dy, const tensor& w, tensor& dz, tensor& dx) {
    const std::int64_t width = w.shape()[0], rows = y.size() / width;
    for (std::int64_t k = 0; k < y.size(); ++k) dz.data()[k] = dy.data()[k] * (T{1} - y.data()[k] * y.data()[k]);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t i = 0; i < width; ++i) {
        T acc{};
        for (std::int64_t j = 0; j < width; ++j) acc += dz.data()[r * width + j] * w.data()[i * width + j];
        dx.data()[r * width + i] = acc;
      }
  }
  static void backward_weight(const tensor& x, const tensor& dz, tensor& dw, tensor& db) {
    const std::int64_t width = dw.shape()[0], rows = x.size() / width;
    for (std::int64_t i = 0; i < width; ++i)
      for (std::int64_t j = 0; j < width; ++j) {
        T acc{};
        for (std::int64_t r = 0; r < rows; ++r) acc += x.data()[r * width + i] * dz.data()[r * width + j];
        dw.data()[i * width + j] += acc;
      }
    for (std::int64_t j = 0; j < width; ++j) {
      T acc{};
      for (std::int64_t r = 0; r < rows; ++r) acc += dz.data()[r * width + j];
      db.data()[j] += acc;
    }
  }
};

}  // namespace

template <class T>
struct baton::payload_traits<host_backed<T>> : baton::detail::payload::pitched_payload_traits<host_backed<T>, host_copier> {
  using base = baton::detail::payload::pitched_payload_traits<host_backed<T>, host_copier>;
  static void scale(host_backed<T>& t, double factor) {
    ++scale_calls;
    base::scale(t, factor);
  }
};

namespace {

using stand_in = host_backed<double>;
static_assert(baton::activation_tensor<stand_in>);
static_assert(!baton::host_accessible_v<stand_in>);
static_assert(baton::host_accessible_v<baton::host_tensor<double>>);
static_assert(!std::is_copy_constructible_v<stand_in>, "the stand-in is move-only, like device_tensor");

std::vector<double> iota_values(std::int64_t n) {
  std::vector<double> v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 1.0);
  return v;
}

}  // namespace

TEST_CASE("pitched copies reproduce the host slice and concat", "[pipeline][cuda][device-payload]") {
  const std::vector<std::vector<std::int64_t>> shapes = {{7}, {5, 3}, {2, 6, 4}, {3, 0, 2}, {4, 3, 2, 5}};
  for (const auto& shape : shapes) {
    const std::int64_t n = pi::checked_element_count(shape, "test", sizeof(double));
    const auto values = iota_values(n);
    const auto* src = reinterpret_cast<const std::byte*>(values.data());
    for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
      const std::int64_t extent = shape[static_cast<std::size_t>(dim)];
      for (std::int64_t begin = 0; begin <= extent; ++begin) {
        for (std::int64_t count = 0; begin + count <= extent; ++count) {
          const auto [d, out_shape] = pi::checked_slice_shape(shape, dim, begin, count, "test");
          const auto m = static_cast<std::size_t>(pi::checked_element_count(out_shape, "test", sizeof(double)));
          std::vector<double> expected(m, -1.0), got(m, -1.0);
          pi::row_major_slice(src, shape, d, begin, count, sizeof(double), reinterpret_cast<std::byte*>(expected.data()));
          pi::run_on_host(pi::slice_copy(shape, d, begin, count, sizeof(double)), src, reinterpret_cast<std::byte*>(got.data()));
          INFO("shape rank " << shape.size() << " dim " << dim << " rows [" << begin << ", " << begin + count << ")");
          CHECK(got == expected);
        }
      }
      // Concatenate the tensor cut in three unequal parts along dim (one possibly empty).
      const std::int64_t a = extent / 3, b = extent - a - extent / 2;
      std::vector<std::vector<std::int64_t>> part_shapes;
      std::vector<std::vector<double>> parts;
      std::int64_t at = 0;
      for (std::int64_t rows : {a, b, extent - a - b}) {
        const auto [d, s] = pi::checked_slice_shape(shape, dim, at, rows, "test");
        std::vector<double> part(static_cast<std::size_t>(pi::checked_element_count(s, "test", sizeof(double))));
        pi::row_major_slice(src, shape, d, at, rows, sizeof(double), reinterpret_cast<std::byte*>(part.data()));
        part_shapes.push_back(s);
        parts.push_back(std::move(part));
        at += rows;
      }
      std::vector<const std::byte*> sources;
      for (const auto& p : parts) sources.push_back(reinterpret_cast<const std::byte*>(p.data()));
      const auto [d, out_shape] = pi::concat_shape(part_shapes, dim, "test");
      REQUIRE(out_shape == shape);
      std::vector<double> expected(values.size(), -1.0), got(values.size(), -1.0);
      pi::row_major_concat(sources, part_shapes, d, out_shape, sizeof(double), reinterpret_cast<std::byte*>(expected.data()));
      const auto copies = pi::concat_copies(part_shapes, d, out_shape, sizeof(double));
      REQUIRE(copies.size() == parts.size());
      for (std::size_t p = 0; p < copies.size(); ++p) pi::run_on_host(copies[p], sources[p], reinterpret_cast<std::byte*>(got.data()));
      INFO("concat, shape rank " << shape.size() << " dim " << dim);
      CHECK(got == values);
      CHECK(expected == values);
    }
  }
}

TEST_CASE("device traits split, merge and scale through the copier", "[pipeline][cuda][device-payload]") {
  const auto values = iota_values(5 * 4);
  const auto batch = stand_in::from_host({5, 4}, values);
  const int before = copier_runs;
  auto parts = baton::split_microbatches(batch, 3);  // rows 2, 2, 1
  REQUIRE(parts.size() == 3);
  CHECK(copier_runs - before == 3);
  CHECK(parts[2].shape() == std::vector<std::int64_t>{1, 4});
  CHECK(parts[2].to_host() == std::vector<double>{17, 18, 19, 20});
  const auto merged = baton::merge_microbatches(std::span<const stand_in>(parts));
  CHECK(merged.shape() == batch.shape());
  CHECK(merged.to_host() == values);

  auto g = stand_in::from_host({2}, std::vector<double>{1.5, -2});
  baton::detail::pipeline::scale_payload(g, 0.25);
  CHECK(g.to_host() == std::vector<double>{0.375, -0.5});

  CHECK_THROWS_AS(baton::tensor_slice(batch, 0, 4, 2), baton::payload_error);
}

TEST_CASE("a device payload never travels inline in the header", "[pipeline][cuda][device-payload]") {
  // Both payloads are 64 bytes, far under the inline limit: only host_accessible decides.
  // The ranks record what they saw; the checks run on this thread (Catch is not thread-safe).
  bool device_inline = true, host_inline = false;
  std::vector<double> received;
  baton::run_local(2, [&](baton::local_communicator& comm) {
    using namespace baton::detail::pipeline;
    const message_id id{1, 0, 0, 0};
    if (comm.rank() == 0) {
      send_spares<baton::local_request, stand_in> device_spares;
      send_spares<baton::local_request, baton::host_tensor<double>> host_spares;
      auto device = post_send(comm, stand_in::from_host({2, 4}, iota_values(8)), 1, 5, id, device_spares);
      auto host = post_send(comm, baton::host_tensor<double>({2, 4}), 1, 6, id, host_spares);
      device_inline = static_cast<outgoing_payload<baton::local_request, stand_in>&>(*device).header.data_inline();
      host_inline = static_cast<outgoing_payload<baton::local_request, baton::host_tensor<double>>&>(*host).header.data_inline();
      device->wait();
      host->wait();
    } else {
      buffer_pool<stand_in> pool;
      incoming<baton::local_request, stand_in> in;
      post_recv(comm, in, 0, 5, id);
      received = complete_recv(comm, in, pool).to_host();
      buffer_pool<baton::host_tensor<double>> host_pool;
      incoming<baton::local_request, baton::host_tensor<double>> host_in;
      post_recv(comm, host_in, 0, 6, id);
      (void)complete_recv(comm, host_in, host_pool);
    }
  });
  CHECK_FALSE(device_inline);
  CHECK(host_inline);
  CHECK(received == iota_values(8));
}

TEMPLATE_TEST_CASE("1F1B and ZBV with device-routed payloads match the sequential run", "[pipeline][cuda][device-payload]",
                   baton::one_f_one_b, baton::zbv) {
  using Policy = TestType;
  for (const int ranks : {1, 2, 3}) {
    const int m = 4;
    const baton::program prog = Policy::generate(baton::shape_for<Policy>(ranks, m));
    const std::int64_t width = 8, rows = 12;
    const auto batch = device_parity::random_tensor<stand_in>({rows, width}, 11, 1.0);
    const auto target = device_parity::random_tensor<stand_in>({rows, width}, 12, 0.5);
    const auto oracle = device_parity::sequential<stand_in, host_ops<double>>(prog.shape.num_stages(), width, batch, target);
    std::vector<device_parity::outcome> by_rank(static_cast<std::size_t>(ranks));
    std::mutex mutex;
    const int scales_before = scale_calls;
    baton::run_local(ranks, [&](baton::local_communicator& comm) {
      auto mine = device_parity::run_rank<stand_in, host_ops<double>>(comm, prog, width, batch, target);
      std::lock_guard lock(mutex);
      by_rank[static_cast<std::size_t>(comm.rank())] = std::move(mine);
    });
    const auto got = device_parity::merge(by_rank, prog.shape.num_stages());
    // Double precision; microbatching changes only the order of the dW/db sums over rows
    // (4 microbatches of 3 rows vs 12 rows): a few ulps, far under 1e-12.
    INFO("ranks " << ranks);
    CHECK(device_parity::parity_error(got, oracle) < 1e-12);
    // The loss gradient of every microbatch was scaled through the traits, not a host loop.
    CHECK(scale_calls - scales_before == m);
  }
}
