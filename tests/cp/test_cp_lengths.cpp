// Issue 17: context parallelism for any sequence length. Every layout (contiguous, zigzag,
// striped) and every mode (ring, Ulysses, hybrid) on rings of 2, 3 and 4 equals attention over
// the whole sequence for every length 1..67, shards of unequal length and empty shards
// included; Ulysses deals head counts the degree does not divide; the ring skips steps that
// no rank needs, compute and transfer.
#include "catch.hpp"
#include "cp_test_support.hpp"

#include <baton/cp/detail/agree.hpp>

#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

using namespace cp_test;
using baton::sequence_sharding;
using baton::shard_layout;

namespace {

// Every length 1..67 in the release build; the sanitizer builds (BATON_CP_LENGTH_STRIDE > 1)
// take every k-th length plus the small ones, where the empty shards are.
#ifndef BATON_CP_LENGTH_STRIDE
#define BATON_CP_LENGTH_STRIDE 1
#endif
bool length_in_grid(std::int64_t n) { return n <= 9 || n % BATON_CP_LENGTH_STRIDE == 0 || n == 67; }

}  // namespace

TEST_CASE("any length: the documentation's uneven zigzag example", "[cp][lengths][docs]") {
  // [doc:cp-any-length]
  baton::sequence_sharding sharding(baton::shard_layout::zigzag, /*seq_len=*/10, /*ranks=*/4);
  // 8 chunks of 2 2 1 1 1 1 1 1 tokens; rank 0 holds chunks 0 and 7
  CHECK(sharding.global_positions(0) == std::vector<std::int64_t>{0, 1, 9});
  CHECK(sharding.local_len(3) == 2);  // chunks 3 and 4
  CHECK_FALSE(sharding.is_even());
  // [/doc:cp-any-length]
}

TEST_CASE("any length: ring, Ulysses and hybrid equal the unsharded reference for lengths 1..67 on 2, 3, 4 ranks",
          "[cp][lengths]") {
  // Double precision, so the tolerance is the CP layer's 1e-12 (tolerance<double>): the same
  // sums in a different order. 4 query heads over 2 kv heads: Ulysses over 3 ranks deals them
  // unevenly (2 1 1), over 4 it replicates the kv heads. One mask per length, in turn, so each
  // of the five masks (none, causal, sliding window, document, block mask with empty rows)
  // meets about 13 lengths of every residue.
  std::int64_t cases = 0;
  for (std::int64_t n = 1; n <= 67; ++n) {
    if (!length_in_grid(n)) continue;
    const dims d{1, n, 4, 2, 3};
    int index = 0;
    for_each_mask(n, [&](const auto& mask, const char* mask_name) {
      if (index++ != n % 5) return;
      const problem<double> p = make_problem<double>(d, mask, static_cast<std::uint32_t>(7 * n));
      for (int ranks : {2, 3, 4})
        for (shard_layout layout : {shard_layout::contiguous, shard_layout::zigzag, shard_layout::striped})
          for (const config& c : {config{mode::ring, layout, ranks, 1}, config{mode::ulysses, layout, ranks, 1},
                                  config{mode::hybrid, layout, ranks, 2}}) {
            INFO(c.text() << ", length " << n << ", mask " << mask_name);
            const errors e = compare(run_cp<double>(c, p, mask), p.reference);
            INFO("out " << e.out << " lse " << e.lse << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv);
            REQUIRE(e.max() <= tolerance<double>());
            ++cases;
          }
    });
  }
  CHECK(cases >= 9 * 3 * 3);
}

TEST_CASE("any length: float shards of unequal length match within the float tolerance", "[cp][lengths]") {
  const dims d{2, 37, 4, 4, 5};
  const baton::causal_mask mask;
  const problem<float> p = make_problem<float>(d, mask, 5);
  for (const config& c : {config{mode::ring, shard_layout::zigzag, 3, 1}, config{mode::ulysses, shard_layout::striped, 3, 1},
                          config{mode::hybrid, shard_layout::zigzag, 2, 3}}) {
    INFO(c.text());
    CHECK(compare(run_cp<float>(c, p, mask), p.reference).max() <= tolerance<float>());
  }
}

TEST_CASE("Ulysses: head counts the degree does not divide are dealt unevenly, exactly", "[cp][lengths][ulysses]") {
  // (query heads, kv heads) over Ulysses degrees that divide neither: uneven query groups
  // (7 over 4: 2 2 2 1), kv heads dealt per query head (6/2, 6/3 over 4), more ranks than
  // heads (3 over 4: one rank holds none), MHA (5/5 over 3), and even query heads with kv
  // heads that neither divide nor are divisible by the degree (12/3 over 2... as 6/3 over 2).
  struct heads {
    std::int64_t q, kv;
    int degree;
  };
  for (const heads h : {heads{7, 7, 4}, heads{6, 2, 4}, heads{6, 3, 4}, heads{3, 1, 4}, heads{5, 5, 3}, heads{6, 3, 2},
                        heads{4, 2, 3}}) {
    const dims d{2, 13, h.q, h.kv, 3};
    for_each_mask(d.seq, [&](const auto& mask, const char* mask_name) {
      const problem<double> p = make_problem<double>(d, mask, 3);
      for (const config& c : {config{mode::ulysses, shard_layout::zigzag, h.degree, 1},
                              config{mode::hybrid, shard_layout::contiguous, 2, h.degree}}) {
        INFO(c.text() << ", heads " << h.q << "/" << h.kv << ", mask " << mask_name);
        const errors e = compare(run_cp<double>(c, p, mask), p.reference);
        INFO("out " << e.out << " lse " << e.lse << " dq " << e.dq << " dk " << e.dk << " dv " << e.dv);
        REQUIRE(e.max() <= tolerance<double>());
      }
    });
  }
}

TEST_CASE("Ulysses: the host gathers each head's rows one after another, and the exchange round-trips them",
          "[cp][ulysses]") {
  // The exchange ulysses_attention runs on host memory for even shards and head groups of more
  // than one head: the gathered tensor is stored [b][heads][sequence][x] (the kernels read a
  // head's rows one after another). Checked on the raw storage, every element, and back.
  namespace d = baton::detail::cp;
  const std::int64_t b = 2, sl = 3, H = 6, x = 5;
  for (const int P : {2, 3}) {
    const d::head_split split = d::split_heads(H, H, P).q;
    const std::int64_t hc = split.per_rank(), S = P * sl;
    std::vector<std::vector<double>> local(static_cast<std::size_t>(P)), gathered(local), back(local);
    baton::run_local(P, [&](baton::local_communicator& comm) {
      const auto r = static_cast<std::size_t>(comm.rank());
      baton::host_memory mem;
      baton::detail::cp::scratch<baton::host_memory> send, recv;
      local[r].resize(static_cast<std::size_t>(b * sl * H * x));
      for (std::size_t i = 0; i < local[r].size(); ++i) local[r][i] = 1000.0 * static_cast<double>(r) + static_cast<double>(i);
      gathered[r].assign(static_cast<std::size_t>(b * S * hc * x), -1.0);
      const auto heads = d::bshd_head_major(gathered[r].data(), b, S, hc, x);
      d::heads_from_sequence_head_major<double>(comm, mem, d::bshd<const double>(local[r].data(), b, sl, H, x), split, heads,
                                                send, recv);
      back[r].assign(local[r].size(), -1.0);
      d::sequence_from_heads_head_major<double>(comm, mem, heads.as_const(), split, d::bshd(back[r].data(), b, sl, H, x),
                                                send, recv);
    });
    for (std::int64_t j = 0; j < P; ++j)
      for (std::int64_t i = 0; i < P; ++i)
        for (std::int64_t bb = 0; bb < b; ++bb)
          for (std::int64_t hh = 0; hh < hc; ++hh)
            for (std::int64_t t = 0; t < sl; ++t)
              for (std::int64_t e = 0; e < x; ++e) {
                INFO(P << " ranks: rank " << j << " from rank " << i << ", batch " << bb << ", head " << hh << ", token " << t);
                const double stored = gathered[static_cast<std::size_t>(j)][static_cast<std::size_t>(((bb * hc + hh) * S + i * sl + t) * x + e)];
                const double sent = local[static_cast<std::size_t>(i)][static_cast<std::size_t>(((bb * sl + t) * H + split.first(j) + hh) * x + e)];
                REQUIRE(stored == sent);
              }
    for (std::int64_t r = 0; r < P; ++r) REQUIRE(back[static_cast<std::size_t>(r)] == local[static_cast<std::size_t>(r)]);
  }
}

namespace {

// Counts, per rank, the backend calls whose every tensor stores each head's rows one after
// another (head-major: the sequence stride is the head dim, or one head) and those that do not.
struct layout_log {
  int head_major = 0, other = 0;
};
struct layout_checking_backend {
  baton::reference_attention inner;
  std::vector<layout_log>* logs = nullptr;
  int rank = 0;
  template <class... V>
  void count(const V&... t) const {
    const bool all = ((t.extent(2) == 1 || t.stride(1) == t.extent(3)) && ...);
    ++(all ? (*logs)[static_cast<std::size_t>(rank)].head_major : (*logs)[static_cast<std::size_t>(rank)].other);
  }
  template <class Q, class K, class V, class M, class O, class L>
  void forward(Q q, K k, V v, const M& mask, O out, L lse, const baton::attention_params& p) const {
    count(q, k, v, out);
    inner.forward(q, k, v, mask, out, lse, p);
  }
  template <class Q, class K, class V, class O, class L, class D, class M, class G1, class G2, class G3>
  void backward(Q q, K k, V v, O out, L lse, D dout, const M& mask, G1 dq, G2 dk, G3 dv,
                const baton::attention_params& p) const {
    count(q, k, v, out, dout, dq, dk, dv);
    inner.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, p);
  }
};

}  // namespace

TEST_CASE("ring: on the host it computes head-major, with the bits of the dense layout", "[cp][ring]") {
  // The ring stages dense shards head-major (K/V blocks travel so, the accumulators are so):
  // every backend call sees each head's rows one after another, in ring_attention and in the
  // hybrid's ring, and the results are those of the ring computing on the dense shards, bit
  // for bit (the same calls on the same values), for uneven shards, GQA and several masks.
  const dims d{2, 29, 4, 2, 5};
  std::vector<std::int64_t> documents(29, 0);
  for (std::size_t i = 9; i < documents.size(); ++i) documents[i] = i < 20 ? 1 : 2;
  const auto check = [&](const auto& mask, const char* what) {
    INFO(what);
    const problem<double> p = make_problem<double>(d, mask, 31);
    for (const int R : {2, 3}) {
      INFO(R << " ranks");
      const sequence_sharding zigzag(shard_layout::zigzag, d.seq, R);
      std::int64_t area = 0;
      const tensors<double> dense = run_ring_core<double>(zigzag, p, mask, baton::reference_attention{}, 0, area, false);
      const tensors<double> head_major = run_ring_core<double>(zigzag, p, mask, baton::reference_attention{}, 0, area, true);
      CHECK(compare(dense, p.reference).max() <= 1e-12);
      CHECK(same_bits(head_major, dense));

      std::vector<layout_log> logs(static_cast<std::size_t>(R));
      tensors<double> result(d);
      baton::run_local(R, [&](baton::local_communicator& comm) {
        baton::ring_attention attn(comm, layout_checking_backend{{}, &logs, comm.rank()}, zigzag);
        run_rank<double>(attn, zigzag, attn.shard_index(), p, mask, result, 0);
      });
      CHECK(same_bits(result, dense));
      for (const layout_log& log : logs) {
        CHECK(log.head_major > 0);
        CHECK(log.other == 0);
      }
    }
    // The hybrid's ring (2 x 2): on the gathered head-major tensors, in place.
    std::vector<layout_log> logs(4);
    tensors<double> result(d);
    const sequence_sharding sharding(shard_layout::zigzag, d.seq, 2, 2);
    baton::run_local(4, [&](baton::local_communicator& comm) {
      auto mesh = baton::make_cp_mesh(comm, 2, 2);
      baton::hybrid_attention attn(mesh, layout_checking_backend{{}, &logs, comm.rank()}, sharding);
      run_rank<double>(attn, sharding, attn.shard_index(), p, mask, result, 0);
    });
    CHECK(compare(result, p.reference).max() <= 1e-12);
    for (const layout_log& log : logs) {
      CHECK(log.head_major > 0);
      CHECK(log.other == 0);
    }
  };
  check(baton::no_mask{}, "no mask");
  check(baton::causal_mask{}, "causal");
  check(baton::intersect(baton::causal_mask{}, baton::document_mask(documents)), "causal documents");
}

TEST_CASE("balanced shardings: ring and hybrid over balanced_sharding equal the unsharded reference",
          "[cp][lengths][balance]") {
  // Random uneven documents (causal inside each), as packed training data looks.
  const std::int64_t n = 61;
  std::vector<std::int64_t> ids;
  for (std::int64_t doc = 0, len = 3; static_cast<std::int64_t>(ids.size()) < n; ++doc, len = (len * 7 + 5) % 17 + 2)
    for (std::int64_t i = 0; i < len && static_cast<std::int64_t>(ids.size()) < n; ++i) ids.push_back(doc);
  const baton::mask_intersection documents{baton::document_mask(ids), baton::causal_mask{}};
  const baton::sliding_window_mask window{7, 0};
  const baton::prefix_lm_mask prefix{20};
  const dims d{1, n, 4, 2, 3};
  const auto check = [&](const auto& balance_for, const auto& mask, const char* name) {
    const problem<double> p = make_problem<double>(d, mask, 29);
    for (int ranks : {2, 3, 4})
      for (std::int64_t block : {4, 5}) {
        const baton::balanced_sharding_result plan = baton::balanced_sharding(balance_for, n, ranks, block);
        for (const config& c : {config{mode::ring, shard_layout::custom, ranks, 1},
                                config{mode::hybrid, shard_layout::custom, ranks, 2}}) {
          INFO(c.text() << ", " << name << ", block " << block << ", ratio " << plan.ratio);
          const errors e = compare(run_cp_sharded<double>(c, plan.sharding(c.inner_degree), p, mask), p.reference);
          REQUIRE(e.max() <= tolerance<double>());
        }
      }
  };
  check(baton::causal_mask{}, baton::causal_mask{}, "causal");
  check(window, window, "sliding window {7, 0}");
  check(documents, documents, "documents (causal)");
  check(prefix, prefix, "prefix-LM 20");
  // Balanced for the ring's walks of each row too (balance_options::ring_row_step): another
  // sharding of the same positions, the same attention.
  for (std::int64_t block : {4, 5}) {
    baton::balance_options for_ring;
    for_ring.ring_row_step = 8;
    const problem<double> p = make_problem<double>(d, documents, 29);
    const baton::balanced_sharding_result plan = baton::balanced_sharding(documents, n, 3, block, for_ring);
    for (const config& c : {config{mode::ring, shard_layout::custom, 3, 1}, config{mode::hybrid, shard_layout::custom, 3, 2}}) {
      INFO(c.text() << ", documents, ring_row_step 8, block " << block << ", ring ratio " << plan.ring_ratio);
      const errors e = compare(run_cp_sharded<double>(c, plan.sharding(c.inner_degree), p, documents), p.reference);
      REQUIRE(e.max() <= tolerance<double>());
    }
  }
  // A two-mask model (sliding-window layers and global causal layers) balanced by the sum of
  // both costs: one sharding, each layer's attention under its own mask.
  const std::vector<baton::attention_cost> model{{window, 3}, {baton::causal_mask{}, 1}};
  const std::span<const baton::attention_cost> both(model);
  check(both, window, "two-mask model: its window layers");
  check(both, baton::causal_mask{}, "two-mask model: its causal layers");
}

namespace {

// Counts the ring's K/V and dK/dV shifts (tag, hops) of one rank.
struct shift_log {
  std::vector<std::pair<int, int>> shifts;  // (tag, k)
  int compute_calls = 0;
};

struct counting_ring {
  baton::local_communicator* inner;
  shift_log* log;
  int rank() const { return inner->rank(); }
  int size() const { return inner->size(); }
  auto shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    if (tag == baton::detail::cp::tag_kv || tag == baton::detail::cp::tag_grad) log->shifts.emplace_back(tag, k);
    return inner->shift(send, recv, k, tag);
  }
};

struct counting_backend {
  baton::reference_attention inner;
  shift_log* log;
  template <class Q, class K, class V, class M, class O, class L>
  void forward(Q q, K k, V v, const M& mask, O out, L lse, const baton::attention_params& p) const {
    ++log->compute_calls;
    inner.forward(q, k, v, mask, out, lse, p);
  }
  template <class Q, class K, class V, class O, class L, class D, class M, class G1, class G2, class G3>
  void backward(Q q, K k, V v, O out, L lse, D dout, const M& mask, G1 dq, G2 dk, G3 dv,
                const baton::attention_params& p) const {
    ++log->compute_calls;
    inner.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, p);
  }
};

template <class Mask>
std::vector<shift_log> run_counted(const problem<double>& p, const Mask& mask, const sequence_sharding& sharding,
                                   tensors<double>& result) {
  const int R = sharding.degree();
  std::vector<shift_log> logs(static_cast<std::size_t>(R));
  baton::run_local(R, [&](baton::local_communicator& local) {
    shift_log& log = logs[static_cast<std::size_t>(local.rank())];
    counting_ring ring{&local, &log};
    baton::ring_attention attn(ring, counting_backend{{}, &log}, sharding);
    run_rank<double>(attn, sharding, attn.shard_index(), p, mask, result, 0);
  });
  return logs;
}

}  // namespace

TEST_CASE("ring: a step no rank needs is skipped by every rank, compute and transfer", "[cp][lengths][ring]") {
  const int R = 4;
  const std::int64_t kv = baton::detail::cp::tag_kv, grad = baton::detail::cp::tag_grad;
  SECTION("a sliding window shorter than a shard: only steps 0 and 1 run") {
    const dims d{1, 32, 2, 1, 3};  // 8 tokens per rank, window of 3 to the left
    const baton::sliding_window_mask mask{3, 0};
    const problem<double> p = make_problem<double>(d, mask, 17);
    tensors<double> result(d);
    const auto logs = run_counted(p, mask, sequence_sharding(shard_layout::contiguous, d.seq, R), result);
    CHECK(compare(result, p.reference).max() <= 1e-12);
    for (const shift_log& log : logs) {
      // forward: one K/V hop (step 0 -> 1) instead of R-1, K and V one message each;
      // backward: the same K/V hop, and the accumulator of step 1's holder returning to the
      // owner (R-1 hops back, in one shift); the owner's own part of step 0 never leaves
      const std::vector<std::pair<int, int>> want{{kv, 1}, {kv, 1}, {kv, 1}, {kv, 1}, {grad, R - 1}};
      CHECK(log.shifts == want);
    }
  }
  SECTION("the own block needed by nobody: the first needed block is fetched first") {
    // queries attend only to the block of 8 before their own: step 1 alone
    const dims d{1, 32, 2, 2, 3};
    const auto mask = baton::block_mask([](std::int64_t q, std::int64_t k) { return k / 8 == q / 8 - 1; }, 32, 32, 8);
    const problem<double> p = make_problem<double>(d, mask, 19);
    tensors<double> result(d);
    const auto logs = run_counted(p, mask, sequence_sharding(shard_layout::contiguous, d.seq, R), result);
    CHECK(compare(result, p.reference).max() <= 1e-12);
    for (const shift_log& log : logs) {
      const std::vector<std::pair<int, int>> want{{kv, 1}, {kv, 1}, {kv, 1}, {kv, 1}, {grad, R - 1}};
      CHECK(log.shifts == want);
    }
    CHECK(logs[0].compute_calls == 0);  // rank 0's queries attend to nothing
    CHECK(logs[1].compute_calls == 2);  // one forward, one backward call
  }
  SECTION("a causal mask needs every step: nothing is skipped") {
    const dims d{1, 29, 2, 2, 3};
    const baton::causal_mask mask;
    const problem<double> p = make_problem<double>(d, mask, 23);
    tensors<double> result(d);
    const auto logs = run_counted(p, mask, sequence_sharding(shard_layout::zigzag, d.seq, R), result);
    CHECK(compare(result, p.reference).max() <= 1e-12);
    for (const shift_log& log : logs) {
      std::map<std::int64_t, int> count;
      for (const auto& [tag, k] : log.shifts) {
        CHECK(k == 1);
        ++count[tag];
      }
      CHECK(count[kv] == 2 * 2 * (R - 1));  // forward and backward, K and V apart
      CHECK(count[grad] == R - 1);  // one hop a step after the first, the last one home
    }
  }
}
