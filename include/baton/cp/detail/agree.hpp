// baton/cp/detail/agree.hpp — every collective entry point of the CP layer starts by having
// all ranks agree on their inputs (core/agreement.hpp): a rank whose input is wrong does not
// throw on its own (its peers would then wait for data that never comes); it reports the
// problem in its descriptor, the descriptors are gathered (comm/agree.hpp), and every rank
// throws the same cp_error.
#pragma once

#include <baton/comm/agree.hpp>
#include <baton/core/agreement.hpp>
#include <baton/core/tags.hpp>
#include <baton/cp/error.hpp>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <span>
#include <string>

namespace baton::detail::cp {

// Tags of the CP layer's point-to-point traffic (the registry's cp range). Messages of one
// (source, dest, tag) match in order, and every rank issues them in the same order, so fixed
// tags are enough.
inline constexpr int tag_agree = tags::cp::tag<0>;
inline constexpr int tag_kv = tags::cp::tag<1>;
inline constexpr int tag_grad = tags::cp::tag<2>;
inline constexpr int tag_settle = tags::cp::tag<3>;

// What a rank knows about its call, in the order a disagreement is reported.
struct call_field {
  enum : std::size_t {
    batch, heads_q, heads_kv, head_dim,                                       // the shard's shape
    seq_len, layout, degree, inner_degree, world_size, sharding_fingerprint,  // the sharding
    kv_seq_len, kv_sharding_fingerprint, kv_offset,                           // the keys' (cross-attention)
    softmax_scale, mask_fingerprint, element_size, lse_element_size,          // the computation
    seq_local, seq_local_kv,                                                  // may differ: messages only
    count
  };
  static constexpr std::uint64_t compared = (std::uint64_t{1} << seq_local) - 1;
};
// A rank's message when it rejects its input: 384 bytes of text.
using call_descriptor = agreement_descriptor<call_field::count, 384>;

inline std::string shape_summary(const call_descriptor& d) {
  using f = call_field;
  const bool cross = d.values[f::seq_local_kv] != d.values[f::seq_local] || d.values[f::kv_seq_len] != d.values[f::seq_len];
  return "[batch " + std::to_string(d.values[f::batch]) + ", seq " + std::to_string(d.values[f::seq_local]) +
         (cross ? " (q) / " + std::to_string(d.values[f::seq_local_kv]) + " (kv)" : std::string()) + ", heads " + std::to_string(d.values[f::heads_q]) + "/" + std::to_string(d.values[f::heads_kv]) +
         " (q/kv), dim " + std::to_string(d.values[f::head_dim]) + "]";
}

// A softmax scale carried as the bits of a double.
inline std::int64_t scale_bits(double scale) noexcept {
  std::int64_t bits = 0;
  static_assert(sizeof bits == sizeof scale);
  std::memcpy(&bits, &scale, sizeof bits);
  return bits;
}
inline std::string scale_text(std::int64_t bits) {
  double scale = 0;
  std::memcpy(&scale, &bits, sizeof scale);
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", scale);
  return text;
}

// Throws the same cp_error on every rank when any descriptor failed or the descriptors
// disagree; `all` holds every rank's descriptor (any order: each carries its rank).
inline void agree_or_throw(const std::string& who, std::span<const call_descriptor> all) {
  int lowest = static_cast<int>(all.front().rank);
  for (const call_descriptor& c : all) lowest = std::min(lowest, static_cast<int>(c.rank));
  const agreement_verdict v = compare_descriptors(all, tags::cp::first, lowest, call_field::compared);
  if (!v) return;
  const auto of = [&](int rank) -> const call_descriptor& {
    for (const call_descriptor& c : all)
      if (c.rank == rank) return c;
    return all.front();
  };
  const std::string pair = "ranks " + std::to_string(v.reference) + " and " + std::to_string(v.rank);
  switch (v.what) {
    case agreement_verdict::kind::agreed: return;
    case agreement_verdict::kind::foreign:
      throw cp_error(who + ": a peer sent something that is not a CP call descriptor: the ranks are not all calling the "
                           "same context-parallel operation at the same time (check that every rank runs the same "
                           "sequence of collective calls)");
    case agreement_verdict::kind::failed:
      throw cp_error(who + ": rank " + std::to_string(v.rank) + " rejected its input, so every rank stops: " +
                     of(v.rank).failure_text());
    case agreement_verdict::kind::operation:
      throw cp_error(who + ": " + pair +
                     " are in different context-parallel operations (forward vs backward, or ring vs Ulysses); every "
                     "rank must make the same collective calls in the same order");
    case agreement_verdict::kind::field: break;
  }
  using f = call_field;
  if (v.field <= f::head_dim) {
    // The sequence extent may differ: shards of an uneven sharding do, and each rank checked
    // its own against sharding.local_len(rank) before the exchange.
    throw cp_error(who + ": ranks hold shards of different shapes: rank " + std::to_string(v.reference) + " has " +
                   shape_summary(of(v.reference)) + ", rank " + std::to_string(v.rank) + " has " +
                   shape_summary(of(v.rank)) +
                   "; every rank must pass the same batch, heads and head dim (only the sequence extent differs, by "
                   "the sharding)");
  }
  if (v.field <= f::sharding_fingerprint) {
    throw cp_error(who + ": " + pair +
                   " pass different sequence shardings or communicator sizes; build the same sequence_sharding on "
                   "every rank");
  }
  if (v.field <= f::kv_offset) {
    throw cp_error(who + ": " + pair +
                   " pass different key/value shardings or key position offsets (cross-attention); build the same "
                   "kv_sharding on every rank");
  }
  if (v.field == f::softmax_scale) {
    throw cp_error(who + ": " + pair + " pass different softmax scales (" + scale_text(v.reference_value) + " and " +
                   scale_text(v.value) +
                   " after 0 selects 1/sqrt(head dim)); every rank must pass the same cp_params::softmax_scale");
  }
  if (v.field == f::mask_fingerprint) {
    throw cp_error(who + ": " + pair +
                   " pass different masks (their types or parameters differ: window extents, prefix length, document "
                   "segment ids, block mask predicate, ...); every rank must pass the same mask, built over the global "
                   "sequence");
  }
  throw cp_error(who + ": " + pair + " use different element types; every rank must run the same precision");
}

// agree_or_throw, settling first (comm/agree.hpp) when the verdict is a cp_error.
template <class Settle>
void agree_settle_or_throw(const std::string& who, std::span<const call_descriptor> all, Settle&& settle) {
  std::exception_ptr verdict;
  try {
    agree_or_throw(who, all);
  } catch (const cp_error&) {
    verdict = std::current_exception();
  }
  if (!verdict) return;
  settle();
  std::rethrow_exception(verdict);
}

// The `stage` of comm/agree.hpp's exchanges for a memory space: its with_host_bytes.
template <class M>
auto staged_by(M& mem) {
  return [&mem](std::span<const std::byte> send, std::span<std::byte> recv, auto&& f) { mem.with_host_bytes(send, recv, f); };
}

}  // namespace baton::detail::cp
