// The core's strided layout and tensor_view: offsets against a hand count, element numbering
// against a nested loop, slicing and axis reordering against the elements they must reach.
#include "catch.hpp"

#include <baton/core/layout.hpp>
#include <baton/core/tensor_view.hpp>

#include <array>
#include <cstdint>
#include <numeric>
#include <vector>

TEST_CASE("core layout: row-major strides and offsets", "[core][layout]") {
  const auto l = baton::strided_layout<3>::row_major({2, 3, 4});
  CHECK(l.strides == std::array<std::int64_t, 3>{12, 4, 1});
  CHECK(l.size() == 24);
  CHECK(l.is_contiguous());
  CHECK(l.offset(1, 2, 3) == 23);
  CHECK(l.offset(0, 1, 0) == 4);
  STATIC_REQUIRE(baton::strided_layout<3>::row_major({2, 3, 4}).offset(1, 0, 2) == 14);  // constexpr
}

TEST_CASE("core layout: element numbering visits a strided view in row-major order", "[core][layout]") {
  // A padded layout: [3, 4, 2, 5] with an inner stride of 3 and a padded row.
  const baton::strided_layout<4> l{{3, 4, 2, 5}, {200, 40, 17, 3}};
  std::int64_t i = 0;
  for (std::int64_t a = 0; a < 3; ++a)
    for (std::int64_t b = 0; b < 4; ++b)
      for (std::int64_t c = 0; c < 2; ++c)
        for (std::int64_t d = 0; d < 5; ++d, ++i) REQUIRE(l.offset_of_element(i) == l.offset(a, b, c, d));
  CHECK_FALSE(l.is_contiguous());
}

TEST_CASE("core layout: slicing and reordering axes reach the same elements", "[core][layout]") {
  std::vector<int> data(2 * 3 * 4);
  std::iota(data.begin(), data.end(), 0);
  const auto v = baton::make_tensor_view(data.data(), {2, 3, 4});
  const auto s = v.slice(1, 1, 2);  // rows 1 and 2 of the middle axis
  CHECK(s.extents() == std::array<std::int64_t, 3>{2, 2, 4});
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 4; ++c) REQUIRE(s(a, b, c) == v(a, b + 1, c));
  const baton::tensor_view<int, 3> t{data.data(), v.layout.permuted({2, 0, 1})};  // [4, 2, 3]
  CHECK(t.extents() == std::array<std::int64_t, 3>{4, 2, 3});
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 3; ++b)
      for (int c = 0; c < 4; ++c) REQUIRE(t(c, a, b) == v(a, b, c));
  const baton::tensor_view<const int, 3> read_only = v.as_const();
  CHECK(&read_only(1, 2, 3) == &v(1, 2, 3));
  CHECK(v.slice(0, 1, 1).layout.sliced(2, 2).size() == 6);
}

TEST_CASE("core layout: the example of strided_layout's comment", "[core][layout][docs]") {
  // [doc:strided_layout]
  auto l = baton::strided_layout<3>::row_major({2, 3, 4});  // strides {12, 4, 1}
  // l.offset(1, 2, 3) == 23; l.sliced(1, 2).extents == {2, 2, 4}
  // [/doc:strided_layout]
  CHECK(l.strides == std::array<std::int64_t, 3>{12, 4, 1});
  CHECK(l.offset(1, 2, 3) == 23);
  CHECK(l.sliced(1, 2).extents == std::array<std::int64_t, 3>{2, 2, 4});
}
