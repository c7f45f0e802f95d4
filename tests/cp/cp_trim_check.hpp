// The ring's trimmed block calls against untrimmed ones: a check shared by test_cp_parity.cpp
// (reference backend) and test_cp_kokkos.cpp (the flash backend, release build only).
#pragma once

#include "catch.hpp"
#include "cp_test_support.hpp"

#include <baton/cp/balance.hpp>

#include <cstdint>
#include <utility>
#include <vector>

namespace cp_test {

// The ring with its block calls trimmed to the tiles the mask leaves non-empty against the
// same ring untrimmed, and both against the oracle, on a document mask with and without
// causality. The documents (70, 200, 10, 64, 40 tokens) have edges inside shards and
// within tiles of every sharding: contiguous and zigzag over 2 ranks, striped over 3 (each
// tile of 64 rows spans 192 positions), and a balanced sharding over 2 (blocks of 32). Under
// the plain document mask some (rank, step) blocks are empty. Trimming only drops rows and
// keys that meet no non-empty tile, in whole tiles from each call's corner, so the results
// must have the same bits; the backend call area must shrink on these masks (else the test
// would not exercise the trim).
template <class T, class Backend>
void check_trimmed_ring(const Backend& backend) {
  const dims d{.batch = 1, .seq = 384, .heads_q = 2, .heads_kv = 1, .dim = 4};
  std::vector<std::int64_t> ids;
  const std::int64_t lengths[] = {70, 200, 10, 64, 40};
  for (std::int64_t doc = 0; doc < 5; ++doc) ids.insert(ids.end(), static_cast<std::size_t>(lengths[doc]), doc);
  const baton::document_mask documents(ids);
  const auto check = [&](const auto& mask, const char* mask_name) {
    const problem<T> p = make_problem<T>(d, mask, 83);
    const std::vector<std::pair<const char*, baton::sequence_sharding>> shardings{
        {"contiguous 2", baton::sequence_sharding(baton::shard_layout::contiguous, d.seq, 2)},
        {"zigzag 2", baton::sequence_sharding(baton::shard_layout::zigzag, d.seq, 2)},
        {"striped 3", baton::sequence_sharding(baton::shard_layout::striped, d.seq, 3)},
        {"balanced 2", baton::balanced_sharding(mask, d.seq, 2, 32).sharding()}};
    std::int64_t all_trimmed = 0, all_full = 0;
    for (const auto& [name, sharding] : shardings) {
      std::int64_t trimmed_area = 0, full_area = 0;
      const tensors<T> trimmed = run_ring_core<T>(sharding, p, mask, backend, baton::detail::cp::trim_tile, trimmed_area);
      const tensors<T> full = run_ring_core<T>(sharding, p, mask, backend, 0, full_area);
      const errors e = compare(trimmed, p.reference);
      INFO(mask_name << ", " << name << ": call area " << trimmed_area << " trimmed, " << full_area
                     << " untrimmed; trimmed vs oracle rel L2 out " << e.out << " lse " << e.lse << " dq " << e.dq
                     << " dk " << e.dk << " dv " << e.dv);
      CHECK(same_bits(trimmed, full));
      CHECK(e.max() <= tolerance<T>());
      CHECK(trimmed_area <= full_area);
      all_trimmed += trimmed_area;
      all_full += full_area;
    }
    INFO(mask_name << ": call area " << all_trimmed << " trimmed, " << all_full << " untrimmed");
    CHECK(all_trimmed < all_full);
  };
  check(baton::intersect(documents, baton::causal_mask{}), "causal documents");
  check(documents, "documents");
}

}  // namespace cp_test
