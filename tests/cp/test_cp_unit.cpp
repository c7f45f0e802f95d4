// The pieces of the CP layer that need no communicator: sharding and its positions,
// shard / unshard, the (out, lse) merge, the ring's bookkeeping and step planner, and the
// Ulysses layout transforms, and host_memory's buffers.
#include "catch.hpp"

#include <baton/attention/masks.hpp>
#include <baton/cp/detail/ring_core.hpp>
#include <baton/cp/detail/ring_plan.hpp>
#include <baton/cp/detail/ulysses_layout.hpp>
#include <baton/cp/memory.hpp>
#include <baton/cp/merge.hpp>
#include <baton/cp/sharding.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <utility>
#include <vector>

using baton::sequence_sharding;
using baton::shard_layout;
using baton::shard_piece;

TEST_CASE("sharding: every layout is a partition of the sequence with the documented positions", "[cp][sharding]") {
  const auto layout = GENERATE(shard_layout::contiguous, shard_layout::zigzag, shard_layout::striped);
  const int ranks = GENERATE(1, 2, 3, 4);
  const std::int64_t seq = 48;
  const sequence_sharding s(layout, seq, ranks);
  REQUIRE(s.local_len() == seq / ranks);
  std::vector<int> seen(seq, 0);
  for (int r = 0; r < ranks; ++r) {
    const auto pos = s.global_positions(r);
    REQUIRE(static_cast<std::int64_t>(pos.size()) == s.local_len());
    for (std::int64_t i = 0; i < s.local_len(); ++i) {
      const std::int64_t p = pos[static_cast<std::size_t>(i)];
      ++seen[static_cast<std::size_t>(p)];
      // independent statement of each layout
      const std::int64_t L = s.local_len(), C = L / 2;
      std::int64_t expected = 0;
      if (layout == shard_layout::contiguous) expected = r * L + i;
      if (layout == shard_layout::zigzag) expected = i < C ? r * C + i : (2 * ranks - 1 - r) * C + (i - C);
      if (layout == shard_layout::striped) expected = r + i * ranks;
      REQUIRE(p == expected);
    }
  }
  REQUIRE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
}

TEST_CASE("sharding: the inner (Ulysses) split keeps the group's local order", "[cp][sharding]") {
  const sequence_sharding s(shard_layout::zigzag, 32, 2, 2);  // ring 2 x Ulysses 2
  REQUIRE(s.ranks() == 4);
  REQUIRE(s.local_len() == 8);
  REQUIRE(s.group_len() == 16);
  // group 0 holds chunks 0 and 3 (chunk = 8): rank 0 gets chunk 0, rank 1 chunk 3
  REQUIRE(s.global_positions(0).front() == 0);
  REQUIRE(s.global_positions(1).front() == 24);
  REQUIRE(s.global_positions(2).front() == 8);
  REQUIRE(s.global_positions(3).front() == 16);
  for (int g = 0; g < 2; ++g) {
    auto both = s.global_positions(2 * g);
    const auto second = s.global_positions(2 * g + 1);
    both.insert(both.end(), second.begin(), second.end());
    REQUIRE(both == s.group_positions(g));
  }
  // striped inside a hybrid: the inner split cuts one strided piece into two strided pieces
  const sequence_sharding st(shard_layout::striped, 16, 2, 2);
  REQUIRE(st.global_positions(1) == std::vector<std::int64_t>{8, 10, 12, 14});
  REQUIRE(st.global_positions(3) == std::vector<std::int64_t>{9, 11, 13, 15});
}

TEST_CASE("sharding: bad degrees and lengths are errors; local_len() of an uneven sharding names local_len(rank)",
          "[cp][sharding][errors]") {
  REQUIRE_THROWS_WITH(sequence_sharding(shard_layout::zigzag, 30, 4).local_len(), Catch::Contains("local_len(rank)"));
  REQUIRE_THROWS_WITH(sequence_sharding(shard_layout::contiguous, 10, 3).group_len(), Catch::Contains("group_len(group)"));
  REQUIRE_THROWS_WITH(sequence_sharding(shard_layout::custom, 10, 2), Catch::Contains("built from its positions"));
  REQUIRE_THROWS_AS(sequence_sharding(shard_layout::contiguous, 12, 0), baton::cp_error);
  REQUIRE_THROWS_AS(sequence_sharding(shard_layout::contiguous, 0, 2), baton::cp_error);
  REQUIRE_NOTHROW(sequence_sharding(shard_layout::zigzag, 24, 3));
}

TEST_CASE("shard_sequence / unshard_sequence round-trip any tensor on any axis", "[cp][sharding]") {
  const auto layout = GENERATE(shard_layout::contiguous, shard_layout::zigzag, shard_layout::striped);
  const int seq_axis = GENERATE(0, 1, 2);
  std::vector<std::int64_t> shape{3, 4, 5};
  shape[static_cast<std::size_t>(seq_axis)] = 12;
  const sequence_sharding s(layout, 12, 3);
  const auto n = static_cast<std::size_t>(shape[0] * shape[1] * shape[2]);
  std::vector<int> full(n);
  std::iota(full.begin(), full.end(), 0);
  std::vector<int> back(n, -1);
  for (int r = 0; r < 3; ++r) {
    const auto local = baton::shard_sequence<int>(s, r, full, shape, seq_axis);
    // every element of the shard is the full tensor's element at the global position
    const auto pos = s.global_positions(r);
    std::vector<std::int64_t> lshape = shape;
    lshape[static_cast<std::size_t>(seq_axis)] = 4;
    for (std::int64_t a = 0; a < lshape[0]; ++a)
      for (std::int64_t b = 0; b < lshape[1]; ++b)
        for (std::int64_t c = 0; c < lshape[2]; ++c) {
          std::array<std::int64_t, 3> gi{a, b, c};
          gi[static_cast<std::size_t>(seq_axis)] = pos[static_cast<std::size_t>(gi[static_cast<std::size_t>(seq_axis)])];
          const auto li = static_cast<std::size_t>((a * lshape[1] + b) * lshape[2] + c);
          const auto fi = static_cast<std::size_t>((gi[0] * shape[1] + gi[1]) * shape[2] + gi[2]);
          REQUIRE(local[li] == full[fi]);
        }
    baton::unshard_sequence<int>(s, r, local, shape, seq_axis, back);
  }
  REQUIRE(back == full);
}

TEST_CASE("shard_sequence rejects a tensor that does not match the sharding", "[cp][sharding][errors]") {
  const sequence_sharding s(shard_layout::contiguous, 8, 2);
  std::vector<float> full(2 * 8 * 3), local(2 * 4 * 3);
  const std::vector<std::int64_t> wrong{2, 9, 3};
  REQUIRE_THROWS_WITH(baton::shard_sequence<float>(s, 0, full, wrong, 1, local), Catch::Contains("9 tokens"));
  const std::vector<std::int64_t> shape{2, 8, 3};
  REQUIRE_THROWS_WITH(baton::shard_sequence<float>(s, 0, full, shape, 3, local), Catch::Contains("out of range"));
  std::vector<float> small(5);
  REQUIRE_THROWS_WITH(baton::shard_sequence<float>(s, 0, full, shape, 1, small), Catch::Contains("shard holds 5"));
  REQUIRE_THROWS_AS(s.pieces(2), baton::cp_error);
}

namespace {
// The oracle for merging: softmax over the union of both key sets, from scratch in long double.
struct partial {
  std::vector<double> out;
  double lse;
};
partial attend(const std::vector<double>& scores, const std::vector<std::vector<double>>& values, std::size_t dim) {
  long double m = -std::numeric_limits<long double>::infinity();
  for (double s : scores) m = std::max<long double>(m, s);
  partial p{std::vector<double>(dim, 0.0), -std::numeric_limits<double>::infinity()};
  if (scores.empty()) return p;
  long double sum = 0;
  std::vector<long double> acc(dim, 0);
  for (std::size_t j = 0; j < scores.size(); ++j) {
    const long double w = std::exp(static_cast<long double>(scores[j]) - m);
    sum += w;
    for (std::size_t x = 0; x < dim; ++x) acc[x] += w * values[j][x];
  }
  for (std::size_t x = 0; x < dim; ++x) p.out[x] = static_cast<double>(acc[x] / sum);
  p.lse = static_cast<double>(m + std::log(sum));
  return p;
}
}  // namespace

TEST_CASE("merge_attention_partial: merging blocks equals attention over their union", "[cp][merge]") {
  std::mt19937 gen(7);
  std::normal_distribution<double> normal(0.0, 3.0);
  const std::size_t dim = 3;
  for (int trial = 0; trial < 50; ++trial) {
    // three key blocks of random sizes, one of them possibly empty (a fully masked block)
    std::vector<std::vector<double>> scores(3);
    std::vector<std::vector<std::vector<double>>> values(3);
    for (int b = 0; b < 3; ++b) {
      const int n = static_cast<int>(gen() % 4);  // 0..3 keys
      for (int j = 0; j < n; ++j) {
        scores[b].push_back(normal(gen) + (b == 1 ? 40.0 : 0.0));  // a block far above the others
        values[b].push_back({normal(gen), normal(gen), normal(gen)});
      }
    }
    std::vector<double> out(dim, 0.0), lse{-std::numeric_limits<double>::infinity()};
    std::vector<double> all_scores;
    std::vector<std::vector<double>> all_values;
    for (int b = 0; b < 3; ++b) {
      const partial p = attend(scores[b], values[b], dim);
      baton::merge_attention_partial<double, double, double>(out, lse, p.out, std::vector<double>{p.lse}, static_cast<std::int64_t>(dim));
      all_scores.insert(all_scores.end(), scores[b].begin(), scores[b].end());
      all_values.insert(all_values.end(), values[b].begin(), values[b].end());
    }
    const partial whole = attend(all_scores, all_values, dim);
    if (all_scores.empty()) {
      REQUIRE(std::isinf(lse[0]));
      REQUIRE(lse[0] < 0);
      REQUIRE(out == std::vector<double>(dim, 0.0));
      continue;
    }
    REQUIRE(std::abs(lse[0] - whole.lse) <= 1e-12 * std::max(1.0, std::abs(whole.lse)));
    for (std::size_t x = 0; x < dim; ++x) REQUIRE(std::abs(out[x] - whole.out[x]) <= 1e-12 * (1 + std::abs(whole.out[x])));
  }
}

TEST_CASE("merge_attention_partial: -inf blocks never make a NaN, in float either", "[cp][merge]") {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> out{0, 0}, lse{-inf};
  // empty into empty: stays empty
  baton::merge_attention_partial<float, float, float>(out, lse, std::vector<float>{0, 0}, std::vector<float>{-inf}, 2);
  REQUIRE(lse[0] == -inf);
  REQUIRE((out[0] == 0 && out[1] == 0));
  // a real block into empty: copied exactly
  baton::merge_attention_partial<float, float, float>(out, lse, std::vector<float>{1.5f, -2}, std::vector<float>{3}, 2);
  REQUIRE(lse[0] == 3);
  REQUIRE((out[0] == 1.5f && out[1] == -2));
  // empty into a real result: unchanged
  baton::merge_attention_partial<float, float, float>(out, lse, std::vector<float>{9, 9}, std::vector<float>{-inf}, 2);
  REQUIRE(lse[0] == 3);
  REQUIRE((out[0] == 1.5f && out[1] == -2));
  // huge gaps in either direction stay finite
  baton::merge_attention_partial<float, float, float>(out, lse, std::vector<float>{4, 4}, std::vector<float>{3000}, 2);
  REQUIRE(lse[0] == 3000);
  REQUIRE(out[0] == 4);
  baton::merge_attention_partial<float, float, float>(out, lse, std::vector<float>{-7, 7}, std::vector<float>{-3000}, 2);
  REQUIRE(lse[0] == 3000);
  REQUIRE(out[0] == 4);
  REQUIRE_THROWS_AS((baton::merge_attention_partial<float, float, float>(out, lse, std::vector<float>{1}, std::vector<float>{0}, 2)),
                    std::invalid_argument);
}

TEST_CASE("ring schedule: every rank sees every block once and accumulators end at their owner", "[cp][ring]") {
  for (int R = 1; R <= 5; ++R) {
    const baton::detail::cp::ring_schedule sched{R};
    for (int r = 0; r < R; ++r) {
      std::set<int> owners;
      for (int s = 0; s < sched.steps(); ++s) owners.insert(sched.kv_owner(r, s));
      REQUIRE(static_cast<int>(owners.size()) == R);
      REQUIRE(sched.kv_owner(r, 0) == r);
      // rank r receives at step s+1 what rank r-1 held at step s
      for (int s = 0; s + 1 < R; ++s) REQUIRE(sched.kv_owner(r, s + 1) == sched.kv_owner((r - 1 + R) % R, s));
    }
    // what a rank holds at any step goes home in hops_to_owner(step) hops forward; with no
    // step skipped the last is R-1, where the block of owner o sits on o - 1: one +1 hop
    for (int r = 0; r < R; ++r)
      for (int s = 0; s < sched.steps(); ++s) REQUIRE((r + sched.hops_to_owner(s)) % R == sched.kv_owner(r, s));
    for (int o = 0; o < R; ++o) {
      const int holder = (o + R - 1) % R;
      REQUIRE(sched.kv_owner(holder, R - 1) == o);
      REQUIRE((holder + sched.hops_to_owner(R - 1)) % R == o);
    }
  }
}

namespace {
std::int64_t step_area(const baton::detail::cp::ring_schedule& sched, const sequence_sharding& s, int rank, int step) {
  const auto q = s.pieces(rank);
  const auto k = s.pieces(sched.kv_owner(rank, step));
  std::int64_t area = 0;
  for (const auto& c : baton::detail::cp::plan_step(baton::causal_mask{}, q, k)) area += c.q_count * c.k_count;
  return area;
}
}  // namespace

TEST_CASE("ring planner: under a causal mask zigzag makes every step after the first half a block", "[cp][ring]") {
  const int R = GENERATE(2, 3, 4);
  const sequence_sharding s(shard_layout::zigzag, 8 * R, R);
  const std::int64_t L = s.local_len(), C = L / 2;
  const baton::detail::cp::ring_schedule sched{R};
  for (int r = 0; r < R; ++r) {
    REQUIRE(step_area(sched, s, r, 0) == 3 * C * C);  // own block: chunk r x chunk r, and chunk 2R-1-r x both
    for (int step = 1; step < R; ++step) REQUIRE(step_area(sched, s, r, step) == L * L / 2);
  }
  // contiguous, for contrast: whole blocks or nothing, so ranks do unequal work
  const sequence_sharding c(shard_layout::contiguous, 8 * R, R);
  std::int64_t first = 0, last = 0;
  for (int step = 1; step < R; ++step) {
    first += step_area(sched, c, 0, step);
    last += step_area(sched, c, R - 1, step);
  }
  REQUIRE(first == 0);
  REQUIRE(last == (R - 1) * L * L);
}

TEST_CASE("ring planner: a document mask skips the blocks of other documents", "[cp][ring]") {
  // documents [0,8) and [8,16); contiguous over 2 ranks: rank 1 never needs rank 0's keys
  std::vector<std::int64_t> ids(16, 0);
  std::fill(ids.begin() + 8, ids.end(), 1);
  const baton::document_mask mask(ids);
  const sequence_sharding s(shard_layout::contiguous, 16, 2);
  const auto q = s.pieces(1), k = s.pieces(0);
  REQUIRE(baton::detail::cp::plan_step(mask, q, k).empty());
  REQUIRE(baton::detail::cp::plan_step(mask, q, q).size() == 1);
}

TEST_CASE("Ulysses layout: heads <-> sequence round-trips, GQA replicas are summed", "[cp][ulysses]") {
  using namespace baton::detail::cp;
  REQUIRE(check_head_split(8, 2, 4).empty());  // replicated: 2 kv heads to 4 ranks
  REQUIRE(check_head_split(8, 2, 2).empty());
  REQUIRE(check_head_split(6, 2, 4).empty());   // q heads uneven: 2 2 1 1
  REQUIRE(check_head_split(12, 3, 2).empty());  // kv heads: neither divides, so dealt per query head
  REQUIRE_FALSE(check_head_split(6, 4, 2).empty());  // GQA needs kv | q
  const head_split rep = split_heads(8, 2, 4).kv;
  REQUIRE(rep.replicated());
  REQUIRE((rep.first(0) == 0 && rep.first(1) == 0 && rep.first(2) == 1 && rep.first(3) == 1));
  // query heads of rank j (8/4 = 2 per rank, group of 4 q heads per kv head) use kv head j*2/4
  for (int j = 0; j < 4; ++j)
    for (int h = 2 * j; h < 2 * j + 2; ++h) REQUIRE(h / 4 == rep.first(j));

  // P ranks each hold [b, sl, H, x]; simulate the all-to-all by moving blocks by hand
  const std::int64_t P = 4, b = 2, sl = 3, H = 2, x = 5;
  const head_split split = split_heads(8, H, P).kv;  // replicated
  const std::int64_t hc = split.per_rank();
  std::vector<std::vector<double>> local(P), send(P);
  for (std::int64_t r = 0; r < P; ++r) {
    local[r].resize(static_cast<std::size_t>(b * sl * H * x));
    for (std::size_t i = 0; i < local[r].size(); ++i) local[r][i] = 1000.0 * static_cast<double>(r) + static_cast<double>(i);
    send[r].resize(static_cast<std::size_t>(P * b * sl * hc * x));
    double* out = send[r].data();
    for (std::int64_t j = 0; j < P; ++j) out = pack_heads_part(bshd<const double>(local[r].data(), b, sl, H, x), split.first(j), hc, out);
  }
  const std::int64_t block = b * sl * hc * x;
  std::vector<std::vector<double>> gathered(P, std::vector<double>(static_cast<std::size_t>(b * P * sl * hc * x)));
  for (std::int64_t j = 0; j < P; ++j) {
    const auto dst = bshd<double>(gathered[j].data(), b, P * sl, hc, x);
    for (std::int64_t i = 0; i < P; ++i) unpack_sequence_part(send[i].data() + j * block, i, dst, sl);
    // rank j holds, at row i*sl + t, rank i's token t of heads first(j) .. first(j) + hc - 1:
    // every element of the gathered block, not one
    for (std::int64_t i = 0; i < P; ++i) {
      const auto src = bshd<double>(local[i].data(), b, sl, H, x);
      for (std::int64_t bb = 0; bb < b; ++bb)
        for (std::int64_t t = 0; t < sl; ++t)
          for (std::int64_t hh = 0; hh < hc; ++hh)
            for (std::int64_t d = 0; d < x; ++d) {
              INFO("rank " << j << " from rank " << i << ": batch " << bb << ", token " << t << ", head " << hh << ", dim " << d);
              REQUIRE(dst(bb, i * sl + t, hh, d) == src(bb, t, split.first(j) + hh, d));
            }
    }
  }
  // inverse: pack by sequence, exchange, unpack by heads summing replicas
  std::vector<std::vector<double>> back_send(P, std::vector<double>(static_cast<std::size_t>(P * block)));
  for (std::int64_t j = 0; j < P; ++j) {
    double* out = back_send[j].data();
    for (std::int64_t i = 0; i < P; ++i) out = pack_sequence_part(bshd<const double>(gathered[j].data(), b, P * sl, hc, x), i, sl, out);
  }
  for (std::int64_t i = 0; i < P; ++i) {
    std::vector<double> recv(static_cast<std::size_t>(P * block));
    for (std::int64_t j = 0; j < P; ++j)
      std::copy_n(back_send[j].data() + i * block, block, recv.data() + j * block);
    std::vector<double> result(local[i].size());
    unpack_heads_part<double>(recv.data(), block, 0, split, bshd<double>(result.data(), b, sl, H, x));
    // each of the 2 kv heads was replicated to 2 ranks: the inverse sums the 2 copies
    for (std::size_t e = 0; e < result.size(); ++e) REQUIRE(result[e] == 2 * local[i][e]);
  }
}

// ---- issue 17: any length, custom shardings ------------------------------------------------

namespace {

// n items in `parts` runs, the first n % parts one longer: an independent statement of the
// rule the layouts use where the length does not divide.
std::int64_t run_start(std::int64_t n, std::int64_t parts, std::int64_t i) {
  std::int64_t start = 0;
  for (std::int64_t j = 0; j < i; ++j) start += n / parts + (j < n % parts ? 1 : 0);
  return start;
}
std::int64_t run_count(std::int64_t n, std::int64_t parts, std::int64_t i) { return n / parts + (i < n % parts ? 1 : 0); }

std::vector<std::int64_t> expected_group(shard_layout layout, std::int64_t n, int degree, int g) {
  std::vector<std::int64_t> out;
  const auto run = [&](std::int64_t parts, std::int64_t i) {
    for (std::int64_t t = 0; t < run_count(n, parts, i); ++t) out.push_back(run_start(n, parts, i) + t);
  };
  if (layout == shard_layout::contiguous) run(degree, g);
  if (layout == shard_layout::zigzag) {
    run(2 * degree, g);
    run(2 * degree, 2 * degree - 1 - g);
  }
  if (layout == shard_layout::striped)
    for (std::int64_t p = g; p < n; p += degree) out.push_back(p);
  return out;
}

}  // namespace

TEST_CASE("sharding: any length, every layout and inner degree: a partition with the stated runs, shards within one "
          "chunk of each other",
          "[cp][sharding]") {
  for (shard_layout layout : {shard_layout::contiguous, shard_layout::zigzag, shard_layout::striped})
    for (int degree = 1; degree <= 5; ++degree)
      for (int inner = 1; inner <= 3; ++inner)
        for (std::int64_t n = 1; n <= 67; ++n) {
          INFO(to_string(layout) << " " << n << " over " << degree << " x " << inner);
          const sequence_sharding s(layout, n, degree, inner);
          std::vector<int> seen(static_cast<std::size_t>(n), 0);
          std::int64_t lo = n, hi = 0, group_lo = n, group_hi = 0;
          for (int g = 0; g < degree; ++g) {
            const auto want = expected_group(layout, n, degree, g);
            REQUIRE(s.group_positions(g) == want);
            REQUIRE(s.group_len(g) == static_cast<std::int64_t>(want.size()));
            group_lo = std::min(group_lo, s.group_len(g));
            group_hi = std::max(group_hi, s.group_len(g));
            // the inner ranks split the group's list in order, the first ones one longer
            for (int u = 0; u < inner; ++u) {
              const int rank = g * inner + u;
              const auto mine = s.global_positions(rank);
              REQUIRE(static_cast<std::int64_t>(mine.size()) == s.local_len(rank));
              REQUIRE(s.local_len(rank) == run_count(s.group_len(g), inner, u));
              REQUIRE(s.offset_in_group(rank) == run_start(s.group_len(g), inner, u));
              for (std::size_t i = 0; i < mine.size(); ++i) {
                REQUIRE(mine[i] == want[static_cast<std::size_t>(s.offset_in_group(rank)) + i]);
                ++seen[static_cast<std::size_t>(mine[i])];
              }
              lo = std::min(lo, s.local_len(rank));
              hi = std::max(hi, s.local_len(rank));
              REQUIRE(s.max_local_len() >= s.local_len(rank));
            }
          }
          REQUIRE(std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; }));
          REQUIRE(s.is_even() == (lo == hi));
          // groups: one token apart (zigzag's two chunks each carry at most one extra token,
          // and only one of them does when the other's partner lacks it); ranks within a group
          // one apart, so ranks at most two apart in all
          REQUIRE(group_hi - group_lo <= 1);
          REQUIRE(hi - lo <= (inner > 1 ? 2 : 1));
          REQUIRE(s.max_group_len() == group_hi);
        }
}

TEST_CASE("sharding: a custom sharding from position lists; runs are compressed; bad lists are named",
          "[cp][sharding]") {
  const sequence_sharding s(std::vector<std::vector<std::int64_t>>{{0, 1, 2, 7, 8}, {3, 4, 5, 6, 9}});
  REQUIRE(s.layout() == shard_layout::custom);
  REQUIRE(s.seq_len() == 10);
  REQUIRE(s.degree() == 2);
  REQUIRE(s.group_pieces(0) == std::vector<shard_piece>{{0, 0, 3, 1}, {3, 7, 2, 1}});
  REQUIRE(s.group_pieces(1) == std::vector<shard_piece>{{0, 3, 4, 1}, {4, 9, 1, 1}});
  // an inner split of a custom group
  const sequence_sharding h(std::vector<std::vector<std::int64_t>>{{5, 0, 1}, {2, 3, 4}}, 2);
  REQUIRE(h.global_positions(0) == std::vector<std::int64_t>{5, 0});
  REQUIRE(h.global_positions(1) == std::vector<std::int64_t>{1});
  REQUIRE(h.global_positions(3) == std::vector<std::int64_t>{4});
  // empty groups are allowed (a rank may hold no token)
  REQUIRE(sequence_sharding(std::vector<std::vector<std::int64_t>>{{0, 1}, {}}).local_len(1) == 0);
  // the fingerprint tells apart shardings of the same sizes and layout kind
  const sequence_sharding other(std::vector<std::vector<std::int64_t>>{{0, 1, 2, 3, 4}, {5, 6, 7, 8, 9}});
  REQUIRE(other.fingerprint() != s.fingerprint());
  REQUIRE(sequence_sharding(shard_layout::contiguous, 10, 2).fingerprint() != other.fingerprint());
  REQUIRE_THROWS_WITH(sequence_sharding(std::vector<std::vector<std::int64_t>>{{0, 1}, {1, 3}}),
                      Catch::Contains("position 1 is listed by group 0 and again by group 1"));
  REQUIRE_THROWS_WITH(sequence_sharding(std::vector<std::vector<std::int64_t>>{{0, 4}, {1, 2}}),
                      Catch::Contains("lists position 4, outside [0, 4)"));
  REQUIRE_THROWS_WITH(sequence_sharding(std::vector<std::vector<std::int64_t>>{{}, {}}),
                      Catch::Contains("at least one position"));
  REQUIRE_THROWS_AS(sequence_sharding(std::vector<std::vector<std::int64_t>>{}), baton::cp_error);
}

TEST_CASE("Ulysses layout: uneven head groups and kv heads dealt per query head", "[cp][ulysses]") {
  using namespace baton::detail::cp;
  using m = head_split::mode;
  // 6 query heads over 4 ranks: 2 2 1 1; kv heads (2, groups of 3) follow each query head
  const head_splits a = split_heads(6, 2, 4);
  REQUIRE(a.q.how == m::uneven);
  REQUIRE(a.kv.how == m::per_query);
  std::vector<std::int64_t> q_of, kv_of;
  for (std::int64_t j = 0; j < 4; ++j) {
    REQUIRE(a.q.count(j) == (j < 2 ? 2 : 1));
    REQUIRE(a.kv.count(j) == a.q.count(j));
    for (std::int64_t i = 0; i < a.q.count(j); ++i) {
      q_of.push_back(a.q.source(j, i));
      kv_of.push_back(a.kv.source(j, i));
    }
  }
  REQUIRE(q_of == std::vector<std::int64_t>{0, 1, 2, 3, 4, 5});  // every query head once, in order
  for (std::size_t i = 0; i < q_of.size(); ++i) REQUIRE(kv_of[i] == q_of[i] / 3);  // its own kv head
  REQUIRE(a.kv.sums());
  // MHA with uneven heads: kv split like q, nothing repeated
  const head_splits b = split_heads(5, 5, 3);
  REQUIRE(b.kv.how == m::uneven);
  REQUIRE_FALSE(b.kv.sums());
  REQUIRE((b.q.count(0) == 2 && b.q.count(1) == 2 && b.q.count(2) == 1));
  // more ranks than heads: some get none
  const head_splits c = split_heads(2, 1, 4);
  REQUIRE((c.q.count(0) == 1 && c.q.count(1) == 1 && c.q.count(2) == 0 && c.q.count(3) == 0));
  // even q, kv neither dividing nor divisible (12 q, 3 kv over 2): per query head, uniform
  const head_splits d = split_heads(12, 3, 2);
  REQUIRE(d.q.how == m::even);
  REQUIRE(d.kv.how == m::per_query);
  REQUIRE(d.kv.uniform());
  for (std::int64_t j = 0; j < 2; ++j)
    for (std::int64_t i = 0; i < 6; ++i) REQUIRE(d.kv.source(j, i) == (6 * j + i) / 4);
}

TEST_CASE("host_memory: a thread's buffers are kept for its next call, and any thread may free one",
          "[cp][memory]") {
  baton::host_memory mem;
  baton::host_memory::release_cached();
  const float* first = nullptr;
  {
    auto a = mem.allocate<float>(100000);
    first = a.data();
    a.data()[99999] = 1.0f;  // the whole size is usable
  }
  {
    // Given back when destroyed: the next buffer of that size is the same memory (no fresh
    // pages to fault in), whichever memory object asks.
    baton::host_memory other;
    auto b = other.allocate<float>(100000);
    CHECK(b.data() == first);
    CHECK(b.size() == 100000);
    // A move assignment gives the buffer it replaces back first.
    auto c = mem.allocate<float>(10);
    const float* small = c.data();
    c = mem.allocate<float>(20);
    CHECK(c.data() != small);
    auto d = mem.allocate<float>(10);
    CHECK(d.data() == small);
    auto empty = mem.allocate<float>(0);
    CHECK(empty.data() == nullptr);
    CHECK(empty.size() == 0);
  }
  // A buffer taken on a thread that has ended, freed here: it keeps its pool alive (ASan
  // would see a use after free otherwise).
  baton::host_memory::buffer<double> moved;
  std::thread([&] {
    baton::host_memory local;
    moved = local.allocate<double>(4096);
    moved.data()[4095] = 2.0;
  }).join();
  CHECK(moved.data()[4095] == 2.0);
  moved = baton::host_memory::buffer<double>();
  CHECK(moved.data() == nullptr);
  baton::host_memory::release_cached();
}
