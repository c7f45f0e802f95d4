// baton/cp/detail/ulysses_layout.hpp — the data movement around Ulysses' all-to-all:
// [b, s/P, h, d] (sequence sharded) <-> [b, s, h/P, d] (heads sharded), as pack / unpack of
// contiguous per-rank blocks, plus the head-split rule (even, uneven, kv-head replication).
#pragma once

#include <baton/cp/detail/bshd.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/memory.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

namespace baton::detail::cp {

// How a tensor's `heads` heads are dealt to `parts` ranks: rank j gets count(j) heads, its
// local head i being the tensor's head source(j, i).
//  - even: heads divisible by parts; rank j gets [j h/P, (j+1) h/P).
//  - replicated (kv heads only, when h divides P and the query heads are even): each kv head
//    is repeated P/h times and rank j gets the single head j h / P — exactly the kv head its
//    query heads [j hq/P, (j+1) hq/P) use, since hq/P divides hq/h.
//  - uneven (query heads not divisible by P): the first h % P ranks get one head more; a
//    rank may get none (h < P).
//  - per_query (kv heads whose split cannot follow the query heads' otherwise): rank j gets,
//    for each of its query heads, that head's kv head — so locally it is plain multi-head
//    attention, and a kv head shared by several of its query heads is repeated. The
//    gradients of repeated heads are summed back (exact).
struct head_split {
  enum class mode : std::uint8_t { even, replicated, uneven, per_query };
  std::int64_t heads = 1;
  std::int64_t parts = 1;
  mode how = mode::even;
  std::int64_t q_heads = 0;  // per_query: the query heads, dealt unevenly or evenly

  std::int64_t count(std::int64_t rank) const noexcept {
    switch (how) {
      case mode::even: return heads / parts;
      case mode::replicated: return 1;
      case mode::uneven: return heads / parts + (rank < heads % parts ? 1 : 0);
      case mode::per_query: return q_heads / parts + (rank < q_heads % parts ? 1 : 0);
    }
    return 0;
  }
  std::int64_t max_count() const noexcept { return count(0); }
  // Every rank gets the same number of heads.
  bool uniform() const noexcept { return count(0) == count(parts - 1); }
  // Some head goes to more than one (rank, local head): its gradients are summed.
  bool sums() const noexcept { return how == mode::replicated || (how == mode::per_query && q_heads > heads); }
  std::int64_t source(std::int64_t rank, std::int64_t i) const noexcept {
    switch (how) {
      case mode::even: return rank * (heads / parts) + i;
      case mode::replicated: return rank * heads / parts;
      case mode::uneven: return rank * (heads / parts) + std::min(rank, heads % parts) + i;
      case mode::per_query: {
        const std::int64_t q = rank * (q_heads / parts) + std::min(rank, q_heads % parts) + i;
        return q / (q_heads / heads);
      }
    }
    return 0;
  }
  // The first head of a rank whose heads are one contiguous run (every mode but per_query).
  std::int64_t first(std::int64_t rank) const noexcept { return source(rank, 0); }
  bool replicated() const noexcept { return how == mode::replicated; }
  // Heads per rank when uniform.
  std::int64_t per_rank() const noexcept { return count(0); }
};

struct head_splits {
  head_split q, kv;
};

// The query and kv splits for hq query and hkv kv heads over P ranks (check_head_split first).
inline head_splits split_heads(std::int64_t q_heads, std::int64_t kv_heads, std::int64_t parts) {
  using m = head_split::mode;
  head_splits s;
  s.q = head_split{q_heads, parts, q_heads % parts == 0 ? m::even : m::uneven, 0};
  if (q_heads % parts == 0 && kv_heads % parts == 0)
    s.kv = head_split{kv_heads, parts, m::even, 0};
  else if (q_heads % parts == 0 && parts % kv_heads == 0)
    s.kv = head_split{kv_heads, parts, m::replicated, 0};
  else if (kv_heads == q_heads)
    s.kv = head_split{kv_heads, parts, m::uneven, 0};
  else
    s.kv = head_split{kv_heads, parts, m::per_query, q_heads};
  return s;
}

// Empty when fine, else why not (the caller prefixes who and which rank). Any head counts
// split (unevenly where they must, see head_split); only GQA's own rule remains.
inline std::string check_head_split(std::int64_t q_heads, std::int64_t kv_heads, std::int64_t parts) {
  if (parts < 1) return "the Ulysses degree must be at least 1";
  if (kv_heads < 1 || q_heads < 1 || q_heads % kv_heads != 0) {
    return "key/value heads (" + std::to_string(kv_heads) + ") must divide the query heads (" + std::to_string(q_heads) + ")";
  }
  return {};
}

// The all-to-all moves one block per peer; a block may carry several tensors one after the
// other (q, k, v), so the functions below read or write one tensor's part of one block and
// return the pointer past it. Every one is a copy (or a sum) issued on the memory space M,
// so the same code moves host or device memory; the overloads without M use host_memory.

// Sequence-sharded -> the part of block j: heads [h0, h0 + hc) of every local token,
// contiguous [b, s_local, hc, x].
template <class M, class T, class U>
T* pack_heads_part(M& mem, const tensor_view<U, 4>& src, std::int64_t h0, std::int64_t hc, T* out) {
  const tensor_view<T, 4> dst = bshd(out, src.extent(0), src.extent(1), hc, src.extent(3));
  mem.copy(src.slice(2, h0, hc).as_const(), dst);
  return out + dst.size();
}

// The part of received block i (rank i's tokens of my heads) -> rows [i s_local, (i+1) s_local)
// of dst [b, P s_local, hc, x].
template <class M, class T, class U>
const U* unpack_sequence_part(M& mem, const U* in, std::int64_t i, const tensor_view<T, 4>& dst, std::int64_t s_local) {
  const tensor_view<const U, 4> src = bshd(in, dst.extent(0), s_local, dst.extent(2), dst.extent(3));
  mem.copy(src, dst.slice(1, i * s_local, s_local));
  return in + src.size();
}

// The inverse direction: rows [i s_local, (i+1) s_local) of src [b, P s_local, hc, x] -> the
// part of block i, contiguous [b, s_local, hc, x].
template <class M, class T, class U>
T* pack_sequence_part(M& mem, const tensor_view<U, 4>& src, std::int64_t i, std::int64_t s_local, T* out) {
  const tensor_view<T, 4> dst = bshd(out, src.extent(0), s_local, src.extent(2), src.extent(3));
  mem.copy(src.slice(1, i * s_local, s_local).as_const(), dst);
  return out + dst.size();
}

// Rank j's heads within a received block: this tensor's part starts at part_offset within
// each block of block_size elements and holds [b, s_local, hc, x] (stored [b][hc][s_local][x]
// when head_major).
template <class U>
tensor_view<const U, 4> received_part(const U* recv, std::int64_t block_size, std::int64_t part_offset, std::int64_t j,
                             std::int64_t b, std::int64_t s_local, std::int64_t hc, std::int64_t x,
                             bool head_major = false) noexcept {
  const U* p = recv + j * block_size + part_offset;
  return head_major ? bshd_head_major(p, b, s_local, hc, x) : bshd(p, b, s_local, hc, x);
}

// Received blocks (block j = my tokens of rank j's heads; this tensor's part starts at
// part_offset within each block of block_size elements, head-major when head_major) -> dst
// [b, s_local, heads, x]. Where heads were replicated (gradients of replicated kv heads) the
// replicas are summed in rank order in accumulator type cp_accumulator_t<T> (in a buffer of
// the memory space): deterministic, and exact when nothing is replicated.
template <class M, class T, class U>
void unpack_heads_part(M& mem, const U* recv, std::int64_t block_size, std::int64_t part_offset,
                       const head_split& split, const tensor_view<T, 4>& dst, bool head_major = false) {
  using A = cp_accumulator_t<T>;
  const std::int64_t hc = split.per_rank(), b = dst.extent(0), sl = dst.extent(1), x = dst.extent(3);
  if (!split.replicated()) {
    // Each head comes from exactly one rank: copy rows of hc x inner. The value still goes
    // through A(0) + v, as the summing path does, so both give the same bits (-0 -> +0).
    for (std::int64_t j = 0; j < split.parts; ++j)
      mem.copy(received_part(recv, block_size, part_offset, j, b, sl, hc, x, head_major),
               dst.slice(2, split.first(j), hc), cp_copy_mode::through_accumulator);
    return;
  }
  auto sum = mem.template allocate<A>(static_cast<std::size_t>(dst.size()));
  const tensor_view<A, 4> acc = bshd(sum.data(), b, sl, dst.extent(2), x);
  mem.fill(std::span<A>(sum.data(), static_cast<std::size_t>(dst.size())), A(0));
  for (std::int64_t j = 0; j < split.parts; ++j)
    mem.accumulate(acc.slice(2, split.first(j), hc), received_part(recv, block_size, part_offset, j, b, sl, hc, x, head_major));
  mem.copy(acc.as_const(), dst);
}

// The host versions (the unit tests call these).
template <class T, class U>
T* pack_heads_part(const tensor_view<U, 4>& src, std::int64_t h0, std::int64_t hc, T* out) {
  host_memory mem;
  return pack_heads_part(mem, src, h0, hc, out);
}
template <class T, class U>
const U* unpack_sequence_part(const U* in, std::int64_t i, const tensor_view<T, 4>& dst, std::int64_t s_local) {
  host_memory mem;
  return unpack_sequence_part(mem, in, i, dst, s_local);
}
template <class T, class U>
T* pack_sequence_part(const tensor_view<U, 4>& src, std::int64_t i, std::int64_t s_local, T* out) {
  host_memory mem;
  return pack_sequence_part(mem, src, i, s_local, out);
}
template <class A, class T, class U>
void unpack_heads_part(const U* recv, std::int64_t block_size, std::int64_t part_offset, const head_split& split,
                       const tensor_view<T, 4>& dst) {
  static_assert(std::is_same_v<A, cp_accumulator_t<T>>, "unpack_heads_part sums in cp_accumulator_t<T>");
  host_memory mem;
  unpack_heads_part(mem, recv, block_size, part_offset, split, dst);
}

}  // namespace baton::detail::cp
