// Ring attention over the CUDA backend's workspace, on the CPU: cuda_attention_emulated runs
// the kernels' source and the very workspace class cuda_attention keeps on the device
// (attention/cuda/plan_cache.hpp), so the counts below are the device's counts.
//  - The ring reserves the backend's workspace for its largest step before the first step:
//    from then on no step allocates (or frees, which on a GPU waits for the stream).
//  - A second ring call with the same shapes and mask plans and uploads nothing.
#include "cp_test_support.hpp"

#include <baton/attention/cuda/emulated.hpp>

#include "catch.hpp"

#include <cstdint>
#include <memory>
#include <vector>

namespace {

// cuda_attention_emulated that records the workspace's counts around every call.
struct recording_backend {
  static constexpr bool stores_bfloat16 = true;
  baton::cuda_attention_emulated inner;
  struct record {
    // At entry and exit of every backend call: the workspace's allocations, and what they
    // were right after the ring's latest reserve.
    std::vector<std::pair<std::int64_t, std::int64_t>> allocations;
    std::int64_t after_reserve = -1;
    int reserves = 0, calls = 0;
  };
  std::shared_ptr<record> log = std::make_shared<record>();

  void note() const { log->allocations.emplace_back(inner.workspace_stats().allocations, log->after_reserve); }
  void reserve_workspace(const baton::attention_workspace_shape& s) const {
    inner.reserve_workspace(s);
    ++log->reserves;
    log->after_reserve = inner.workspace_stats().allocations;
  }
  template <class Q, class K, class V, class M, class O, class L>
  void forward(Q q, K k, V v, const M& mask, O out, L lse, const baton::attention_params& p) const {
    ++log->calls;
    note();
    inner.forward(q, k, v, mask, out, lse, p);
    note();
  }
  template <class Q, class K, class V, class O, class L, class D, class M, class G1, class G2, class G3>
  void backward(Q q, K k, V v, O out, L lse, D dout, const M& mask, G1 dq, G2 dk, G3 dv,
                const baton::attention_params& p) const {
    ++log->calls;
    note();
    inner.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, p);
    note();
  }
};

}  // namespace

TEST_CASE("cp cuda workspace: no ring step allocates after the ring's reserve; a repeated call plans nothing",
          "[cp][cuda][workspace]") {
  // 3 ranks, zigzag (two pieces per rank, so several calls of different lengths per step),
  // GQA, head dim 64 (the kernels' smallest), float storage. Tiny shards: a plan is about as
  // large as the reservation's default room, so the first call's steps evict one another
  // and the next reservation must grow the room to the working set.
  cp_test::dims d;
  d.batch = 1;
  d.seq = 96;
  d.heads_q = 2;
  d.heads_kv = 1;
  d.dim = 64;
  constexpr int ranks = 3, runs = 3;
  const baton::sequence_sharding sharding(baton::shard_layout::zigzag, d.seq, ranks);
  const baton::causal_mask mask;
  const auto p = cp_test::make_problem<float>(d, mask, 5);
  std::vector<cp_test::tensors<float>> results(runs, cp_test::tensors<float>(d));
  std::vector<recording_backend::record> logs(ranks);
  using stats = baton::detail::attention::cuda::workspace_stats;
  std::vector<std::vector<stats>> after(ranks, std::vector<stats>(runs));
  std::vector<std::vector<int>> calls(ranks, std::vector<int>(runs));
  baton::run_local(ranks, [&](baton::local_communicator& comm) {
    recording_backend backend;  // one per rank: its own workspace
    baton::ring_attention attn(comm, backend, sharding);
    const int me = attn.shard_index();
    const auto r = static_cast<std::size_t>(comm.rank());
    for (int run = 0; run < runs; ++run) {
      const int before = backend.log->calls;
      cp_test::run_rank<float>(attn, sharding, me, p, mask, results[static_cast<std::size_t>(run)], 0);
      after[r][static_cast<std::size_t>(run)] = backend.inner.workspace_stats();
      calls[r][static_cast<std::size_t>(run)] = backend.log->calls - before;
    }
    logs[r] = *backend.log;
  });
  for (int r = 0; r < ranks; ++r) {
    INFO("rank " << r);
    const auto& log = logs[static_cast<std::size_t>(r)];
    const auto& s = after[static_cast<std::size_t>(r)];
    const auto& n = calls[static_cast<std::size_t>(r)];
    REQUIRE(log.reserves == 2 * runs);  // before every forward and every backward
    REQUIRE(n[0] > 6);                  // several calls per ring step
    // Every call of every step, first step included, found the workspace as the ring's
    // latest reserve left it, and left it so: no step allocated.
    for (const auto& [now, reserved] : log.allocations) CHECK(now == reserved);
    CHECK(s[0].plan_evictions > 0);  // (the situation this test is about)
    // The second run's reserve grew the room to the plans the first one built; from then on
    // nothing is evicted, and the third run plans, uploads and allocates nothing.
    CHECK(s[1].plan_evictions == s[0].plan_evictions);
    CHECK(s[2].plan_builds == s[1].plan_builds);
    CHECK(s[2].plan_uploads == s[1].plan_uploads);
    CHECK(s[2].plan_hits - s[1].plan_hits == n[2]);
    CHECK(s[2].allocations == s[1].allocations);
    CHECK(s[2].frees == s[1].frees);
  }
  // The results: the unsharded reference's (float through 3xTF32: the parity tests' float
  // bound), and runs from cached plans equal to the first bit for bit.
  CHECK(cp_test::compare(results[0], p.reference).max() < cp_test::tolerance<float>());
  CHECK(cp_test::same_bits(results[0], results[1]));
  CHECK(cp_test::same_bits(results[0], results[2]));
}
