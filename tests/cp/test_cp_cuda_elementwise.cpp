// What each thread of cuda_device_memory's kernels does (cp/detail/cuda_elementwise.hpp),
// run on the CPU over every index of strided views and compared with host_memory, the
// reference the context-parallel parity tests stand on: copies (both modes, with element
// conversions), accumulations, and the online-softmax merge with its -inf and NaN rows.
// The kernels (cuda_kernels.cuh) call exactly these functions from a grid-stride loop, so
// what remains untested without a GPU is the launch itself.
#include "catch.hpp"

#include <baton/attention/cuda/storage.hpp>
#include <baton/cp/detail/cuda_elementwise.hpp>
#include <baton/cp/memory.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {

using baton::tensor_view;
namespace dc = baton::detail::cp::cuda;

template <class T>
std::vector<T> random_vector(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(normal(gen));
  return v;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(static_cast<double>(a[i])) && std::isnan(static_cast<double>(b[i]))) continue;
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return false;
  }
  return true;
}

// The strided views the CP layer uses: a [b, s, h, d] block, a head slice of a wider
// tensor, a sequence slice, an LSE [b, h, s] seen as [b, s, h, 1] (swapped strides).
struct layout_case {
  const char* name;
  std::array<std::int64_t, 4> ext, src_str, dst_str;
  std::int64_t src_offset, dst_offset, src_elems, dst_elems;
};

std::vector<layout_case> layouts() {
  // b = 2, s = 5, h = 3, d = 4 inside buffers of larger shapes.
  return {
      {"contiguous", {2, 5, 3, 4}, {60, 12, 4, 1}, {60, 12, 4, 1}, 0, 0, 120, 120},
      {"head slice -> packed", {2, 5, 2, 4}, {5 * 6 * 4, 6 * 4, 4, 1}, {40, 8, 4, 1}, 1 * 4, 0, 240, 80},
      {"packed -> sequence slice", {2, 3, 3, 4}, {36, 12, 4, 1}, {7 * 12, 12, 4, 1}, 0, 2 * 12, 72, 168},
      {"lse [b,h,s] as [b,s,h,1]", {2, 5, 3, 1}, {15, 1, 5, 1}, {15, 3, 1, 1}, 0, 0, 30, 30},
      {"exchange block (max heads 3, rows 6)", {2, 5, 1, 4}, {60, 12, 4, 1}, {6 * 3 * 4, 3 * 4, 4, 1}, 4, 8, 120, 144},
  };
}

template <class U, class T>
void check_copy(baton::cp_copy_mode mode) {
  using A = baton::cp_accumulator_t<T>;
  for (const layout_case& c : layouts()) {
    INFO(c.name);
    auto src = random_vector<U>(static_cast<std::size_t>(c.src_elems), 3);
    src[0] = static_cast<U>(-0.0);  // -0 -> +0 through the accumulator
    const auto init = random_vector<T>(static_cast<std::size_t>(c.dst_elems), 4);
    auto want = init, got = init;
    const tensor_view<const U, 4> s{src.data() + c.src_offset, {c.ext, c.src_str}};
    baton::host_memory{}.copy(s, tensor_view<T, 4>{want.data() + c.dst_offset, {c.ext, c.dst_str}}, mode);
    const tensor_view<T, 4> d{got.data() + c.dst_offset, {c.ext, c.dst_str}};
    const baton::strided_layout<4> sd = s.layout, dd = d.layout;
    for (std::int64_t i = 0; i < dd.size(); ++i)
      dc::copy_element<U, T, A>(s.data, sd, d.data, dd, i, mode == baton::cp_copy_mode::through_accumulator);
    CHECK(same_bits(got, want));
  }
}

}  // namespace

TEST_CASE("cp cuda elementwise: copies equal host_memory's on every layout", "[cp][cuda][elementwise]") {
  check_copy<double, double>(baton::cp_copy_mode::exact);
  check_copy<double, double>(baton::cp_copy_mode::through_accumulator);
  check_copy<float, float>(baton::cp_copy_mode::through_accumulator);
  check_copy<double, float>(baton::cp_copy_mode::exact);  // accumulator -> storage
  check_copy<float, double>(baton::cp_copy_mode::exact);
}

TEST_CASE("cp cuda elementwise: accumulations equal host_memory's", "[cp][cuda][elementwise]") {
  for (const layout_case& c : layouts()) {
    INFO(c.name);
    const auto src = random_vector<float>(static_cast<std::size_t>(c.src_elems), 5);
    const auto init = random_vector<float>(static_cast<std::size_t>(c.dst_elems), 6);
    auto want = init, got = init;
    const tensor_view<const float, 4> s{src.data() + c.src_offset, {c.ext, c.src_str}};
    baton::host_memory{}.accumulate(tensor_view<float, 4>{want.data() + c.dst_offset, {c.ext, c.dst_str}}, s);
    const tensor_view<float, 4> a{got.data() + c.dst_offset, {c.ext, c.dst_str}};
    for (std::int64_t i = 0; i < a.size(); ++i)
      dc::accumulate_element<float, float>(a.data, a.layout, s.data, s.layout, i);
    CHECK(same_bits(got, want));
  }
}

TEST_CASE("cp cuda elementwise: the merge equals host_memory's, -inf and NaN rows included", "[cp][cuda][elementwise]") {
  // out accumulators [b, s, h, d] as a sequence slice of a longer buffer, lse as [b, h, s]
  // seen as [b, s, h, 1]; the block's out_b / lse_b packed as the ring's out_blk / lse_blk.
  const std::int64_t b = 2, s_all = 7, s = 4, s0 = 2, h = 3, d = 5;
  const auto n_out = static_cast<std::size_t>(b * s_all * h * d), n_lse = static_cast<std::size_t>(b * h * s_all);
  auto out0 = random_vector<double>(n_out, 7), lse0 = random_vector<double>(n_lse, 8);
  const auto out_b = random_vector<double>(static_cast<std::size_t>(b * s * h * d), 9);
  auto lse_b = random_vector<double>(static_cast<std::size_t>(b * h * s), 10);
  const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
  lse0[static_cast<std::size_t>(0 * s_all + s0)] = -inf;      // (b0, h0, first row): first block with keys
  lse_b[1] = -inf;                                            // a row the block saw no key for
  lse0[static_cast<std::size_t>(1 * s_all + s0 + 1)] = -inf;  // both empty:
  lse_b[static_cast<std::size_t>(1 * s + 1)] = -inf;          // stays out, -inf
  lse_b[static_cast<std::size_t>(2 * s + 2)] = nan;           // a NaN block row makes the row NaN
  lse0[static_cast<std::size_t>((h + 1) * s_all + s0 + 3)] = 40;  // far apart: weights near 0 and 1
  lse_b[static_cast<std::size_t>((h + 1) * s + 3)] = -40;
  auto want_out = out0, got_out = out0, want_lse = lse0, got_lse = lse0;
  const auto views = [&](std::vector<double>& out, std::vector<double>& lse) {
    const tensor_view<double, 4> o = baton::detail::cp::bshd(out.data(), b, s_all, h, d).slice(1, s0, s);
    const tensor_view<double, 4> l = baton::detail::cp::lse_as_bshd(lse.data(), b, h, s_all).slice(1, s0, s);
    return std::pair{o, l};
  };
  const tensor_view<const double, 4> ob = baton::detail::cp::bshd(out_b.data(), b, s, h, d).as_const();
  const tensor_view<const double, 4> lb = baton::detail::cp::lse_as_bshd(static_cast<const double*>(lse_b.data()), b, h, s);
  const auto [wo, wl] = views(want_out, want_lse);
  baton::host_memory{}.merge(wo, wl, ob, lb);
  const auto [go, gl] = views(got_out, got_lse);
  const std::int64_t rows = b * s * h;
  for (std::int64_t r = 0; r < rows; ++r)
    dc::merge_row_element<double, double, double>(go.data, go.layout, gl.data, gl.layout, ob.data,
                                                  ob.layout, lb.data, lb.layout, r);
  CHECK(same_bits(got_out, want_out));
  CHECK(same_bits(got_lse, want_lse));
  CHECK(std::isnan(got_lse[static_cast<std::size_t>(2 * s_all + s0 + 2)]));
  CHECK(got_lse[static_cast<std::size_t>(1 * s_all + s0 + 1)] == -inf);
  CHECK_FALSE(same_bits(got_out, out0));  // the merge did something
}

TEST_CASE("cp cuda elementwise: index decoding visits every element of a view once", "[cp][cuda][elementwise]") {
  const baton::strided_layout<4> layout{{3, 4, 2, 5}, {4 * 2 * 5 * 3, 2 * 5 * 3, 5 * 3, 3}};  // inner stride 3
  std::vector<int> hits(static_cast<std::size_t>(3 * 4 * 2 * 5 * 3), 0);
  for (std::int64_t i = 0; i < 3 * 4 * 2 * 5; ++i) ++hits[static_cast<std::size_t>(layout.offset_of_element(i))];
  for (std::size_t o = 0; o < hits.size(); ++o) CHECK(hits[o] == (o % 3 == 0 ? 1 : 0));
}

TEST_CASE("cp cuda elementwise: bfloat16 and float16 convert through float", "[cp][cuda][elementwise]") {
  for (const float f : {0.0f, -0.0f, 1.0f, -2.5f, 3.14159f, 65504.0f, 1e-3f}) {
    CHECK(dc::convert<float>(dc::convert<baton::bfloat16>(f)) == baton::bfloat16(f).to_float());
    CHECK(dc::convert<float>(dc::convert<baton::float16>(f)) == baton::float16(f).to_float());
    CHECK(dc::convert<double>(baton::bfloat16(f)) == static_cast<double>(baton::bfloat16(f).to_float()));
    CHECK(dc::convert<baton::bfloat16>(static_cast<double>(f)).bits == baton::bfloat16(f).bits);
  }
  STATIC_REQUIRE(std::is_same_v<baton::lse_t<baton::bfloat16>, float>);
  STATIC_REQUIRE(std::is_same_v<baton::cp_accumulator_t<baton::bfloat16>, float>);
  STATIC_REQUIRE(std::is_same_v<baton::cp_accumulator_t<const baton::float16>, float>);
  STATIC_REQUIRE(std::is_same_v<baton::cp_accumulator_t<double>, double>);
}
