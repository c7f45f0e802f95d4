// The Kokkos::View adapter: host views of rank 1-4 split and merged like host_tensor, checked
// element by element through View::operator(); views the adapter does not take are rejected.
#include "catch.hpp"

#include <baton/payload.hpp>
#include <baton/payload/kokkos.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <vector>

using namespace baton;

template <class V>
using traits_of = payload_traits<V>;

using view1 = Kokkos::View<double*, Kokkos::LayoutRight, Kokkos::HostSpace>;
using view2 = Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace>;
using view3 = Kokkos::View<std::int32_t***, Kokkos::LayoutRight, Kokkos::HostSpace>;
using view4 = Kokkos::View<std::int64_t****, Kokkos::LayoutRight, Kokkos::HostSpace>;

TEST_CASE("Kokkos views the adapter takes, and those it refuses", "[payload][kokkos]") {
  STATIC_REQUIRE(tensor_payload<view1>);
  STATIC_REQUIRE(tensor_payload<view2>);
  STATIC_REQUIRE(tensor_payload<view3>);
  STATIC_REQUIRE(tensor_payload<view4>);
  STATIC_REQUIRE(activation_tensor<view2>);
  STATIC_REQUIRE(pointer_concatenable<view2>);
  STATIC_REQUIRE(tensor_payload<constant<view1>>);
  STATIC_REQUIRE_FALSE(has_payload_traits<Kokkos::View<double**, Kokkos::LayoutLeft, Kokkos::HostSpace>>);
  STATIC_REQUIRE_FALSE(has_payload_traits<Kokkos::View<double* [3], Kokkos::LayoutRight, Kokkos::HostSpace>>);
  STATIC_REQUIRE_FALSE(has_payload_traits<Kokkos::View<const double*, Kokkos::LayoutRight, Kokkos::HostSpace>>);
  STATIC_REQUIRE_FALSE(has_payload_traits<Kokkos::View<double*****, Kokkos::LayoutRight, Kokkos::HostSpace>>);
  STATIC_REQUIRE_FALSE(
      has_payload_traits<Kokkos::View<double*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>>);
}

namespace {
// Fills every element with a distinct value through operator(), and checks a part against the
// source with the microbatch offset applied along dim: an oracle that shares no code with the
// adapter's block copies.
template <class V, class F>
void for_each_index(const V& v, F&& f) {
  constexpr int rank = static_cast<int>(V::traits::rank);
  const std::size_t e0 = v.extent(0), e1 = rank > 1 ? v.extent(1) : 1, e2 = rank > 2 ? v.extent(2) : 1,
                    e3 = rank > 3 ? v.extent(3) : 1;
  for (std::size_t i = 0; i < e0; ++i)
    for (std::size_t j = 0; j < e1; ++j)
      for (std::size_t k = 0; k < e2; ++k)
        for (std::size_t l = 0; l < e3; ++l) f(std::array<std::size_t, 4>{i, j, k, l});
}

template <class V>
auto& at(const V& v, std::array<std::size_t, 4> i) {
  constexpr int rank = static_cast<int>(V::traits::rank);
  if constexpr (rank == 1) return v(i[0]);
  else if constexpr (rank == 2) return v(i[0], i[1]);
  else if constexpr (rank == 3) return v(i[0], i[1], i[2]);
  else return v(i[0], i[1], i[2], i[3]);
}

template <class V>
void check_round_trip(const V& v) {
  using value_type = typename V::traits::value_type;
  std::int64_t n = 0;
  for_each_index(v, [&](auto i) { at(v, i) = static_cast<value_type>(n++); });
  constexpr int rank = static_cast<int>(V::traits::rank);
  for (int dim = 0; dim < rank; ++dim) {
    const auto extent = static_cast<std::int64_t>(v.extent(static_cast<unsigned>(dim)));
    for (std::int64_t chunks = 1; chunks <= extent; ++chunks) {
      INFO("rank " << rank << " dim " << dim << " chunks " << chunks);
      const auto parts = split_microbatches(v, chunks, dim);
      const auto sizes = microbatch_sizes(extent, chunks);
      std::size_t offset = 0;
      for (std::size_t c = 0; c < parts.size(); ++c) {
        REQUIRE(parts[c].extent(static_cast<unsigned>(dim)) == static_cast<std::size_t>(sizes[c]));
        CHECK(parts[c].data() != v.data());  // a microbatch never aliases the batch
        bool equal = true;
        for_each_index(parts[c], [&](auto i) {
          auto src = i;
          src[static_cast<std::size_t>(dim)] += offset;
          equal = equal && at(parts[c], i) == at(v, src);
        });
        CHECK(equal);
        offset += static_cast<std::size_t>(sizes[c]);
      }
      const auto merged = merge_microbatches(parts, dim);
      bool equal = merged.size() == v.size();
      for_each_index(v, [&](auto i) { equal = equal && at(merged, i) == at(v, i); });
      CHECK(equal);
    }
  }
}
}  // namespace

TEST_CASE("Kokkos views split and merge along every dim, ranks 1 to 4", "[payload][kokkos]") {
  check_round_trip(view1("v1", 7));
  check_round_trip(view2("v2", 5, 3));
  check_round_trip(view3("v3", 3, 4, 2));
  check_round_trip(view4("v4", 2, 3, 2, 3));
}

TEST_CASE("Kokkos views: bytes, allocation, records and errors", "[payload][kokkos]") {
  view2 v("v", 4, 3);
  CHECK(tensor_bytes(v).size() == 12 * sizeof(float));
  CHECK(tensor_mutable_bytes(v).data() == reinterpret_cast<std::byte*>(v.data()));
  CHECK(tensor_shape(v) == std::vector<std::int64_t>{4, 3});
  const std::vector<std::int64_t> shape{2, 5};
  auto a = traits_of<view2>::allocate(shape);
  CHECK(a.extent(1) == 5);
  CHECK(a(1, 4) == 0.f);
  const std::vector<std::int64_t> wrong{2, 5, 1};
  CHECK_THROWS_WITH(traits_of<view2>::allocate(wrong), Catch::Contains("has 3 extents but the view type has rank 2"));
  CHECK_THROWS_WITH(split_microbatches(v, 5), Catch::Contains("use at most 4 microbatches"));
  std::vector<view2> mismatched{view2("a", 2, 3), view2("b", 2, 4)};
  CHECK_THROWS_WITH(merge_microbatches(mismatched), Catch::Contains("part 1 has shape [2, 4]"));

  using input = record<field<"hidden", view2>, field<"positions", constant<view1>>>;
  for (int i = 0; i < 4; ++i) v(i, 0) = static_cast<float>(i);
  view1 pos("pos", 4);
  for (int i = 0; i < 4; ++i) pos(i) = 10.0 * i;
  input x{v, constant{pos}};
  STATIC_REQUIRE(std::is_same_v<grad_t<input>, record<field<"hidden", view2>>>);
  const auto parts = split_microbatches(x, 3);
  CHECK(get<"hidden">(parts[1])(0, 0) == 2.f);
  CHECK(get<"positions">(parts[2])->operator()(0) == 30.0);
  const auto merged = merge_microbatches(parts);
  CHECK(get<"positions">(merged)->operator()(3) == 30.0);
  auto g = grad_like(x);
  CHECK(get<"hidden">(g).extent(0) == 4);
  CHECK(get<"hidden">(g).data() != v.data());
}

TEST_CASE("Kokkos views: a shape whose element or byte count overflows is a payload_error",
          "[payload][kokkos][reliability]") {
  // 2^40 x 2^40 wrapped to 0 elements before anything was allocated.
  const std::vector<std::int64_t> wraps{std::int64_t{1} << 40, std::int64_t{1} << 40};
  CHECK_THROWS_WITH(traits_of<view2>::allocate(wraps),
                    Catch::Contains("baton Kokkos::View allocate: shape [1099511627776, 1099511627776] overflows"));
  // 2^61 doubles fit in std::int64_t but are 2^64 bytes.
  const std::vector<std::int64_t> too_many_bytes{std::int64_t{1} << 61};
  CHECK_THROWS_AS(traits_of<view1>::allocate(too_many_bytes), payload_error);
}
