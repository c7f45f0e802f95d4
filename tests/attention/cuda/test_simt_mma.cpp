// The CUDA backend's host-side building blocks, on the CPU: 16-bit storage conversions, the
// lockstep simt emulation (shuffles, shared memory, the race detector, ldmatrix) and the
// tensor-core fragment layouts with their host emulation.
#include <baton/attention/backend.hpp>
#include <baton/attention/cuda/detail/mma.hpp>
#include <baton/attention/cuda/detail/simt.hpp>
#include <baton/attention/cuda/storage.hpp>

#include "catch.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <utility>
#include <vector>

namespace cu = baton::detail::attention::cuda;
namespace simt = baton::detail::attention::cuda::simt;
using block = simt::host_block<64>;  // two warps: shuffles must stay inside each
template <class T>
using L = block::lanes_of<T>;

namespace {
// Round to nearest even computed in double: the value of the 16-bit type closest to x.
double nearest_bf16(float x) {
  const double d = x;
  double best = 0, best_err = INFINITY;
  std::uint16_t best_bits = 0;
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const float v = cu::bf16_bits_to_float(static_cast<std::uint16_t>(b));
    if (!std::isfinite(v)) continue;
    const double err = std::abs(static_cast<double>(v) - d);
    if (err < best_err || (err == best_err && (b & 1u) == 0 && (best_bits & 1u) == 1)) {
      best = v, best_err = err, best_bits = static_cast<std::uint16_t>(b);
    }
  }
  return best;
}
}  // namespace

TEST_CASE("bfloat16 / float16: round to nearest even, exact back to float, NaN and inf kept", "[cuda][storage]") {
  // Every 16-bit pattern converts to float and back unchanged (NaNs stay NaN).
  for (std::uint32_t b = 0; b < 0x10000u; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float fb = cu::bf16_bits_to_float(bits), fh = cu::f16_bits_to_float(bits);
    if (std::isnan(fb))
      CHECK(std::isnan(cu::bf16_bits_to_float(cu::float_to_bf16_bits(fb))));
    else
      CHECK(cu::float_to_bf16_bits(fb) == bits);
    if (std::isnan(fh))
      CHECK(std::isnan(cu::f16_bits_to_float(cu::float_to_f16_bits(fh))));
    else
      CHECK(cu::float_to_f16_bits(fh) == bits);
  }
  // Halfway cases go to the even neighbour; others to the nearest.
  CHECK(baton::bfloat16(1.0f + 0x1p-8f).to_float() == 1.0f);                  // tie, 1.0 is even
  CHECK(baton::bfloat16(1.0f + 3 * 0x1p-8f).to_float() == 1.0f + 0x1p-6f);    // tie, up to even
  CHECK(baton::float16(1.0f + 0x1p-11f).to_float() == 1.0f);
  CHECK(baton::float16(1.0f + 3 * 0x1p-11f).to_float() == 1.0f + 0x1p-9f);
  CHECK(baton::float16(65504.0f).to_float() == 65504.0f);
  CHECK(std::isinf(baton::float16(65520.0f).to_float()));                    // rounds past the max
  CHECK(baton::float16(65519.0f).to_float() == 65504.0f);
  CHECK(baton::float16(0x1p-24f).to_float() == 0x1p-24f);                    // smallest subnormal
  CHECK(baton::float16(0x1p-25f).to_float() == 0.0f);                        // tie to even (0)
  CHECK(baton::float16(0x1.8p-25f).to_float() == 0x1p-24f);
  CHECK(baton::float16(-3 * 0x1p-24f).to_float() == -3 * 0x1p-24f);
  CHECK(std::isinf(baton::bfloat16(std::numeric_limits<float>::infinity()).to_float()));
  CHECK(std::isnan(baton::bfloat16(std::numeric_limits<float>::quiet_NaN()).to_float()));
  CHECK(std::isnan(baton::float16(-std::numeric_limits<float>::quiet_NaN()).to_float()));
  CHECK(std::isinf(baton::bfloat16(3.4e38f).to_float()));  // rounds up past the largest bf16
  // Random floats against the exhaustive nearest search.
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-4.0f, 4.0f);
  for (int i = 0; i < 200; ++i) {
    const float x = u(gen);
    CHECK(static_cast<double>(baton::bfloat16(x).to_float()) == nearest_bf16(x));
  }
  CHECK(!cu::storage_finite(baton::bfloat16(INFINITY)));
  CHECK(!cu::storage_finite(baton::float16(NAN)));
  CHECK(cu::storage_finite(baton::float16(65504.0f)));
  CHECK(!cu::storage_finite(std::numeric_limits<float>::infinity()));
  static_assert(std::is_same_v<baton::lse_t<baton::bfloat16>, float>);
  static_assert(std::is_same_v<baton::lse_t<baton::float16>, float>);
}

TEST_CASE("simt host block: lanes arithmetic, select, shuffles stay inside a warp", "[cuda][simt]") {
  const L<int> t = block::thread_index();
  CHECK(t[37] == 37);
  CHECK(block::lane()[37] == 5);
  CHECK(block::warp()[37] == 1);
  const L<int> x = t * 2 + 1;
  const L<int> y = simt::select(t < 10, x, L<int>(-1));
  CHECK(y[3] == 7);
  CHECK(y[10] == -1);
  const L<int> xo = block::shfl_xor(t, 1);
  CHECK(xo[0] == 1);
  CHECK(xo[33] == 32);
  const L<int> xo16 = block::shfl_xor(t, 16);
  CHECK(xo16[40] == 56);  // lane 8 of warp 1 <- lane 24 of warp 1
  const L<int> s = block::shfl(t, L<int>(3));
  CHECK(s[0] == 3);
  CHECK(s[63] == 35);
  const L<float> f = simt::exp2(simt::cast<float>(t % 4));
  CHECK(f[3] == 8.0f);
  CHECK(simt::max(L<int>(2), t)[1] == 2);
  // exp2 flushes what ex2.approx.ftz flushes on the device: results below 2^-126 are 0,
  // 2^-126 itself is kept, and -inf gives 0; NaN stays NaN.
  CHECK(simt::exp2(L<float>(-126.0f))[0] == std::numeric_limits<float>::min());
  CHECK(simt::exp2(L<float>(-126.5f))[0] == 0.0f);
  CHECK(simt::exp2(L<float>(-std::numeric_limits<float>::infinity()))[0] == 0.0f);
  CHECK(std::isnan(simt::exp2(L<float>(std::numeric_limits<float>::quiet_NaN()))[0]));
  // max of floats is fmaxf on both sides (FMNMX): a NaN operand yields the other one.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  CHECK(simt::max(L<float>(nan), L<float>(-1.0f))[0] == -1.0f);
  CHECK(simt::max(L<float>(-1.0f), L<float>(nan))[0] == -1.0f);
  CHECK(simt::max(L<float>(-std::numeric_limits<float>::infinity()), L<float>(-3.0f))[0] == -3.0f);
  CHECK(simt::fma(L<float>(3.0f), L<float>(0.5f), L<float>(-1.0f))[0] == 0.5f);
}

TEST_CASE("simt host block: the race detector catches a missing sync_block, and only that", "[cuda][simt]") {
  block b(64 * 4);
  const L<int> t = block::thread_index();
  const L<std::uint32_t> own = simt::cast<std::uint32_t>(t * 4);
  const L<std::uint32_t> next = simt::cast<std::uint32_t>(((t + 1) % 64) * 4);
  b.shared_store<int>(own, t);
  CHECK(b.shared_load<int>(own)[5] == 5);  // a thread re-reading its own word: fine
  CHECK_THROWS_AS(b.shared_load<int>(next), simt::simt_race);  // a neighbour's word, no barrier

  block c(64 * 4);
  c.shared_store<int>(own, t);
  c.sync_block();
  const L<int> got = c.shared_load<int>(next);
  CHECK(got[63] == 0);
  CHECK(got[10] == 11);
  CHECK_THROWS_AS(c.shared_store<int>(own, t), simt::simt_race);  // overwriting what a neighbour read

  block d(64 * 4);  // two writers of one word
  CHECK_THROWS_AS(d.shared_store<int>(L<std::uint32_t>(0u), t), simt::simt_race);
  block e(64);
  CHECK_THROWS_AS(e.shared_load<int>(own), simt::simt_race);  // past the end of shared memory
}

TEST_CASE("ldmatrix emulation: x4 and x4.trans hand out the 8x8 matrices as the PTX ISA says", "[cuda][simt]") {
  simt::host_block<32> w(4 * 8 * 8 * 2);
  std::vector<std::uint16_t> m(4 * 64);
  for (int i = 0; i < 4 * 64; ++i) m[static_cast<std::size_t>(i)] = static_cast<std::uint16_t>(i);
  // Matrix r occupies bytes [128 r, 128 r + 128), row i at + 16 i.
  const auto lane = simt::host_block<32>::lane();
  {
    simt::host_block<32>::lanes_of<const void*> src;
    for (int l = 0; l < 32; ++l) src[l] = m.data() + 8 * l;
    w.copy16_async(simt::cast<std::uint32_t>(lane * 16), src, simt::host_block<32>::lanes_of<bool>(true));
  }
  w.sync_block();
  const auto rows = simt::cast<std::uint32_t>((lane / 8) * 128 + (lane % 8) * 16);
  for (const bool trans : {false, true}) {
    simt::host_block<32>::lanes_of<std::uint32_t> r[4];
    w.ldmatrix_x4(r, rows, trans);
    for (int l = 0; l < 32; ++l)
      for (int mat = 0; mat < 4; ++mat)
        for (int h = 0; h < 2; ++h) {
          const int row = trans ? 2 * (l % 4) + h : l / 4;
          const int col = trans ? l / 4 : 2 * (l % 4) + h;
          CHECK(((r[mat][l] >> (16 * h)) & 0xffffu) == static_cast<std::uint32_t>(mat * 64 + row * 8 + col));
        }
  }
}

TEST_CASE("fragment layouts: every element of A, B, C held by exactly one (lane, register)", "[cuda][mma]") {
  std::set<std::pair<int, int>> a16, b16, c, atf, btf;
  for (int l = 0; l < 32; ++l) {
    for (int r = 0; r < 4; ++r)
      for (int h = 0; h < 2; ++h) {
        const auto e = cu::frag::a16(l, r, h);
        a16.insert({e.row, e.col});
      }
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h) {
        const auto e = cu::frag::b16(l, r, h);
        b16.insert({e.row, e.col});
      }
    for (int i = 0; i < 4; ++i) {
      const auto e = cu::frag::c(l, i);
      c.insert({e.row, e.col});
      const auto a = cu::frag::a_tf32(l, i);
      atf.insert({a.row, a.col});
    }
    for (int r = 0; r < 2; ++r) {
      const auto e = cu::frag::b_tf32(l, r);
      btf.insert({e.row, e.col});
    }
  }
  const auto within = [](const std::set<std::pair<int, int>>& s, int rows, int cols) {
    for (const auto& [r, col] : s)
      if (r < 0 || r >= rows || col < 0 || col >= cols) return false;
    return static_cast<int>(s.size()) == rows * cols;
  };
  CHECK(within(a16, 16, 16));  // 256 distinct elements from 32 lanes x 8 halves: a bijection
  CHECK(within(b16, 16, 8));
  CHECK(within(c, 16, 8));
  CHECK(within(atf, 16, 8));
  CHECK(within(btf, 8, 8));
  // Spot values from the ISA's figures (lane 5: group 1, thread 1).
  CHECK(cu::frag::a16(5, 3, 1) == cu::element_at{9, 11});
  CHECK(cu::frag::b16(5, 1, 0) == cu::element_at{10, 1});
  CHECK(cu::frag::c(5, 2) == cu::element_at{9, 2});
  CHECK(cu::frag::a_tf32(5, 2) == cu::element_at{1, 5});
  CHECK(cu::frag::b_tf32(5, 1) == cu::element_at{5, 1});
}

namespace {
template <class S>
void check_mma16() {
  using W = simt::host_block<64>;
  std::mt19937 gen(11);
  std::uniform_int_distribution<int> small(-8, 8);
  // Per warp its own A (16 x 16), B (16 x 8), C (16 x 8): small integers, exact in any type.
  float A[2][16][16], B[2][16][8], C[2][16][8];
  W::lanes_of<std::uint32_t> a[4], b[2];
  W::lanes_of<float> d[4];
  for (int w = 0; w < 2; ++w) {
    for (auto& row : A[w])
      for (auto& x : row) x = static_cast<float>(small(gen)) / 4;
    for (auto& row : B[w])
      for (auto& x : row) x = static_cast<float>(small(gen));
    for (auto& row : C[w])
      for (auto& x : row) x = static_cast<float>(small(gen));
    for (int l = 0; l < 32; ++l) {
      for (int r = 0; r < 4; ++r) {
        std::uint32_t reg = 0;
        for (int h = 0; h < 2; ++h) {
          const auto e = cu::frag::a16(l, r, h);
          reg |= static_cast<std::uint32_t>(cu::float_to_half<S>(A[w][e.row][e.col])) << (16 * h);
        }
        a[r][32 * w + l] = reg;
      }
      for (int r = 0; r < 2; ++r) {
        std::uint32_t reg = 0;
        for (int h = 0; h < 2; ++h) {
          const auto e = cu::frag::b16(l, r, h);
          reg |= static_cast<std::uint32_t>(cu::float_to_half<S>(B[w][e.row][e.col])) << (16 * h);
        }
        b[r][32 * w + l] = reg;
      }
      for (int i = 0; i < 4; ++i) {
        const auto e = cu::frag::c(l, i);
        d[i][32 * w + l] = C[w][e.row][e.col];
      }
    }
  }
  simt::mma_m16n8k16<S>(d, a, b);
  for (int w = 0; w < 2; ++w)
    for (int l = 0; l < 32; ++l)
      for (int i = 0; i < 4; ++i) {
        const auto e = cu::frag::c(l, i);
        double want = C[w][e.row][e.col];
        for (int k = 0; k < 16; ++k) want += static_cast<double>(A[w][e.row][k]) * B[w][k][e.col];
        CHECK(static_cast<double>(d[i][32 * w + l]) == want);
      }
}
}  // namespace

TEST_CASE("mma m16n8k16 emulation equals the matrix product (bf16, f16)", "[cuda][mma]") {
  check_mma16<baton::bfloat16>();
  check_mma16<baton::float16>();
}

TEST_CASE("3xTF32 on the m16n8k8 emulation reaches fp32 accuracy; 1xTF32 does not", "[cuda][mma]") {
  using W = simt::host_block<32>;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  float A[16][8], B[8][8];
  for (auto& row : A)
    for (auto& x : row) x = normal(gen);
  for (auto& row : B)
    for (auto& x : row) x = normal(gen);
  W::lanes_of<float> av[4], bv[2];
  for (int l = 0; l < 32; ++l) {
    for (int r = 0; r < 4; ++r) {
      const auto e = cu::frag::a_tf32(l, r);
      av[r][l] = A[e.row][e.col];
    }
    for (int r = 0; r < 2; ++r) {
      const auto e = cu::frag::b_tf32(l, r);
      bv[r][l] = B[e.row][e.col];
    }
  }
  W::lanes_of<std::uint32_t> ab[4], as[4], bb[2], bs[2];
  for (int r = 0; r < 4; ++r) simt::split_tf32(av[r], ab[r], as[r]);
  for (int r = 0; r < 2; ++r) simt::split_tf32(bv[r], bb[r], bs[r]);
  W::lanes_of<float> three[4], one[4];
  for (int i = 0; i < 4; ++i) three[i] = one[i] = W::lanes_of<float>(0.0f);
  simt::mma_3xtf32(three, ab, as, bb, bs);
  simt::mma_m16n8k8_tf32(one, ab, bb);
  double err3 = 0, err1 = 0;
  for (int l = 0; l < 32; ++l)
    for (int i = 0; i < 4; ++i) {
      const auto e = cu::frag::c(l, i);
      double want = 0, scale = 0;
      for (int k = 0; k < 8; ++k) {
        want += static_cast<double>(A[e.row][k]) * B[k][e.col];
        scale += std::abs(static_cast<double>(A[e.row][k]) * B[k][e.col]);
      }
      err3 = std::max(err3, std::abs(three[i][l] - want) / scale);
      err1 = std::max(err1, std::abs(one[i][l] - want) / scale);
    }
  // fp32 accumulation of 8 terms: a few ulp (2^-24 ~ 6e-8) of the sum of magnitudes.
  CHECK(err3 < 1e-6);
  CHECK(err1 > 1e-5);  // a single tf32 product keeps 11 bits: the split is what buys accuracy
  CHECK(cu::round_tf32(1.0f + 0x1p-11f) == 1.0f + 0x1p-10f);  // tie: away from zero (rna)
}
