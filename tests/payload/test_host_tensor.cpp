// host_tensor: construction, element access, copies, and its payload_traits (slice/concat
// checked against a naive element-by-element oracle for ranks 1 to 4 and every dim).
#include "catch.hpp"
#include "payload_test_util.hpp"

#include <baton/payload/host_tensor.hpp>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

using baton::host_tensor;
using baton::payload_traits;
using baton_test::iota_tensor;
using baton_test::naive_slice;
using baton_test::same_values;

TEMPLATE_TEST_CASE("host_tensor construction and element access", "[payload][host_tensor]", float, double,
                   std::int32_t, std::int64_t) {
  SECTION("shape, rank, size, zero fill") {
    host_tensor<TestType> t({2, 3, 4});
    CHECK(t.rank() == 3);
    CHECK(t.size() == 24);
    CHECK(t.shape() == std::vector<std::int64_t>{2, 3, 4});
    CHECK(t.extent(1) == 3);
    CHECK(t.extent(-1) == 4);
    for (auto v : t.values()) CHECK(v == TestType{0});
  }
  SECTION("default is empty, {} is a scalar") {
    host_tensor<TestType> empty;
    CHECK(empty.size() == 0);
    CHECK(empty.rank() == 1);
    host_tensor<TestType> scalar(std::vector<std::int64_t>{});
    CHECK(scalar.rank() == 0);
    CHECK(scalar.size() == 1);
  }
  SECTION("row-major multi-index") {
    auto t = iota_tensor<TestType>({2, 3, 4});
    CHECK(t(1, 2, 3) == TestType(1 * 12 + 2 * 4 + 3));
    CHECK(t(0, 1, 0) == TestType(4));
    CHECK(t.at(1, 0, 2) == TestType(14));
    t(1, 1, 1) = TestType(99);
    CHECK(t[1 * 12 + 1 * 4 + 1] == TestType(99));
  }
  SECTION("values constructor and filled") {
    host_tensor<TestType> t({2, 2}, {1, 2, 3, 4});
    CHECK(t(1, 0) == TestType(3));
    auto f = host_tensor<TestType>::filled({3}, TestType(7));
    for (auto v : f.values()) CHECK(v == TestType(7));
  }
  SECTION("copies are deep, moves leave an empty tensor") {
    auto a = iota_tensor<TestType>({3, 2});
    host_tensor<TestType> b = a;
    b(0, 0) = TestType(42);
    CHECK(a(0, 0) == TestType(0));
    host_tensor<TestType> c = std::move(a);
    CHECK(c(2, 1) == TestType(5));
    CHECK(a.size() == 0);  // NOLINT(bugprone-use-after-move): the moved-from state is specified
    a = c;
    CHECK(a(2, 1) == TestType(5));
  }
}

TEST_CASE("host_tensor reports misuse with payload_error", "[payload][host_tensor]") {
  CHECK_THROWS_AS(host_tensor<float>({2, -1}), baton::payload_error);
  CHECK_THROWS_WITH(host_tensor<float>({2, 2}, {1.f, 2.f, 3.f}), Catch::Contains("4 elements but 3 values"));
  host_tensor<float> t({2, 3});
  CHECK_THROWS_WITH(t.at(2, 0), Catch::Contains("index 2 along dim 0"));
  CHECK_THROWS_WITH(t.at(0), Catch::Contains("1 indices for a tensor of rank 2"));
  CHECK_THROWS_WITH(t.extent(2), Catch::Contains("dim 2 is out of range for a tensor of rank 2"));
}

TEMPLATE_TEST_CASE("host_tensor traits: slice along every dim of ranks 1 to 4", "[payload][host_tensor]", float,
                   std::int64_t) {
  using traits = payload_traits<host_tensor<TestType>>;
  const auto shape = GENERATE(std::vector<std::int64_t>{7}, std::vector<std::int64_t>{5, 3},
                              std::vector<std::int64_t>{3, 4, 5}, std::vector<std::int64_t>{2, 3, 4, 5});
  const auto t = iota_tensor<TestType>(shape);
  for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
    const auto extent = shape[static_cast<std::size_t>(dim)];
    for (std::int64_t begin = 0; begin < extent; ++begin) {
      for (std::int64_t count = 0; count <= extent - begin; ++count) {
        INFO("rank " << shape.size() << " dim " << dim << " begin " << begin << " count " << count);
        CHECK(same_values(traits::slice(t, dim, begin, count), naive_slice(t, dim, begin, count)));
      }
    }
  }
}

TEST_CASE("host_tensor traits: concat, bytes and allocation", "[payload][host_tensor]") {
  using traits = payload_traits<host_tensor<double>>;
  const auto t = iota_tensor<double>({4, 3, 2});
  SECTION("concat of slices along each dim rebuilds the tensor") {
    for (int dim = 0; dim < 3; ++dim) {
      const auto extent = t.shape()[static_cast<std::size_t>(dim)];
      std::vector<host_tensor<double>> parts{traits::slice(t, dim, 0, 1), traits::slice(t, dim, 1, extent - 1)};
      CHECK(same_values(traits::concat(parts, dim), t));
    }
  }
  SECTION("concat rejects parts that disagree off the concat dim") {
    std::vector<host_tensor<double>> parts{host_tensor<double>({2, 3}), host_tensor<double>({2, 4})};
    CHECK_THROWS_WITH(traits::concat(parts, 0), Catch::Contains("part 1 has shape [2, 4] but part 0 has [2, 3]"));
    CHECK_NOTHROW(traits::concat(parts, 1));
  }
  SECTION("bytes alias the storage") {
    auto u = t;
    auto bytes = traits::mutable_bytes(u);
    CHECK(bytes.size() == 24 * sizeof(double));
    const double v = 123.5;
    std::memcpy(bytes.data() + 5 * sizeof(double), &v, sizeof v);
    CHECK(u[5] == 123.5);
    CHECK(traits::bytes(t).data() == reinterpret_cast<const std::byte*>(t.data()));
  }
  SECTION("allocate and allocate_like give zero-filled tensors") {
    auto a = traits::allocate_like(t);
    CHECK(a.shape() == t.shape());
    for (auto v : a.values()) CHECK(v == 0.0);
    const std::vector<std::int64_t> shape{2, 5};
    CHECK(traits::allocate(shape).size() == 10);
  }
  SECTION("slice out of range") {
    CHECK_THROWS_WITH(traits::slice(t, 0, 3, 2), Catch::Contains("rows [3, 5) along dim 0"));
    CHECK_THROWS_WITH(traits::slice(t, 3, 0, 1), Catch::Contains("out of range"));
  }
}
