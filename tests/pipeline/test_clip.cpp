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
  // Rank r holds r + 1 values.
  std::vector<std::vector<double>> per_rank{{0.5, -1.5}, {2.0, 0.25, -3.0}, {1.0}};
  std::vector<double> all;
  for (const auto& v : per_rank) all.insert(all.end(), v.begin(), v.end());
  auto expected = all;
  const double expected_norm = baton::clip_grad_norm(expected, 0.5, p);
  std::vector<double> norms(3);
  std::mutex m;
  baton::run_local(3, [&](baton::local_communicator& comm) {
    auto mine = per_rank[static_cast<std::size_t>(comm.rank())];
    const double norm = baton::clip_grad_norm(mine, 0.5, p, comm);
    std::lock_guard lock(m);
    norms[static_cast<std::size_t>(comm.rank())] = norm;
    per_rank[static_cast<std::size_t>(comm.rank())] = mine;
  });
  std::size_t k = 0;
  for (int r = 0; r < 3; ++r) {
    CHECK(norms[static_cast<std::size_t>(r)] == Approx(expected_norm).epsilon(1e-14));
    for (double v : per_rank[static_cast<std::size_t>(r)]) CHECK(v == Approx(expected[k++]).epsilon(1e-14));
  }
}
