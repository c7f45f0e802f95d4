// baton/cp/detail/ring_core.hpp — the ring attention algorithm, shared by ring_attention
// (shards of one rank) and hybrid_attention (shards re-assembled by Ulysses over a group).
//
// Forward: K and V travel around the ring (two messages per hop, sent from the rank's own
// tensors where they are dense: kv_blocks); at step s rank r holds the block of rank
// (r - s) mod R. The transfer of the next block is started before the current block
// is computed, so it overlaps the compute. Each step's partial (out, lse) is merged into
// fp32-or-better accumulators with the sigmoid form.
//
// Steps at which no rank's queries need the block held are skipped by every rank, compute
// and transfer: the block then jumps several hops in one shift (active_ring_steps). Shards
// may differ in length; transfers carry the longest shard's size.
//
// Backward (seed 001): every step calls the backend with the K/V block of *that* step, the
// FINAL merged out and lse, and dout — nothing saved at step 0 is reused. A dK/dV
// accumulator (fp32 or better) follows its K/V block, sent on once the step's compute is
// done; after the last active step one more shift (ring_schedule::hops_to_owner) returns
// every accumulator to the rank that owns the keys. The owner's own part (step 0) does not
// travel: it waits at home for the others' sum.
//
// Layout (ring_geometry::head_major): on the host the ring computes on head-major copies
// ([b][h][s][d], bshd_head_major) of what the caller passed dense: the K/V blocks travel
// head-major, the queries, outputs and gradients are staged once per call, and the
// accumulators are head-major, so the CPU kernels read a head's rows one after another
// (a document-masked call was 12-21 % slower on rows h x d apart; docs/context-parallel.md,
// "The ring computes head-major"). Hybrid's gathered tensors already are.
//
// Memory: every buffer comes from the memory space M and every copy, fill, accumulation and
// merge is a call on it (memory.hpp), so the same steps run on host or device memory. M is
// synchronised before a buffer is handed to the communicator (a transfer reads what the
// memory space's stream wrote), and a transfer's wait() completes before its buffers are
// touched again; the backend is expected to run on M's stream (cp/cuda.hpp takes the
// stream from the backend).
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/cp/detail/agree.hpp>
#include <baton/cp/detail/ring_plan.hpp>
#include <baton/cp/detail/views.hpp>
#include <baton/cp/memory.hpp>
#include <baton/cp/merge.hpp>
#include <baton/cp/sharding.hpp>

#include <algorithm>
#include <array>
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
  Request& request() noexcept { return *request_; }
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

// Before a transfer is posted: the communicator must read what the memory space's queued
// work wrote, and may overwrite only what that work has finished reading. A space that can
// order the communicator after its queue (cuda_device_memory over nccl_communicator: an
// event the communicator's streams wait for) does so without the host waiting; any other
// waits on the host.
template <class M, class Ring>
void before_transfer(M& mem, Ring& ring) {
  if constexpr (requires { mem.order_before(ring); })
    mem.order_before(ring);
  else
    mem.synchronize();
}

// The transfers of a ring call, made usable by the memory space's later work. settle(t):
// from now on, work queued on the memory space may use what t moved. A space that can
// order its queue after a request (cuda_device_memory with an nccl_request: the stream
// waits for the request's event) does so without the host waiting, and keeps the request;
// finish() then waits for every kept one on the host, once per call, with the
// communicator's timeout (so a transfer that never completes is reported, not hung on in
// the final stream synchronisation). Any other space waits on the host at settle. Kept
// requests not finished (an exception) are waited for by their destructors, ignoring
// their outcome, before the buffers they use are freed.
template <class M, class Request>
class transfer_settler {
 public:
  explicit transfer_settler(M& mem) : mem_(&mem) {}

  void settle(in_flight<Request>& t) {
    if (!t.active()) return;
    if constexpr (requires { mem_->order_after(t.request()); }) {
      mem_->order_after(t.request());
      kept_.push_back(std::move(t));
    } else {
      t.wait();
    }
  }
  void finish() {
    for (in_flight<Request>& t : kept_) t.wait();
    kept_.clear();
  }

 private:
  M* mem_;
  std::vector<in_flight<Request>> kept_;
};

// Sends `send` k ranks on around the ring and receives from k ranks back, after everything
// the memory space was asked to do (before_transfer).
template <class Ring, class M, class Buffer>
in_flight<shift_request_t<Ring>> start_shift(Ring& ring, M& mem, const Buffer& send, Buffer& recv, int k, int tag) {
  using T = std::remove_cvref_t<decltype(*send.data())>;
  before_transfer(mem, ring);
  return in_flight<shift_request_t<Ring>>(ring.shift(std::as_bytes(std::span<const T>(send.data(), send.size())),
                                                     std::as_writable_bytes(std::span<T>(recv.data(), recv.size())),
                                                     k, tag));
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

// Whether `v` has the strides `layout` (those of its axes of extent 1 are free).
template <class T>
bool has_layout(const tensor_view<T, 4>& v, const std::array<std::int64_t, 4>& layout) noexcept {
  for (std::size_t axis = 0; axis < 4; ++axis)
    if (v.extent(axis) != 1 && v.stride(axis) != layout[axis]) return false;
  return true;
}

// An accumulator of element type A with the extents of `target` and the strides `layout`
// (dense: its elements are one contiguous run, so it can be filled as a span). It is
// `target` itself when that already has type A and that layout (the user's float or double
// output): no buffer, and no copy at the end (`in_place`). Otherwise a buffer of M, which
// the caller copies into `target` at the end.
template <class A, class T, class M>
tensor_view<A, 4> accumulator_for(M& mem, const tensor_view<T, 4>& target, const std::array<std::int64_t, 4>& layout,
                         typename M::template buffer<A>& storage, bool& in_place) {
  if constexpr (std::is_same_v<A, T>) {
    if (has_layout(target, layout)) {
      in_place = true;
      return target;
    }
  }
  in_place = false;
  storage = mem.template allocate<A>(static_cast<std::size_t>(target.size()));
  return {storage.data(), target.extents(), layout};
}

// A K/V block in flight: K and V travel as two messages.
template <class Ring>
struct kv_transfer {
  in_flight<shift_request_t<Ring>> k, v;
  bool active() const noexcept { return k.active(); }
  template <class M>
  void settle(transfer_settler<M, shift_request_t<Ring>>& settler) {
    settler.settle(k);
    settler.settle(v);
  }
};

// The K/V block a rank holds, and the buffer the next one arrives in. K and V travel as two
// messages of `capacity` elements each (the longest shard's K or V, so that every rank sends
// the same count); in a buffer, V starts at `capacity` whatever the block's own length, and
// each is stored in the ring's layout (dense or head-major). The rank's own K and V, when in
// that layout and that long, are computed on and sent from where they are; otherwise they
// are first packed into the buffer, the padding past a short shard zeroed (it travels but
// is never read).
template <class T, class M>
class kv_blocks {
 public:
  kv_blocks(M& mem, const tensor_view<const T, 4>& k, const tensor_view<const T, 4>& v, std::int64_t capacity,
            bool head_major)
      : mem_(&mem), k_(k), v_(v), capacity_(capacity), head_major_(head_major) {
    const auto kv = k, vv = v;
    own_in_place_ = kv.size() == capacity && has_layout(kv, stored<const T>(nullptr, kv.extent(1)).strides()) &&
                    has_layout(vv, stored<const T>(nullptr, vv.extent(1)).strides());
    if (own_in_place_) return;
    held_ = mem.template allocate<T>(static_cast<std::size_t>(2 * capacity));
    const std::int64_t used = kv.size(), padding = capacity - used;
    mem.copy(kv, stored(held_.data(), kv.extent(1)));
    mem.copy(vv, stored(held_.data() + capacity, vv.extent(1)));
    if (padding > 0) {
      mem.fill(std::span<T>(held_.data() + used, static_cast<std::size_t>(padding)), T(0));
      mem.fill(std::span<T>(held_.data() + capacity + used, static_cast<std::size_t>(padding)), T(0));
    }
  }

  // K and V of the block held, whose owner's shard has `len` positions.
  tensor_view<const T, 4> k(std::int64_t len) const noexcept {
    return own_in_place_ ? k_ : stored(held_.data(), len);
  }
  tensor_view<const T, 4> v(std::int64_t len) const noexcept {
    return own_in_place_ ? v_ : stored(held_.data() + capacity_, len);
  }

  // Sends the block held `hops` ranks on and receives the one `hops` ranks back, once
  // everything the memory space was asked to do has completed.
  template <class Ring>
  kv_transfer<Ring> start_shift(Ring& ring, int hops) {
    const T* k_send = own_in_place_ ? k_.data : held_.data();
    const T* v_send = own_in_place_ ? v_.data : held_.data() + capacity_;
    const auto n = static_cast<std::size_t>(capacity_);
    if (next_.size() == 0) next_ = mem_->template allocate<T>(2 * n);  // (none when nothing travels)
    before_transfer(*mem_, ring);
    kv_transfer<Ring> t;
    t.k = in_flight<shift_request_t<Ring>>(ring.shift(std::as_bytes(std::span<const T>(k_send, n)),
                                                      std::as_writable_bytes(std::span<T>(next_.data(), n)), hops, tag_kv));
    t.v = in_flight<shift_request_t<Ring>>(ring.shift(std::as_bytes(std::span<const T>(v_send, n)),
                                                      std::as_writable_bytes(std::span<T>(next_.data() + n, n)), hops,
                                                      tag_kv));
    return t;
  }
  // After a transfer was settled: the block that arrived is the one held.
  void take_arrived() noexcept {
    std::swap(held_, next_);
    own_in_place_ = false;
  }

 private:
  using buffer_t = typename M::template buffer<T>;
  // A K or V block of `len` positions at p, in the ring's layout.
  template <class E>
  tensor_view<E, 4> stored(E* p, std::int64_t len) const noexcept {
    return bshd_stored<E>(head_major_, p, k_.extent(0), len, k_.extent(2), k_.extent(3));
  }
  M* mem_;
  tensor_view<const T, 4> k_, v_;
  std::int64_t capacity_;
  bool head_major_;
  buffer_t held_, next_;
  bool own_in_place_ = false;
};

struct ring_geometry {
  // pieces[g]: the shard ring rank g holds (its queries, and its K/V block), in local order.
  std::vector<std::vector<shard_piece>> pieces;
  // Cross-attention: the key/value shard ring rank g holds, its positions as the mask sees
  // them (the kv_sharding's offset added); empty: the keys are the queries' pieces.
  std::vector<std::vector<shard_piece>> kv_pieces;
  std::int64_t batch = 0, heads_q = 0, heads_kv = 0, dim = 0;
  // The layout the ring computes in: head-major on the host, dense on a device (see above).
  bool head_major = false;

  // A [batch, len, heads, dim] tensor at p in that layout.
  template <class E>
  tensor_view<E, 4> stored(E* p, std::int64_t len, std::int64_t heads) const noexcept {
    return bshd_stored<E>(head_major, p, batch, len, heads, dim);
  }

  const std::vector<shard_piece>& q_of(int rank) const noexcept { return pieces[static_cast<std::size_t>(rank)]; }
  const std::vector<shard_piece>& kv_of(int rank) const noexcept {
    return (kv_pieces.empty() ? pieces : kv_pieces)[static_cast<std::size_t>(rank)];
  }
  static std::int64_t count(const std::vector<shard_piece>& ps) noexcept {
    std::int64_t n = 0;
    for (const shard_piece& p : ps) n += p.count;
    return n;
  }
  std::int64_t len(int rank) const noexcept { return count(q_of(rank)); }
  std::int64_t kv_len(int rank) const noexcept { return count(kv_of(rank)); }
  // Shards may differ in length; every transfer carries the longest key/value shard, so that
  // all ranks send and receive the same byte count (the ring_communicator contract).
  std::int64_t max_kv_len() const noexcept {
    std::int64_t m = 0;
    for (int r = 0; r < static_cast<int>(pieces.size()); ++r) m = std::max(m, kv_len(r));
    return m;
  }
  // Elements of the K (or V) a transfer carries: the longest shard's.
  std::int64_t kv_capacity() const noexcept { return batch * max_kv_len() * heads_kv * dim; }
};

// `x` in the ring's layout: x itself when it has it, else a copy in `storage`.
template <class T, class M>
tensor_view<const T, 4> in_ring_layout(M& mem, const ring_geometry& g, const tensor_view<const T, 4>& x,
                                       typename M::template buffer<T>& storage) {
  if (has_layout(x, g.stored<const T>(nullptr, x.extent(1), x.extent(2)).strides())) return x;
  storage = mem.template allocate<T>(static_cast<std::size_t>(x.size()));
  const tensor_view<T, 4> staged = g.stored(storage.data(), x.extent(1), x.extent(2));
  mem.copy(x, staged);
  return staged.as_const();
}

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
      const auto& q = g.q_of(r);
      const auto& k = g.kv_of(schedule.kv_owner(r, step));
      if (!plan_step(mask, std::span<const shard_piece>(q), std::span<const shard_piece>(k)).empty()) {
        active.push_back(step);
        break;
      }
    }
  }
  return active;
}

// A rank's walk over the active steps, the same for forward and backward: the K/V block held
// at each (the first needed one fetched up front when the own block is not), and the next
// one's transfer started before the step's work and settled after it, so that the two
// overlap. `step_work(i, owner, k, v)` does active step i on the block of `owner` (its K and
// V, g.kv_len(owner) positions long). On a stream-ordered memory space nothing here makes
// the host wait (before_transfer, transfer_settler): the host queues every step and the
// GPU orders them.
template <class T, class Ring, class M, class StepWork>
void walk_ring(Ring& ring, kv_blocks<T, M>& blocks, const ring_geometry& g, const std::vector<int>& active,
               transfer_settler<M, shift_request_t<Ring>>& settler, StepWork&& step_work) {
  const ring_schedule schedule{ring.size()};
  if (!active.empty() && active.front() != 0) {
    kv_transfer<Ring> first = blocks.start_shift(ring, active.front());
    first.settle(settler);
    blocks.take_arrived();
  }
  for (std::size_t i = 0; i < active.size(); ++i) {
    const int step = active[i];
    const int owner = schedule.kv_owner(ring.rank(), step);
    kv_transfer<Ring> next_block;
    if (i + 1 < active.size())  // skipped steps are jumped in one shift
      next_block = blocks.start_shift(ring, active[i + 1] - step);
    const std::int64_t kl = g.kv_len(owner);
    step_work(i, owner, blocks.k(kl), blocks.v(kl));
    if (next_block.active()) {
      next_block.settle(settler);
      blocks.take_arrived();
    }
  }
}

// The backend's parameters for call c of a step: its queries' and keys' global positions
// (backed by the stores when they are not one run).
inline attention_params call_params(std::span<const shard_piece> q_pieces, std::span<const shard_piece> k_pieces,
                                    const block_call& c, double softmax_scale, std::vector<std::int64_t>& q_store,
                                    std::vector<std::int64_t>& k_store) {
  attention_params params;
  params.q_pos = positions_for(q_pieces, c.q_piece_begin, c.q_piece_end, q_store);
  params.k_pos = positions_for(k_pieces, c.k_piece_begin, c.k_piece_end, k_store);
  params.softmax_scale = softmax_scale;
  return params;
}

// A backend with a device workspace (cuda_attention) sizes it for the largest call of this
// ring before anything is queued or posted: then no step allocates, and no step frees a
// block (which would wait for the stream), whatever order the calls come in. Every call of
// a step has at most the rank's queries and the longest key/value shard.
template <class T, class Backend>
void reserve_backend(const Backend& backend, const ring_geometry& g, int me) {
  if constexpr (backend_with_workspace<Backend>) {
    attention_workspace_shape shape;
    shape.batch = g.batch;
    shape.heads_q = g.heads_q;
    shape.heads_kv = g.heads_kv;
    shape.seq_q = g.len(me);
    shape.seq_k = g.max_kv_len();
    shape.dim = g.dim;
    shape.element_bytes = static_cast<int>(sizeof(T));
    backend.reserve_workspace(shape);
  }
}

template <class T, class Ring, class Backend, class Mask, class M>
void ring_forward(Ring& ring, Backend& backend, M& mem, const ring_geometry& g, tensor_view<const T, 4> q,
                  tensor_view<const T, 4> k, tensor_view<const T, 4> v, const Mask& mask, tensor_view<T, 4> out,
                  tensor_view<lse_t<T>, 3> lse, double softmax_scale, std::int64_t trim = trim_tile) {
  using A = cp_accumulator_t<T>;
  using L = lse_t<T>;
  const int me = ring.rank();
  const std::int64_t b = g.batch, sl = g.len(me), hq = g.heads_q, d = g.dim;
  const std::span<const shard_piece> my_pieces(g.q_of(me));
  const std::vector<int> active = active_ring_steps(mask, g);
  if (!active.empty()) reserve_backend<T>(backend, g, me);

  const auto out_size = static_cast<std::size_t>(b * sl * hq * d), lse_size = static_cast<std::size_t>(b * hq * sl);
  kv_blocks<T, M> blocks(mem, k, v, g.kv_capacity(), g.head_major);
  typename M::template buffer<T> q_staged;
  q = in_ring_layout(mem, g, q, q_staged);
  // The running (out, lse), in fp32 or better: the caller's out and lse themselves when they
  // have that type and the ring's layout.
  typename M::template buffer<A> out_acc, lse_acc;
  bool out_in_place = false, lse_in_place = false;
  const tensor_view<A, 4> out_all = accumulator_for<A>(mem, out, g.stored<A>(nullptr, sl, hq).strides(), out_acc, out_in_place);
  const tensor_view<A, 4> lse_all =
      accumulator_for<A>(mem, lse_as_bshd(lse), lse_as_bshd<A>(nullptr, b, hq, sl).strides(), lse_acc, lse_in_place);
  // A query row's accumulators start as the empty result (0, -inf), set when first needed:
  // when the backend's output types are the accumulator's, a call whose rows nothing has
  // touched yet writes its result straight into them (merging it into (0, -inf) would give
  // those same bits), which saves the fill and that merge; the other calls merge a block.
  constexpr bool write_first = std::is_same_v<A, T> && std::is_same_v<A, L>;
  std::vector<char> touched(static_cast<std::size_t>(sl), 0);
  const auto set_empty = [&](std::int64_t row, std::int64_t count) {  // rows [row, row + count), every batch
    if (count == sl) {  // all of them: one run each
      mem.fill(std::span<A>(out_all.data, out_size), A(0));
      mem.fill(std::span<A>(lse_all.data, lse_size), -std::numeric_limits<A>::infinity());
      return;
    }
    for (std::int64_t bi = 0; bi < b; ++bi) {
      if (g.head_major)  // each head's rows are one run
        for (std::int64_t h = 0; h < hq; ++h)
          mem.fill(std::span<A>(&out_all(bi, row, h, 0), static_cast<std::size_t>(count * d)), A(0));
      else
        mem.fill(std::span<A>(&out_all(bi, row, 0, 0), static_cast<std::size_t>(count * hq * d)), A(0));
      for (std::int64_t h = 0; h < hq; ++h)
        mem.fill(std::span<A>(&lse_all(bi, row, h, 0), static_cast<std::size_t>(count)),
                 -std::numeric_limits<A>::infinity());
    }
  };
  const auto untouched = [&](std::int64_t row, std::int64_t count) {
    return std::none_of(touched.begin() + row, touched.begin() + row + count, [](char t) { return t != 0; });
  };
  // Marks rows [row, row + count) touched, first setting those that were not to the empty
  // result when `set` (before a merge into them, or at the end).
  const auto touch = [&](std::int64_t row, std::int64_t count, bool set) {
    for (std::int64_t r = row; r < row + count;) {
      if (touched[static_cast<std::size_t>(r)]) {
        ++r;
        continue;
      }
      std::int64_t end = r;
      while (end < row + count && !touched[static_cast<std::size_t>(end)]) touched[static_cast<std::size_t>(end++)] = 1;
      if (set) set_empty(r, end - r);
      r = end;
    }
  };
  if constexpr (!write_first) touch(0, sl, true);  // every call merges: all rows start empty, in two fills
  const std::size_t blk_size = write_first ? 0 : 1;  // (write_first: allocated at the first merge)
  auto out_blk = mem.template allocate<T>(blk_size * out_size);
  auto lse_blk = mem.template allocate<L>(blk_size * lse_size);
  std::vector<std::int64_t> q_store, k_store;
  transfer_settler<M, shift_request_t<Ring>> settler(mem);

  walk_ring<T>(ring, blocks, g, active, settler, [&](std::size_t, int owner, const auto& kb, const auto& vb) {
    const std::span<const shard_piece> k_pieces(g.kv_of(owner));
    for (block_call c : plan_step(mask, my_pieces, k_pieces)) {
      attention_params params = call_params(my_pieces, k_pieces, c, softmax_scale, q_store, k_store);
      if (!trim_call(mask, c, params, trim)) continue;
      const auto call = [&](tensor_view<T, 4> ob, tensor_view<L, 3> lb) {
        backend.forward(q.slice(1, c.q_offset, c.q_count), kb.slice(1, c.k_offset, c.k_count),
                        vb.slice(1, c.k_offset, c.k_count), mask, ob, lb, params);
      };
      if constexpr (write_first) {
        if (untouched(c.q_offset, c.q_count)) {
          touch(c.q_offset, c.q_count, false);
          call(out_all.slice(1, c.q_offset, c.q_count),
               lse_of_bshd(lse_all.slice(1, c.q_offset, c.q_count)));
          continue;
        }
        if (out_blk.size() == 0) {  // the first merge: its block buffers, as large as any call
          out_blk = mem.template allocate<T>(out_size);
          lse_blk = mem.template allocate<L>(lse_size);
        }
      }
      touch(c.q_offset, c.q_count, true);
      const auto ob = g.stored<T>(out_blk.data(), c.q_count, hq);
      const auto lb = lse_view<L>(lse_blk.data(), b, hq, c.q_count);
      call(ob, lb);
      mem.merge(out_all.slice(1, c.q_offset, c.q_count), lse_all.slice(1, c.q_offset, c.q_count),
                ob.as_const(), lse_as_bshd(lb).as_const());
    }
  });
  touch(0, sl, true);  // rows no block reached: the empty result
  if (!out_in_place) mem.copy(out_all.as_const(), out);
  if (!lse_in_place) mem.copy(lse_all.as_const(), lse_as_bshd(lse));
  settler.finish();
}

template <class T, class Ring, class Backend, class Mask, class M>
void ring_backward(Ring& ring, Backend& backend, M& mem, const ring_geometry& g, tensor_view<const T, 4> q,
                   tensor_view<const T, 4> k, tensor_view<const T, 4> v, tensor_view<const T, 4> out,
                   tensor_view<const lse_t<T>, 3> lse, tensor_view<const T, 4> dout, const Mask& mask,
                   tensor_view<T, 4> dq, tensor_view<T, 4> dk, tensor_view<T, 4> dv, double softmax_scale,
                   std::int64_t trim = trim_tile) {
  using A = cp_accumulator_t<T>;
  const int me = ring.rank();
  const ring_schedule schedule{ring.size()};
  const std::int64_t b = g.batch, sl = g.len(me), hq = g.heads_q, hkv = g.heads_kv, d = g.dim;
  const std::int64_t capacity = g.kv_capacity();
  const std::span<const shard_piece> my_pieces(g.q_of(me));
  const std::vector<int> active = active_ring_steps(mask, g);
  if (!active.empty()) reserve_backend<T>(backend, g, me);

  const auto kv_size = static_cast<std::size_t>(2 * capacity), dq_size = static_cast<std::size_t>(b * sl * hq * d);
  kv_blocks<T, M> blocks(mem, k, v, capacity, g.head_major);
  typename M::template buffer<T> q_staged, out_staged, dout_staged;
  q = in_ring_layout(mem, g, q, q_staged);
  out = in_ring_layout(mem, g, out, out_staged);
  dout = in_ring_layout(mem, g, dout, dout_staged);
  typename M::template buffer<A> dq_acc;
  bool dq_in_place = false;
  const tensor_view<A, 4> dq_all = accumulator_for<A>(mem, dq, g.stored<A>(nullptr, sl, hq).strides(), dq_acc, dq_in_place);
  mem.fill(std::span<A>(dq_all.data, dq_size), A(0));
  // This step's dK/dV for the held block (then its sum with what arrived); the accumulator
  // arriving from the previous holder; the sum being sent on. Three buffers so that the
  // send of one step overlaps the next compute.
  // Each is laid out as the held block's owner's K and V: [b, len(owner), hkv, d] at 0 and at
  // `capacity`, in the ring's layout.
  auto grad_step = mem.template allocate<A>(kv_size), grad_in = mem.template allocate<A>(kv_size),
       grad_out = mem.template allocate<A>(kv_size);
  // When the own block is the first one held and others follow, the owner's own dK/dV does
  // not travel: it is summed where the result goes (dk and dv themselves when they are dense
  // and of the accumulator's type, else a buffer each, as dq), and the others' sum is added
  // when it comes home. The accumulator that travels starts at the second active step: R - 1
  // hops of the fp32 K/V-sized block instead of R (at R = 2, one instead of two).
  const bool own_kept = own_grad_stays_home(active);
  typename M::template buffer<A> own_k_acc, own_v_acc;
  bool own_k_in_place = false, own_v_in_place = false;
  tensor_view<A, 4> own_k, own_v;
  if (own_kept) {
    const std::array<std::int64_t, 4> layout = g.stored<A>(nullptr, g.kv_len(me), hkv).strides();
    own_k = accumulator_for<A>(mem, dk, layout, own_k_acc, own_k_in_place);
    own_v = accumulator_for<A>(mem, dv, layout, own_v_acc, own_v_in_place);
  }
  // When the accumulators have the element type (float, double), the backend adds into them
  // itself (params.accumulate); otherwise each call writes a block that is then accumulated.
  constexpr bool backend_accumulates = std::is_same_v<A, T>;
  const std::size_t block_size = backend_accumulates ? 0 : dq_size;
  const std::size_t kv_block_size = backend_accumulates ? 0 : static_cast<std::size_t>(capacity);
  auto dq_blk = mem.template allocate<T>(block_size), dk_blk = mem.template allocate<T>(kv_block_size),
       dv_blk = mem.template allocate<T>(kv_block_size);
  std::vector<std::int64_t> q_store, k_store;
  transfer_settler<M, shift_request_t<Ring>> settler(mem);
  in_flight<shift_request_t<Ring>> grad_transfer;

  walk_ring<T>(ring, blocks, g, active, settler, [&](std::size_t i, int owner, const auto& kb, const auto& vb) {
    const int step = active[i];
    const bool last = i + 1 == active.size();
    const bool own_here = own_kept && i == 0;  // this step's dK/dV is the own part, summed in own_k, own_v
    const std::span<const shard_piece> k_pieces(g.kv_of(owner));
    const std::int64_t kl = g.kv_len(owner);
    const tensor_view<A, 4> dk_all = own_here ? own_k : g.stored(grad_step.data(), kl, hkv);
    const tensor_view<A, 4> dv_all = own_here ? own_v : g.stored(grad_step.data() + capacity, kl, hkv);
    if (own_here) {
      mem.fill(std::span<A>(own_k.data, static_cast<std::size_t>(own_k.size())), A(0));
      mem.fill(std::span<A>(own_v.data, static_cast<std::size_t>(own_v.size())), A(0));
    } else {
      mem.fill(std::span<A>(grad_step.data(), kv_size), A(0));
    }
    for (block_call c : plan_step(mask, my_pieces, k_pieces)) {
      attention_params params = call_params(my_pieces, k_pieces, c, softmax_scale, q_store, k_store);
      if (!trim_call(mask, c, params, trim)) continue;
      // The K/V of THIS step, and the final merged out / lse (never anything from step 0).
      const auto call = [&](tensor_view<T, 4> gq, tensor_view<T, 4> gk, tensor_view<T, 4> gv) {
        backend.backward(q.slice(1, c.q_offset, c.q_count), kb.slice(1, c.k_offset, c.k_count),
                         vb.slice(1, c.k_offset, c.k_count), out.slice(1, c.q_offset, c.q_count),
                         lse.slice(2, c.q_offset, c.q_count), dout.slice(1, c.q_offset, c.q_count), mask,
                         gq, gk, gv, params);
      };
      if constexpr (backend_accumulates) {
        params.accumulate = true;
        call(dq_all.slice(1, c.q_offset, c.q_count),
             dk_all.slice(1, c.k_offset, c.k_count),
             dv_all.slice(1, c.k_offset, c.k_count));
      } else {
        const auto gq = g.stored<T>(dq_blk.data(), c.q_count, hq);
        const auto gk = g.stored<T>(dk_blk.data(), c.k_count, hkv);
        const auto gv = g.stored<T>(dv_blk.data(), c.k_count, hkv);
        call(gq, gk, gv);
        mem.accumulate(dq_all.slice(1, c.q_offset, c.q_count), gq.as_const());
        mem.accumulate(dk_all.slice(1, c.k_offset, c.k_count), gk.as_const());
        mem.accumulate(dv_all.slice(1, c.k_offset, c.k_count), gv.as_const());
      }
    }
    if (own_here) return;  // nothing travels yet
    // The held block's accumulator so far arrives from its previous holder (none at the first
    // step that sends) and is added to this step's in place; the sum becomes grad_out (whose
    // previous send has completed: grad_transfer was settled) and grad_step is reused.
    settler.settle(grad_transfer);
    if (i > (own_kept ? 1u : 0u))  // an accumulator arrived from the block's previous holder
      mem.accumulate(flat_view(grad_step.data(), 2 * capacity), flat_view(grad_in.data(), 2 * capacity).as_const());
    std::swap(grad_step, grad_out);
    // Send it on with the block; after the last active step, back to the owner (me - step),
    // none when the last block held is the own one.
    const int hop = last ? schedule.hops_to_owner(step) : active[i + 1] - step;
    if (hop != 0)
      grad_transfer = start_shift(ring, mem, grad_out, grad_in, hop, tag_grad);
    else
      std::swap(grad_in, grad_out);
  });
  // grad_in now holds the dK/dV of my own keys from every rank's queries (but mine, when own_kept).
  settler.settle(grad_transfer);
  if (active.empty()) mem.fill(std::span<A>(grad_in.data(), kv_size), A(0));

  if (!dq_in_place) mem.copy(dq_all.as_const(), dq);
  const std::int64_t kl = g.kv_len(me);
  const auto others_k = g.stored(static_cast<const A*>(grad_in.data()), kl, hkv);
  const auto others_v = g.stored(static_cast<const A*>(grad_in.data()) + capacity, kl, hkv);
  if (own_kept) {  // the own part, kept here, plus the others' sum
    mem.accumulate(own_k, others_k);
    mem.accumulate(own_v, others_v);
    if (!own_k_in_place) mem.copy(own_k.as_const(), dk);
    if (!own_v_in_place) mem.copy(own_v.as_const(), dv);
  } else {
    mem.copy(others_k, dk);
    mem.copy(others_v, dv);
  }
  settler.finish();
}

}  // namespace baton::detail::cp
