// The CUDA backend's workspace (cuda/plan_cache.hpp): plans cached by (mask fingerprint,
// positions, lengths, tiles) and kept in device memory, scratch sized up front. The device
// is host memory here (plan_workspace over counting operations); cuda_attention runs the
// same class over cudaMalloc / cudaMemcpyAsync. The end-to-end counts through the backend
// (cuda_attention_emulated, same workspace) are in test_forward_emulated.cpp and, across a
// ring's steps, in tests/cp/test_cp_cuda_workspace.cpp.
#include <baton/attention/cuda/plan_cache.hpp>
#include <baton/attention/cuda/detail/call.hpp>

#include "catch.hpp"

#include <baton/attention/masks.hpp>

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace cu = baton::detail::attention::cuda;

namespace {

// Host "device" memory that counts what the workspace asks of it.
struct counting_ops {
  struct counts {
    int allocations = 0, frees = 0, uploads = 0;
  };
  counts* c = nullptr;
  void* allocate(std::size_t bytes) {
    ++c->allocations;
    return cu::host_workspace_ops{}.allocate(bytes);
  }
  void free(void* p) noexcept {
    ++c->frees;
    cu::host_workspace_ops{}.free(p);
  }
  void free_at_exit(void* p) noexcept { cu::host_workspace_ops{}.free(p); }
  void upload(void* dst, const void* src, std::size_t bytes) {
    ++c->uploads;
    std::memcpy(dst, src, bytes);
  }
  void copy(void* dst, const void* src, std::size_t bytes) { std::memcpy(dst, src, bytes); }
};

template <class Mask>
std::optional<cu::plan_key> key_of(const Mask& mask, const baton::positions& q, const baton::positions& k,
                                   std::int32_t tq = 64, std::int32_t tk = 64) {
  return cu::plan_key_for(mask, q, k, q.size(), k.size(), tq, tk);
}

// Every array of the view equals the freshly built plan's (the cached copy is the plan).
void require_same_plan(const cu::tile_plan_view& got, const cu::tile_plan& want_plan) {
  const cu::tile_plan_view want = want_plan.view();
  REQUIRE(got.q_tiles == want.q_tiles);
  REQUIRE(got.k_tiles == want.k_tiles);
  REQUIRE(got.partial_tiles == want.partial_tiles);
  const auto cells = static_cast<std::size_t>(want.q_tiles) * static_cast<std::size_t>(want.k_tiles);
  CHECK(std::memcmp(got.kind, want.kind, cells) == 0);
  CHECK(std::memcmp(got.partial_slot, want.partial_slot, cells * 4) == 0);
  const auto words = static_cast<std::size_t>(want.partial_tiles) * static_cast<std::size_t>(want.tile_q) *
                     static_cast<std::size_t>(want.words_per_row);
  CHECK(std::memcmp(got.bits, want.bits, words * 8) == 0);
  CHECK(std::memcmp(got.q_list_begin, want.q_list_begin, (static_cast<std::size_t>(want.q_tiles) + 1) * 4) == 0);
  CHECK(std::memcmp(got.k_list_begin, want.k_list_begin, (static_cast<std::size_t>(want.k_tiles) + 1) * 4) == 0);
}

struct opaque_mask {  // an attention_mask with no fingerprint(): its answers cannot be hashed
  bool allowed(std::int64_t q, std::int64_t k) const { return (q + k) % 3 != 0; }
  baton::block_kind classify(const baton::position_block&, const baton::position_block&) const {
    return baton::block_kind::partial;
  }
};
struct promised_mask : opaque_mask {  // the same, with its author's fingerprint
  std::uint64_t salt = 0;
  std::uint64_t fingerprint() const { return salt; }
};

}  // namespace

TEST_CASE("plan cache: the key tells apart every input of make_tile_plan and only those", "[cuda][plan][cache]") {
  const baton::positions all(0, 200), shifted(8, 200), shorter(0, 150);
  const std::vector<std::int64_t> list_a{0, 1, 2, 3, 100, 101, 102, 103}, list_b{0, 1, 2, 3, 100, 101, 102, 104};
  const baton::positions la(list_a), lb(list_b);
  const auto causal = key_of(baton::causal_mask{}, all, all);
  REQUIRE(causal);
  CHECK(key_of(baton::causal_mask{}, all, all) == causal);  // the same call: the same key
  CHECK(key_of(baton::no_mask{}, all, all) != causal);      // another mask type
  CHECK(key_of(baton::causal_mask{}, shifted, all) != causal);     // other query positions
  CHECK(key_of(baton::causal_mask{}, all, shifted) != causal);     // other key positions
  CHECK(key_of(baton::causal_mask{}, shorter, all) != causal);     // another length
  CHECK(key_of(baton::causal_mask{}, all, all, 128, 32) != causal);  // other tiles
  CHECK(key_of(baton::causal_mask{}, all, all, 64, 32) != key_of(baton::causal_mask{}, all, all, 32, 64));
  CHECK(key_of(baton::causal_mask{}, la, la) != key_of(baton::causal_mask{}, lb, la));  // list contents
  CHECK(key_of(baton::causal_mask{}, la, la) == key_of(baton::causal_mask{}, la, la));
  // every parameter of the parametrised masks
  CHECK(key_of(baton::sliding_window_mask{8, 0}, all, all) != key_of(baton::sliding_window_mask{9, 0}, all, all));
  CHECK(key_of(baton::sliding_window_mask{8, 0}, all, all) != key_of(baton::sliding_window_mask{8, 1}, all, all));
  CHECK(key_of(baton::sliding_window_mask{1, 8}, all, all) != key_of(baton::sliding_window_mask{8, 1}, all, all));
  CHECK(key_of(baton::prefix_lm_mask{5}, all, all) != key_of(baton::prefix_lm_mask{6}, all, all));
  // the masks' own fingerprints, which both the plan cache and the CP agreement hash
  static_assert(baton::sliding_window_mask{1, 8}.fingerprint() != baton::sliding_window_mask{8, 1}.fingerprint());
  std::vector<std::int64_t> ids(200, 0);
  for (std::size_t i = 100; i < 200; ++i) ids[i] = 1;
  const baton::document_mask docs(ids);
  ids[150] = 2;
  const baton::document_mask other_docs(ids);
  CHECK(key_of(docs, all, all) == key_of(baton::document_mask(docs), all, all));
  CHECK(key_of(docs, all, all) != key_of(other_docs, all, all));
  CHECK(key_of(baton::intersect(docs, baton::causal_mask{}), all, all) !=
        key_of(baton::intersect(other_docs, baton::causal_mask{}), all, all));
  CHECK(key_of(baton::intersect(docs, baton::causal_mask{}), all, all) != key_of(docs, all, all));
  CHECK(key_of(baton::padding_mask(baton::causal_mask{}, 190), all, all) !=
        key_of(baton::padding_mask(baton::causal_mask{}, 191), all, all));
  // Opaque masks get no key (their plans are never cached); a fingerprint() makes them keyed.
  CHECK_FALSE(key_of(opaque_mask{}, all, all));
  CHECK_FALSE(key_of(baton::block_mask([](std::int64_t q, std::int64_t k) { return k <= q; }, 200, 200), all, all));
  CHECK_FALSE(key_of(baton::intersect(opaque_mask{}, baton::causal_mask{}), all, all));
  CHECK(key_of(promised_mask{{}, 1}, all, all));
  CHECK(key_of(promised_mask{{}, 1}, all, all) != key_of(promised_mask{{}, 2}, all, all));
}

TEST_CASE("plan cache: a repeated call neither builds nor uploads; another mask or shape does both",
          "[cuda][plan][cache]") {
  counting_ops::counts n;
  cu::plan_workspace<counting_ops> ws(counting_ops{&n});
  ws.reserve(0, 1 << 20);  // room for every plan below: nothing is evicted
  int builds = 0;
  const auto plan = [&](const auto& mask, const baton::positions& q, const baton::positions& k) {
    return ws.plan(key_of(mask, q, k), [&] {
      ++builds;
      return cu::make_tile_plan(mask, q, k, q.size(), k.size(), 64, 64);
    });
  };
  const baton::positions all(0, 300), tail(100, 200);
  const cu::tile_plan_view first = plan(baton::causal_mask{}, all, all);
  CHECK(builds == 1);
  CHECK(n.uploads == 1);
  const cu::tile_plan_view again = plan(baton::causal_mask{}, all, all);
  CHECK(builds == 1);  // no planning
  CHECK(n.uploads == 1);  // no upload
  CHECK(again.kind == first.kind);  // the same device copy
  CHECK(ws.stats().plan_hits == 1);
  require_same_plan(again, cu::make_tile_plan(baton::causal_mask{}, all, all, 300, 300, 64, 64));

  // Another mask, another shape, other positions: each planned and uploaded once, then hit.
  plan(baton::sliding_window_mask{16, 0}, all, all);
  plan(baton::causal_mask{}, tail, all);
  plan(baton::causal_mask{}, all, tail);
  CHECK(builds == 4);
  CHECK(n.uploads == 4);
  require_same_plan(plan(baton::sliding_window_mask{16, 0}, all, all),
                    cu::make_tile_plan(baton::sliding_window_mask{16, 0}, all, all, 300, 300, 64, 64));
  require_same_plan(plan(baton::causal_mask{}, tail, all), cu::make_tile_plan(baton::causal_mask{}, tail, all, 200, 300, 64, 64));
  require_same_plan(plan(baton::causal_mask{}, all, all), cu::make_tile_plan(baton::causal_mask{}, all, all, 300, 300, 64, 64));
  CHECK(builds == 4);
  CHECK(n.uploads == 4);
  CHECK(ws.stats().cached_plans == 4);

  // A mask with no fingerprint is planned at every call, but uploaded only when its bytes
  // differ from a plan held.
  plan(opaque_mask{}, all, all);
  plan(opaque_mask{}, all, all);
  CHECK(builds == 6);
  CHECK(n.uploads == 5);
  require_same_plan(plan(opaque_mask{}, all, all), cu::make_tile_plan(opaque_mask{}, all, all, 300, 300, 64, 64));
}

TEST_CASE("plan cache: after reserve nothing allocates; a full arena is emptied, not grown", "[cuda][plan][cache]") {
  counting_ops::counts n;
  cu::plan_workspace<counting_ops> ws(counting_ops{&n});
  const baton::positions all(0, 256);
  const auto causal_bytes = cu::make_tile_plan(baton::causal_mask{}, all, all, 256, 256, 64, 64).size_bytes();
  // Room for exactly two causal-sized plans (each placed at a 256-byte boundary).
  ws.reserve(4096, 2 * cu::align_up(causal_bytes));
  CHECK(n.allocations == 2);  // the scratch and the arena, now
  const int allocations = n.allocations;
  int builds = 0;
  const auto plan_at = [&](std::int64_t offset) {
    const baton::positions q(offset, 256);
    return ws.plan(key_of(baton::causal_mask{}, q, all), [&] {
      ++builds;
      return cu::make_tile_plan(baton::causal_mask{}, q, all, 256, 256, 64, 64);
    });
  };
  plan_at(0);
  plan_at(64);
  CHECK(ws.stats().plan_evictions == 0);
  plan_at(0);  // held
  CHECK(builds == 2);
  // A third plan does not fit: the arena is emptied and reused, nothing allocated.
  require_same_plan(plan_at(128), cu::make_tile_plan(baton::causal_mask{}, baton::positions(128, 256), all, 256, 256, 64, 64));
  CHECK(ws.stats().plan_evictions == 1);
  CHECK(builds == 3);
  (void)ws.scratch(4096);
  (void)ws.scratch(100);
  require_same_plan(plan_at(0), cu::make_tile_plan(baton::causal_mask{}, all, all, 256, 256, 64, 64));  // rebuilt, right
  CHECK(n.allocations == allocations);
  CHECK(n.frees == 0);
  CHECK(ws.stats().allocations == allocations);

  // The next reserve (a quiescent point) grows the arena to the distinct plans built since
  // the first one, so that they fit together from now on; one more with nothing new built
  // is covered and does nothing.
  std::size_t three = 0;
  for (const std::int64_t offset : {0, 64, 128})
    three += cu::align_up(cu::make_tile_plan(baton::causal_mask{}, baton::positions(offset, 256), all, 256, 256, 64, 64).size_bytes());
  ws.reserve(4096, 0);
  CHECK(n.allocations == allocations + 1);
  CHECK(ws.stats().plan_capacity >= three);
  ws.reserve(4096, 0);
  CHECK(n.allocations == allocations + 1);
  const auto evictions = ws.stats().plan_evictions;
  for (const std::int64_t offset : {0, 64, 128}) (void)plan_at(offset);
  for (const std::int64_t offset : {0, 64, 128}) (void)plan_at(offset);
  CHECK(ws.stats().plan_evictions == evictions);
  CHECK(n.allocations == allocations + 1);
  // Scratch beyond the reservation grows (and says so).
  (void)ws.scratch(5000);
  CHECK(n.allocations == allocations + 2);
  CHECK(n.frees == 2);  // the old arena and the old scratch
}

TEST_CASE("plan cache: without reserve the arena grows only for plans that come back, until they fit",
          "[cuda][plan][cache]") {
  counting_ops::counts n;
  cu::plan_workspace<counting_ops> ws(counting_ops{&n});
  const baton::positions all(0, 512);
  const auto plan_at = [&](std::int64_t offset) {
    const baton::positions q(offset, 512);
    return ws.plan(key_of(baton::causal_mask{}, q, all),
                   [&] { return cu::make_tile_plan(baton::causal_mask{}, q, all, 512, 512, 64, 64); });
  };
  // Plans that never repeat (40 distinct ones): the arena is emptied, never grown past room
  // for the first plan's doubling.
  for (std::int64_t step = 0; step < 40; ++step) (void)plan_at(64 * step + 100000);
  const auto once = ws.stats();
  CHECK(once.plan_builds == 40);
  CHECK(once.allocations <= 2);
  CHECK(once.plan_evictions > 30);
  // A "ring" of 6 distinct plans, passed over again and again: evicted plans come back, so
  // the arena grows (plans moving along, views rebased) until the six fit; from then on the
  // passes only hit.
  for (int pass = 0; pass < 6; ++pass)
    for (std::int64_t step = 0; step < 6; ++step) (void)plan_at(64 * step);
  const auto before = ws.stats();
  CHECK(before.allocations > once.allocations);  // it grew
  for (int pass = 0; pass < 2; ++pass)
    for (std::int64_t step = 0; step < 6; ++step) {
      const cu::tile_plan_view v = plan_at(64 * step);
      require_same_plan(v, cu::make_tile_plan(baton::causal_mask{}, baton::positions(64 * step, 512), all, 512, 512, 64, 64));
    }
  const auto after = ws.stats();
  CHECK(after.allocations == before.allocations);
  CHECK(after.plan_builds == before.plan_builds);
  CHECK(after.plan_uploads == before.plan_uploads);
  CHECK(after.plan_evictions == before.plan_evictions);
  CHECK(after.plan_hits == before.plan_hits + 12);
}

TEST_CASE("plan cache: reserve_workspace's sizes cover every call of the shape", "[cuda][plan][cache]") {
  // The bound is the most make_tile_plan can need: an opaque mask (every tile partial) at the
  // shape's lengths reaches it exactly.
  const baton::positions q(0, 200), k(0, 300);
  for (const auto& [tq, tk] : {std::pair{64, 64}, std::pair{128, 32}, std::pair{64, 16}, std::pair{32, 64}}) {
    const auto p = cu::make_tile_plan(opaque_mask{}, q, k, 200, 300, tq, tk);
    CHECK(p.size_bytes() == cu::tile_plan_bytes_bound(200, 300, tq, tk));
    CHECK(cu::make_tile_plan(baton::causal_mask{}, q, k, 200, 300, tq, tk).size_bytes() <= p.size_bytes());
  }
  baton::attention_workspace_shape s{.batch = 2, .heads_q = 4, .heads_kv = 2, .seq_q = 100, .seq_k = 70, .dim = 64};
  const auto need = cu::workspace_need_for(s, "test");
  CHECK(need.scratch >= cu::backward_workspace_bytes(2, 4, 100, 2, 70));
  CHECK(need.scratch >= cu::key_flag_bytes(2, 2, 70));
  s.plan_bytes = 12345;
  CHECK(cu::workspace_need_for(s, "test").plans == 12345);
  s.element_bytes = 8;
  try {
    (void)cu::workspace_need_for(s, "baton::cuda_attention");
    FAIL("element_bytes 8 was accepted");
  } catch (const baton::attention_error& e) {
    CHECK(std::string(e.what()).find("2 (bfloat16, float16) or 4 (float)") != std::string::npos);
  }
  s.element_bytes = 2;
  s.dim = 96;
  CHECK_THROWS_AS(cu::workspace_need_for(s, "baton::cuda_attention"), baton::attention_error);
}
