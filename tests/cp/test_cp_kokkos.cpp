// Context parallelism over the Kokkos flash backend: ring, Ulysses and hybrid with
// kokkos_attention on every rank must match the reference oracle on the whole sequence, as
// they do with reference_attention in test_cp_parity.cpp. The sequence (S = 160) is long
// enough that a rank's block holds full 64 x 64 tiles next to partial ones, so the masked,
// empty and full tile paths of the backend all run under CP's block offsets.
//
// Tolerances (relative L2, per tensor): 1e-5 float, 1e-12 double, as in test_cp_parity.cpp.
// The oracle accumulates in double; the Kokkos tiles sum in T over <= 160 keys and CP merges
// the blocks, a few ulps of T per element: float's largest measured error is 4.4e-7 (dv),
// double's below 1e-15 — while a wrong tile offset, mask position or gradient route is an
// error of order 1.
#include "catch.hpp"
#include "cp_cross_support.hpp"
#include "cp_test_support.hpp"
#include "cp_trim_check.hpp"

#include <baton/attention/kokkos.hpp>

using namespace cp_test;
using baton::shard_layout;

TEMPLATE_TEST_CASE("CP over kokkos_attention matches the reference: ring, Ulysses, hybrid, every mask",
                   "[cp][kokkos]", float, double) {
  const dims d{.batch = 1, .seq = 160, .heads_q = 4, .heads_kv = 2, .dim = 8};
  const std::vector<config> configs{
      {mode::ring, shard_layout::contiguous, 2, 1},  {mode::ring, shard_layout::zigzag, 2, 1},
      {mode::ring, shard_layout::striped, 4, 1},     {mode::ulysses, shard_layout::zigzag, 2, 1},
      {mode::hybrid, shard_layout::zigzag, 2, 2},
  };
  for_each_mask(d.seq, [&](const auto& mask, const char* mask_name) {
    const problem<TestType> p = make_problem<TestType>(d, mask, 71);
    for (const config& c : configs) {
      const errors e = compare(run_cp<TestType>(c, p, mask, 0, baton::kokkos_attention{}), p.reference);
      INFO(c.text() << ", mask " << mask_name << ": rel L2 out " << e.out << " lse " << e.lse << " dq " << e.dq
                    << " dk " << e.dk << " dv " << e.dv);
      CHECK(e.max() <= tolerance<TestType>());
    }
  });
}

// The ring's trimmed block calls (whole 64 x 64 tiles from each call's corner: this backend's
// tiles) give the untrimmed calls' bits with the flash backend too, whose tiles and online
// softmax order a trim that is not tile-aligned would change.
TEMPLATE_TEST_CASE("ring over kokkos_attention: trimmed block calls give the untrimmed bits", "[cp][kokkos][ring]",
                   float, double) {
  check_trimmed_ring<TestType>(baton::kokkos_attention{});
}

// Cross-attention (issue 31) over the flash backend: 70 queries and 150 keys, so that blocks
// hold full and partial 64 x 64 tiles, queries and keys sharded by different layouts; double,
// against the double reference on one rank (1e-12: the tiles' sums differ from the
// reference's in order only).
TEST_CASE("cross-attention over kokkos_attention matches the reference: ring, Ulysses, hybrid",
          "[cp][kokkos][cross_attention]") {
  const cross_test::cross_dims d{1, 70, 150, 4, 2, 8};
  const std::vector<cross_test::setup> setups{{mode::ring, 2, 1, shard_layout::zigzag, shard_layout::contiguous},
                                              {mode::ring, 3, 1, shard_layout::striped, shard_layout::zigzag},
                                              {mode::ulysses, 2, 1, shard_layout::contiguous, shard_layout::striped},
                                              {mode::hybrid, 2, 2, shard_layout::zigzag, shard_layout::zigzag}};
  cross_test::for_each_cross_mask(d, [&](const auto& mask, std::int64_t offset, const char* mask_name) {
    const cross_test::cross_problem p = cross_test::make_cross(d, offset, mask, 73);
    for (const cross_test::setup& c : setups) {
      const cross_test::cross_errors e =
          cross_test::compare_cross(cross_test::run_cross(c, p, mask, baton::kokkos_attention{}), p.want);
      INFO(c.text() << ", mask " << mask_name << ": rel L2 out " << e.out << " lse " << e.lse << " dq " << e.dq
                    << " dk " << e.dk << " dv " << e.dv);
      CHECK(e.max() <= 1e-12);
    }
  });
}
