// baton/cp/detail/ring_core.hpp — the ring attention algorithm, shared by ring_attention
// (shards of one rank) and hybrid_attention (shards re-assembled by Ulysses over a group).
//
// Forward: K and V travel around the ring in one buffer; at step s rank r holds the block
// of rank (r - s) mod R. The transfer of the next block is started before the current block
// is computed, so it overlaps the compute. Each step's partial (out, lse) is merged into
// fp32-or-better accumulators with the sigmoid form.
//
// Steps at which no rank's queries need the block held are skipped by every rank, compute
// and transfer: the block then jumps several hops in one shift (active_ring_steps). Shards
// may differ in length; transfers carry the longest shard's size.
//
// Backward (seed 001): every step calls the backend with the K/V block of *that* step, the
// FINAL merged out and lse, and dout — nothing saved at step 0 is reused. A dK/dV
// accumulator (fp32 or better) travels one step behind its K/V block; after the last step
// one more hop returns every accumulator to the rank that owns the keys.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/attention/tensor_view.hpp>
#include <baton/cp/detail/agree.hpp>
#include <baton/cp/detail/ring_plan.hpp>
#include <baton/cp/detail/views.hpp>
#include <baton/cp/merge.hpp>
#include <baton/cp/sharding.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <utility>
#include <vector>

namespace baton::detail::cp {

// A transfer in flight. If the step that started it throws, the destructor still waits for
// it (ignoring its outcome) so that no transport writes into a buffer being freed.
template <class Request>
class in_flight {
 public:
  in_flight() = default;
  explicit in_flight(Request r) : request_(std::make_unique<Request>(std::move(r))) {}
  in_flight(in_flight&&) noexcept = default;
  in_flight& operator=(in_flight&& other) noexcept {
    drain();
    request_ = std::move(other.request_);
    return *this;
  }
  in_flight(const in_flight&) = delete;
  in_flight& operator=(const in_flight&) = delete;
  ~in_flight() { drain(); }

  bool active() const noexcept { return request_ != nullptr; }
  void wait() {
    if (!request_) return;
    const std::unique_ptr<Request> r = std::move(request_);
    r->wait();
  }

 private:
  void drain() noexcept {
    if (!request_) return;
    try {
      request_->wait();
    } catch (...) {  // the exception already unwinding is the one to report
    }
    request_.reset();
  }
  std::unique_ptr<Request> request_;  // (not std::optional: g++ 12 warns falsely through it)
};

template <class Ring>
using shift_request_t =
    decltype(std::declval<Ring&>().shift(std::span<const std::byte>{}, std::span<std::byte>{}, 1, 0));

// Sends `send` k ranks on around the ring and receives from k ranks back.
template <class Ring, class T>
in_flight<shift_request_t<Ring>> start_shift(Ring& ring, const std::vector<T>& send, std::vector<T>& recv, int k,
                                             int tag) {
  return in_flight<shift_request_t<Ring>>(
      ring.shift(std::as_bytes(std::span<const T>(send)), std::as_writable_bytes(std::span<T>(recv)), k, tag));
}

// The backend calls of one step: which rectangles of (my queries) x (held keys) the mask
// leaves non-empty, decided on global positions with the mask's block classifier.
template <class Mask>
std::vector<block_call> plan_step(const Mask& mask, std::span<const shard_piece> q_pieces,
                                  std::span<const shard_piece> k_pieces) {
  return plan_block_calls(q_pieces, k_pieces, [&](const shard_piece& qp, const shard_piece& kp) {
    const std::span<const shard_piece> qs(&qp, 1), ks(&kp, 1);
    std::vector<std::int64_t> q_store, k_store;
    const positions qpos = positions_for(qs, 0, 1, q_store);
    const positions kpos = positions_for(ks, 0, 1, k_store);
    return mask.classify(position_block(qpos, 0, qp.count), position_block(kpos, 0, kp.count)) != block_kind::empty;
  });
}

// K then V of a block, each contiguous, in element type T: the unit that travels the ring.
// The buffer holds 2 x `capacity` elements (the longest shard's K or V); V starts at
// `capacity`, whatever this block's own length.
template <class T, class TK>
void pack_kv(const tensor_view<TK, 4>& k, const tensor_view<TK, 4>& v, std::int64_t capacity, std::vector<T>& buffer) {
  const auto kv = as_view4(k), vv = as_view4(v);
  buffer.assign(static_cast<std::size_t>(2 * capacity), T(0));
  for (const auto* src : {&kv, &vv}) {
    T* out = buffer.data() + (src == &vv ? capacity : 0);
    for (std::int64_t b = 0; b < src->ext[0]; ++b)
      for (std::int64_t s = 0; s < src->ext[1]; ++s)
        for (std::int64_t h = 0; h < src->ext[2]; ++h)
          for (std::int64_t x = 0; x < src->ext[3]; ++x) *out++ = (*src)(b, s, h, x);
  }
}

struct ring_geometry {
  // pieces[g]: the shard ring rank g holds (its queries, and its K/V block), in local order.
  std::vector<std::vector<shard_piece>> pieces;
  std::int64_t batch = 0, heads_q = 0, heads_kv = 0, dim = 0;

  std::int64_t len(int rank) const noexcept {
    std::int64_t n = 0;
    for (const shard_piece& p : pieces[static_cast<std::size_t>(rank)]) n += p.count;
    return n;
  }
  // Shards may differ in length; every transfer carries the longest, so that all ranks send
  // and receive the same byte count (the ring_communicator contract).
  std::int64_t max_len() const noexcept {
    std::int64_t m = 0;
    for (int r = 0; r < static_cast<int>(pieces.size()); ++r) m = std::max(m, len(r));
    return m;
  }
};

// The ring steps at which some rank's queries need the block it holds: the others are
// skipped by every rank at once, compute and transfer (the block jumps k hops in one shift),
// since a step that is empty for every rank moves data nobody uses. Every rank computes the
// same list from the agreed sharding and mask. Step 0 (the own block) may be skipped too.
template <class Mask>
std::vector<int> active_ring_steps(const Mask& mask, const ring_geometry& g) {
  const int ranks = static_cast<int>(g.pieces.size());
  const ring_schedule schedule{ranks};
  std::vector<int> active;
  for (int step = 0; step < schedule.steps(); ++step) {
    for (int r = 0; r < ranks; ++r) {
      const auto& q = g.pieces[static_cast<std::size_t>(r)];
      const auto& k = g.pieces[static_cast<std::size_t>(schedule.kv_owner(r, step))];
      if (!plan_step(mask, std::span<const shard_piece>(q), std::span<const shard_piece>(k)).empty()) {
        active.push_back(step);
        break;
      }
    }
  }
  return active;
}

template <class T, class Ring, class Backend, class Mask>
void ring_forward(Ring& ring, Backend& backend, const ring_geometry& g, tensor_view<const T, 4> q,
                  tensor_view<const T, 4> k, tensor_view<const T, 4> v, const Mask& mask, tensor_view<T, 4> out,
                  tensor_view<lse_t<T>, 3> lse, double softmax_scale) {
  using A = cp_accumulator_t<T>;
  using L = lse_t<T>;
  const int ranks = ring.size(), me = ring.rank();
  const ring_schedule schedule{ranks};
  const std::int64_t b = g.batch, sl = g.len(me), hq = g.heads_q, hkv = g.heads_kv, d = g.dim;
  const std::int64_t capacity = b * g.max_len() * hkv * d;
  const std::span<const shard_piece> my_pieces(g.pieces[static_cast<std::size_t>(me)]);
  const std::vector<int> active = active_ring_steps(mask, g);

  std::vector<T> held, next(static_cast<std::size_t>(2 * capacity));
  pack_kv<T>(k, v, capacity, held);
  std::vector<A> out_acc(static_cast<std::size_t>(b * sl * hq * d), A(0));
  std::vector<A> lse_acc(static_cast<std::size_t>(b * hq * sl), -std::numeric_limits<A>::infinity());
  std::vector<T> out_blk(out_acc.size());
  std::vector<L> lse_blk(lse_acc.size());
  std::vector<std::int64_t> q_store, k_store;

  // At active step s the block held is rank (me - s)'s. When nobody needs the own block
  // (step 0), the first needed one is fetched before anything is computed.
  if (!active.empty() && active.front() != 0) {
    start_shift(ring, held, next, active.front(), tag_kv).wait();
    std::swap(held, next);
  }
  for (std::size_t i = 0; i < active.size(); ++i) {
    const int step = active[i];
    const int owner = schedule.kv_owner(me, step);
    in_flight<shift_request_t<Ring>> transfer;
    if (i + 1 < active.size())  // overlaps this step; skipped steps are jumped in one shift
      transfer = start_shift(ring, held, next, active[i + 1] - step, tag_kv);

    const std::span<const shard_piece> k_pieces(g.pieces[static_cast<std::size_t>(owner)]);
    const std::int64_t kl = g.len(owner);
    const auto kb = bshd_view<const T>(held.data(), b, kl, hkv, d);
    const auto vb = bshd_view<const T>(held.data() + capacity, b, kl, hkv, d);
    for (const block_call& c : plan_step(mask, my_pieces, k_pieces)) {
      attention_params params;
      params.q_pos = positions_for(my_pieces, c.q_piece_begin, c.q_piece_end, q_store);
      params.k_pos = positions_for(k_pieces, c.k_piece_begin, c.k_piece_end, k_store);
      params.softmax_scale = softmax_scale;
      const auto ob = bshd_view<T>(out_blk.data(), b, c.q_count, hq, d);
      const auto lb = lse_view<L>(lse_blk.data(), b, hq, c.q_count);
      backend.forward(slice_axis(q, 1, c.q_offset, c.q_count), slice_axis(kb, 1, c.k_offset, c.k_count),
                      slice_axis(vb, 1, c.k_offset, c.k_count), mask, ob, lb, params);
      for (std::int64_t bi = 0; bi < b; ++bi)
        for (std::int64_t i2 = 0; i2 < c.q_count; ++i2)
          for (std::int64_t h = 0; h < hq; ++h) {
            const std::int64_t row = c.q_offset + i2;
            merge_row(out_acc.data() + ((bi * sl + row) * hq + h) * d, 1,
                      lse_acc[static_cast<std::size_t>((bi * hq + h) * sl + row)], &ob(bi, i2, h, 0), 1,
                      lb(bi, h, i2), d);
          }
    }
    if (transfer.active()) {
      transfer.wait();
      std::swap(held, next);
    }
  }
  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t i = 0; i < sl; ++i)
      for (std::int64_t h = 0; h < hq; ++h) {
        for (std::int64_t x = 0; x < d; ++x)
          out(bi, i, h, x) = static_cast<T>(out_acc[static_cast<std::size_t>(((bi * sl + i) * hq + h) * d + x)]);
        lse(bi, h, i) = static_cast<L>(lse_acc[static_cast<std::size_t>((bi * hq + h) * sl + i)]);
      }
}

template <class T, class Ring, class Backend, class Mask>
void ring_backward(Ring& ring, Backend& backend, const ring_geometry& g, tensor_view<const T, 4> q,
                   tensor_view<const T, 4> k, tensor_view<const T, 4> v, tensor_view<const T, 4> out,
                   tensor_view<const lse_t<T>, 3> lse, tensor_view<const T, 4> dout, const Mask& mask,
                   tensor_view<T, 4> dq, tensor_view<T, 4> dk, tensor_view<T, 4> dv, double softmax_scale) {
  using A = cp_accumulator_t<T>;
  const int ranks = ring.size(), me = ring.rank();
  const ring_schedule schedule{ranks};
  const std::int64_t b = g.batch, sl = g.len(me), hq = g.heads_q, hkv = g.heads_kv, d = g.dim;
  const std::int64_t capacity = b * g.max_len() * hkv * d;
  const std::span<const shard_piece> my_pieces(g.pieces[static_cast<std::size_t>(me)]);
  const std::vector<int> active = active_ring_steps(mask, g);

  std::vector<T> held, next(static_cast<std::size_t>(2 * capacity));
  pack_kv<T>(k, v, capacity, held);
  std::vector<A> dq_acc(static_cast<std::size_t>(b * sl * hq * d), A(0));
  // This step's dK/dV for the held block; the accumulator arriving from the previous holder;
  // the sum sent on. Three buffers so that the send of one step overlaps the next compute.
  // Each is laid out as the held block's owner's K and V: [b, len(owner), hkv, d] at 0 and at
  // `capacity`.
  std::vector<A> grad_step(static_cast<std::size_t>(2 * capacity)), grad_in(grad_step.size(), A(0)),
      grad_out(grad_step.size());
  std::vector<T> dq_blk(dq_acc.size()), dk_blk(static_cast<std::size_t>(capacity)), dv_blk(dk_blk.size());
  std::vector<std::int64_t> q_store, k_store;
  in_flight<shift_request_t<Ring>> grad_transfer;

  if (!active.empty() && active.front() != 0) {
    start_shift(ring, held, next, active.front(), tag_kv).wait();
    std::swap(held, next);
  }
  for (std::size_t i = 0; i < active.size(); ++i) {
    const int step = active[i];
    const int owner = schedule.kv_owner(me, step);
    const bool last = i + 1 == active.size();
    in_flight<shift_request_t<Ring>> kv_transfer;
    if (!last) kv_transfer = start_shift(ring, held, next, active[i + 1] - step, tag_kv);

    std::fill(grad_step.begin(), grad_step.end(), A(0));
    const std::span<const shard_piece> k_pieces(g.pieces[static_cast<std::size_t>(owner)]);
    const std::int64_t kl = g.len(owner);
    const auto kb = bshd_view<const T>(held.data(), b, kl, hkv, d);
    const auto vb = bshd_view<const T>(held.data() + capacity, b, kl, hkv, d);
    for (const block_call& c : plan_step(mask, my_pieces, k_pieces)) {
      attention_params params;
      params.q_pos = positions_for(my_pieces, c.q_piece_begin, c.q_piece_end, q_store);
      params.k_pos = positions_for(k_pieces, c.k_piece_begin, c.k_piece_end, k_store);
      params.softmax_scale = softmax_scale;
      const auto gq = bshd_view<T>(dq_blk.data(), b, c.q_count, hq, d);
      const auto gk = bshd_view<T>(dk_blk.data(), b, c.k_count, hkv, d);
      const auto gv = bshd_view<T>(dv_blk.data(), b, c.k_count, hkv, d);
      // The K/V of THIS step, and the final merged out / lse (never anything from step 0).
      backend.backward(slice_axis(q, 1, c.q_offset, c.q_count), slice_axis(kb, 1, c.k_offset, c.k_count),
                       slice_axis(vb, 1, c.k_offset, c.k_count), slice_axis(out, 1, c.q_offset, c.q_count),
                       slice_axis(lse, 2, c.q_offset, c.q_count), slice_axis(dout, 1, c.q_offset, c.q_count), mask,
                       gq, gk, gv, params);
      for (std::int64_t bi = 0; bi < b; ++bi)
        for (std::int64_t i2 = 0; i2 < c.q_count; ++i2)
          for (std::int64_t h = 0; h < hq; ++h)
            for (std::int64_t x = 0; x < d; ++x)
              dq_acc[static_cast<std::size_t>(((bi * sl + c.q_offset + i2) * hq + h) * d + x)] +=
                  static_cast<A>(gq(bi, i2, h, x));
      for (std::int64_t bi = 0; bi < b; ++bi)
        for (std::int64_t j = 0; j < c.k_count; ++j)
          for (std::int64_t h = 0; h < hkv; ++h)
            for (std::int64_t x = 0; x < d; ++x) {
              const auto at = static_cast<std::size_t>(((bi * kl + c.k_offset + j) * hkv + h) * d + x);
              grad_step[at] += static_cast<A>(gk(bi, j, h, x));
              grad_step[static_cast<std::size_t>(capacity) + at] += static_cast<A>(gv(bi, j, h, x));
            }
    }
    // The held block's accumulator so far arrives from its previous holder (none at the first
    // active step).
    grad_transfer.wait();
    for (std::size_t e = 0; e < grad_out.size(); ++e) grad_out[e] = (i == 0 ? A(0) : grad_in[e]) + grad_step[e];
    // Send it on with the block; after the last active step, back to the owner (me - step):
    // a shift by -step, none when the last block held is the own one.
    const int hop = last ? (ranks - step) % ranks : active[i + 1] - step;
    if (hop != 0)
      grad_transfer = start_shift(ring, grad_out, grad_in, hop, tag_grad);
    else
      std::swap(grad_in, grad_out);

    if (kv_transfer.active()) {
      kv_transfer.wait();
      std::swap(held, next);
    }
  }
  grad_transfer.wait();  // grad_in now holds the dK/dV of my own keys, from every rank's queries
  if (active.empty()) std::fill(grad_in.begin(), grad_in.end(), A(0));

  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t i = 0; i < sl; ++i) {
      for (std::int64_t h = 0; h < hq; ++h)
        for (std::int64_t x = 0; x < d; ++x)
          dq(bi, i, h, x) = static_cast<T>(dq_acc[static_cast<std::size_t>(((bi * sl + i) * hq + h) * d + x)]);
      for (std::int64_t h = 0; h < hkv; ++h)
        for (std::int64_t x = 0; x < d; ++x) {
          const auto at = static_cast<std::size_t>(((bi * sl + i) * hkv + h) * d + x);
          dk(bi, i, h, x) = static_cast<T>(grad_in[at]);
          dv(bi, i, h, x) = static_cast<T>(grad_in[static_cast<std::size_t>(capacity) + at]);
        }
    }
}

}  // namespace baton::detail::cp
