// baton/cp/detail/ulysses_core.hpp — Ulysses' two all-to-alls, for any number of tensors at
// once: heads_from_sequence ([b, s/P, H, x] on every rank -> [b, s, H/P, x]) and its inverse
// sequence_from_heads. Shared by ulysses_attention and hybrid_attention.
#pragma once

#include <baton/cp/detail/ulysses_layout.hpp>
#include <baton/cp/merge.hpp>

#include <cstdint>
#include <span>
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

}  // namespace baton::detail::cp
