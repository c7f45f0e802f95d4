// Bad input: every rank gets a cp_error that names the problem, and nothing hangs (each
// world runs with a short timeout, so a rank left waiting would fail the test instead).
#include "catch.hpp"
#include "cp_test_support.hpp"

#include <chrono>
#include <functional>

using namespace cp_test;
using baton::shard_layout;

namespace {

// Each rank's cp_error message (cp_test_support.hpp).
constexpr auto cp_errors = &cp_test::rank_cp_errors;

void every_rank_says(const std::vector<std::string>& messages, const std::string& needle) {
  for (std::size_t r = 0; r < messages.size(); ++r) {
    INFO("rank " << r << ": " << messages[r]);
    CHECK_FALSE(messages[r].empty());
    CHECK(messages[r].find(needle) != std::string::npos);
  }
}

// Local buffers of the given shard shape on one rank.
struct shard {
  std::int64_t b, s, hq, hkv, d;
  std::vector<float> q, k, v, out, lse;
  shard(std::int64_t b_, std::int64_t s_, std::int64_t hq_, std::int64_t hkv_, std::int64_t d_)
      : b(b_), s(s_), hq(hq_), hkv(hkv_), d(d_), q(static_cast<std::size_t>(b * s * hq * d), 0.5f),
        k(static_cast<std::size_t>(b * s * hkv * d), 0.25f), v(k.size(), 1.0f), out(q.size()),
        lse(static_cast<std::size_t>(b * hq * s)) {}
  template <class Attention, class Mask = baton::causal_mask>
  void forward(Attention& attn, const Mask& mask = {}) {
    attn.forward(cview4(q, b, s, hq, d), cview4(k, b, s, hkv, d), cview4(v, b, s, hkv, d), mask, view4(out, b, s, hq, d),
                 baton::make_tensor_view(lse.data(), {b, hq, s}));
  }
  template <class Attention>
  void backward(Attention& attn) {
    std::vector<float> dq(q.size()), dk(k.size()), dv(k.size());
    attn.backward(cview4(q, b, s, hq, d), cview4(k, b, s, hkv, d), cview4(v, b, s, hkv, d), cview4(out, b, s, hq, d),
                  baton::make_tensor_view(static_cast<const float*>(lse.data()), {b, hq, s}), cview4(out, b, s, hq, d),
                  baton::causal_mask{}, view4(dq, b, s, hq, d), view4(dk, b, s, hkv, d), view4(dv, b, s, hkv, d));
  }
};

}  // namespace

TEST_CASE("errors: a shard of the wrong length for its rank fails on every rank, naming local_len(rank)",
          "[cp][errors]") {
  // 37 tokens over 4 zigzag ranks: 9, 9, 9 and 10. Every rank passes 9: rank 3 is wrong.
  every_rank_says(cp_errors(4,
                            [](baton::local_communicator& comm) {
                              const baton::sequence_sharding s(shard_layout::zigzag, 37, comm.size());
                              shard sh(1, 9, 2, 2, 3);
                              baton::ring_attention attn(comm, baton::reference_attention{}, s);
                              sh.forward(attn);
                            }),
                  "rank 3: the local shard holds 9 tokens but the sequence_sharding gives this rank 10 "
                  "(sequence_sharding::local_len(rank) for this rank)");
}

TEST_CASE("errors: ranks that built different custom shardings of the same sizes all stop", "[cp][errors]") {
  every_rank_says(cp_errors(2,
                            [](baton::local_communicator& comm) {
                              const std::vector<std::vector<std::int64_t>> mine =
                                  comm.rank() == 0 ? std::vector<std::vector<std::int64_t>>{{0, 1, 2}, {3, 4, 5}}
                                                   : std::vector<std::vector<std::int64_t>>{{0, 1, 5}, {2, 3, 4}};
                              const baton::sequence_sharding s(mine);
                              shard sh(1, 3, 2, 2, 3);
                              baton::ring_attention attn(comm, baton::reference_attention{}, s);
                              sh.forward(attn);
                            }),
                  "pass different sequence shardings");
}

TEST_CASE("errors: kv heads that do not divide the query heads fail on every rank", "[cp][errors]") {
  // Any head count splits over the Ulysses degree (unevenly where it must: test_cp_lengths);
  // GQA's own rule is what remains.
  every_rank_says(cp_errors(2,
                            [](baton::local_communicator& comm) {
                              const baton::sequence_sharding s(shard_layout::contiguous, 8, comm.size());
                              shard sh(1, 4, 6, 4, 3);
                              baton::ulysses_attention attn(comm, baton::reference_attention{}, s);
                              sh.forward(attn);
                            }),
                  "q has 6 heads and k/v 4");
  // and through the hybrid's Ulysses groups
  every_rank_says(cp_errors(4,
                            [](baton::local_communicator& comm) {
                              auto mesh = baton::make_cp_mesh(comm, 2, 2);
                              const baton::sequence_sharding s(shard_layout::zigzag, 16, 2, 2);
                              shard sh(1, 4, 3, 2, 3);
                              baton::hybrid_attention attn(mesh, baton::reference_attention{}, s);
                              sh.forward(attn);
                            }),
                  "q has 3 heads and k/v 2");
}

TEST_CASE("errors: ranks with different shard shapes all stop, naming the odd rank", "[cp][errors]") {
  // rank 1 holds one token too many: its own checks see it, the others learn it
  every_rank_says(cp_errors(3,
                            [](baton::local_communicator& comm) {
                              const baton::sequence_sharding s(shard_layout::contiguous, 12, comm.size());
                              shard sh(1, comm.rank() == 1 ? 5 : 4, 2, 2, 3);
                              baton::ring_attention attn(comm, baton::reference_attention{}, s);
                              sh.forward(attn);
                            }),
                  "rank 1");
  // rank 2 has a different batch: every local check passes, only the agreement sees it
  every_rank_says(cp_errors(3,
                            [](baton::local_communicator& comm) {
                              const baton::sequence_sharding s(shard_layout::contiguous, 12, comm.size());
                              shard sh(comm.rank() == 2 ? 2 : 1, 4, 2, 2, 3);
                              baton::ring_attention attn(comm, baton::reference_attention{}, s);
                              sh.backward(attn);
                            }),
                  "ranks hold shards of different shapes");
  every_rank_says(cp_errors(4,
                            [](baton::local_communicator& comm) {
                              const baton::sequence_sharding s(shard_layout::contiguous, 16, comm.size());
                              shard sh(1, 4, 4, 2, comm.rank() == 3 ? 5 : 3);
                              baton::ulysses_attention attn(comm, baton::reference_attention{}, s);
                              sh.forward(attn);
                            }),
                  "ranks hold shards of different shapes");
  // in the hybrid, rank 3's error must cross both the Ulysses group and the ring
  every_rank_says(cp_errors(4,
                            [](baton::local_communicator& comm) {
                              auto mesh = baton::make_cp_mesh(comm, 2, 2);
                              const baton::sequence_sharding s(shard_layout::zigzag, 16, 2, 2);
                              shard sh(1, comm.rank() == 3 ? 3 : 4, 2, 2, 3);
                              baton::hybrid_attention attn(mesh, baton::reference_attention{}, s);
                              sh.forward(attn);
                            }),
                  "rank 3");
}

TEST_CASE("errors: a mesh or sharding that does not match the world fails on every rank", "[cp][errors]") {
  every_rank_says(cp_errors(4, [](baton::local_communicator& comm) { (void)baton::make_cp_mesh(comm, 3, 2); }),
                  "does not match the world size 4");
  every_rank_says(cp_errors(4,
                            [](baton::local_communicator& comm) {
                              auto mesh = baton::make_cp_mesh(comm, 2, 2);
                              const baton::sequence_sharding s(shard_layout::zigzag, 16, 4, 1);
                              shard sh(1, 4, 2, 2, 3);
                              baton::hybrid_attention attn(mesh, baton::reference_attention{}, s);
                              sh.forward(attn);
                            }),
                  "but the mesh is 2 x 2");
  every_rank_says(cp_errors(2,
                            [](baton::local_communicator& comm) {
                              const baton::sequence_sharding s(shard_layout::contiguous, 16, 4);
                              shard sh(1, 4, 2, 2, 3);
                              baton::ring_attention attn(comm, baton::reference_attention{}, s);
                              sh.forward(attn);
                            }),
                  "the ring communicator has 2");
}

TEST_CASE("errors: ranks that disagree on the call or the sharding all stop", "[cp][errors]") {
  every_rank_says(cp_errors(2,
                            [](baton::local_communicator& comm) {
                              const baton::sequence_sharding s(shard_layout::contiguous, 8, comm.size());
                              shard sh(1, 4, 2, 2, 3);
                              baton::ring_attention attn(comm, baton::reference_attention{}, s);
                              if (comm.rank() == 0) sh.forward(attn); else sh.backward(attn);
                            }),
                  "different context-parallel operations");
  every_rank_says(cp_errors(2,
                            [](baton::local_communicator& comm) {
                              const baton::sequence_sharding s(
                                  comm.rank() == 0 ? shard_layout::contiguous : shard_layout::striped, 8, comm.size());
                              shard sh(1, 4, 2, 2, 3);
                              baton::ring_attention attn(comm, baton::reference_attention{}, s);
                              sh.forward(attn);
                            }),
                  "different sequence shardings");
}

TEST_CASE("errors: a mask that cannot describe the sequence fails on every rank before any data moves", "[cp][errors]") {
  every_rank_says(cp_errors(2,
                            [](baton::local_communicator& comm) {
                              const baton::sequence_sharding s(shard_layout::zigzag, 8, comm.size());
                              shard sh(1, 4, 2, 2, 3);
                              baton::ring_attention attn(comm, baton::reference_attention{}, s);
                              sh.forward(attn, baton::document_mask(std::vector<std::int64_t>(6, 0)));
                            }),
                  "the mask does not cover the sequence");
}

TEST_CASE("errors: a problem the caller found on one rank stops every rank of ring, Ulysses and hybrid",
          "[cp][errors]") {
  // cp_params::caller_problem travels through the call's agreement, ahead of the layer's own
  // checks: the layer above (baton::nn) rejects one rank's bad input on every rank together.
  const auto call = [](auto& attn, int rank, bool backward) {
    shard s(1, 4, 2, 2, 3);
    baton::cp_params params;
    if (rank == 1) params.caller_problem = "the caller's input on rank 1 is wrong";
    std::vector<float> dq(s.q.size()), dk(s.k.size()), dv(s.k.size());
    if (backward) {
      attn.backward(cview4(s.q, 1, 4, 2, 3), cview4(s.k, 1, 4, 2, 3), cview4(s.v, 1, 4, 2, 3), cview4(s.out, 1, 4, 2, 3),
                    baton::make_tensor_view(static_cast<const float*>(s.lse.data()), {1, 2, 4}),
                    cview4(s.out, 1, 4, 2, 3), baton::causal_mask{}, view4(dq, 1, 4, 2, 3), view4(dk, 1, 4, 2, 3),
                    view4(dv, 1, 4, 2, 3), params);
    } else {
      attn.forward(cview4(s.q, 1, 4, 2, 3), cview4(s.k, 1, 4, 2, 3), cview4(s.v, 1, 4, 2, 3), baton::causal_mask{},
                   view4(s.out, 1, 4, 2, 3), baton::make_tensor_view(s.lse.data(), {1, 2, 4}), params);
    }
  };
  for (bool backward : {false, true}) {
    INFO((backward ? "backward" : "forward"));
    every_rank_says(cp_errors(2,
                              [&](baton::local_communicator& comm) {
                                baton::ring_attention ring(comm, baton::reference_attention{},
                                                           baton::sequence_sharding(shard_layout::zigzag, 8, 2));
                                call(ring, comm.rank(), backward);
                              }),
                    "rank 1 rejected its input, so every rank stops: rank 1: the caller's input on rank 1 is wrong");
    every_rank_says(cp_errors(2,
                              [&](baton::local_communicator& comm) {
                                baton::ulysses_attention ulysses(comm, baton::reference_attention{},
                                                                 baton::sequence_sharding(shard_layout::contiguous, 8, 2));
                                call(ulysses, comm.rank(), backward);
                              }),
                    "rank 1 rejected its input");
    every_rank_says(cp_errors(4,
                              [&](baton::local_communicator& comm) {
                                auto mesh = baton::make_cp_mesh(comm, 2, 2);
                                baton::hybrid_attention hybrid(mesh, baton::reference_attention{},
                                                               baton::sequence_sharding(shard_layout::zigzag, 16, 2, 2));
                                call(hybrid, comm.rank(), backward);
                              }),
                    "rank 1 rejected its input");
  }
}
