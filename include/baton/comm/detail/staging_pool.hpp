// baton/comm/detail/staging_pool.hpp — the bookkeeping of a GPU communicator's host staging
// (which slot may be handed out, when the pool may grow, who returns a slot and when), apart
// from the CUDA calls it makes: those go through a Runtime policy, so the logic compiles
// without CUDA and its test drives it through a fake runtime on the host. The NCCL backend
// instantiates it with the runtime of detail/nccl_staging.hpp.
//
// Why the discipline: allocating pinned host memory (and waiting for a stream-ordered
// device allocation) synchronises with the device. If a receive of this rank is posted, that
// wait lasts until the peer's send arrives, and the peer may be waiting for this rank's host:
// a deadlock. So every slot is made in advance, sized by the caller, the pool grows only when
// no transfer it knows of is pending, and otherwise an exhausted pool is an error that names
// the option to raise.
#pragma once

#include <baton/comm/error.hpp>

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace baton::detail::comm {

/// What a staging pool is allowed to hold: `slots` slots of `slot_bytes` made in advance,
/// and whether it may grow at a quiescent point (see staging_pool::acquire).
struct staging_limits {
  std::size_t slots = 32;
  std::size_t slot_bytes = 16 * 1024;
  bool grow = true;
};

/// Empty, or what is wrong with `limits` and the fix; `where` names the rank.
inline std::string staging_limits_problem(const std::string& where, const staging_limits& limits) {
  if (limits.slots != 0 && limits.slot_bytes == 0) {
    return where + ": nccl_options::staging_slot_bytes is 0 with " + std::to_string(limits.slots) +
           " staging slots; give each slot the size of the largest host message (the default is 16384 bytes), or set "
           "staging_slots to 0 to stage nothing in advance";
  }
  if (limits.slots == 0 && !limits.grow) {
    return where + ": nccl_options::staging_slots is 0 and staging_growth is false, so no host memory could ever be "
                   "sent or received; allow some slots or growth";
  }
  return {};
}

/// What the pool needs from the device runtime. `memory` is one slot's pinned host and device
/// buffers; `event` is a marker recorded on a stream, which has passed once the stream got
/// past the point where it was recorded (an event never recorded has passed).
template <class R>
concept staging_runtime = requires(R& r, const R& cr, typename R::memory m, typename R::event e, typename R::stream s,
                                   std::size_t n, std::span<const std::byte> bytes) {
  { r.allocate(n) } -> std::same_as<typename R::memory>;  // pinned + device; throws comm_error
  { r.free(m) } noexcept;
  { r.make_event() } -> std::same_as<typename R::event>;
  { r.destroy_event(e) } noexcept;
  { r.record(e, s) };                                    // throws comm_error
  { r.try_record(e, s) } noexcept -> std::same_as<bool>;  // for exception paths
  { cr.passed(e) } -> std::same_as<bool>;
  { r.to_device(m, bytes, s) };                           // host bytes -> pinned -> device, on s
  { r.to_pinned(m, n, s) };                               // device -> pinned, on s
  { cr.pinned(m) } -> std::same_as<std::byte*>;
  { cr.device(m) } -> std::same_as<std::byte*>;
};

template <staging_runtime Runtime>
class staging_pool;

namespace staging {

enum class slot_state {
  free,       // reusable once `done` has passed (it has, if never recorded)
  leased,     // held by a lease: a transfer uses it or is about to
  lost,       // a lease ended without a marker after its last use: never reused
};

template <class Runtime>
struct slot {
  typename Runtime::memory memory{};
  typename Runtime::event done{};
  std::size_t capacity = 0;
  slot_state state = slot_state::free;
};

// What leases and the pool share: the slots outlive the pool object (it moves with its
// communicator) and a lease may outlive the pool (a request kept past its communicator).
template <class Runtime>
struct core {
  Runtime runtime;
  std::vector<slot<Runtime>> slots;
  bool closed = false;  // released: leases ending now touch nothing
};

}  // namespace staging

/// One slot, held while a transfer uses it. Move-only. The lease marks its slot's `done`
/// event after the last use (mark), and when it ends the slot returns to the pool, to be
/// handed out again only once that event has passed. A lease that ends unmarked (an
/// exception between acquiring the slot and enqueueing the transfer, or after it) marks the
/// stream it was acquired for, so a transfer already enqueued there keeps its memory; if
/// even that fails the slot is lost rather than reused.
template <class Runtime>
class staging_lease {
 public:
  staging_lease() = default;
  staging_lease(staging_lease&& other) noexcept { *this = std::move(other); }
  staging_lease& operator=(staging_lease&& other) noexcept {
    if (this != &other) {
      end();
      core_ = std::move(other.core_);
      index_ = other.index_;
      stream_ = other.stream_;
      marked_ = other.marked_;
      other.core_.reset();
    }
    return *this;
  }
  staging_lease(const staging_lease&) = delete;
  staging_lease& operator=(const staging_lease&) = delete;
  ~staging_lease() { end(); }

  explicit operator bool() const noexcept { return core_ != nullptr; }
  /// The pool was released (its communicator destroyed) while this lease was held: its
  /// memory is gone, and using it throws.
  bool orphaned() const noexcept { return core_ != nullptr && core_->closed; }
  std::byte* device() const { return core_->runtime.device(entry().memory); }
  std::byte* pinned() const { return core_->runtime.pinned(entry().memory); }
  std::size_t capacity() const { return entry().capacity; }

  /// Records the slot's `done` event on `stream`, after the last operation that uses it there.
  void mark(typename Runtime::stream stream) {
    core_->runtime.record(entry().done, stream);
    marked_ = true;
  }

  /// Returns the slot now (mark() came after its last use).
  void reset() noexcept { end(); }

 private:
  friend class staging_pool<Runtime>;

  staging_lease(std::shared_ptr<staging::core<Runtime>> core, std::size_t index, typename Runtime::stream stream)
      : core_(std::move(core)), index_(index), stream_(stream) {}

  staging::slot<Runtime>& entry() const {
    if (core_->closed) {
      throw comm_error("a staging slot was used after its communicator was destroyed: wait for (or drop) every "
                       "request of a communicator before destroying it");
    }
    return core_->slots[index_];
  }

  void end() noexcept {
    if (core_ == nullptr) return;
    if (!core_->closed) {
      auto& s = entry();
      const bool safe = marked_ || core_->runtime.try_record(s.done, stream_);
      s.state = safe ? staging::slot_state::free : staging::slot_state::lost;
    }
    core_.reset();
    marked_ = false;
  }

  std::shared_ptr<staging::core<Runtime>> core_;
  std::size_t index_ = 0;
  typename Runtime::stream stream_{};
  bool marked_ = false;
};

/// The staging slots of one communicator, and one marker per lane (a stream its transfers
/// travel on) recorded after every transfer posted there: the pool is quiescent when every
/// marker has passed, i.e. no transfer it was told of is pending.
template <staging_runtime Runtime>
class staging_pool {
 public:
  using lease = staging_lease<Runtime>;
  using stream = typename Runtime::stream;

  staging_pool() = default;

  /// Makes `limits.slots` slots of `limits.slot_bytes` and `lanes` markers (nothing is
  /// posted yet: this is the one place the pool allocates without asking). `where` names
  /// the rank in errors. Throws comm_error for bad limits or a failed allocation (what was
  /// made is freed by release()).
  void make_in_advance(Runtime runtime, staging_limits limits, std::size_t lanes, std::string where) {
    where_ = std::move(where);
    if (auto bad = staging_limits_problem(where_, limits); !bad.empty()) throw comm_error(bad);
    limits_ = limits;
    core_ = std::make_shared<staging::core<Runtime>>(staging::core<Runtime>{std::move(runtime), {}, false});
    core_->slots.reserve(limits.slots);
    for (std::size_t i = 0; i < lanes; ++i) markers_.push_back(core_->runtime.make_event());
    for (std::size_t i = 0; i < limits.slots; ++i) add(limits.slot_bytes);
  }

  /// A slot of at least `bytes` for a transfer on `on`: a free one whose last transfer has
  /// passed, or — only when quiescent() and growth is allowed — a new one. Otherwise throws
  /// comm_error naming the need, the pool and the option to raise; `what` names the transfer.
  lease acquire(std::size_t bytes, stream on, const std::string& what) {
    for (std::size_t i = 0; i < core_->slots.size(); ++i) {
      auto& s = core_->slots[i];
      if (s.state == staging::slot_state::free && s.capacity >= bytes && core_->runtime.passed(s.done)) {
        s.state = staging::slot_state::leased;
        return lease(core_, i, on);
      }
    }
    if (!limits_.grow || !quiescent()) throw comm_error(exhausted(bytes, what));
    add(std::max(bytes, limits_.slot_bytes));
    core_->slots.back().state = staging::slot_state::leased;
    return lease(core_, core_->slots.size() - 1, on);
  }

  /// Host bytes to send: a slot whose device buffer holds them once `on` gets there.
  lease stage_send(std::span<const std::byte> data, stream on, const std::string& what) {
    lease l = acquire(data.size(), on, what);
    core_->runtime.to_device(core_->slots[l.index_].memory, data, on);
    return l;
  }

  /// A received slot's device bytes back to its pinned buffer, on `on` after the transfer.
  void copy_back(const lease& l, std::size_t bytes, stream on) {
    core_->runtime.to_pinned(core_->slots[l.index_].memory, bytes, on);
  }

  /// A transfer was enqueued on lane `lane`'s stream `on`: its marker moves after it.
  void posted(std::size_t lane, stream on) { core_->runtime.record(markers_.at(lane), on); }

  /// No transfer posted on any lane is pending (every marker has passed).
  bool quiescent() const {
    return std::all_of(markers_.begin(), markers_.end(), [&](const auto& e) { return core_->runtime.passed(e); });
  }

  /// Forgets every slot without freeing it, for when a transfer that can no longer be waited
  /// for may still use one (a timed-out collective): leaked rather than freed under it.
  void abandon() noexcept {
    if (core_ == nullptr) return;
    core_->closed = true;
    core_.reset();
    markers_.clear();
  }

  std::size_t slot_count() const noexcept { return core_ != nullptr ? core_->slots.size() : 0; }

  /// Frees every slot and marker. The caller waits for the lanes first (a slot's memory may
  /// still be in use there); leases ending later touch nothing.
  void release() noexcept {
    if (core_ == nullptr) return;
    for (auto& s : core_->slots) {
      core_->runtime.destroy_event(s.done);
      core_->runtime.free(s.memory);
    }
    for (auto& e : markers_) core_->runtime.destroy_event(e);
    core_->slots.clear();
    markers_.clear();
    core_->closed = true;
    core_.reset();
  }

 private:
  void add(std::size_t capacity) {
    staging::slot<Runtime> s;
    s.capacity = capacity;
    s.done = core_->runtime.make_event();
    try {
      s.memory = core_->runtime.allocate(capacity);
    } catch (...) {
      core_->runtime.destroy_event(s.done);
      throw;
    }
    core_->slots.push_back(std::move(s));
  }

  std::string exhausted(std::size_t bytes, const std::string& what) const {
    std::size_t leased = 0, largest = 0;
    for (const auto& s : core_->slots) {
      if (s.state != staging::slot_state::free) ++leased;
      largest = std::max(largest, s.capacity);
    }
    const std::string pool = std::to_string(core_->slots.size()) + " slots x " + std::to_string(limits_.slot_bytes) +
                             " bytes (largest " + std::to_string(largest) + ", " + std::to_string(leased) +
                             " held by pending requests, the others still in flight or too small)";
    const std::string why = limits_.grow
                                ? "growing it now could deadlock (allocating pinned memory waits for the device, and a "
                                  "transfer of this communicator is pending)"
                                : "nccl_options::staging_growth is false";
    return where_ + ": " + what + " needs a host staging slot of " + std::to_string(bytes) +
           " bytes, but none of the staging pool's " + pool + " is free; " + why +
           "; raise nccl_options::staging_slots (slots in flight at once) or staging_slot_bytes (the largest host "
           "message), or complete earlier requests first";
  }

  std::shared_ptr<staging::core<Runtime>> core_;
  std::vector<typename Runtime::event> markers_;
  staging_limits limits_;
  std::string where_;
};

}  // namespace baton::detail::comm
