// baton/cp/detail/ulysses_core.hpp — Ulysses' two all-to-alls, for any number of tensors at
// once: heads_from_sequence ([b, s/P, H, x] on every rank -> [b, s, H/P, x]) and its inverse
// sequence_from_heads. Shared by ulysses_attention and hybrid_attention. Every buffer comes
// from the memory space M and every pack / unpack is a copy issued on it (memory.hpp); M is
// synchronised before a buffer is handed to the communicator.
#pragma once

#include <baton/cp/detail/ulysses_layout.hpp>
#include <baton/cp/memory.hpp>
#include <baton/cp/merge.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

namespace baton::detail::cp {

// One tensor of a sequence -> heads exchange.
template <class T>
struct heads_part {
  tensor_view<const T, 4> sequence_sharded;  // [b, s_local, H, x] (source)
  head_split split;                 // how its H heads are dealt
  tensor_view<T, 4> head_sharded;            // [b, P s_local, per_rank, x] (destination)
};

// One tensor of the inverse exchange. Replicated heads are summed (gradients).
template <class T>
struct sequence_part {
  tensor_view<const T, 4> head_sharded;  // [b, P s_local, per_rank, x] (source)
  head_split split;
  tensor_view<T, 4> sequence_sharded;  // [b, s_local, H, x] (destination)
};

// Elements a part puts in each rank's block of the exchange: [b, s_local, per_rank, x].
template <class Part>
std::int64_t part_block(const Part& p) noexcept {
  return p.sequence_sharded.extent(0) * p.sequence_sharded.extent(1) * p.split.per_rank() *
         p.sequence_sharded.extent(3);
}

// One all-to-all for every part at once: each rank's block holds every part's part_block
// elements, in order. `pack(part, rank, out)` writes a part's share for a rank at `out` and
// returns where the next one goes; `unpack(recv, block)` reads what arrived (block: the
// elements per rank).
template <class T, class Comm, class M, class Part, class Pack, class Unpack>
void exchange_parts(Comm& comm, M& mem, std::span<const Part> parts, Pack&& pack, Unpack&& unpack) {
  const std::int64_t ranks = comm.size();
  std::int64_t block = 0;
  for (const auto& p : parts) block += part_block(p);
  const auto count = static_cast<std::size_t>(block * ranks);
  auto send = mem.template allocate<T>(count), recv = mem.template allocate<T>(count);
  T* out = send.data();
  for (std::int64_t j = 0; j < ranks; ++j)
    for (const auto& p : parts) out = pack(p, j, out);
  mem.synchronize();
  comm.all_to_all(std::span<const T>(send.data(), count), std::span<T>(recv.data(), count));
  unpack(static_cast<const T*>(recv.data()), block);
}

template <class T, class Comm, class M>
void heads_from_sequence(Comm& comm, M& mem, std::span<const heads_part<T>> parts) {
  exchange_parts<T>(
      comm, mem, parts,
      [&](const heads_part<T>& p, std::int64_t j, T* out) {
        return pack_heads_part(mem, p.sequence_sharded, p.split.first(j), p.split.per_rank(), out);
      },
      [&](const T* in, std::int64_t) {
        for (std::int64_t i = 0; i < comm.size(); ++i)
          for (const auto& p : parts) in = unpack_sequence_part(mem, in, i, p.head_sharded, p.sequence_sharded.extent(1));
      });
}

template <class T, class Comm, class M>
void sequence_from_heads(Comm& comm, M& mem, std::span<const sequence_part<T>> parts) {
  exchange_parts<T>(
      comm, mem, parts,
      [&](const sequence_part<T>& p, std::int64_t i, T* out) {
        return pack_sequence_part(mem, p.head_sharded, i, p.sequence_sharded.extent(1), out);
      },
      [&](const T* in, std::int64_t block) {
        std::int64_t offset = 0;  // where the part starts in each rank's block
        for (const auto& p : parts) {
          unpack_heads_part(mem, in, block, offset, p.split, p.sequence_sharded);
          offset += part_block(p);
        }
      });
}

// The exchanges' scratch: grow-only buffers of the memory space reused across calls. A
// Ulysses call needs up to a dozen tensors of b x s x h/P x d; allocating them afresh every
// call costs page faults and zero fills on every call, a share of the attention that
// bench_cp's Ulysses figures show.

// One tensor, sequence -> heads, received in place: per batch entry the all-to-all's receive
// buffer [P][s_local][hc][x] is exactly that entry's rows of the head-sharded
// [b, P s_local, hc, x] (rank i's tokens are rows [i s_local, (i+1) s_local)), so the
// all-to-all writes `dst` directly and nothing is unpacked. One all-to-all per batch entry.
template <class T, class Comm, class M>
void heads_from_sequence_into(Comm& comm, M& mem, const tensor_view<const T, 4>& src, const head_split& split, T* dst,
                              scratch<M>& send_scratch) {
  const std::int64_t ranks = comm.size(), hc = split.per_rank();
  const std::int64_t block = src.extent(1) * hc * src.extent(3);
  const auto count = static_cast<std::size_t>(ranks * block);
  T* const send = send_scratch.template get<T>(mem, count);
  for (std::int64_t b = 0; b < src.extent(0); ++b) {
    const tensor_view<const T, 4> rows = src.slice(0, b, 1);
    T* out = send;
    for (std::int64_t j = 0; j < ranks; ++j) out = pack_heads_part(mem, rows, split.first(j), hc, out);
    mem.synchronize();
    comm.all_to_all(std::span<const T>(send, count), std::span<T>(dst + b * ranks * block, count));
  }
}

// The inverse, sent in place: per batch entry the head-sharded rows [P s_local, hc, x] of
// `src` are already the all-to-all's send blocks (block j = rank j's tokens), so nothing is
// packed; the receive buffer is unpacked into dst [b, s_local, H, x], summing replicas.
template <class T, class Comm, class M>
void sequence_from_heads_from(Comm& comm, M& mem, const T* src, const head_split& split, const tensor_view<T, 4>& dst,
                              scratch<M>& recv_scratch) {
  const std::int64_t ranks = comm.size(), hc = split.per_rank();
  const std::int64_t block = dst.extent(1) * hc * dst.extent(3);
  const auto count = static_cast<std::size_t>(ranks * block);
  T* const recv = recv_scratch.template get<T>(mem, count);
  mem.synchronize();  // src was written by the backend (or the ring) on the memory space
  for (std::int64_t b = 0; b < dst.extent(0); ++b) {
    comm.all_to_all(std::span<const T>(src + b * ranks * block, count), std::span<T>(recv, count));
    unpack_heads_part(mem, recv, block, 0, split, dst.slice(0, b, 1));
    mem.synchronize();  // the unpack reads recv before the next batch entry overwrites it
  }
}

// The buffers of a head-major exchange (below): per rank a block of one batch entry's s_local
// tokens of hc heads, stored [hc][s_local][x], in the send and the receive scratch.
template <class T>
struct head_major_blocks {
  std::int64_t ranks, s_local, hc, x;
  T* send;
  T* recv;
  template <class M>
  head_major_blocks(M& mem, std::int64_t ranks_, std::int64_t s_local_, std::int64_t hc_, std::int64_t x_,
                    scratch<M>& send_scratch, scratch<M>& recv_scratch)
      : ranks(ranks_), s_local(s_local_), hc(hc_), x(x_),
        send(send_scratch.template get<T>(mem, count())), recv(recv_scratch.template get<T>(mem, count())) {}
  std::int64_t block() const noexcept { return s_local * hc * x; }
  std::size_t count() const noexcept { return static_cast<std::size_t>(ranks * block()); }
  // Block j of `base` as [1, s_local, hc, x].
  template <class U>
  tensor_view<U, 4> at(U* base, std::int64_t j) const noexcept {
    return bshd_head_major(base + j * block(), 1, s_local, hc, x);
  }
  template <class Comm>
  void exchange(Comm& comm) const {
    comm.all_to_all(std::span<const T>(send, count()), std::span<T>(recv, count()));
  }
};

// One tensor, sequence -> heads, into a head-major dst: dst is the [b, P s_local, hc, x] view
// of a buffer stored [b][hc][P s_local][x] (bshd_head_major). Rank i's tokens of a head are
// one run of s_local x elements there, so each rank packs its block for rank j head-major,
// [hc][s_local][x] (the pack writes hc streams of x elements), and what arrives is copied
// run by run to its place: one copy of whole runs more than the in-place exchange above, for
// a backend that then reads each head's rows one after another instead of hc x apart — on
// the host kernels a tenth of a document-masked call (docs/context-parallel.md). One
// all-to-all per batch entry.
template <class T, class Comm, class M>
void heads_from_sequence_head_major(Comm& comm, M& mem, const tensor_view<const T, 4>& src, const head_split& split,
                                    const tensor_view<T, 4>& dst, scratch<M>& send_scratch, scratch<M>& recv_scratch) {
  const head_major_blocks<T> io(mem, comm.size(), src.extent(1), split.per_rank(), src.extent(3), send_scratch,
                                recv_scratch);
  for (std::int64_t b = 0; b < src.extent(0); ++b) {
    const tensor_view<const T, 4> rows = src.slice(0, b, 1);
    for (std::int64_t j = 0; j < io.ranks; ++j) mem.copy(rows.slice(2, split.first(j), io.hc), io.at(io.send, j));
    mem.synchronize();
    io.exchange(comm);
    const tensor_view<T, 4> mine = dst.slice(0, b, 1);
    for (std::int64_t i = 0; i < io.ranks; ++i)
      mem.copy(heads_outer(io.at(static_cast<const T*>(io.recv), i)), heads_outer(mine.slice(1, i * io.s_local, io.s_local)));
    mem.synchronize();  // the copies read recv before the next batch entry's all-to-all overwrites it
  }
}

// The inverse, from a head-major src (the [b, P s_local, hc, x] view of [b][hc][P s_local][x]):
// rank j's tokens of each head are copied run by run into its block, [hc][s_local][x], and
// the blocks received are unpacked into dst [b, s_local, H, x], summing replicas.
template <class T, class Comm, class M>
void sequence_from_heads_head_major(Comm& comm, M& mem, const tensor_view<const T, 4>& src, const head_split& split,
                                    const tensor_view<T, 4>& dst, scratch<M>& send_scratch, scratch<M>& recv_scratch) {
  const head_major_blocks<T> io(mem, comm.size(), dst.extent(1), split.per_rank(), dst.extent(3), send_scratch,
                                recv_scratch);
  for (std::int64_t b = 0; b < dst.extent(0); ++b) {
    const tensor_view<const T, 4> heads = src.slice(0, b, 1);
    for (std::int64_t j = 0; j < io.ranks; ++j)
      mem.copy(heads_outer(heads.slice(1, j * io.s_local, io.s_local)), heads_outer(io.at(io.send, j)));
    mem.synchronize();  // src was written by the backend on the memory space, the blocks just now
    io.exchange(comm);
    unpack_heads_part(mem, static_cast<const T*>(io.recv), io.block(), 0, split, dst.slice(0, b, 1), /*head_major=*/true);
    mem.synchronize();  // the unpack reads recv before the next batch entry overwrites it
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

// The layout of the general exchange's blocks: [b][max_len][max_heads][x], block j at j block.
template <class T>
tensor_view<T, 4> exchange_block(T* base, std::int64_t block, std::int64_t j, std::int64_t head, std::int64_t b,
                        std::int64_t len, std::int64_t heads, std::int64_t rows, std::int64_t max_heads,
                        std::int64_t x) noexcept {
  return {base + j * block + head * x, {{b, len, heads, x}, {rows * max_heads * x, max_heads * x, x, 1}}};
}

// The general exchange around `pack` and `unpack`: one all-to-all of [b][max_len][max_heads][x]
// blocks (exchange_block), the send buffer zeroed first. pack(to) writes rank j's block
// through to(j, head, len, heads): the view of `len` rows and `heads` heads from local head
// `head`; unpack(from) reads what arrived from rank i through from(i, head, len, heads).
template <class T, class Comm, class M, class Pack, class Unpack>
void padded_exchange(Comm& comm, M& mem, const exchange_shape& e, const head_split& split, std::int64_t b,
                     std::int64_t x, scratch<M>& send_scratch, scratch<M>& recv_scratch, Pack&& pack,
                     Unpack&& unpack) {
  const std::int64_t ranks = comm.size(), rows = e.max_len(), heads = split.max_count();
  const std::int64_t block = b * rows * heads * x;
  const auto count = static_cast<std::size_t>(ranks * block);
  T* const send = send_scratch.template get<T>(mem, count);
  T* const recv = recv_scratch.template get<T>(mem, count);
  mem.fill(std::span<T>(send, count), T(0));
  pack([&](std::int64_t j, std::int64_t head, std::int64_t len, std::int64_t count_heads) {
    return exchange_block(send, block, j, head, b, len, count_heads, rows, heads, x);
  });
  mem.synchronize();
  comm.all_to_all(std::span<const T>(send, count), std::span<T>(recv, count));
  unpack([&](std::int64_t i, std::int64_t head, std::int64_t len, std::int64_t count_heads) {
    return exchange_block(static_cast<const T*>(recv), block, i, head, b, len, count_heads, rows, heads, x);
  });
}

// Sequence-sharded src [b, lens[me], H, x] -> head-sharded dst [b, sum(lens), count(me), x].
template <class T, class Comm, class M>
void heads_from_sequence_general(Comm& comm, M& mem, const exchange_shape& e, const tensor_view<const T, 4>& src,
                                 const head_split& split, const tensor_view<T, 4>& dst, scratch<M>& send_scratch,
                                 scratch<M>& recv_scratch) {
  const std::int64_t ranks = comm.size(), me = e.rank, mine = e.lens[static_cast<std::size_t>(me)];
  padded_exchange<T>(
      comm, mem, e, split, src.extent(0), src.extent(3), send_scratch, recv_scratch,
      [&](const auto& to) {
        for (std::int64_t j = 0; j < ranks; ++j)
          for (std::int64_t i = 0; i < split.count(j); ++i) mem.copy(src.slice(2, split.source(j, i), 1), to(j, i, mine, 1));
      },
      [&](const auto& from) {
        for (std::int64_t i = 0; i < ranks; ++i) {
          const std::int64_t len = e.lens[static_cast<std::size_t>(i)];
          mem.copy(from(i, 0, len, split.count(me)), dst.slice(1, e.offset(i), len));
        }
      });
}

// The inverse: head-sharded src [b, sum(lens), count(me), x] -> sequence-sharded dst
// [b, lens[me], H, x]. A head dealt to several (rank, local head) is summed over them in
// rank order in accumulator type A (gradients of repeated kv heads); every other head is
// copied through A(0) + v, as the in-place path does, so both give the same bits.
template <class T, class Comm, class M>
void sequence_from_heads_general(Comm& comm, M& mem, const exchange_shape& e, const tensor_view<const T, 4>& src,
                                 const head_split& split, const tensor_view<T, 4>& dst, scratch<M>& send_scratch,
                                 scratch<M>& recv_scratch) {
  using A = cp_accumulator_t<T>;
  const std::int64_t ranks = comm.size(), me = e.rank, mine = e.lens[static_cast<std::size_t>(me)];
  const std::int64_t b = dst.extent(0), x = dst.extent(3), all_heads = dst.extent(2);
  padded_exchange<T>(
      comm, mem, e, split, b, x, send_scratch, recv_scratch,
      [&](const auto& to) {
        for (std::int64_t j = 0; j < ranks; ++j) {
          const std::int64_t len = e.lens[static_cast<std::size_t>(j)];
          mem.copy(src.slice(1, e.offset(j), len), to(j, 0, len, split.count(me)));
        }
      },
      [&](const auto& from) {
        const auto n = static_cast<std::size_t>(b * mine * all_heads * x);
        auto sum = mem.template allocate<A>(n);
        const tensor_view<A, 4> acc = bshd(sum.data(), b, mine, all_heads, x);
        mem.fill(std::span<A>(sum.data(), n), A(0));
        for (std::int64_t j = 0; j < ranks; ++j)
          for (std::int64_t i = 0; i < split.count(j); ++i)
            mem.accumulate(acc.slice(2, split.source(j, i), 1), from(j, i, mine, 1));
        mem.copy(acc.as_const(), dst);
      });
}

}  // namespace baton::detail::cp
