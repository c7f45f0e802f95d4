// baton/cp/detail/ulysses_layout.hpp — the data movement around Ulysses' all-to-all:
// [b, s/P, h, d] (sequence sharded) <-> [b, s, h/P, d] (heads sharded), as pack / unpack of
// contiguous per-rank blocks, plus the head-split rule (even, uneven, kv-head replication).
#pragma once

#include <baton/cp/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

namespace baton::detail::cp {

// A strided 4-D view [batch, seq, heads, inner]. The LSE [batch, heads, seq] is viewed as
// [batch, seq, heads, 1] with swapped strides, so one set of transforms serves both.
template <class T>
struct view4 {
  T* data = nullptr;
  std::array<std::int64_t, 4> ext{};
  std::array<std::int64_t, 4> str{};

  T& operator()(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t x) const noexcept {
    return data[b * str[0] + s * str[1] + h * str[2] + x * str[3]];
  }
  std::int64_t size() const noexcept { return ext[0] * ext[1] * ext[2] * ext[3]; }
  view4<const T> as_const() const noexcept { return {data, ext, str}; }
  // The single batch entry `b`, as a view of batch extent 1.
  view4 batch_slice(std::int64_t b) const noexcept {
    view4 v = *this;
    v.data = data + b * str[0];
    v.ext[0] = 1;
    return v;
  }
  // The rows [begin, begin + count) of the sequence axis.
  view4 seq_slice(std::int64_t begin, std::int64_t count) const noexcept {
    view4 v = *this;
    v.data = data + begin * str[1];
    v.ext[1] = count;
    return v;
  }
};

template <class T>
view4<T> bshd(T* p, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) noexcept {
  return {p, {b, s, h, d}, {s * h * d, h * d, d, 1}};
}

// A contiguous LSE [b, h, s] seen as [b, s, h, 1].
template <class T>
view4<T> lse_as_bshd(T* p, std::int64_t b, std::int64_t h, std::int64_t s) noexcept {
  return {p, {b, s, h, 1}, {h * s, 1, s, 1}};
}

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
// return the pointer past it.

// Sequence-sharded -> the part of block j: heads [h0, h0 + hc) of every local token,
// contiguous [b, s_local, hc, x].
template <class T, class U>
T* pack_heads_part(const view4<U>& src, std::int64_t h0, std::int64_t hc, T* out) {
  for (std::int64_t b = 0; b < src.ext[0]; ++b)
    for (std::int64_t s = 0; s < src.ext[1]; ++s)
      for (std::int64_t h = 0; h < hc; ++h)
        for (std::int64_t x = 0; x < src.ext[3]; ++x) *out++ = static_cast<T>(src(b, s, h0 + h, x));
  return out;
}

// The part of received block i (rank i's tokens of my heads) -> rows [i s_local, (i+1) s_local)
// of dst [b, P s_local, hc, x].
template <class T, class U>
const U* unpack_sequence_part(const U* in, std::int64_t i, const view4<T>& dst, std::int64_t s_local) {
  for (std::int64_t b = 0; b < dst.ext[0]; ++b)
    for (std::int64_t s = 0; s < s_local; ++s)
      for (std::int64_t h = 0; h < dst.ext[2]; ++h)
        for (std::int64_t x = 0; x < dst.ext[3]; ++x) dst(b, i * s_local + s, h, x) = static_cast<T>(*in++);
  return in;
}

// The inverse direction: rows [i s_local, (i+1) s_local) of src [b, P s_local, hc, x] -> the
// part of block i, contiguous [b, s_local, hc, x].
template <class T, class U>
T* pack_sequence_part(const view4<U>& src, std::int64_t i, std::int64_t s_local, T* out) {
  for (std::int64_t b = 0; b < src.ext[0]; ++b)
    for (std::int64_t s = 0; s < s_local; ++s)
      for (std::int64_t h = 0; h < src.ext[2]; ++h)
        for (std::int64_t x = 0; x < src.ext[3]; ++x) *out++ = static_cast<T>(src(b, i * s_local + s, h, x));
  return out;
}

// Received blocks (block j = my tokens of rank j's heads; this tensor's part starts at
// part_offset within each block of block_size elements) -> dst [b, s_local, heads, x].
// Where heads were replicated (gradients of replicated kv heads) the replicas are summed in
// rank order in accumulator type A: deterministic, and exact when nothing is replicated.
template <class A, class T, class U>
void unpack_heads_part(const U* recv, std::int64_t block_size, std::int64_t part_offset, const head_split& split,
                       const view4<T>& dst) {
  const std::int64_t hc = split.per_rank();
  if (!split.replicated()) {
    // Each head comes from exactly one rank: copy rows of hc x inner. The value still goes
    // through A(0) + v, as the summing path does, so both give the same bits (-0 -> +0).
    for (std::int64_t b = 0; b < dst.ext[0]; ++b)
      for (std::int64_t s = 0; s < dst.ext[1]; ++s)
        for (std::int64_t j = 0; j < split.parts; ++j) {
          const U* row = recv + j * block_size + part_offset + (b * dst.ext[1] + s) * hc * dst.ext[3];
          const std::int64_t h0 = split.first(j);
          for (std::int64_t h = 0; h < hc; ++h)
            for (std::int64_t x = 0; x < dst.ext[3]; ++x)
              dst(b, s, h0 + h, x) = static_cast<T>(A(0) + static_cast<A>(row[h * dst.ext[3] + x]));
        }
    return;
  }
  for (std::int64_t b = 0; b < dst.ext[0]; ++b)
    for (std::int64_t s = 0; s < dst.ext[1]; ++s)
      for (std::int64_t h = 0; h < dst.ext[2]; ++h)
        for (std::int64_t x = 0; x < dst.ext[3]; ++x) {
          A sum = 0;
          for (std::int64_t j = 0; j < split.parts; ++j) {
            const std::int64_t h0 = split.first(j);
            if (h < h0 || h >= h0 + hc) continue;
            sum += static_cast<A>(recv[j * block_size + part_offset + ((b * dst.ext[1] + s) * hc + (h - h0)) * dst.ext[3] + x]);
          }
          dst(b, s, h, x) = static_cast<T>(sum);
        }
}

}  // namespace baton::detail::cp
