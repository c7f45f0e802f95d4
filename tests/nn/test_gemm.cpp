// The model layer's matrix product: the blocked fallback and (when linked) cblas against a
// naive triple loop, for every transpose combination, alpha/beta and odd sizes.
#include <baton/nn/detail/gemm.hpp>

#include "catch.hpp"

#include "nn_test_util.hpp"

#include <cstdint>
#include <limits>
#include <span>
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

template <class T, class Gemm>
void check_all(Gemm gemm, double tolerance) {
  // Sizes that cross the fallback's 4-row, 256-deep and 512-wide blocks, and a padded ldc.
  const std::int64_t sizes[][3] = {{1, 1, 1}, {5, 7, 3}, {9, 513, 17}, {33, 20, 300}, {4, 4, 0}};
  std::uint32_t seed = 1;
  for (const auto& s : sizes) {
    const std::int64_t m = s[0], n = s[1], k = s[2];
    for (op ta : {op::none, op::transpose})
      for (op tb : {op::none, op::transpose})
        for (double beta : {0.0, 1.0, -0.5}) {
          const std::int64_t lda = (ta == op::none ? k : m) + 1, ldb = (tb == op::none ? n : k) + 2, ldc = n + 3;
          const auto rows_a = ta == op::none ? m : k, rows_b = tb == op::none ? k : n;
          const auto a = nn_test::random_tensor<T>({rows_a * lda}, seed++);
          const auto b = nn_test::random_tensor<T>({rows_b * ldb}, seed++);
          auto c = nn_test::random_tensor<T>({m * ldc}, seed++);
          if (beta == 0.0) c[0] = std::numeric_limits<T>::quiet_NaN();  // beta 0 overwrites, NaN included
          const std::vector<T> av(a.values().begin(), a.values().end()), bv(b.values().begin(), b.values().end()),
              cv(c.values().begin(), c.values().end());
          const auto expected = naive(ta, tb, m, n, k, 0.75, av, lda, bv, ldb, beta, cv, ldc);
          gemm(ta, tb, m, n, k, T(0.75), a.data(), lda, b.data(), ldb, static_cast<T>(beta), c.data(), ldc);
          INFO("m " << m << " n " << n << " k " << k << " ta " << (ta == op::transpose) << " tb "
                    << (tb == op::transpose) << " beta " << beta);
          REQUIRE(nn_test::max_rel_error(std::span<const T>(c.values()), std::span<const double>(expected)) <= tolerance);
        }
  }
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
