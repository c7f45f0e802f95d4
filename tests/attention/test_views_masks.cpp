// tensor_view, positions, position blocks, and every mask's classifier against its own
// allowed(): a classifier may say "partial" when unsure, never "empty" or "full" wrongly.
#include "catch.hpp"

#include <baton/attention.hpp>

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

template <class Mask>
void check_classifier_is_sound(const Mask& mask, const std::vector<baton::positions>& q_sets,
                               const std::vector<baton::positions>& k_sets, std::int64_t tile, int* tight = nullptr) {
  for (const auto& qp : q_sets)
    for (const auto& kp : k_sets)
      for (std::int64_t q0 = 0; q0 < qp.size(); q0 += tile)
        for (std::int64_t k0 = 0; k0 < kp.size(); k0 += tile) {
          const baton::position_block qb(qp, q0, std::min(tile, qp.size() - q0));
          const baton::position_block kb(kp, k0, std::min(tile, kp.size() - k0));
          bool any = false, all = true;
          for (std::int64_t i = 0; i < qb.size(); ++i)
            for (std::int64_t j = 0; j < kb.size(); ++j) {
              const bool a = mask.allowed(qb[i], kb[j]);
              any = any || a;
              all = all && a;
            }
          const baton::block_kind kind = mask.classify(qb, kb);
          INFO("q block at " << q0 << " (positions " << qb.min() << ".." << qb.max() << "), k block at " << k0
                             << " (positions " << kb.min() << ".." << kb.max() << ")");
          if (kind == baton::block_kind::empty) REQUIRE_FALSE(any);
          if (kind == baton::block_kind::full) REQUIRE(all);
          if (tight && ((kind == baton::block_kind::empty) == !any) && ((kind == baton::block_kind::full) == all))
            ++*tight;
        }
}

struct position_sets {
  std::vector<std::int64_t> zigzag, scattered;
  std::vector<baton::positions> sets;
  explicit position_sets(std::int64_t n) {
    // Zigzag shard of 4 ranks, rank 1: chunks 1 and 6 of 8.
    const std::int64_t chunk = n / 8;
    for (std::int64_t i = 0; i < chunk; ++i) zigzag.push_back(chunk + i);
    for (std::int64_t i = 0; i < chunk; ++i) zigzag.push_back(6 * chunk + i);
    std::mt19937 gen(5);
    for (std::int64_t i = 0; i < n / 2; ++i) scattered.push_back(static_cast<std::int64_t>(gen() % n));
    sets = {baton::positions(0, n), baton::positions(n / 3, n / 2), baton::positions::list(zigzag),
            baton::positions::list(scattered)};
  }
};

}  // namespace

TEST_CASE("tensor_view: row-major views, strides, element access", "[attention][view]") {
  std::vector<float> data(2 * 3 * 4 * 5);
  for (std::size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  auto v = baton::make_tensor_view(data.data(), {2, 3, 4, 5});
  STATIC_REQUIRE(std::is_same_v<decltype(v), baton::tensor_view<float, 4>>);
  CHECK(v.strides() == std::array<std::int64_t, 4>{60, 20, 5, 1});
  CHECK(v.size() == 120);
  CHECK(v.is_contiguous());
  CHECK(v(1, 2, 3, 4) == 119.0f);
  CHECK(v(1, 0, 2, 1) == static_cast<float>(60 + 10 + 1));
  v(0, 1, 0, 0) = -1.0f;
  CHECK(data[20] == -1.0f);

  const baton::tensor_view<const float, 4> c = v;  // mutable converts to const
  CHECK(c(0, 1, 0, 0) == -1.0f);

  // A transposed (seq <-> heads) view of the same memory: strided, not contiguous.
  auto t = baton::make_tensor_view(data.data(), std::array<std::int64_t, 4>{2, 4, 3, 5},
                                   std::array<std::int64_t, 4>{60, 5, 20, 1});
  CHECK_FALSE(t.is_contiguous());
  CHECK(t(1, 3, 2, 4) == v(1, 2, 3, 4));
}

TEST_CASE("positions: ranges, lists, and resolution against a tensor", "[attention][positions]") {
  const baton::positions unsized;
  CHECK(unsized.is_unsized());
  const auto all = unsized.resolved(7, "q_pos");
  CHECK(all.size() == 7);
  CHECK(all[6] == 6);

  const baton::positions chunk(100, 5);
  CHECK(chunk.is_range());
  CHECK(chunk[4] == 104);
  CHECK_THROWS_WITH(chunk.resolved(6, "attention_params::k_pos"),
                    Catch::Contains("k_pos lists 5 positions but the tensor's sequence axis has 6 rows"));
  CHECK_THROWS_AS(baton::positions(0, -1), baton::attention_error);

  const std::vector<std::int64_t> ids = {9, 3, 4, 5};
  const auto list = baton::positions::list(ids);
  CHECK(list.is_list());
  CHECK(list[0] == 9);
  const baton::position_block whole(list, 0, 4);
  CHECK(whole.min() == 3);
  CHECK(whole.max() == 9);
  CHECK_FALSE(whole.is_contiguous());
  const baton::position_block tail(list, 1, 3);
  CHECK(tail.is_contiguous());
  CHECK(tail.min() == 3);
  CHECK(tail.max() == 5);

  const std::vector<std::int64_t> negative = {0, -2};
  CHECK_THROWS_WITH(baton::positions::list(negative).resolved(2, "attention_params::q_pos"),
                    Catch::Contains("q_pos[1] = -2 is negative"));
}

TEST_CASE("masks: allowed() follows the definitions", "[attention][mask]") {
  CHECK(baton::no_mask{}.allowed(0, 1000));
  CHECK(baton::causal_mask{}.allowed(5, 5));
  CHECK_FALSE(baton::causal_mask{}.allowed(5, 6));
  const baton::sliding_window_mask window{2, 1};
  CHECK(window.allowed(10, 8));
  CHECK_FALSE(window.allowed(10, 7));
  CHECK(window.allowed(10, 11));
  CHECK_FALSE(window.allowed(10, 12));
  const baton::prefix_lm_mask prefix{4};
  CHECK(prefix.allowed(0, 3));  // the prefix is bidirectional
  CHECK_FALSE(prefix.allowed(5, 6));
  CHECK(prefix.allowed(6, 5));
  const baton::document_mask docs(std::vector<std::int64_t>{0, 0, 0, 1, 1, 2});
  CHECK(docs.allowed(1, 2));
  CHECK_FALSE(docs.allowed(2, 3));
  const auto causal_docs = baton::intersect(docs, baton::causal_mask{});
  CHECK(causal_docs.allowed(4, 3));
  CHECK_FALSE(causal_docs.allowed(3, 4));
  CHECK_FALSE(causal_docs.allowed(3, 2));
}

TEST_CASE("masks: classify is sound for ranges, zigzag shards and scattered positions", "[attention][mask]") {
  constexpr std::int64_t n = 96;
  const position_sets ps(n);
  std::vector<std::int64_t> segments(n);
  for (std::int64_t p = 0; p < n; ++p) segments[p] = p < 20 ? 0 : p < 21 ? 1 : p < 70 ? 2 : 3;
  // Labels out of order (one label on two separate runs): classify cannot read a block's
  // documents off its ends, as it does for ascending labels, and must look inside.
  std::vector<std::int64_t> unordered(n);
  for (std::int64_t p = 0; p < n; ++p) unordered[p] = p < 20 ? 3 : p < 21 ? 0 : p < 70 ? 3 : 1;
  int tight = 0;
  for (std::int64_t tile : {1, 7, 16}) {
    check_classifier_is_sound(baton::no_mask{}, ps.sets, ps.sets, tile, &tight);
    check_classifier_is_sound(baton::causal_mask{}, ps.sets, ps.sets, tile, &tight);
    check_classifier_is_sound(baton::sliding_window_mask{5, 0}, ps.sets, ps.sets, tile, &tight);
    check_classifier_is_sound(baton::sliding_window_mask{3, 9}, ps.sets, ps.sets, tile, &tight);
    check_classifier_is_sound(baton::prefix_lm_mask{30}, ps.sets, ps.sets, tile, &tight);
    check_classifier_is_sound(baton::document_mask(segments), ps.sets, ps.sets, tile, &tight);
    check_classifier_is_sound(baton::intersect(baton::document_mask(segments), baton::causal_mask{}), ps.sets,
                              ps.sets, tile, &tight);
    check_classifier_is_sound(baton::document_mask(unordered), ps.sets, ps.sets, tile, &tight);
    const auto mod = [](std::int64_t q, std::int64_t k) { return (q / 8 + k / 8) % 3 != 0 && k <= q + 4; };
    check_classifier_is_sound(baton::block_mask(mod, n, n, 8), ps.sets, ps.sets, tile, &tight);
    check_classifier_is_sound(baton::basic_block_mask(mod, n, n, 16), ps.sets, ps.sets, tile, &tight);
  }
  // Sound is not enough to skip work: exact answers must occur (the trivial "always partial"
  // classifier would pass the soundness checks above).
  CHECK(tight > 0);
}

namespace {
// allowed_keys(q, k_begin, k_end) must return exactly the keys of [k_begin, k_end) that
// allowed(q, .) admits: the kernels trust it instead of testing pairs. Checked on every
// contiguous run of keys a kernel may ask about (tiles of ranges, of zigzag shards and of
// index lists, where a run occurs) and on arbitrary intervals.
template <class Mask>
void check_key_intervals(const Mask& mask, const std::vector<baton::positions>& q_sets,
                         const std::vector<baton::positions>& k_sets, std::int64_t n, int& runs) {
  STATIC_REQUIRE(baton::mask_with_key_intervals<Mask>);
  const auto check = [&](std::int64_t q, std::int64_t k_begin, std::int64_t k_end) {
    const baton::key_interval keys = mask.allowed_keys(q, k_begin, k_end);
    INFO("q " << q << ", keys [" << k_begin << ", " << k_end << ") -> [" << keys.begin << ", " << keys.end << ")");
    REQUIRE(keys.begin >= k_begin);
    REQUIRE(keys.begin <= keys.end);
    REQUIRE(keys.end <= k_end);
    for (std::int64_t k = k_begin; k < k_end; ++k) REQUIRE(mask.allowed(q, k) == (keys.begin <= k && k < keys.end));
  };
  for (const auto& qp : q_sets)
    for (std::int64_t i = 0; i < qp.size(); ++i) {
      const std::int64_t q = qp[i];
      for (const auto& kp : k_sets)
        for (std::int64_t tile : {1, 7, 16})
          for (std::int64_t k0 = 0; k0 < kp.size(); k0 += tile) {
            const baton::position_block kb(kp, k0, std::min(tile, kp.size() - k0));
            if (!kb.is_contiguous()) continue;
            check(q, kb.min(), kb.max() + 1);
            ++runs;
          }
    }
  for (std::int64_t q = 0; q < n; q += 5)
    for (std::int64_t k_begin = 0; k_begin <= n; k_begin += 3)
      for (std::int64_t k_end = k_begin; k_end <= n + 4; k_end += 4) check(q, k_begin, k_end);
}
}  // namespace

TEST_CASE("masks: allowed_keys agrees with allowed() on ranges, zigzag shards and index lists", "[attention][mask]") {
  constexpr std::int64_t n = 96;
  const position_sets ps(n);
  int runs = 0;
  constexpr std::int64_t unbounded = std::int64_t{1} << 40;  // wider than any sequence
  check_key_intervals(baton::no_mask{}, ps.sets, ps.sets, n, runs);
  check_key_intervals(baton::causal_mask{}, ps.sets, ps.sets, n, runs);
  check_key_intervals(baton::sliding_window_mask{5, 0}, ps.sets, ps.sets, n, runs);
  check_key_intervals(baton::sliding_window_mask{3, 9}, ps.sets, ps.sets, n, runs);
  check_key_intervals(baton::sliding_window_mask{0, 0}, ps.sets, ps.sets, n, runs);
  check_key_intervals(baton::sliding_window_mask{unbounded, unbounded}, ps.sets, ps.sets, n, runs);
  check_key_intervals(baton::sliding_window_mask{unbounded, 0}, ps.sets, ps.sets, n, runs);
  check_key_intervals(baton::prefix_lm_mask{30}, ps.sets, ps.sets, n, runs);
  check_key_intervals(baton::prefix_lm_mask{0}, ps.sets, ps.sets, n, runs);
  check_key_intervals(baton::intersect(baton::causal_mask{}, baton::sliding_window_mask{7, 2}), ps.sets, ps.sets, n,
                      runs);
  check_key_intervals(baton::intersect(baton::prefix_lm_mask{20}, baton::sliding_window_mask{4, 4}), ps.sets,
                      ps.sets, n, runs);
  // Zigzag shards and index lists hold contiguous runs: those were checked, not skipped.
  CHECK(runs > 0);

  // Masks whose allowed keys need not be one interval do not offer the hook, so the
  // kernels test them pair by pair.
  STATIC_REQUIRE_FALSE(baton::mask_with_key_intervals<baton::document_mask>);
  STATIC_REQUIRE_FALSE(baton::mask_with_key_intervals<baton::block_mask>);
  STATIC_REQUIRE_FALSE(
      baton::mask_with_key_intervals<baton::mask_intersection<baton::document_mask, baton::causal_mask>>);
}

TEST_CASE("masks: classify is exact on tile-aligned ranges", "[attention][mask]") {
  const baton::positions all(0, 128);
  const baton::position_block a(all, 0, 64), b(all, 64, 64);
  CHECK(baton::causal_mask{}.classify(b, a) == baton::block_kind::full);
  CHECK(baton::causal_mask{}.classify(a, b) == baton::block_kind::empty);
  CHECK(baton::causal_mask{}.classify(a, a) == baton::block_kind::partial);
  CHECK(baton::sliding_window_mask{10, 0}.classify(b, a) == baton::block_kind::partial);
  const baton::position_block far(all, 0, 16), near(all, 100, 28);
  CHECK(baton::sliding_window_mask{10, 0}.classify(near, far) == baton::block_kind::empty);
  CHECK(baton::prefix_lm_mask{64}.classify(a, a) == baton::block_kind::full);
  std::vector<std::int64_t> ids(128, 0);
  for (std::int64_t p = 64; p < 128; ++p) ids[p] = 1;
  const baton::document_mask docs(ids);
  CHECK(docs.classify(a, a) == baton::block_kind::full);
  CHECK(docs.classify(a, b) == baton::block_kind::empty);
}

TEST_CASE("block_mask: built once from a mask_mod, cells classified", "[attention][mask]") {
  const auto causal = [](std::int64_t q, std::int64_t k) { return k <= q; };
  const baton::block_mask mask(causal, 256, 256, 64);
  CHECK(mask.q_blocks() == 4);
  CHECK(mask.k_blocks() == 4);
  CHECK(mask.count(baton::block_kind::partial) == 4);  // the diagonal
  CHECK(mask.count(baton::block_kind::full) == 6);
  CHECK(mask.count(baton::block_kind::empty) == 6);
  CHECK(mask.cell(2, 1) == baton::block_kind::full);
  CHECK(mask.cell(1, 2) == baton::block_kind::empty);

  // Ragged edges: 100 positions, cells of 64.
  const baton::block_mask ragged(causal, 100, 100, 64);
  CHECK(ragged.cell(1, 0) == baton::block_kind::full);
  CHECK(ragged.cell(1, 1) == baton::block_kind::partial);

  // Positions outside the grid are refused up front.
  CHECK_THROWS_WITH(ragged.validate(baton::positions(0, 101), baton::positions(0, 100)),
                    Catch::Contains("query position 100 is outside the grid the mask was built for"));
  CHECK_THROWS_AS(baton::block_mask(causal, 10, 10, 0), baton::attention_error);

  // The typed form keeps the lambda's type; the erased form is one type for all.
  baton::basic_block_mask typed(causal, 64, 64);
  STATIC_REQUIRE(std::is_same_v<decltype(typed), baton::basic_block_mask<std::decay_t<decltype(causal)>>>);
  STATIC_REQUIRE(std::is_same_v<baton::block_mask, baton::basic_block_mask<std::function<bool(std::int64_t, std::int64_t)>>>);
}

TEST_CASE("document_mask and sliding_window_mask refuse what they cannot describe", "[attention][mask]") {
  const baton::document_mask docs(std::vector<std::int64_t>{0, 0, 1});
  CHECK_THROWS_WITH(docs.validate(baton::positions(0, 4), baton::positions(0, 3)),
                    Catch::Contains("query position 3 has no segment id (the mask holds 3)"));
  CHECK_THROWS_WITH((baton::sliding_window_mask{-1, 0}.validate(baton::positions(0, 1), baton::positions(0, 1))),
                    Catch::Contains("must be >= 0"));
}

namespace {
struct not_a_mask {
  bool allowed(std::int64_t, std::int64_t) const { return true; }
};
struct user_mask {  // a mask written by a user, conservative classifier
  bool allowed(std::int64_t q, std::int64_t k) const { return (q + k) % 2 == 0; }
  baton::block_kind classify(const baton::position_block&, const baton::position_block&) const {
    return baton::block_kind::partial;
  }
};
}  // namespace

TEST_CASE("attention_mask concept", "[attention][mask]") {
  STATIC_REQUIRE(baton::attention_mask<baton::no_mask>);
  STATIC_REQUIRE(baton::attention_mask<baton::causal_mask>);
  STATIC_REQUIRE(baton::attention_mask<baton::sliding_window_mask>);
  STATIC_REQUIRE(baton::attention_mask<baton::document_mask>);
  STATIC_REQUIRE(baton::attention_mask<baton::prefix_lm_mask>);
  STATIC_REQUIRE(baton::attention_mask<baton::block_mask>);
  STATIC_REQUIRE(baton::attention_mask<baton::mask_intersection<baton::causal_mask, baton::document_mask>>);
  STATIC_REQUIRE(baton::attention_mask<user_mask>);
  STATIC_REQUIRE_FALSE(baton::attention_mask<not_a_mask>);
  STATIC_REQUIRE_FALSE(baton::attention_mask<int>);
}
