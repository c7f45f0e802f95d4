// baton/comm/concepts.hpp — what a communicator is, one concept per capability.
//
// Code that moves data between ranks (the pipeline executor, ring and Ulysses attention)
// names the capabilities it needs, not a transport:
//
//     template <ring_communicator C> void ring_step(C& comm, ...);
//
// and runs unchanged on the local world (threads) and MPI processes. The NCCL backend models
// the same concepts but is compiled only: it has not yet run on a GPU.
#pragma once

#include <baton/comm/error.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ranges>
#include <span>
#include <type_traits>
#include <utility>

namespace baton {

/// The element types `all_reduce` reduces: float, double, std::int32_t, std::int64_t.
template <class T>
concept reducible_element = std::same_as<T, float> || std::same_as<T, double> ||
                            std::same_as<T, std::int32_t> || std::same_as<T, std::int64_t>;

/// Element types the data-movement collectives (all_gather, all_to_all, broadcast) and the
/// typed point-to-point helpers accept: anything that can be copied as bytes.
template <class T>
concept communicable_element = std::is_trivially_copyable_v<T> && !std::is_reference_v<T>;

/// A pending transfer returned by `isend`, `irecv` and `shift`.
///
/// Requirements:
///  1. movable (and usually move-only: it stands for one transfer);
///  2. `r.wait()` blocks until the transfer is complete, and throws `baton::comm_error` when
///     it cannot complete (timeout, failed peer, size mismatch); the message names the
///     rank, the peer and the tag;
///  3. `r.test()` returns whether it is complete without blocking (and throws like wait()
///     when it has failed).
/// The buffer given to the operation belongs to the transfer until wait() or a true
/// test() returns: do not read (receive) or modify (send) it before.
template <class R>
concept comm_request = std::movable<R> && requires(R& r) {
  r.wait();
  { r.test() } -> std::same_as<bool>;
};

/// The base of every communicator: a group of `size()` ranks in which this one is `rank()`.
///
/// Requirements: `c.rank()` and `c.size()` return int, with 0 <= rank() < size().
///
///     template <communicator C> bool is_first(const C& c) { return c.rank() == 0; }
template <class C>
concept communicator = requires(const C& c) {
  { c.rank() } -> std::same_as<int>;
  { c.size() } -> std::same_as<int>;
};

/// Tagged, non-blocking point-to-point messages.
///
/// Requirements (on top of `communicator`):
///  1. `c.isend(std::span<const std::byte> data, int dest, int tag)` starts sending;
///  2. `c.irecv(std::span<std::byte> data, int source, int tag)` starts receiving;
///  both return a `comm_request`. Messages from one source to one destination with one tag
///  are matched in the order they were sent; different tags may be received in any order.
///  A message must exactly fill its receive buffer. Peers are ranks of `c`; tags are >= 0.
///
///     auto r = baton::irecv(c, std::span(in), /*source=*/0, /*tag=*/7);
///     r.wait();
template <class C>
concept point_to_point_communicator =
    communicator<C> && requires(C& c, std::span<const std::byte> send, std::span<std::byte> recv,
                                int peer, int tag) {
      { c.isend(send, peer, tag) } -> comm_request;
      { c.irecv(recv, peer, tag) } -> comm_request;
    };

/// `c.all_reduce(std::span<T> inout, reduce_op op)` for every `reducible_element` T:
/// on return every rank holds the element-wise reduction over all ranks. Floating-point
/// results are bitwise identical on every rank.
template <class C>
concept all_reduce_communicator =
    communicator<C> && requires(C& c, std::span<float> f, std::span<double> d, std::span<std::int32_t> i,
                                std::span<std::int64_t> l, reduce_op op) {
      c.all_reduce(f, op);
      c.all_reduce(d, op);
      c.all_reduce(i, op);
      c.all_reduce(l, op);
    };

/// `c.all_gather(std::span<const T> send, std::span<T> recv)`: recv holds size() blocks of
/// send.size() elements, block r being rank r's send.
template <class C>
concept all_gather_communicator =
    communicator<C> && requires(C& c, std::span<const float> fs, std::span<float> fr,
                                std::span<const std::byte> bs, std::span<std::byte> br) {
      c.all_gather(fs, fr);
      c.all_gather(bs, br);
    };

/// `c.all_to_all(send, recv)`: send holds size() equal blocks, block j going to rank j;
/// recv block i comes from rank i. `c.all_to_all_v(send, send_counts, recv, recv_counts)`
/// is the same with per-rank element counts (blocks contiguous, in rank order).
template <class C>
concept all_to_all_communicator =
    communicator<C> && requires(C& c, std::span<const float> fs, std::span<float> fr,
                                std::span<const std::byte> bs, std::span<std::byte> br,
                                std::span<const std::int64_t> counts) {
      c.all_to_all(fs, fr);
      c.all_to_all(bs, br);
      c.all_to_all_v(fs, counts, fr, counts);
      c.all_to_all_v(bs, counts, br, counts);
    };

/// `c.broadcast(std::span<T> data, int root)`: every rank ends with root's data.
template <class C>
concept broadcast_communicator =
    communicator<C> && requires(C& c, std::span<float> f, std::span<std::byte> b, int root) {
      c.broadcast(f, root);
      c.broadcast(b, root);
    };

/// `c.barrier()`: returns once every rank has called it.
template <class C>
concept barrier_communicator = communicator<C> && requires(C& c) { c.barrier(); };

/// `c.split(int color, int key)` (collective) returns, by value, a communicator of the same
/// type over the ranks that passed the same color, ranked by (key, old rank).
/// Colors must be >= 0 on every rank.
template <class C>
concept splittable_communicator = communicator<C> && requires(C& c, int color, int key) {
  { c.split(color, key) } -> std::same_as<C>;
};

/// A ring shift: `c.shift(std::span<const std::byte> send, std::span<std::byte> recv, int k,
/// int tag)` sends to rank (rank()+k) mod size() and receives from (rank()-k) mod size(),
/// returning a `comm_request` so the transfer overlaps compute until wait().
/// Every rank must call it with the same k and tag, and send and recv the same byte count.
template <class C>
concept ring_communicator =
    communicator<C> && requires(C& c, std::span<const std::byte> send, std::span<std::byte> recv, int k,
                                int tag) {
      { c.shift(send, recv, k, tag) } -> comm_request;
    };

/// Every collective above plus barrier: what data-parallel and context-parallel code
/// usually needs from one group.
template <class C>
concept collective_communicator = all_reduce_communicator<C> && all_gather_communicator<C> &&
                                  all_to_all_communicator<C> && broadcast_communicator<C> &&
                                  barrier_communicator<C>;

/// The largest message tag `c` accepts: `c.max_tag()` where the communicator has a bound
/// (MPI's MPI_TAG_UB, at least 32767), else INT_MAX.
template <communicator C>
[[nodiscard]] int tag_bound(const C& c) noexcept {
  if constexpr (requires { { c.max_tag() } -> std::convertible_to<int>; })
    return c.max_tag();
  else
    return std::numeric_limits<int>::max();
}

/// The request type a point-to-point communicator returns.
template <point_to_point_communicator C>
using comm_request_t = decltype(std::declval<C&>().isend(std::span<const std::byte>{}, 0, 0));

// ---- typed conveniences ---------------------------------------------------------------

/// Sends the elements of `data` as bytes: `baton::isend(c, std::span(v), dest, tag)`.
template <point_to_point_communicator C, communicable_element T>
[[nodiscard]] auto isend(C& c, std::span<T> data, int dest, int tag) {
  return c.isend(std::as_bytes(data), dest, tag);
}

/// Receives into the elements of `data`: `baton::irecv(c, std::span(v), source, tag)`.
template <point_to_point_communicator C, communicable_element T>
  requires(!std::is_const_v<T>)
[[nodiscard]] auto irecv(C& c, std::span<T> data, int source, int tag) {
  return c.irecv(std::as_writable_bytes(data), source, tag);
}

/// Typed ring shift: sends `send` to rank+k, receives `recv` from rank-k.
template <ring_communicator C, communicable_element T>
  requires(!std::is_const_v<T>)
[[nodiscard]] auto shift(C& c, std::span<const std::type_identity_t<T>> send, std::span<T> recv, int k,
                         int tag) {
  return c.shift(std::as_bytes(send), std::as_writable_bytes(recv), k, tag);
}

/// Waits for every request of a range in order. The first failure propagates; requests not
/// yet waited are then cancelled when their owner destroys them.
template <std::ranges::range Requests>
  requires comm_request<std::ranges::range_value_t<Requests>>
void wait_all(Requests& requests) {
  for (auto& r : requests) r.wait();
}

}  // namespace baton
