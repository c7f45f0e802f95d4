// baton/nn/detail/gemm.hpp — the one matrix product of the model layer.
//
// C = alpha op(A) op(B) + beta C on row-major float or double matrices. With baton::blas
// linked (BATON_HAS_BLAS()), it is cblas_sgemm / cblas_dgemm; otherwise a cache-blocked loop
// nest that the compiler vectorises. Both are deterministic for a given thread count.
//
// OpenBLAS runs a call on several threads unless told otherwise (OPENBLAS_NUM_THREADS=1 or
// openblas_set_num_threads(1)). When ranks are threads of one process, one BLAS thread per
// rank is what you want: the ranks already occupy the cores.
#pragma once

#include <baton/config.hpp>
#include <baton/nn/error.hpp>

#if BATON_HAS_BLAS()
#include <cblas.h>
#endif

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace baton::detail::nn {

/// Whether an operand is used as stored or transposed.
enum class op { none, transpose };

/// The blocked fallback (always compiled, so tests can compare it with BLAS). Same contract
/// as gemm() below.
template <class T>
void gemm_blocked(op op_a, op op_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a,
                  std::int64_t lda, const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "baton::nn gemm: float or double");
  // C = beta C first (beta 0 overwrites, as BLAS does: NaNs in C do not survive).
  for (std::int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    if (beta == T(0)) {
      std::fill(row, row + n, T(0));
    } else if (beta != T(1)) {
      for (std::int64_t j = 0; j < n; ++j) row[j] *= beta;
    }
  }
  if (k == 0 || alpha == T(0)) return;

  // Panels of op(B) (kb x nb, packed row-major) are reused by every row of C; rows of op(A)
  // are packed kb at a time. The inner loop runs along a row of C and of the B panel, four
  // rows of C at once so that each B element loaded serves four multiply-adds.
  // The buffers are sized to this product, not to the largest panel: the model's products are
  // often tiny, and a full 256 x 512 panel zero-filled on every call cost more than the
  // arithmetic (and, under the sanitizers, a fresh mapping per call).
  constexpr std::int64_t kb_max = 256, nb_max = 512;
  std::vector<T> b_panel(static_cast<std::size_t>(std::min(kb_max, k) * std::min(nb_max, n)));
  std::vector<T> a_rows(static_cast<std::size_t>(4 * std::min(kb_max, k)));
  const auto a_at = [&](std::int64_t i, std::int64_t p) { return op_a == op::none ? a[i * lda + p] : a[p * lda + i]; };
  const auto b_at = [&](std::int64_t p, std::int64_t j) { return op_b == op::none ? b[p * ldb + j] : b[j * ldb + p]; };

  for (std::int64_t j0 = 0; j0 < n; j0 += nb_max) {
    const std::int64_t nb = std::min(nb_max, n - j0);
    for (std::int64_t p0 = 0; p0 < k; p0 += kb_max) {
      const std::int64_t kb = std::min(kb_max, k - p0);
      for (std::int64_t p = 0; p < kb; ++p)
        for (std::int64_t j = 0; j < nb; ++j) b_panel[static_cast<std::size_t>(p * nb + j)] = b_at(p0 + p, j0 + j);
      for (std::int64_t i0 = 0; i0 < m; i0 += 4) {
        const std::int64_t rows = std::min<std::int64_t>(4, m - i0);
        for (std::int64_t r = 0; r < rows; ++r)
          for (std::int64_t p = 0; p < kb; ++p)
            a_rows[static_cast<std::size_t>(r * kb + p)] = alpha * a_at(i0 + r, p0 + p);
        if (rows == 4) {
          T* c0 = c + i0 * ldc + j0;
          T* c1 = c0 + ldc;
          T* c2 = c1 + ldc;
          T* c3 = c2 + ldc;
          for (std::int64_t p = 0; p < kb; ++p) {
            const T x0 = a_rows[static_cast<std::size_t>(p)], x1 = a_rows[static_cast<std::size_t>(kb + p)],
                    x2 = a_rows[static_cast<std::size_t>(2 * kb + p)], x3 = a_rows[static_cast<std::size_t>(3 * kb + p)];
            const T* bp = b_panel.data() + p * nb;
            for (std::int64_t j = 0; j < nb; ++j) {
              const T bv = bp[j];
              c0[j] += x0 * bv;
              c1[j] += x1 * bv;
              c2[j] += x2 * bv;
              c3[j] += x3 * bv;
            }
          }
        } else {
          for (std::int64_t r = 0; r < rows; ++r) {
            T* cr = c + (i0 + r) * ldc + j0;
            for (std::int64_t p = 0; p < kb; ++p) {
              const T x = a_rows[static_cast<std::size_t>(r * kb + p)];
              const T* bp = b_panel.data() + p * nb;
              for (std::int64_t j = 0; j < nb; ++j) cr[j] += x * bp[j];
            }
          }
        }
      }
    }
  }
}

/// C[m x n] = alpha op(A)[m x k] op(B)[k x n] + beta C, row-major, leading dimensions in
/// elements. beta = 0 overwrites C.
template <class T>
void gemm(op op_a, op op_b, std::int64_t m, std::int64_t n, std::int64_t k, T alpha, const T* a, std::int64_t lda,
          const T* b, std::int64_t ldb, T beta, T* c, std::int64_t ldc) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>, "baton::nn gemm: float or double");
  if (m == 0 || n == 0) return;
#if BATON_HAS_BLAS()
  for (std::int64_t extent : {m, n, k, lda, ldb, ldc}) {
    if (extent > INT_MAX)
      throw baton::nn::nn_error("baton::nn gemm: extent " + std::to_string(extent) +
                     " exceeds the 32-bit BLAS interface; split the batch into smaller microbatches");
  }
  const auto ta = op_a == op::none ? CblasNoTrans : CblasTrans;
  const auto tb = op_b == op::none ? CblasNoTrans : CblasTrans;
  const auto i = [](std::int64_t v) { return static_cast<int>(v); };
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, i(m), i(n), i(k), alpha, a, i(lda), b, i(ldb), beta, c, i(ldc));
  }
#else
  gemm_blocked(op_a, op_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

/// Which implementation gemm() uses: "cblas" (baton::blas linked) or "blocked fallback".
constexpr const char* gemm_implementation() noexcept {
#if BATON_HAS_BLAS()
  return "cblas";
#else
  return "blocked fallback";
#endif
}

}  // namespace baton::detail::nn
