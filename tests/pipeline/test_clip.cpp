// clip_grad_norm: the norm over every rank of the groups, and the scaling.
#include "catch.hpp"

#include <baton/comm.hpp>
#include <baton/pipeline/clip.hpp>

#include <cmath>
#include <limits>
#include <mutex>
#include <span>
#include <vector>

namespace {
// A communicator of one rank (all_reduce is the identity), to call the collective form alone.
struct solo {
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T>
  void all_reduce(std::span<T>, baton::reduce_op) {}
};
}  // namespace

TEST_CASE("clip_grad_norm on one rank", "[pipeline][clip]") {
  SECTION("2-norm: returns the norm and scales by max_norm / (norm + 1e-6)") {
    std::vector<double> a{3.0, 0.0};
    std::vector<double> b{4.0};
    std::vector<std::span<double>> grads{a, b};
    const double norm = baton::clip_grad_norm(grads, 1.0, 2.0);
    CHECK(norm == 5.0);
    const double c = 1.0 / (5.0 + 1e-6);
    CHECK(a[0] == 3.0 * c);
    CHECK(b[0] == 4.0 * c);
  }
  SECTION("inf-norm: the largest magnitude") {
    std::vector<float> g{1.0f, -7.0f, 2.0f};
    const double norm = baton::clip_grad_norm(g, 100.0, std::numeric_limits<double>::infinity());
    CHECK(norm == 7.0);
    CHECK(g[1] == -7.0f);  // below max_norm: untouched
  }
  SECTION("1-norm and p = 3") {
    std::vector<double> g{1.0, -2.0, 2.0};
    CHECK(baton::clip_grad_norm(g, 100.0, 1.0) == 5.0);
    CHECK(baton::clip_grad_norm(g, 100.0, 3.0) == Approx(std::cbrt(17.0)).epsilon(1e-15));
  }
  SECTION("a group of one rank changes nothing") {
    std::vector<double> g{6.0, 8.0};
    solo group;
    CHECK(baton::clip_grad_norm(g, 5.0, 2.0, group) == 10.0);
    CHECK(g[0] == Approx(3.0).epsilon(1e-6));
  }
  SECTION("bad arguments say what to pass") {
    std::vector<double> g{1.0};
    CHECK_THROWS_WITH(baton::clip_grad_norm(g, 1.0, 0.0), Catch::Matchers::Contains("norm_type must be positive"));
    CHECK_THROWS_WITH(baton::clip_grad_norm(g, -1.0, 2.0), Catch::Matchers::Contains("max_norm"));
  }
  SECTION("a NaN gradient gives a NaN norm and no scaling") {
    std::vector<double> g{std::nan(""), 100.0};
    CHECK(std::isnan(baton::clip_grad_norm(g, 1.0, 2.0)));
    CHECK(std::isnan(baton::clip_grad_norm(g, 1.0, std::numeric_limits<double>::infinity())));
    CHECK(g[1] == 100.0);
  }
}

TEST_CASE("clip_grad_norm over ranks equals clipping the concatenation on one rank", "[pipeline][clip]") {
  const double p = GENERATE(2.0, std::numeric_limits<double>::infinity());
  // Rank 0 holds two values, rank 1 three, rank 2 one.
  std::vector<std::vector<double>> per_rank{{0.5, -1.5}, {2.0, 0.25, -3.0}, {1.0}};
  // The expectation, written out rather than computed by clip_grad_norm on one rank: the
  // 2-norm of all six values is sqrt(0.25 + 2.25 + 4 + 0.0625 + 9 + 1) = sqrt(16.5625), the
  // inf-norm |-3| = 3; each value is then multiplied by 0.5 / (norm + 1e-6).
  const double expected_norm = p == 2.0 ? std::sqrt(16.5625) : 3.0;
  const double scale = 0.5 / (expected_norm + 1e-6);
  std::vector<std::vector<double>> expected = per_rank;
  for (auto& v : expected)
    for (double& x : v) x *= scale;
  std::vector<double> norms(3);
  std::mutex m;
  baton::run_local(3, [&](baton::local_communicator& comm) {
    auto mine = per_rank[static_cast<std::size_t>(comm.rank())];
    const double norm = baton::clip_grad_norm(mine, 0.5, p, comm);
    std::lock_guard lock(m);
    norms[static_cast<std::size_t>(comm.rank())] = norm;
    per_rank[static_cast<std::size_t>(comm.rank())] = mine;
  });
  for (std::size_t r = 0; r < 3; ++r) {
    INFO("rank " << r);
    CHECK(norms[r] == Approx(expected_norm).epsilon(1e-14));
    REQUIRE(per_rank[r].size() == expected[r].size());
    for (std::size_t i = 0; i < per_rank[r].size(); ++i) CHECK(per_rank[r][i] == Approx(expected[r][i]).epsilon(1e-14));
  }
}
