// Cross-attention under context parallelism (issue 31): queries (Sq) and keys/values (Sk)
// from different sequences, each sharded by its own layout over the same ranks, through
// ring, Ulysses and hybrid, forward and backward, against reference attention in double on
// one rank over the whole q and k/v (the oracle), with masks none, key padding and document
// pairs (keys placed after the queries by the kv_sharding's position offset). Results are
// recorded in the rank threads and checked on the main thread.
#include "catch.hpp"
#include "cp_cross_support.hpp"

#include <chrono>
#include <functional>
#include <sstream>

using namespace cross_test;

#ifndef BATON_CP_LENGTH_STRIDE
#define BATON_CP_LENGTH_STRIDE 1
#endif

TEST_CASE("cross-attention: ring, Ulysses and hybrid equal the double reference for Sq != Sk, every layout pair, "
          "forward and backward",
          "[cp][cross_attention]") {
  // (Sq, Sk): Sk not divisible by 2, 3 or 4; Sq < R (empty query shards) at R = 3, 4 and the
  // hybrid's 4 ranks; Sq > Sk with Sk < 2R (zigzag chunks of one token, and empty ones); Sk < R
  // (empty key shards: their blocks travel empty).
  const std::vector<std::pair<std::int64_t, std::int64_t>> lengths{{5, 23}, {2, 13}, {17, 7}, {4, 2}};
  const std::vector<shard_layout> layouts{shard_layout::contiguous, shard_layout::zigzag, shard_layout::striped};
  // Tolerance: both sides compute in double; they differ only in the order the softmax is
  // summed over key blocks and in the merges (a few roundings of 1e-16 per element), so
  // 1e-12 leaves four orders of margin, while a key block missed or counted twice, or a
  // gradient sent to the wrong rank, is an error of order 1 (checked below: a shifted offset).
  constexpr double tolerance = 1e-12;
  struct outcome {
    std::string what;
    cross_errors e;
  };
  std::vector<outcome> outcomes;
  std::size_t runs = 0;
  for (const auto& [sq, sk] : lengths) {
    const cross_dims d{2, sq, sk, 4, 2, 3};
    for_each_cross_mask(d, [&](const auto& mask, std::int64_t offset, const char* mask_name) {
      const cross_problem p = make_cross(d, offset, mask, 31);
      for (setup c : modes()) {
        for (const shard_layout ql : layouts) {
          for (const shard_layout kl : layouts) {
            if (runs++ % BATON_CP_LENGTH_STRIDE != 0) continue;
            c.q_layout = ql;
            c.kv_layout = kl;
            outcomes.push_back({c.text() + ", Sq " + std::to_string(sq) + " Sk " + std::to_string(sk) + ", mask " +
                                    mask_name,
                                compare_cross(run_cross(c, p, mask), p.want)});
          }
        }
      }
    });
  }
  CHECK(outcomes.size() >= runs / BATON_CP_LENGTH_STRIDE);
  for (const outcome& o : outcomes) {
    INFO(o.what << ": out " << o.e.out << " lse " << o.e.lse << " dq " << o.e.dq << " dk " << o.e.dk << " dv "
                << o.e.dv);
    CHECK(o.e.max() < tolerance);
  }
}

TEST_CASE("cross-attention: custom shardings of queries and keys (any positions per rank), ring, Ulysses, hybrid",
          "[cp][cross_attention]") {
  // 9 queries and 13 keys over 2 groups, each group's positions in no particular order; the
  // hybrid splits each group over 2 Ulysses ranks.
  const std::vector<std::vector<std::int64_t>> q_groups{{8, 0, 5, 3}, {1, 2, 4, 6, 7}},
      k_groups{{12, 11, 0, 1, 2, 9}, {3, 4, 5, 6, 7, 8, 10}};
  const cross_dims d{2, 9, 13, 4, 2, 3};
  std::vector<std::string> failures;
  std::size_t runs = 0;
  for_each_cross_mask(d, [&](const auto& mask, std::int64_t offset, const char* mask_name) {
    const cross_problem p = make_cross(d, offset, mask, 41);
    for (const setup& c : {setup{mode::ring, 2, 1}, setup{mode::ulysses, 2, 1}, setup{mode::hybrid, 2, 2}}) {
      const baton::sequence_sharding qs(q_groups, c.inner);
      const baton::kv_sharding kv{baton::sequence_sharding(k_groups, c.inner), offset};
      const cross_errors e = compare_cross(run_cross(c, qs, kv, p, mask), p.want);
      ++runs;
      if (!(e.max() < 1e-12))  // the tolerance of the parity case above, for the same reasons
        failures.push_back(std::string(cp_test::name(c.m)) + ", mask " + mask_name + ": max rel L2 " +
                           std::to_string(e.max()));
    }
  });
  CHECK(runs == 9);
  std::string all;
  for (const std::string& f : failures) all += "\n  " + f;
  INFO("failures:" << all);
  CHECK(failures.empty());
}

TEST_CASE("cross-attention: the check can fail (keys placed one position off under document pairs)",
          "[cp][cross_attention]") {
  // The oracle with the keys at offset Sq, the CP run with them at Sq + 1: the document ids
  // then pair the wrong tokens, and the comparison must see it.
  const cross_dims d{1, 6, 11, 2, 1, 3};
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < d.seq_q; ++i) ids.push_back(i < 3 ? 0 : 1);
  for (std::int64_t j = 0; j < d.seq_k + 1; ++j) ids.push_back(j < 5 ? 0 : 1);
  const baton::document_mask mask(ids);
  const cross_problem p = make_cross(d, d.seq_q, mask, 7);
  cross_problem shifted = p;
  shifted.kv_offset = d.seq_q + 1;
  const cross_errors e = compare_cross(run_cross(setup{mode::ring, 2, 1}, shifted, mask), p.want);
  CHECK(e.max() > 1e-3);
}

namespace cross_test {

// Each rank's cp_error message (cp_test_support.hpp).
constexpr auto rank_errors = &cp_test::rank_cp_errors;

// A forward on every rank with shards of the lengths `qs` and `kv` give it (or `k_len` keys
// where >= 0), through ring or Ulysses.
inline void cross_forward(baton::local_communicator& comm, mode m, const baton::sequence_sharding& qs,
                          const baton::kv_sharding& kv, std::int64_t k_len = -1) {
  const int r = comm.rank();
  const std::int64_t nq = qs.degree() == comm.size() ? qs.local_len(r) : 1;
  const std::int64_t nk = k_len >= 0 ? k_len : kv.sharding.degree() == comm.size() ? kv.sharding.local_len(r) : 1;
  std::vector<double> q(static_cast<std::size_t>(nq * 2 * 3), 0.5), k(static_cast<std::size_t>(nk * 2 * 3), 0.25),
      v(k.size(), 1.0), out(q.size()), lse(static_cast<std::size_t>(2 * nq));
  const auto call = [&](auto& attn) {
    attn.forward(c4(q, 1, nq, 2, 3), c4(k, 1, nk, 2, 3), c4(v, 1, nk, 2, 3), baton::no_mask{}, v4(out, 1, nq, 2, 3),
                 baton::make_tensor_view(lse.data(), {1, 2, nq}));
  };
  if (m == mode::ring) {
    baton::ring_attention attn(comm, baton::reference_attention{}, qs, kv);
    call(attn);
  } else {
    baton::ulysses_attention attn(comm, baton::reference_attention{}, qs, kv);
    call(attn);
  }
}

inline std::vector<std::string> same_everywhere(const std::vector<std::string>& messages) {
  for (const std::string& m : messages)
    if (m != messages.front()) return messages;
  return {messages.front()};
}

}  // namespace cross_test

TEST_CASE("cross-attention: a bad pairing of shardings is one clear error on every rank", "[cp][cross_attention][errors]") {
  struct verdict {
    std::string what;
    std::vector<std::string> messages;
    std::string needle;
  };
  std::vector<verdict> verdicts;
  for (const mode m : {mode::ring, mode::ulysses}) {
    const std::string who = cp_test::name(m);
    // Keys sharded over 4 ranks, queries over the world's 2.
    verdicts.push_back({who + ": kv degree 4, q degree 2",
                        rank_errors(2,
                                    [&](baton::local_communicator& comm) {
                                      cross_forward(comm, m, baton::sequence_sharding(shard_layout::zigzag, 9, 2),
                                                    {baton::sequence_sharding(shard_layout::zigzag, 13, 4), 0});
                                    }),
                        "the key/value sharding is 4 x 1 (degree x inner degree) but the query sharding 2 x 1; "
                        "cross-attention shards queries and keys over the same ranks"});
    // One rank builds its keys' sharding over another length: the agreement names it.
    verdicts.push_back({who + ": ranks disagree on the kv sharding",
                        rank_errors(2,
                                    [&](baton::local_communicator& comm) {
                                      cross_forward(comm, m, baton::sequence_sharding(shard_layout::contiguous, 9, 2),
                                                    {baton::sequence_sharding(shard_layout::contiguous,
                                                                              comm.rank() == 1 ? 14 : 13, 2),
                                                     0});
                                    }),
                        "pass different key/value shardings or key position offsets (cross-attention)"});
    // A key shard of the wrong length on rank 1 (13 keys over 2: rank 1 holds 6, passes 7).
    verdicts.push_back({who + ": key shard of the wrong length",
                        rank_errors(2,
                                    [&](baton::local_communicator& comm) {
                                      cross_forward(comm, m, baton::sequence_sharding(shard_layout::contiguous, 9, 2),
                                                    {baton::sequence_sharding(shard_layout::contiguous, 13, 2), 0},
                                                    7);
                                    }),
                        "rank 1: the local key/value shard holds 7 tokens but the key/value sharding gives this rank 6"});
    // A negative key offset.
    verdicts.push_back({who + ": negative key offset",
                        rank_errors(2,
                                    [&](baton::local_communicator& comm) {
                                      cross_forward(comm, m, baton::sequence_sharding(shard_layout::contiguous, 9, 2),
                                                    {baton::sequence_sharding(shard_layout::contiguous, 13, 2), -2});
                                    }),
                        "the key/value position offset is -2; it must be >= 0"});
  }
  // The hybrid: keys sharded 4 x 1 against queries 2 x 2 on a 2 x 2 mesh.
  verdicts.push_back(
      {"hybrid: kv 4 x 1, q 2 x 2",
       rank_errors(4,
                   [&](baton::local_communicator& comm) {
                     auto mesh = baton::make_cp_mesh(comm, 2, 2);
                     const baton::sequence_sharding qs(shard_layout::zigzag, 9, 2, 2);
                     baton::hybrid_attention attn(mesh, baton::reference_attention{}, qs,
                                                  baton::kv_sharding{baton::sequence_sharding(shard_layout::zigzag, 13, 4), 0});
                     const std::int64_t nq = qs.local_len(attn.shard_index()), nk = 3;
                     std::vector<double> q(static_cast<std::size_t>(nq * 2 * 3)), k(static_cast<std::size_t>(nk * 2 * 3)),
                         out(q.size()), lse(static_cast<std::size_t>(2 * nq));
                     attn.forward(c4(q, 1, nq, 2, 3), c4(k, 1, nk, 2, 3), c4(k, 1, nk, 2, 3), baton::no_mask{},
                                  v4(out, 1, nq, 2, 3), baton::make_tensor_view(lse.data(), {1, 2, nq}));
                   }),
       "the key/value sharding is 4 x 1 (degree x inner degree) but the query sharding 2 x 2"});
  // Self-attention still names a key tensor whose length is not the queries' (its shape is
  // now read apart from q's): rank 0 passes one key too few.
  verdicts.push_back({"ring self-attention: k shorter than q",
                      rank_errors(2,
                                  [&](baton::local_communicator& comm) {
                                    const baton::sequence_sharding s(shard_layout::contiguous, 8, 2);
                                    const std::int64_t nk = comm.rank() == 0 ? 3 : 4;
                                    std::vector<double> q(4 * 2 * 3), k(static_cast<std::size_t>(nk * 2 * 3)),
                                        out(q.size()), lse(2 * 4);
                                    baton::ring_attention attn(comm, baton::reference_attention{}, s);
                                    attn.forward(c4(q, 1, 4, 2, 3), c4(k, 1, nk, 2, 3), c4(k, 1, nk, 2, 3),
                                                 baton::no_mask{}, v4(out, 1, 4, 2, 3),
                                                 baton::make_tensor_view(lse.data(), {1, 2, 4}));
                                  }),
                      "rank 0: tensor 'k' has shape [1, 3, 2, 3] but expected [1, 4, 2, 3]"});
  for (const verdict& v : verdicts) {
    INFO(v.what);
    std::string all;
    for (const std::string& m : v.messages) all += "\n  " + m;
    INFO("messages:" << all);
    const std::vector<std::string> one = same_everywhere(v.messages);
    CHECK(one.size() == 1);  // every rank throws, and the same message
    CHECK(one.front().find(v.needle) != std::string::npos);
  }
}

TEST_CASE("docs: cross-attention over a ring, keys sharded on their own", "[cp][cross_attention][docs]") {
  const std::int64_t sq = 10, sk = 23, heads = 2, dim = 4;
  const std::vector<double> q_full = cp_test::random_values<double>(sq * heads * dim, 3),
                            k_full = cp_test::random_values<double>(sk * heads * dim, 4),
                            v_full = cp_test::random_values<double>(sk * heads * dim, 5);
  std::vector<double> out_full(q_full.size());
  std::vector<std::int64_t> lens(6);
  // [doc:cross_ring]
  // A decoder's 10 queries attend to an encoder's 23 keys, the last 3 of them padding, on 3 ranks.
  baton::run_local(3, [&](baton::local_communicator& comm) {
    const int r = comm.rank();
    const baton::sequence_sharding q_sharding(baton::shard_layout::zigzag, sq, comm.size());  // 3, 3, 4 queries
    const baton::kv_sharding kv{baton::sequence_sharding(baton::shard_layout::contiguous, sk, comm.size()),
                                /*position_offset=*/0};                                     // 8, 8, 7 keys
    const std::int64_t nq = q_sharding.local_len(r), nk = kv.sharding.local_len(r);
    const std::vector<std::int64_t> q_shape{1, sq, heads, dim}, kv_shape{1, sk, heads, dim};
    auto q = baton::shard_sequence<double>(q_sharding, r, q_full, q_shape, 1);
    auto k = baton::shard_sequence<double>(kv.sharding, r, k_full, kv_shape, 1);
    auto v = baton::shard_sequence<double>(kv.sharding, r, v_full, kv_shape, 1);
    std::vector<double> out(q.size()), lse(heads * nq);

    baton::ring_attention ring(comm, baton::reference_attention{}, q_sharding, kv);
    const baton::padding_mask mask(baton::no_mask{}, /*q_length=*/sq, /*k_length=*/sk - 3);
    ring.forward(baton::make_tensor_view(q.data(), {1, nq, heads, dim}), baton::make_tensor_view(k.data(), {1, nk, heads, dim}),
                 baton::make_tensor_view(v.data(), {1, nk, heads, dim}), mask,
                 baton::make_tensor_view(out.data(), {1, nq, heads, dim}),
                 baton::make_tensor_view(lse.data(), {1, heads, nq}));
    baton::unshard_sequence<double>(q_sharding, r, out, q_shape, 1, out_full);
  });
  // [/doc:cross_ring]
  const baton::sequence_sharding qs(baton::shard_layout::zigzag, sq, 3), ks(baton::shard_layout::contiguous, sk, 3);
  for (int r = 0; r < 3; ++r) {
    lens[static_cast<std::size_t>(r)] = qs.local_len(r);
    lens[static_cast<std::size_t>(3 + r)] = ks.local_len(r);
  }
  CHECK(lens == std::vector<std::int64_t>{3, 3, 4, 8, 8, 7});  // what the example's comments say
  // The oracle: the whole decoder against the 20 real keys alone, on one rank (no mask).
  std::vector<double> want(q_full.size()), lse(heads * sq);
  const std::int64_t real = sk - 3;
  baton::reference_attention{}.forward(
      baton::make_tensor_view(q_full.data(), {1, sq, heads, dim}), baton::make_tensor_view(k_full.data(), {1, real, heads, dim}),
      baton::make_tensor_view(v_full.data(), {1, real, heads, dim}), baton::no_mask{},
      baton::make_tensor_view(want.data(), {1, sq, heads, dim}), baton::make_tensor_view(lse.data(), {1, heads, sq}));
  CHECK(cp_test::rel_l2(out_full, want) < 1e-12);  // double on both sides (see the parity case)
}
