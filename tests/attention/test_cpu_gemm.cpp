// The register-tiled GEMM of the host flash kernels (baton/attention/detail/cpu_gemm.hpp)
// against a naive triple loop in double, on the shapes the kernels use and around their edges:
// every column-panel width (1 to tile_vectors vectors), row counts that use the wide and the
// narrow register tiles, contractions of 0, 1, one chunk, and several chunks with a
// remainder; A plain and transposed (the strides the kernels pass for P^T and dS^T); C
// overwritten, overwritten from a start value per row (the forward's scores start at minus
// their row's reference max), and accumulated into, inside a larger matrix whose other
// elements must stay as they were; B row-major and B stored by column panels (the forward's
// packed V). And the softmax tiles' exp2 (flash_tiles.hpp), whose form differs by target
// (AVX-512, and the shifter form for AVX2 and SSE): its error over the scores' range and its
// values at the edges.
//
// Tolerance: each element is a dot product of length K (plus C's old value when
// accumulating) summed in T by FMAs in some order, so its rounding error is at most
// gamma_{K+1} * (|c0| + sum_k |a_k b_k|) with gamma_n = n u / (1 - n u) and u T's unit
// roundoff (Higham, Accuracy and Stability of Numerical Algorithms, 3.1): a bound that holds
// for any summation order, checked per element. The double reference adds at most its own
// rounding, some 2^29 times smaller in float and negligible against gamma in double.
#include "catch.hpp"

#include <baton/attention/detail/cpu_gemm.hpp>
#include <baton/attention/detail/flash_tiles.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

namespace da = baton::detail::attention;

struct gemm_case {
  std::int64_t rows, cols, kdim;
  bool transposed_a;  // A stored as A^T: element (r, k) at a[k * rows_padded + r]
  bool accumulate;
  bool from_row_values = false;  // C = row_init[r] + A B instead of A B
  bool b_by_panels = false;      // B stored panel by panel (gemm's b_panel_stride)
};

template <class T>
void check_gemm(const gemm_case& g, unsigned seed) {
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  const auto random = [&](std::int64_t n) {
    std::vector<T> x(static_cast<std::size_t>(n));
    for (auto& e : x) e = static_cast<T>(uniform(gen));
    return x;
  };
  // Leading dimensions larger than the operands: the kernel must read and write only inside.
  const std::int64_t lda = g.transposed_a ? g.rows + 3 : g.kdim + 5;
  const std::int64_t ldb = g.cols + 2 * da::width_v<T>;
  const std::int64_t ldc = g.cols + da::width_v<T> + 1;
  const std::int64_t a_rows = g.transposed_a ? std::max<std::int64_t>(g.kdim, 1) : g.rows;
  const std::vector<T> a = random(a_rows * lda);
  const std::vector<T> b = random(std::max<std::int64_t>(g.kdim, 1) * ldb);
  std::vector<T> c = random((g.rows + 1) * ldc);  // one extra row that must stay untouched
  const std::vector<T> c0 = c;
  const std::int64_t a_row = g.transposed_a ? 1 : lda;
  const std::int64_t a_k = g.transposed_a ? lda : 1;
  const std::vector<T> row_init = random(g.rows);
  // The same B by column panels: element (k, j) at panel j / P, row k, column j % P, with a
  // leading dimension and a panel stride larger than the panel (filled with NaN: read, they
  // would show).
  constexpr std::int64_t P = da::panel_columns<T>;
  const std::int64_t panel_ld = P + da::width_v<T>;
  const std::int64_t panel_stride = (std::max<std::int64_t>(g.kdim, 1) + 1) * panel_ld;
  std::vector<T> b_panels(static_cast<std::size_t>((ldb + P - 1) / P * panel_stride),
                          std::numeric_limits<T>::quiet_NaN());
  for (std::int64_t k = 0; k < g.kdim; ++k)
    for (std::int64_t j = 0; j < g.cols; ++j)
      b_panels[static_cast<std::size_t>(j / P * panel_stride + k * panel_ld + j % P)] =
          b[static_cast<std::size_t>(k * ldb + j)];
  const T* b_arg = g.b_by_panels ? b_panels.data() : b.data();
  const std::int64_t b_ld = g.b_by_panels ? panel_ld : ldb;
  const std::int64_t b_panel_stride = g.b_by_panels ? panel_stride : 0;

  if (g.accumulate) {
    da::gemm<T, true>(c.data(), ldc, g.rows, g.cols, a.data(), a_row, a_k, b_arg, b_ld, g.kdim, nullptr,
                      b_panel_stride);
  } else {
    da::gemm<T, false>(c.data(), ldc, g.rows, g.cols, a.data(), a_row, a_k, b_arg, b_ld, g.kdim,
                       g.from_row_values ? row_init.data() : nullptr, b_panel_stride);
  }

  const double u = std::numeric_limits<T>::epsilon() / 2;
  const double n = static_cast<double>(g.kdim + 1);
  const double gamma = n * u / (1 - n * u);
  std::int64_t wrong = 0, outside_changed = 0;
  std::string first;
  for (std::int64_t r = 0; r <= g.rows; ++r) {
    for (std::int64_t j = 0; j < ldc; ++j) {
      const auto at = static_cast<std::size_t>(r * ldc + j);
      if (r == g.rows || j >= g.cols) {
        outside_changed += c[at] != c0[at];
        continue;
      }
      const double start = g.accumulate        ? static_cast<double>(c0[at])
                           : g.from_row_values ? static_cast<double>(row_init[static_cast<std::size_t>(r)])
                                               : 0.0;
      double exact = start;
      double magnitude = std::abs(start);
      for (std::int64_t k = 0; k < g.kdim; ++k) {
        const double product = static_cast<double>(a[static_cast<std::size_t>(r * a_row + k * a_k)]) *
                               static_cast<double>(b[static_cast<std::size_t>(k * ldb + j)]);
        exact += product;
        magnitude += std::abs(product);
      }
      const double error = std::abs(static_cast<double>(c[at]) - exact);
      if (!(error <= gamma * magnitude)) {
        if (wrong++ == 0) {
          first = "C(" + std::to_string(r) + ", " + std::to_string(j) + ") = " + std::to_string(c[at]) +
                  ", expected " + std::to_string(exact) + ", error " + std::to_string(error) + " > bound " +
                  std::to_string(gamma * magnitude);
        }
      }
    }
  }
  INFO("rows " << g.rows << ", cols " << g.cols << ", kdim " << g.kdim << (g.transposed_a ? ", A^T" : "")
               << (g.b_by_panels ? ", B by panels" : "")
               << (g.accumulate ? ", C +=" : g.from_row_values ? ", C = row value +" : ", C =")
               << "; first wrong element: " << first);
  CHECK(wrong == 0);
  CHECK(outside_changed == 0);
}

}  // namespace

TEMPLATE_TEST_CASE("cpu_gemm matches a naive GEMM in double within the dot-product error bound", "[attention][gemm]",
                   float, double) {
  using T = TestType;
  constexpr std::int64_t W = da::width_v<T>;
  constexpr std::int64_t tile = da::tile_rows;
  // Columns: every panel width from one vector to a full panel, a full panel plus a narrower
  // remainder, and a 64-key tile; rows: one register tile, two and three (a 6-row tile with
  // 16 registers leaves 2 of 8 rows: two 4-row tiles instead; 12 rows are two 6-row tiles),
  // a wide tile's worth with a narrow remainder, and a 64-row tile; contractions: none, one, a
  // chunk minus one, a chunk, several chunks plus a remainder.
  const std::vector<std::int64_t> cols_cases{W, 2 * W, 3 * W, da::tile_vectors * W, (da::tile_vectors + 1) * W,
                                             std::max<std::int64_t>(64, W)};
  const std::vector<std::int64_t> rows_cases{tile, 2 * tile, 3 * tile, 5 * tile, 64};
  const std::vector<std::int64_t> kdim_cases{0, 1, da::contraction_chunk - 1, da::contraction_chunk,
                                             2 * da::contraction_chunk + 37};
  unsigned seed = 1;
  for (const std::int64_t cols : cols_cases)
    for (const std::int64_t rows : rows_cases)
      for (const std::int64_t kdim : kdim_cases)
        for (const bool transposed_a : {false, true})
          for (const int start : {0, 1, 2})  // C =, C = row value +, C +=
            for (const bool b_by_panels : {false, true})
              check_gemm<T>({rows, cols, kdim, transposed_a, start == 2, start == 1, b_by_panels}, ++seed);
}

TEST_CASE("cpu_gemm with an empty contraction zeroes C (or sets its row values), or leaves it when accumulating",
          "[attention][gemm]") {
  constexpr std::int64_t W = da::width_v<float>;
  std::vector<float> c(static_cast<std::size_t>(4 * W), 3.0f);
  const std::vector<float> a(4, 1.0f), b(static_cast<std::size_t>(W), 1.0f);
  da::gemm<float, true>(c.data(), W, 4, W, a.data(), 1, 4, b.data(), W, 0);
  for (float x : c) CHECK(x == 3.0f);
  da::gemm<float, false>(c.data(), W, 4, W, a.data(), 1, 4, b.data(), W, 0);
  for (float x : c) CHECK(x == 0.0f);
  const float row_values[4] = {1.0f, -2.0f, 0.5f, 7.0f};
  da::gemm<float, false>(c.data(), W, 4, W, a.data(), 1, 4, b.data(), W, 0, row_values);
  for (std::int64_t i = 0; i < 4 * W; ++i) CHECK(c[static_cast<std::size_t>(i)] == row_values[i / W]);
}

namespace {

// exp2_scores on one vector of x, lane by lane.
template <bool NanToNan>
std::vector<float> exp2_scores_of(const std::vector<float>& x) {
  constexpr std::size_t W = static_cast<std::size_t>(da::width_v<float>);
  std::vector<float> out(x.size());
  for (std::size_t i = 0; i < x.size(); i += W) {
    float lanes[W];
    for (std::size_t j = 0; j < W; ++j) lanes[j] = i + j < x.size() ? x[i + j] : 0.0f;
    const auto e = da::exp2_scores<NanToNan, float>(da::load(lanes));
    da::store(lanes, e);
    for (std::size_t j = 0; j < W && i + j < x.size(); ++j) out[i + j] = lanes[j];
  }
  return out;
}

}  // namespace

TEST_CASE("the softmax tiles' exp2 is within 2.5e-7 of 2^x on the scores' range, and 0, huge or NaN at its edges",
          "[attention][gemm]") {
  // Every x = k / 128 + a fraction from -126 to 127, against exp2 in long double. The bound:
  // 1.5e-7 (AVX-512's degree-5 fit) or 1.7e-7 (the shifter form with FMAs) measured over every
  // fraction on a 2^-24 grid, plus room for SSE, which rounds a * b + c twice.
  std::vector<float> x;
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> frac(0.0f, 1.0f / 128);
  for (int k = -126 * 128; k <= 127 * 128; ++k) x.push_back(static_cast<float>(k) / 128 + frac(gen));
  for (const bool forward : {true, false}) {
    const std::vector<float> e = forward ? exp2_scores_of<true>(x) : exp2_scores_of<false>(x);
    double worst = 0;
    float worst_x = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      const long double want = std::exp2(static_cast<long double>(x[i]));
      const double err = static_cast<double>(std::fabs(static_cast<long double>(e[i]) / want - 1));
      if (!(err <= worst)) {
        worst = err;
        worst_x = x[i];
      }
    }
    INFO((forward ? "forward" : "backward") << ": worst relative error " << worst << " at x = " << worst_x);
    CHECK(worst <= 2.5e-7);
  }

  constexpr float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // Below -126.5 (and -inf, a masked score) exactly 0; from 128 on (an overflowing score,
  // which the softmax must see) at least 2^127 (+inf, or FLT_MAX where the polynomial's
  // value at 0 is a hair below 1); -126.5 to -126 may give a subnormal or 0 by target.
  const std::vector<float> edges{-inf,   -1e30f, -1000.0f, -150.0f, -127.0f, -126.6f,
                                 -126.3f, 128.0f, 200.0f,   1e30f,   inf};
  for (const bool forward : {true, false}) {
    const std::vector<float> e = forward ? exp2_scores_of<true>(edges) : exp2_scores_of<false>(edges);
    for (std::size_t i = 0; i < edges.size(); ++i) {
      INFO((forward ? "forward" : "backward") << ", x = " << edges[i] << " gives " << e[i]);
      if (edges[i] <= -126.5f)
        CHECK(e[i] == 0.0f);
      else if (edges[i] < -126.0f)
        CHECK((e[i] >= 0.0f && e[i] < std::numeric_limits<float>::min()));
      else
        CHECK(e[i] >= 0x1p127f);
    }
  }
  // A NaN score stays NaN in the forward (the row's sum then carries it to the non-finite
  // rule) and gives 0 in the backward.
  const std::vector<float> nans{nan, 1.0f, nan, -3.0f};
  const std::vector<float> fwd = exp2_scores_of<true>(nans), bwd = exp2_scores_of<false>(nans);
  CHECK(std::isnan(fwd[0]));
  CHECK(std::isnan(fwd[2]));
  CHECK(bwd[0] == 0.0f);
  CHECK(bwd[2] == 0.0f);
  CHECK(std::fabs(fwd[1] / 2.0f - 1.0f) <= 2.5e-7f);
  CHECK(std::fabs(bwd[3] / 0.125f - 1.0f) <= 2.5e-7f);
}
