// The model layer's matrix product: the blocked fallback and (when linked) cblas against a
// naive triple loop, for every transpose combination, alpha/beta and odd sizes; the bf16
// product (gemm_bf16, both kernels) against the same loop on the operands rounded to bf16.
#include <baton/nn/detail/gemm.hpp>
#include <baton/nn/detail/gemm_bf16.hpp>
#include <baton/nn/error.hpp>

#include "catch.hpp"
#include "skip.hpp"

#include "nn_test_util.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace {

using baton::detail::nn::op;

// C = alpha op(A) op(B) + beta C, in double, straight from the definition.
template <class T>
std::vector<double> naive(op ta, op tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha,
                          const std::vector<T>& a, std::int64_t lda, const std::vector<T>& b, std::int64_t ldb,
                          double beta, const std::vector<T>& c, std::int64_t ldc) {
  std::vector<double> out(c.begin(), c.end());
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (std::int64_t p = 0; p < k; ++p) {
        const double av = ta == op::none ? a[i * lda + p] : a[p * lda + i];
        const double bv = tb == op::none ? b[p * ldb + j] : b[j * ldb + p];
        s += av * bv;
      }
      out[i * ldc + j] = alpha * s + (beta == 0 ? 0.0 : beta * static_cast<double>(c[i * ldc + j]));
    }
  return out;
}

// One case of the grid every check walks: a size, both transposes of A and B, beta 0, 1 and
// -0.5, with A, B and C drawn N(0, 1) from consecutive seeds at padded leading dimensions
// (beta 0 puts a NaN in C: it must be overwritten, as BLAS does).
template <class T>
struct gemm_case {
  std::int64_t m, n, k, lda, ldb, ldc;
  op ta, tb;
  double beta;
  baton::host_tensor<T> a, b, c;
};

template <class T, std::size_t N, class Visit>
void for_each_case(const std::int64_t (&sizes)[N][3], std::uint32_t seed, Visit&& visit) {
  for (const auto& s : sizes) {
    const std::int64_t m = s[0], n = s[1], k = s[2];
    for (op ta : {op::none, op::transpose})
      for (op tb : {op::none, op::transpose})
        for (double beta : {0.0, 1.0, -0.5}) {
          const std::int64_t lda = (ta == op::none ? k : m) + 1, ldb = (tb == op::none ? n : k) + 2, ldc = n + 3;
          const auto rows_a = ta == op::none ? m : k, rows_b = tb == op::none ? k : n;
          gemm_case<T> g{m, n, k, lda, ldb, ldc, ta, tb, beta, nn_test::random_tensor<T>({rows_a * lda}, seed),
                         nn_test::random_tensor<T>({rows_b * ldb}, seed + 1),
                         nn_test::random_tensor<T>({m * ldc}, seed + 2)};
          seed += 3;
          if (beta == 0.0) g.c[0] = std::numeric_limits<T>::quiet_NaN();
          INFO("m " << m << " n " << n << " k " << k << " ta " << (ta == op::transpose) << " tb "
                    << (tb == op::transpose) << " beta " << beta);
          visit(g);
        }
  }
}

template <class T, class Gemm>
void check_all(Gemm gemm, double tolerance) {
  // Sizes that cross the fallback's 4-row, 256-deep and 512-wide blocks, and a padded ldc.
  const std::int64_t sizes[][3] = {{1, 1, 1}, {5, 7, 3}, {9, 513, 17}, {33, 20, 300}, {4, 4, 0}};
  for_each_case<T>(sizes, 1, [&](gemm_case<T>& g) {
    const std::vector<T> av(g.a.values().begin(), g.a.values().end()), bv(g.b.values().begin(), g.b.values().end()),
        cv(g.c.values().begin(), g.c.values().end());
    const auto expected = naive(g.ta, g.tb, g.m, g.n, g.k, 0.75, av, g.lda, bv, g.ldb, g.beta, cv, g.ldc);
    gemm(g.ta, g.tb, g.m, g.n, g.k, T(0.75), g.a.data(), g.lda, g.b.data(), g.ldb, static_cast<T>(g.beta), g.c.data(),
         g.ldc);
    REQUIRE(nn_test::max_rel_error(std::span<const T>(g.c.values()), std::span<const double>(expected)) <= tolerance);
  });
}

}  // namespace

TEST_CASE("nn gemm: the blocked fallback equals the definition", "[nn][gemm]") {
  check_all<double>(baton::detail::nn::gemm_blocked<double>, 1e-13);
  check_all<float>(baton::detail::nn::gemm_blocked<float>, 1e-5);  // float rounding over k <= 300 terms
}

TEST_CASE("nn gemm: the configured implementation equals the definition", "[nn][gemm]") {
  INFO("implementation: " << baton::detail::nn::gemm_implementation());
  check_all<double>(baton::detail::nn::gemm<double>, 1e-13);
  check_all<float>(baton::detail::nn::gemm<float>, 1e-5);
}

// ---- gemm_bf16 ----
//
// Oracle: the definition in double on the operands rounded to bf16 (bfloat16(float), the
// scalar conversion the model layer checks on every upper half). A bf16 x bf16 product is
// exact in float (8 + 8 significant bits), so the only error is the float sums: at most k + 1
// additions into the accumulator (two per VDPBF16PS lane, one per FMA) and alpha, beta, each
// a relative error of at most 2^-24 of a partial sum bounded by sum |a_p b_p|. Bound per element:
// (k + 3) 2^-24 (|alpha| sum_p |a_p b_p| + |beta c|). Values are N(0, 1) and not bf16 values, so
// a kernel that skipped the rounding misses the oracle by ~2^-9 of the sum: far outside.
namespace {

using baton::bfloat16;
using baton::detail::nn::bf16_gemm_kernel;

float rounded(float x) { return bfloat16(x).to_float(); }

template <class SA, class SB>
void check_bf16(bf16_gemm_kernel kernel) {
  // Sizes around the kernel's tile (14 x 32), its blocks (k 256, m 224, n 2048) and odd k,
  // with padded leading dimensions; a size with k = 0 (C = beta C).
  const std::int64_t sizes[][3] = {{1, 1, 1}, {5, 7, 3}, {15, 33, 2}, {29, 45, 33},   {230, 70, 513},
                                   {3, 2049, 9}, {14, 32, 256}, {4, 4, 0}, {33, 20, 300}};
  // x as the kernel's operand type S, and its bf16 value and magnitude for the oracle.
  const auto operand = [](const baton::host_tensor<float>& x, auto& as_s, std::vector<double>& value,
                          std::vector<double>& magnitude) {
    using S = typename std::remove_reference_t<decltype(as_s)>::value_type;
    for (std::int64_t i = 0; i < x.size(); ++i) {
      as_s.push_back(S(x[i]));
      value.push_back(rounded(x[i]));
      magnitude.push_back(std::fabs(rounded(x[i])));
    }
  };
  for_each_case<float>(sizes, 7, [&](gemm_case<float>& g) {
    std::vector<SA> a;
    std::vector<SB> b;
    std::vector<double> ar, br, absa, absb;
    operand(g.a, a, ar, absa);
    operand(g.b, b, br, absb);
    const std::vector<double> cv(g.c.values().begin(), g.c.values().end());
    std::vector<double> absc(cv.size());
    for (std::size_t i = 0; i < cv.size(); ++i) absc[i] = std::isnan(cv[i]) ? 0.0 : std::fabs(cv[i]);
    const auto expected = naive(g.ta, g.tb, g.m, g.n, g.k, 0.75, ar, g.lda, br, g.ldb, g.beta, cv, g.ldc);
    const auto magnitude =
        naive(g.ta, g.tb, g.m, g.n, g.k, 0.75, absa, g.lda, absb, g.ldb, std::fabs(g.beta), absc, g.ldc);
    baton::detail::nn::gemm_bf16(g.ta, g.tb, g.m, g.n, g.k, 0.75f, a.data(), g.lda, b.data(), g.ldb,
                                 static_cast<float>(g.beta), g.c.data(), g.ldc, kernel);
    double worst = 0;  // error / bound, over C's m x n elements (the padding is not C's)
    for (std::int64_t i = 0; i < g.m; ++i)
      for (std::int64_t j = 0; j < g.n; ++j) {
        const std::int64_t at = i * g.ldc + j;
        const double bound = static_cast<double>(g.k + 3) * 0x1p-24 * magnitude[static_cast<std::size_t>(at)] + 1e-30;
        REQUIRE(std::isfinite(g.c[at]));
        worst = std::max(worst, std::fabs(g.c[at] - expected[static_cast<std::size_t>(at)]) / bound);
      }
    REQUIRE(worst <= 1.0);
  });
}

}  // namespace

TEST_CASE("nn gemm_bf16: the widened-sgemm kernel equals the definition on bf16-rounded operands", "[nn][gemm]") {
  check_bf16<float, float>(bf16_gemm_kernel::widened_sgemm);
  check_bf16<baton::bfloat16, float>(bf16_gemm_kernel::widened_sgemm);
  check_bf16<float, baton::bfloat16>(bf16_gemm_kernel::widened_sgemm);
}

TEST_CASE("nn gemm_bf16: the AVX512_BF16 kernel equals the definition on bf16-rounded operands",
          "[nn][gemm][can-skip]") {
  if (!baton::detail::nn::cpu_has_avx512_bf16()) BATON_SKIP("this CPU has no AVX512_BF16 (the widened kernel runs)");
  check_bf16<float, float>(bf16_gemm_kernel::avx512_bf16);
  check_bf16<baton::bfloat16, baton::bfloat16>(bf16_gemm_kernel::avx512_bf16);
  check_bf16<float, baton::bfloat16>(bf16_gemm_kernel::avx512_bf16);
}

TEST_CASE("nn gemm_bf16: the AMX kernel equals the definition on bf16-rounded operands", "[nn][gemm][can-skip]") {
  if (!baton::detail::nn::cpu_has_amx_bf16())
    BATON_SKIP("this CPU (or its OS) offers no AMX-BF16 tiles (another kernel runs)");
  check_bf16<float, float>(bf16_gemm_kernel::amx_bf16);
  check_bf16<baton::bfloat16, baton::bfloat16>(bf16_gemm_kernel::amx_bf16);
  check_bf16<float, baton::bfloat16>(bf16_gemm_kernel::amx_bf16);
  check_bf16<baton::bfloat16, float>(bf16_gemm_kernel::amx_bf16);
}

TEST_CASE("nn gemm_bf16: automatic runs, bit for bit, the kernel bf16_gemm_implementation names", "[nn][gemm]") {
  // The choice follows the CPU (AMX; else AVX512_BF16 and whether its dot products beat float
  // FMAs), never a timing: the same machine sums in the same order on every run.
  const bool amx = baton::detail::nn::cpu_has_amx_bf16();
  const bool fast = baton::detail::nn::bf16_dot_products_fast();
  const bf16_gemm_kernel kernel = amx    ? bf16_gemm_kernel::amx_bf16
                                  : fast ? bf16_gemm_kernel::avx512_bf16
                                         : bf16_gemm_kernel::widened_sgemm;
  CHECK(baton::detail::nn::bf16_gemm_automatic_kernel() == kernel);
  const std::string named = baton::detail::nn::bf16_gemm_implementation();
  INFO("implementation here: " << named);
  CHECK(named.starts_with(amx ? "amx_bf16" : fast ? "avx512_bf16" : "widened sgemm"));
  CHECK((!fast || baton::detail::nn::cpu_has_avx512_bf16()));
  const std::int64_t m = 37, n = 45, k = 300;  // long sums: the two kernels add in different orders
  std::vector<float> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::sin(0.37f * static_cast<float>(i));
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.11f * static_cast<float>(i));
  std::vector<float> automatic(static_cast<std::size_t>(m * n)), chosen(automatic.size());
  baton::detail::nn::gemm_bf16(op::none, op::none, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, automatic.data(), n);
  baton::detail::nn::gemm_bf16(op::none, op::none, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, chosen.data(), n,
                               kernel);
  CHECK(std::memcmp(automatic.data(), chosen.data(), automatic.size() * sizeof(float)) == 0);
}

TEST_CASE("nn gemm_bf16: operands are rounded to bf16, sums are not", "[nn][gemm]") {
  // 1 + 2^-9 rounds to 1 in bf16 (8 significant bits; a tie, to even); a float product would
  // give 1 + 2^-9. The sum of 512 products of 1 is 512: exact in float, 2^9 past bf16's steps
  // (a bf16 accumulator would stop at 256).
  for (bf16_gemm_kernel kernel : {bf16_gemm_kernel::automatic, bf16_gemm_kernel::widened_sgemm}) {
    const float a = 1.0f + 0x1p-9f, b = 1.0f;
    float c = 7.0f;
    baton::detail::nn::gemm_bf16(op::none, op::none, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1, kernel);
    CHECK(c == 1.0f);
    const std::vector<float> ones(512, 1.0f + 0x1p-10f);
    baton::detail::nn::gemm_bf16(op::none, op::transpose, 1, 1, 512, 1.0f, ones.data(), 512, ones.data(), 512, 0.0f,
                                 &c, 1, kernel);
    CHECK(c == 512.0f);
  }
  INFO("implementation here: " << baton::detail::nn::bf16_gemm_implementation());
  if (!baton::detail::nn::cpu_has_avx512_bf16()) {
    const float a = 1.0f;
    float c = 0.0f;
    REQUIRE_THROWS_WITH(baton::detail::nn::gemm_bf16(op::none, op::none, 1, 1, 1, 1.0f, &a, 1, &a, 1, 0.0f, &c, 1,
                                                     bf16_gemm_kernel::avx512_bf16),
                        Catch::Matchers::Contains("needs a CPU with AVX512_BF16"));
  }
  if (!baton::detail::nn::cpu_has_amx_bf16()) {
    const float a = 1.0f;
    float c = 0.0f;
    REQUIRE_THROWS_WITH(baton::detail::nn::gemm_bf16(op::none, op::none, 1, 1, 1, 1.0f, &a, 1, &a, 1, 0.0f, &c, 1,
                                                     bf16_gemm_kernel::amx_bf16),
                        Catch::Matchers::Contains("amx_bf16 kernel"));
  }
}
