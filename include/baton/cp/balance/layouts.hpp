// baton/cp/balance/layouts.hpp — the fixed layouts balanced_sharding is measured against, as
// position lists per rank: zigzag and contiguous over any length (their chunk edges rounded
// to blocks when only block costs are known), and zigzag within each packed document.
#pragma once

#include <baton/cp/balance/cost.hpp>
#include <baton/cp/sharding.hpp>

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

namespace baton {

namespace detail::cp::balance {

// Positions [round(b), round(e)) for an even cut whose edges are rounded to `granule`:
// nearest multiple, except the sequence's end, which stays (so the chunks still cover it).
[[nodiscard]] constexpr std::int64_t round_edge(std::int64_t x, std::int64_t granule, std::int64_t seq_len) noexcept {
  if (x >= seq_len) return seq_len;
  return std::min(seq_len, (x + granule / 2) / granule * granule);
}

inline void append_range(std::vector<std::int64_t>& out, std::int64_t begin, std::int64_t end) {
  for (std::int64_t p = begin; p < end; ++p) out.push_back(p);
}

// Zigzag over [0, seq_len) with chunk edges rounded to `granule` (1: token granularity, the
// positions of sequence_sharding(shard_layout::zigzag, seq_len, ranks): the same run rule).
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> zigzag_cut(std::int64_t seq_len, int ranks,
                                                                       std::int64_t granule) {
  const std::int64_t chunks = 2 * std::int64_t{ranks};
  const auto edge = [&](std::int64_t c) { return round_edge(even_run_start(seq_len, chunks, c), granule, seq_len); };
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    auto& mine = out[static_cast<std::size_t>(r)];
    append_range(mine, edge(r), edge(r + 1));
    append_range(mine, edge(chunks - 1 - r), edge(chunks - r));
  }
  return out;
}

[[nodiscard]] inline std::vector<std::vector<std::int64_t>> contiguous_cut(std::int64_t seq_len, int ranks,
                                                                           std::int64_t granule) {
  const auto edge = [&](std::int64_t r) { return round_edge(even_run_start(seq_len, ranks, r), granule, seq_len); };
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) append_range(out[static_cast<std::size_t>(r)], edge(r), edge(r + 1));
  return out;
}

}  // namespace detail::cp::balance

/// Rank r's share of zigzag over any sequence length: 2R chunks cut as evenly as possible (the
/// first S mod 2R one token longer), rank r holding chunks r and 2R-1-r, ascending — the
/// positions of sequence_sharding(shard_layout::zigzag, S, R).
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> zigzag_positions(std::int64_t seq_len, int ranks) {
  detail::cp::balance::check_balance_args("baton::zigzag_positions", seq_len, ranks, 1);
  return detail::cp::balance::zigzag_cut(seq_len, ranks, 1);
}

/// R contiguous chunks cut as evenly as possible (the first S mod R one token longer), the
/// positions of sequence_sharding(shard_layout::contiguous, S, R).
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> contiguous_positions(std::int64_t seq_len, int ranks) {
  detail::cp::balance::check_balance_args("baton::contiguous_positions", seq_len, ranks, 1);
  return detail::cp::balance::contiguous_cut(seq_len, ranks, 1);
}

/// Per-document zigzag for a packed sequence (segment_ids[p] = document of position p; a
/// document is a maximal run of equal ids): each document is cut into 2R chunks as evenly as
/// possible and rank r holds chunks r and 2R-1-r of every document. With block > 1 every
/// chunk edge is rounded to the nearest multiple of `block` (kernels tile whole blocks), so a
/// document shorter than 2R blocks leaves some ranks without a share of it.
[[nodiscard]] inline std::vector<std::vector<std::int64_t>> per_document_zigzag_positions(
    std::span<const std::int64_t> segment_ids, int ranks, std::int64_t block = 1) {
  const auto seq_len = static_cast<std::int64_t>(segment_ids.size());
  detail::cp::balance::check_balance_args("baton::per_document_zigzag_positions", seq_len, ranks, block);
  const std::int64_t chunks = 2 * std::int64_t{ranks};
  std::vector<std::vector<std::int64_t>> out(static_cast<std::size_t>(ranks));
  std::int64_t begin = 0;
  while (begin < seq_len) {
    std::int64_t end = begin + 1;
    while (end < seq_len && segment_ids[static_cast<std::size_t>(end)] == segment_ids[static_cast<std::size_t>(begin)]) ++end;
    const std::int64_t length = end - begin;
    const auto edge = [&](std::int64_t c) {
      return detail::cp::balance::round_edge(begin + detail::cp::even_run_start(length, chunks, c), block, seq_len);
    };
    for (int r = 0; r < ranks; ++r) {
      auto& mine = out[static_cast<std::size_t>(r)];
      detail::cp::balance::append_range(mine, edge(r), edge(r + 1));
      detail::cp::balance::append_range(mine, edge(chunks - 1 - r), edge(chunks - r));
    }
    begin = end;
  }
  // Rounded edges are monotone, so each rank's runs are ascending already; sort anyway for
  // labellings that revisit a document id later (two runs, two documents).
  for (auto& mine : out) std::sort(mine.begin(), mine.end());
  return out;
}

}  // namespace baton
