// baton/core/tags.hpp — the tag registry: which point-to-point message tags each protocol and
// data stream of baton uses, so that layers sharing one communicator never read each other's
// messages.
//
// Every layer that starts exchanges on its own — the MPI communicator's agreement and chunked
// all-reduce, context parallelism's agreement and ring transfers, the pipeline's agreement,
// loss and stage-to-stage data — takes its tags from a range of baton::tags::registry. The
// ranges are checked at compile time to be disjoint: a range that overlaps another does not
// compile, and the error names both. Tags below tags::first_reserved are the application's:
// baton never uses them, so a program may send its own messages on a communicator it shares
// with baton. A stream whose length depends on the run (the pipeline's data: one tag per
// microbatch, stage boundary and direction) is open-ended, up to the communicator's tag bound;
// its user checks at construction that the run fits, and refuses one that does not with a
// message naming the limit, rather than reuse a tag within a call.
#pragma once

#include <baton/core/meta.hpp>

#include <climits>
#include <cstddef>
#include <string_view>

namespace baton {

/// A range of tags of one protocol or data stream: [First, First + Count), or [First, the
/// communicator's largest tag] when Count is tag_range_to_bound.
template <fixed_string Name, int First, int Count>
struct tag_range {
  static_assert(First >= 0, "baton tag_range: tags are non-negative (MPI's rule): start the range at 0 or above");
  static_assert(Count >= 1 || Count == -1,
                "baton tag_range: a range holds at least one tag (or is open-ended: tag_range_to_bound)");
  static_assert(First <= INT_MAX - (Count < 0 ? 0 : Count), "baton tag_range: the range ends past INT_MAX");

  static constexpr std::string_view name = Name.view();
  static constexpr int first = First;
  static constexpr bool open_ended = Count == -1;
  /// The last tag of the range (INT_MAX for an open-ended one: the communicator's bound decides).
  static constexpr int last = open_ended ? INT_MAX : First + Count - 1;

  /// The k-th tag of the range, for a fixed range's compile-time k.
  template <int K>
  static constexpr int tag = [] {
    static_assert(K >= 0 && (open_ended || K < Count), "baton tag_range: tag index outside the range");
    return First + K;
  }();
};

/// The Count of an open-ended tag_range.
inline constexpr int tag_range_to_bound = -1;

namespace detail::core {
// Instantiated for every pair of ranges of a registry, so that a compiler error about an
// overlap shows the two ranges (with their names) in its "required from" lines.
template <class A, class B>
struct tag_ranges_must_not_overlap {
  static_assert(A::last < B::first || B::last < A::first,
                "baton tag registry: two tag ranges overlap (the two tag_range types this is instantiated with): "
                "give every protocol and data stream a range of its own");
  static constexpr bool value = true;
};

template <class A, class... Rest>
constexpr bool disjoint_from_each() {
  return (tag_ranges_must_not_overlap<A, Rest>::value && ...);
}
template <class... Ranges>
struct pairwise_disjoint;
template <>
struct pairwise_disjoint<> {
  static constexpr bool value = true;
};
template <class A, class... Rest>
struct pairwise_disjoint<A, Rest...> {
  static constexpr bool value = disjoint_from_each<A, Rest...>() && pairwise_disjoint<Rest...>::value;
};
}  // namespace detail::core

/// A set of tag ranges that are pairwise disjoint (checked when the registry is instantiated).
template <class... Ranges>
struct tag_registry {
  static constexpr bool disjoint = detail::core::pairwise_disjoint<Ranges...>::value;
  static constexpr std::size_t size = sizeof...(Ranges);
};

/// baton's own tags. Messages of one (source, destination, tag) are matched in the order they
/// were sent, so a protocol whose messages every rank issues in the same order needs few tags.
namespace tags {
/// Tags [0, first_reserved) are the application's.
inline constexpr int first_reserved = 1 << 10;
/// mpi_communicator's collectives, on its private duplicate of the user's communicator:
/// the agreement header (and a small all-reduce's data), a rank's piece of another rank's
/// chunk, a reduced chunk sent back.
using comm_mpi = tag_range<"comm.mpi", first_reserved, 3>;
/// Context parallelism (ring, Ulysses, hybrid): the agreement, K/V blocks, gradient blocks,
/// and the settling rounds before every rank throws an agreed error.
using cp = tag_range<"cp", first_reserved + 16, 4>;
/// The pipeline executor: its agreement (fingerprints), the loss, then its data — one tag
/// per (microbatch, stage boundary, direction) of a call, never reused within the call; a
/// second executor on the same communicator starts after the first one's (tag_offset).
using pipeline = tag_range<"pipeline", first_reserved + 32, tag_range_to_bound>;

using registry = tag_registry<comm_mpi, cp, pipeline>;
static_assert(registry::disjoint);
}  // namespace tags

}  // namespace baton
