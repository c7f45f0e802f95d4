// baton/cp/detail/ulysses_core.hpp — Ulysses' two all-to-alls, for any number of tensors at
// once: heads_from_sequence ([b, s/P, H, x] on every rank -> [b, s, H/P, x]) and its inverse
// sequence_from_heads. Shared by ulysses_attention and hybrid_attention.
#pragma once

#include <baton/cp/detail/ulysses_layout.hpp>
#include <baton/cp/merge.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <type_traits>
#include <vector>

namespace baton::detail::cp {

// One tensor of a sequence -> heads exchange.
template <class T>
struct heads_part {
  view4<const T> sequence_sharded;  // [b, s_local, H, x] (source)
  head_split split;                 // how its H heads are dealt
  view4<T> head_sharded;            // [b, P s_local, per_rank, x] (destination)
};

// One tensor of the inverse exchange. Replicated heads are summed (gradients).
template <class T>
struct sequence_part {
  view4<const T> head_sharded;  // [b, P s_local, per_rank, x] (source)
  head_split split;
  view4<T> sequence_sharded;  // [b, s_local, H, x] (destination)
};

template <class T, class Comm>
void heads_from_sequence(Comm& comm, std::span<const heads_part<T>> parts) {
  const std::int64_t ranks = comm.size();
  std::int64_t block = 0;
  for (const auto& p : parts) block += p.sequence_sharded.ext[0] * p.sequence_sharded.ext[1] * p.split.per_rank() * p.sequence_sharded.ext[3];
  std::vector<T> send(static_cast<std::size_t>(block * ranks)), recv(send.size());
  T* out = send.data();
  for (std::int64_t j = 0; j < ranks; ++j)
    for (const auto& p : parts) out = pack_heads_part(p.sequence_sharded, p.split.first(j), p.split.per_rank(), out);
  comm.all_to_all(std::span<const T>(send), std::span<T>(recv));
  const T* in = recv.data();
  for (std::int64_t i = 0; i < ranks; ++i)
    for (const auto& p : parts) in = unpack_sequence_part(in, i, p.head_sharded, p.sequence_sharded.ext[1]);
}

template <class T, class Comm>
void sequence_from_heads(Comm& comm, std::span<const sequence_part<T>> parts) {
  using A = cp_accumulator_t<T>;
  const std::int64_t ranks = comm.size();
  std::int64_t block = 0;
  for (const auto& p : parts) block += p.sequence_sharded.ext[0] * p.sequence_sharded.ext[1] * p.split.per_rank() * p.sequence_sharded.ext[3];
  std::vector<T> send(static_cast<std::size_t>(block * ranks)), recv(send.size());
  T* out = send.data();
  for (std::int64_t i = 0; i < ranks; ++i)
    for (const auto& p : parts) out = pack_sequence_part(p.head_sharded, i, p.sequence_sharded.ext[1], out);
  comm.all_to_all(std::span<const T>(send), std::span<T>(recv));
  std::int64_t offset = 0;
  for (const auto& p : parts) {
    unpack_heads_part<A>(recv.data(), block, offset, p.split, p.sequence_sharded);
    offset += p.sequence_sharded.ext[0] * p.sequence_sharded.ext[1] * p.split.per_rank() * p.sequence_sharded.ext[3];
  }
}

// Grow-only scratch reused across calls. A Ulysses call needs up to a dozen tensors of
// b x s x h/P x d; allocating them afresh every call costs page faults and zero fills of the
// order of several percent of the attention itself (measured: bench_cp). Zeroed when it
// grows, so its contents are always defined. A copy starts empty: buffers belong to one
// object, which one rank uses at a time.
class scratch_buffer {
 public:
  scratch_buffer() = default;
  scratch_buffer(const scratch_buffer&) noexcept {}
  scratch_buffer& operator=(const scratch_buffer&) noexcept { return *this; }
  scratch_buffer(scratch_buffer&&) noexcept = default;
  scratch_buffer& operator=(scratch_buffer&&) noexcept = default;
  ~scratch_buffer() = default;

  // n elements of T; the previous contents are kept unless the buffer had to grow.
  template <class T>
  std::span<T> get(std::size_t n) {
    static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_default_constructible_v<T> &&
                      alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__,
                  "scratch_buffer holds plain numbers");
    const std::size_t bytes = n * sizeof(T);
    if (bytes > bytes_) {
      data_.reset(new std::byte[bytes]());
      bytes_ = bytes;
    }
    return {std::launder(reinterpret_cast<T*>(data_.get())), n};
  }
  void release() noexcept {
    data_.reset();
    bytes_ = 0;
  }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t bytes_ = 0;
};

// One tensor, sequence -> heads, received in place: per batch entry the all-to-all's receive
// buffer [P][s_local][hc][x] is exactly that entry's rows of the head-sharded
// [b, P s_local, hc, x] (rank i's tokens are rows [i s_local, (i+1) s_local)), so the
// all-to-all writes `dst` directly and nothing is unpacked. One all-to-all per batch entry.
template <class T, class Comm>
void heads_from_sequence_into(Comm& comm, const view4<const T>& src, const head_split& split, T* dst,
                              scratch_buffer& send_scratch) {
  const std::int64_t ranks = comm.size(), hc = split.per_rank();
  const std::int64_t block = src.ext[1] * hc * src.ext[3];
  const auto count = static_cast<std::size_t>(ranks * block);
  const std::span<T> send = send_scratch.get<T>(count);
  for (std::int64_t b = 0; b < src.ext[0]; ++b) {
    const view4<const T> rows = src.batch_slice(b);
    T* out = send.data();
    for (std::int64_t j = 0; j < ranks; ++j) out = pack_heads_part(rows, split.first(j), hc, out);
    comm.all_to_all(std::span<const T>(send), std::span<T>(dst + b * ranks * block, count));
  }
}

// The inverse, sent in place: per batch entry the head-sharded rows [P s_local, hc, x] of
// `src` are already the all-to-all's send blocks (block j = rank j's tokens), so nothing is
// packed; the receive buffer is unpacked into dst [b, s_local, H, x], summing replicas.
template <class T, class Comm>
void sequence_from_heads_from(Comm& comm, const T* src, const head_split& split, const view4<T>& dst,
                              scratch_buffer& recv_scratch) {
  using A = cp_accumulator_t<T>;
  const std::int64_t ranks = comm.size(), hc = split.per_rank();
  const std::int64_t block = dst.ext[1] * hc * dst.ext[3];
  const auto count = static_cast<std::size_t>(ranks * block);
  const std::span<T> recv = recv_scratch.get<T>(count);
  for (std::int64_t b = 0; b < dst.ext[0]; ++b) {
    comm.all_to_all(std::span<const T>(src + b * ranks * block, count), recv);
    unpack_heads_part<A>(recv.data(), block, 0, split, dst.batch_slice(b));
  }
}

// The general exchange, for shards of different lengths or heads dealt unevenly (see
// head_split): one all-to-all whose blocks are all sized for the longest shard and the most
// heads, [b][max_len][max_heads][x], the unused rows and heads left zero. The receiving side
// copies out only what it needs, so the padding never reaches a result.
struct exchange_shape {
  std::vector<std::int64_t> lens;  // tokens each rank of the group holds
  std::int64_t rank = 0;           // this rank in the group

  std::int64_t max_len() const noexcept {
    std::int64_t m = 0;
    for (std::int64_t l : lens) m = std::max(m, l);
    return m;
  }
  std::int64_t total() const noexcept {
    std::int64_t n = 0;
    for (std::int64_t l : lens) n += l;
    return n;
  }
  std::int64_t offset(std::int64_t i) const noexcept {
    std::int64_t n = 0;
    for (std::int64_t j = 0; j < i; ++j) n += lens[static_cast<std::size_t>(j)];
    return n;
  }
  bool even() const noexcept { return max_len() * static_cast<std::int64_t>(lens.size()) == total(); }
};

// The exchanges can take the in-place paths above: equal shards and contiguous, equal head
// groups.
inline bool in_place_exchange(const exchange_shape& e, const head_split& split) noexcept {
  return e.even() && (split.how == head_split::mode::even || split.how == head_split::mode::replicated);
}

// Sequence-sharded src [b, lens[me], H, x] -> head-sharded dst [b, sum(lens), count(me), x].
template <class T, class Comm>
void heads_from_sequence_general(Comm& comm, const exchange_shape& e, const view4<const T>& src, const head_split& split,
                                 const view4<T>& dst, scratch_buffer& send_scratch, scratch_buffer& recv_scratch) {
  const std::int64_t ranks = comm.size(), me = e.rank, b = src.ext[0], x = src.ext[3];
  const std::int64_t rows = e.max_len(), heads = split.max_count();
  const std::int64_t block = b * rows * heads * x;
  const auto count = static_cast<std::size_t>(ranks * block);
  const std::span<T> send = send_scratch.get<T>(count), recv = recv_scratch.get<T>(count);
  std::fill(send.begin(), send.end(), T(0));
  const std::int64_t mine = e.lens[static_cast<std::size_t>(me)];
  for (std::int64_t j = 0; j < ranks; ++j)
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t t = 0; t < mine; ++t)
        for (std::int64_t i = 0; i < split.count(j); ++i) {
          T* out = send.data() + j * block + ((bi * rows + t) * heads + i) * x;
          const std::int64_t h = split.source(j, i);
          for (std::int64_t c = 0; c < x; ++c) out[c] = src(bi, t, h, c);
        }
  comm.all_to_all(std::span<const T>(send), recv);
  for (std::int64_t i = 0; i < ranks; ++i) {
    const std::int64_t at = e.offset(i);
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t t = 0; t < e.lens[static_cast<std::size_t>(i)]; ++t)
        for (std::int64_t h = 0; h < split.count(me); ++h) {
          const T* in = recv.data() + i * block + ((bi * rows + t) * heads + h) * x;
          for (std::int64_t c = 0; c < x; ++c) dst(bi, at + t, h, c) = in[c];
        }
  }
}

// The inverse: head-sharded src [b, sum(lens), count(me), x] -> sequence-sharded dst
// [b, lens[me], H, x]. A head dealt to several (rank, local head) is summed over them in
// rank order in accumulator type A (gradients of repeated kv heads); every other head is
// copied through A(0) + v, as the in-place path does, so both give the same bits.
template <class T, class Comm>
void sequence_from_heads_general(Comm& comm, const exchange_shape& e, const view4<const T>& src, const head_split& split,
                                 const view4<T>& dst, scratch_buffer& send_scratch, scratch_buffer& recv_scratch) {
  using A = cp_accumulator_t<T>;
  const std::int64_t ranks = comm.size(), me = e.rank, b = dst.ext[0], x = dst.ext[3], all_heads = dst.ext[2];
  const std::int64_t rows = e.max_len(), heads = split.max_count();
  const std::int64_t block = b * rows * heads * x;
  const auto count = static_cast<std::size_t>(ranks * block);
  const std::span<T> send = send_scratch.get<T>(count), recv = recv_scratch.get<T>(count);
  std::fill(send.begin(), send.end(), T(0));
  for (std::int64_t j = 0; j < ranks; ++j) {
    const std::int64_t at = e.offset(j);
    for (std::int64_t bi = 0; bi < b; ++bi)
      for (std::int64_t t = 0; t < e.lens[static_cast<std::size_t>(j)]; ++t)
        for (std::int64_t h = 0; h < split.count(me); ++h) {
          T* out = send.data() + j * block + ((bi * rows + t) * heads + h) * x;
          for (std::int64_t c = 0; c < x; ++c) out[c] = src(bi, at + t, h, c);
        }
  }
  comm.all_to_all(std::span<const T>(send), recv);
  const std::int64_t mine = e.lens[static_cast<std::size_t>(me)];
  std::vector<A> sum(static_cast<std::size_t>(all_heads * x));
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t t = 0; t < mine; ++t) {
      std::fill(sum.begin(), sum.end(), A(0));
      for (std::int64_t j = 0; j < ranks; ++j)
        for (std::int64_t i = 0; i < split.count(j); ++i) {
          const T* in = recv.data() + j * block + ((bi * rows + t) * heads + i) * x;
          A* acc = sum.data() + split.source(j, i) * x;
          for (std::int64_t c = 0; c < x; ++c) acc[c] += static_cast<A>(in[c]);
        }
      for (std::int64_t h = 0; h < all_heads; ++h)
        for (std::int64_t c = 0; c < x; ++c) dst(bi, t, h, c) = static_cast<T>(sum[static_cast<std::size_t>(h * x + c)]);
    }
}

}  // namespace baton::detail::cp
