// baton/cp/detail/ring_core.hpp — the ring attention algorithm, shared by ring_attention
// (shards of one rank) and hybrid_attention (shards re-assembled by Ulysses over a group).
//
// Forward: K and V travel around the ring in one buffer; at step s rank r holds the block
// of rank (r - s) mod R. The transfer of the next block is started before the current block
// is computed, so it overlaps the compute. Each step's partial (out, lse) is merged into
// fp32-or-better accumulators with the sigmoid form.
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

template <class Ring, class T>
in_flight<shift_request_t<Ring>> start_shift(Ring& ring, const std::vector<T>& send, std::vector<T>& recv, int tag) {
  return in_flight<shift_request_t<Ring>>(
      ring.shift(std::as_bytes(std::span<const T>(send)), std::as_writable_bytes(std::span<T>(recv)), 1, tag));
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

// K then V of a block, contiguous, in element type T: the unit that travels the ring.
template <class T, class TK>
void pack_kv(const tensor_view<TK, 4>& k, const tensor_view<TK, 4>& v, std::vector<T>& buffer) {
  const auto kv = as_view4(k), vv = as_view4(v);
  const std::int64_t n = kv.size();
  buffer.resize(static_cast<std::size_t>(2 * n));
  T* out = buffer.data();
  for (const auto* src : {&kv, &vv})
    for (std::int64_t b = 0; b < src->ext[0]; ++b)
      for (std::int64_t s = 0; s < src->ext[1]; ++s)
        for (std::int64_t h = 0; h < src->ext[2]; ++h)
          for (std::int64_t x = 0; x < src->ext[3]; ++x) *out++ = (*src)(b, s, h, x);
}

struct ring_geometry {
  // pieces[g]: the shard ring rank g holds (its queries, and its K/V block), in local order.
  std::vector<std::vector<shard_piece>> pieces;
  std::int64_t batch = 0, seq = 0, heads_q = 0, heads_kv = 0, dim = 0;
};

template <class T, class Ring, class Backend, class Mask>
void ring_forward(Ring& ring, Backend& backend, const ring_geometry& g, tensor_view<const T, 4> q,
                  tensor_view<const T, 4> k, tensor_view<const T, 4> v, const Mask& mask, tensor_view<T, 4> out,
                  tensor_view<lse_t<T>, 3> lse, double softmax_scale) {
  using A = cp_accumulator_t<T>;
  using L = lse_t<T>;
  const int ranks = ring.size(), me = ring.rank();
  const ring_schedule schedule{ranks};
  const std::int64_t b = g.batch, sl = g.seq, hq = g.heads_q, hkv = g.heads_kv, d = g.dim;
  const std::span<const shard_piece> my_pieces(g.pieces[static_cast<std::size_t>(me)]);

  std::vector<T> held, next(static_cast<std::size_t>(2 * b * sl * hkv * d));
  pack_kv<T>(k, v, held);
  std::vector<A> out_acc(static_cast<std::size_t>(b * sl * hq * d), A(0));
  std::vector<A> lse_acc(static_cast<std::size_t>(b * hq * sl), -std::numeric_limits<A>::infinity());
  std::vector<T> out_blk(out_acc.size());
  std::vector<L> lse_blk(lse_acc.size());
  std::vector<std::int64_t> q_store, k_store;

  for (int step = 0; step < schedule.steps(); ++step) {
    const int owner = schedule.kv_owner(me, step);
    in_flight<shift_request_t<Ring>> transfer;
    if (step + 1 < schedule.steps()) transfer = start_shift(ring, held, next, tag_kv);  // overlaps this step

    const std::span<const shard_piece> k_pieces(g.pieces[static_cast<std::size_t>(owner)]);
    const auto kb = bshd_view<const T>(held.data(), b, sl, hkv, d);
    const auto vb = bshd_view<const T>(held.data() + b * sl * hkv * d, b, sl, hkv, d);
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
        for (std::int64_t i = 0; i < c.q_count; ++i)
          for (std::int64_t h = 0; h < hq; ++h) {
            const std::int64_t row = c.q_offset + i;
            merge_row(out_acc.data() + ((bi * sl + row) * hq + h) * d, 1,
                      lse_acc[static_cast<std::size_t>((bi * hq + h) * sl + row)], &ob(bi, i, h, 0), 1,
                      lb(bi, h, i), d);
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
  const std::int64_t b = g.batch, sl = g.seq, hq = g.heads_q, hkv = g.heads_kv, d = g.dim;
  const std::int64_t kv_elems = b * sl * hkv * d;
  const std::span<const shard_piece> my_pieces(g.pieces[static_cast<std::size_t>(me)]);

  std::vector<T> held, next(static_cast<std::size_t>(2 * kv_elems));
  pack_kv<T>(k, v, held);
  std::vector<A> dq_acc(static_cast<std::size_t>(b * sl * hq * d), A(0));
  // This step's dK/dV for the held block; the accumulator arriving from the previous holder;
  // the sum sent on. Three buffers so that the send of one step overlaps the next compute.
  std::vector<A> grad_step(static_cast<std::size_t>(2 * kv_elems)), grad_in(grad_step.size()), grad_out(grad_step.size());
  std::vector<T> dq_blk(dq_acc.size()), dk_blk(static_cast<std::size_t>(kv_elems)), dv_blk(dk_blk.size());
  std::vector<std::int64_t> q_store, k_store;
  in_flight<shift_request_t<Ring>> grad_transfer;

  for (int step = 0; step < schedule.steps(); ++step) {
    const int owner = schedule.kv_owner(me, step);
    in_flight<shift_request_t<Ring>> kv_transfer;
    if (step + 1 < schedule.steps()) kv_transfer = start_shift(ring, held, next, tag_kv);

    std::fill(grad_step.begin(), grad_step.end(), A(0));
    const std::span<const shard_piece> k_pieces(g.pieces[static_cast<std::size_t>(owner)]);
    const auto kb = bshd_view<const T>(held.data(), b, sl, hkv, d);
    const auto vb = bshd_view<const T>(held.data() + kv_elems, b, sl, hkv, d);
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
        for (std::int64_t i = 0; i < c.q_count; ++i)
          for (std::int64_t h = 0; h < hq; ++h)
            for (std::int64_t x = 0; x < d; ++x)
              dq_acc[static_cast<std::size_t>(((bi * sl + c.q_offset + i) * hq + h) * d + x)] +=
                  static_cast<A>(gq(bi, i, h, x));
      for (std::int64_t bi = 0; bi < b; ++bi)
        for (std::int64_t j = 0; j < c.k_count; ++j)
          for (std::int64_t h = 0; h < hkv; ++h)
            for (std::int64_t x = 0; x < d; ++x) {
              const auto at = static_cast<std::size_t>(((bi * sl + c.k_offset + j) * hkv + h) * d + x);
              grad_step[at] += static_cast<A>(gk(bi, j, h, x));
              grad_step[static_cast<std::size_t>(kv_elems) + at] += static_cast<A>(gv(bi, j, h, x));
            }
    }
    // The held block's accumulator so far arrives from the previous holder (none at step 0).
    grad_transfer.wait();
    for (std::size_t i = 0; i < grad_out.size(); ++i) grad_out[i] = (step == 0 ? A(0) : grad_in[i]) + grad_step[i];
    // Send it on with the block: after the last step this hop returns it to the owner.
    grad_transfer = start_shift(ring, grad_out, grad_in, tag_grad);

    if (kv_transfer.active()) {
      kv_transfer.wait();
      std::swap(held, next);
    }
  }
  grad_transfer.wait();  // grad_in now holds the dK/dV of my own keys, from every rank's queries

  for (std::int64_t bi = 0; bi < b; ++bi)
    for (std::int64_t i = 0; i < sl; ++i) {
      for (std::int64_t h = 0; h < hq; ++h)
        for (std::int64_t x = 0; x < d; ++x)
          dq(bi, i, h, x) = static_cast<T>(dq_acc[static_cast<std::size_t>(((bi * sl + i) * hq + h) * d + x)]);
      for (std::int64_t h = 0; h < hkv; ++h)
        for (std::int64_t x = 0; x < d; ++x) {
          const auto at = static_cast<std::size_t>(((bi * sl + i) * hkv + h) * d + x);
          dk(bi, i, h, x) = static_cast<T>(grad_in[at]);
          dv(bi, i, h, x) = static_cast<T>(grad_in[static_cast<std::size_t>(kv_elems) + at]);
        }
    }
}

}  // namespace baton::detail::cp
