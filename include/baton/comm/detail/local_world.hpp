// baton/comm/detail/local_world.hpp — the shared state behind baton::local_communicator.
//
// One `world` per run_local call: the failure record and which ranks have returned.
// One `group` per communicator (the world's, and one per split): mailboxes for
// point-to-point messages and the rendezvous for collectives. All state is guarded by the
// world's single mutex; bulk copies run outside it. A rank waits on its own doorbell
// (detail/wakeup.hpp): it spins briefly, then sleeps, and every change that concerns it rings.
//
// Point-to-point is a rendezvous without intermediate buffers: isend and irecv each post a
// descriptor of the caller's buffer, and the two meet in the receiver's mailbox. The bytes go
// straight from the sender's buffer into the receiver's (one memcpy, outside the lock). Who
// copies: the call that finds its partner posted copies at once — unless the message is large
// (deferred_copy_bytes and up) and the partner's rank is busy (in no wait of this world). Then
// the two are only paired, and the first end to wait on it (or test it, or drop its request)
// copies. Rationale: in a ring shift every rank posts and then computes, so "the second
// poster copies" gave one rank both directions of every shift before its compute while the
// other copied nothing — at two ranks one copy time per shift on the slower rank's path.
// Deferred, each rank's wait copies what is still pending, an idle rank copying for a busy
// one, and both directions run at once. Where the partner already waits, the poster copies:
// handing the copy over would add a wake-up to a blocking send or receive (1 MiB one way:
// 0.50 of memcpy's speed copied at once, 0.43 handed over). A matched message can always be
// finished by either end alone, so a rank blocked in one wait never holds up a transfer
// another rank needs.
//
// One exception: a large message (receiver_copy_bytes and up) whose sender finds the receiver
// asleep in a wait on exactly that receive is copied by the receiver, woken for it. Copies
// that took turns between the two ranks' threads found the destination's lines dirty in the
// other core's caches each time: 64 MiB one way ran at 0.84-0.94 of memcpy so and 0.87-1.14
// with the receiver copying (docs/communicators.md). The data is then in the cache of the rank
// that reads it next. Only a receiver that sleeps on that very receive is handed the copy
// (one asleep in another wait might wait there for this sender: a deadlock), and a sender's
// wait that reaches its deadline copies itself, so the rule above still holds.
#pragma once

#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/elements.hpp>
#include <baton/comm/detail/wakeup.hpp>
#include <baton/comm/error.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace baton::detail::comm::local {

using clock = std::chrono::steady_clock;

struct p2p_op;
class group;

/// What a world rank is blocked in (guarded by the world's mutex): a request's wait() or a
/// collective's wait for its members, set while it sleeps. A wait that times out follows these
/// records from the ranks it waits for to the one that is in no wait at all, the stalled rank,
/// and names it (as the MPI backend does by asking every rank).
struct blocked_on {
  const group* in = nullptr;  // null: not blocked in this world
  int rank = -1;              // its rank in `in`
  const p2p_op* op = nullptr;  // the message it waits for, or null in a collective
  comm::collective_kind kind = comm::collective_kind::barrier;
};

/// Failure and exit records of one run_local world. Guarded by `mutex`.
class world {
 public:
  explicit world(int n, wait_mode waits = wait_mode::automatic)
      : exited(static_cast<std::size_t>(n), 0),
        blocked(static_cast<std::size_t>(n)),
        bells(static_cast<std::size_t>(n)),
        awake(n),
        cores(static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
        mode(waits) {}

  std::mutex mutex;

  int failed_rank = -1;
  std::string failure;             // what() of the first error
  std::exception_ptr first_error;  // null until a rank failed
  std::vector<char> exited;        // by world rank: its function returned normally
  std::vector<blocked_on> blocked;  // by world rank: what it is waiting in now

  /// Whether a rank has failed (lock held).
  bool failed() const noexcept { return first_error != nullptr; }

  /// Where world rank r waits. A state change rings only the ranks it concerns — the two
  /// ends of a message, the members of a group — so a message costs one wake-up, not one per
  /// rank of the world. Failure and exit can concern anyone: they ring every rank.
  ///
  /// ring() bumps the rank's doorbell (lock held) and returns whether the rank is asleep;
  /// only then does it need notify(), which the ringer calls after unlocking, so that the
  /// sleeper does not wake into a mutex that is still held (it would block on it at once:
  /// two more trips through the kernel, most of a hand-off's cost before this).
  ///
  /// Only the first ring of a sleep owes a wake-up: it clears `asleep`. One wake-up after a
  /// ring is enough, because the sleeper's futex compares the count the ring moved (it cannot
  /// sleep on through it). A woken rank keeps its `asleep` until it has a core and the mutex
  /// again, and with more ranks than cores that takes a while: every message meanwhile used to
  /// wake it again, a system call that found nobody (a quarter of the executor's futex calls
  /// at 4 ranks on 2 cores, docs/pipeline.md).
  bool ring(int world_rank) {
    doorbell& d = bell(world_rank);
    d.rings.fetch_add(1, std::memory_order_release);
    if (!d.asleep) return false;
    d.asleep = false;
    d.wake_owed.store(true, std::memory_order_relaxed);
    return true;
  }
  /// Delivers the wake-up a ring owes (without the mutex); nothing where none is owed, so a
  /// group may notify all of its members after ringing them.
  void notify(int world_rank) {
    doorbell& d = bell(world_rank);
    if (d.wake_owed.exchange(false, std::memory_order_acq_rel)) d.wake();
  }
  void wake_everyone() {
    for (std::size_t r = 0; r < bells.size(); ++r) {
      if (ring(static_cast<int>(r))) notify(static_cast<int>(r));
    }
  }

  /// Waits until world rank r is rung or `deadline` passes (lock held on entry and on
  /// return). It may also return early: callers re-check what they wait for. Rings are
  /// bumped under the lock and read here under it before sleeping, so none is lost.
  void sleep(int world_rank, std::unique_lock<std::mutex>& lock, clock::time_point deadline) {
    doorbell& d = bell(world_rank);
    const std::uint32_t seen = d.rings.load(std::memory_order_relaxed);
    if (may_spin() && d.should_spin()) {
      lock.unlock();
      const bool rung = d.spin(seen, deadline);
      relock(lock);
      if (rung || d.rings.load(std::memory_order_relaxed) != seen || clock::now() >= deadline) return;
    }
    d.asleep = true;
    --awake;
    d.block(lock, seen, deadline);
    ++awake;
    d.asleep = false;
  }

  /// Records the first error of the world and wakes every waiter. Later errors are
  /// consequences (other ranks aborting) and are dropped.
  void fail(int world_rank, std::exception_ptr error) {
    std::string what;
    try {
      std::rethrow_exception(error);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "an exception not derived from std::exception";
    }
    std::lock_guard lock(mutex);
    if (!failed()) {
      failed_rank = world_rank;
      failure = std::move(what);
      first_error = std::move(error);
    }
    wake_everyone();
  }

  void mark_exited(int world_rank) {
    std::lock_guard lock(mutex);
    exited[static_cast<std::size_t>(world_rank)] = 1;
    --awake;  // its thread ends: it no longer competes for a core
    wake_everyone();
  }

  /// "aborted because rank 2 failed: <what>" (lock held).
  std::string abort_reason() const {
    return "aborted because rank " + std::to_string(failed_rank) + " failed: " + failure;
  }

 private:
  doorbell& bell(int world_rank) { return bells[static_cast<std::size_t>(world_rank)]; }

  std::vector<doorbell> bells;  // by world rank; never resized
  int awake;                    // ranks neither returned nor asleep in sleep()
  int cores;                    // hardware threads of the machine
  wait_mode mode;

  /// Spinning needs a ringer that runs meanwhile: another awake rank (awake counts this
  /// one). In automatic mode the awake ranks must also leave a core spare, for the rest of
  /// the machine's work: where they would take every core (2 ranks on a 2-core machine,
  /// 4 on 4), a spin measured no faster than blocking and stole the time slices of
  /// whatever else ran there, peers included (docs/pipeline.md, "Figures").
  bool may_spin() const noexcept {
    switch (mode) {
      case wait_mode::block: return false;
      case wait_mode::spin: return awake >= 2;
      case wait_mode::automatic: break;
    }
    return awake >= 2 && awake < cores;
  }
};

enum class op_kind : std::uint8_t { send, recv };
/// posted: waiting for its partner; matched: paired, the copy not started (either end may
/// start it); copying: one end copies; done / failed: finished.
enum class op_state : std::uint8_t { posted, matched, copying, done, failed };

/// Messages of at least this many bytes, paired while the partner's rank is busy, are copied
/// by whichever end waits first, not by the call that pairs them (see the top of this file).
/// Below it a copy costs less than the extra wake-up that handing it over can cost.
inline constexpr std::size_t deferred_copy_bytes = std::size_t{256} << 10;

/// Messages of at least this many bytes whose sender pairs them with a receive its rank
/// sleeps on are copied by the receiver (see the top of this file). The hand-off this adds to
/// the sender's wait is a few percent of such a copy at most.
inline constexpr std::size_t receiver_copy_bytes = std::size_t{16} << 20;

/// One posted isend or irecv: a view of the caller's buffer. Owned by its request; queued
/// (by pointer) in a mailbox until matched or cancelled.
struct p2p_op {
  op_kind kind = op_kind::send;
  int owner = 0;  // group rank that posted it
  int peer = 0;   // destination of a send, source of a receive
  int tag = 0;
  const std::byte* send_data = nullptr;
  std::byte* recv_data = nullptr;
  std::size_t bytes = 0;
  op_state state = op_state::posted;
  bool receiver_copies = false;  // a send handed to its waiting receiver: its sender's wait leaves the copy
  p2p_op* partner = nullptr;  // the other end, once matched (alive while this one is matched)
  std::string error;  // set when state == failed
};

/// Unmatched sends addressed to one rank, and that rank's unmatched receives, in post order.
struct mailbox {
  std::vector<p2p_op*> sends;
  std::vector<p2p_op*> recvs;
};

using coll_kind = comm::collective_kind;

/// What one rank brings to a collective. Published at arrival; read by every rank between
/// the first and the last barrier of that collective.
struct coll_entry {
  coll_kind kind = coll_kind::barrier;
  const void* send = nullptr;
  void* recv = nullptr;  // all_reduce: the in/out buffer
  std::size_t send_bytes = 0;
  std::size_t recv_bytes = 0;
  std::size_t element_size = 1;
  element_kind element = element_kind::float32;  // all_reduce: which reducible_element
  reduce_op op = reduce_op::sum;
  int root = 0;
  std::span<const std::int64_t> send_counts;
  std::span<const std::int64_t> recv_counts;
  int color = 0;
  int key = 0;
  std::shared_ptr<void> created;  // split: the new group, published by its leader
};

/// One communicator's ranks: mailboxes and the collective rendezvous.
class group {
 public:
  group(std::shared_ptr<world> w, std::vector<int> ranks)
      : the_world(std::move(w)),
        world_ranks(std::move(ranks)),
        boxes(world_ranks.size()),
        entries(world_ranks.size()),
        present(world_ranks.size(), 0) {}

  int size() const noexcept { return static_cast<int>(world_ranks.size()); }

  std::shared_ptr<world> the_world;
  std::vector<int> world_ranks;  // group rank -> world rank
  std::vector<mailbox> boxes;    // guarded by the world mutex
  std::vector<coll_entry> entries;
  std::vector<char> present;  // guarded: who has arrived at the current barrier
  int arrived = 0;
  std::uint64_t generation = 0;
  std::string broken;  // set when a collective failed part-way: the group cannot continue

  /// "rank 1", or "rank 1 (world rank 3)" in a sub-group.
  std::string rank_text(int rank) const {
    const int w = world_ranks[static_cast<std::size_t>(rank)];
    const bool is_world = world_ranks.size() == the_world->exited.size() && w == rank;
    return "rank " + std::to_string(rank) + (is_world ? "" : " (world rank " + std::to_string(w) + ")");
  }

  int world_rank_of(int rank) const { return world_ranks[static_cast<std::size_t>(rank)]; }

  /// Rings every member (lock held); true when one of them is asleep and needs
  /// notify_members() (after unlocking).
  bool ring_members() {
    bool sleeping = false;
    for (int r : world_ranks) sleeping = the_world->ring(r) || sleeping;
    return sleeping;
  }
  void notify_members() {
    for (int r : world_ranks) the_world->notify(r);
  }
  /// Rings and notifies every member (lock held): for the rare paths.
  void wake_members() {
    if (ring_members()) notify_members();
  }

  bool peer_exited(int peer) const { return the_world->exited[static_cast<std::size_t>(world_ranks[static_cast<std::size_t>(peer)])] != 0; }

  /// Posts `op`; if its partner is already posted, pairs them, and copies a small message at
  /// once (a large one is left to whichever end waits first: deliver()).
  void post(p2p_op& op) {
    world& w = *the_world;
    std::unique_lock lock(w.mutex);
    if (w.failed()) {
      throw comm_error(rank_text(op.owner) + ": " + describe(op) + " " + w.abort_reason());
    }
    // Both ends meet in the receiver's mailbox: a send looks among its receives, a receive
    // among the sends addressed to it, for the first one from the other end with this tag.
    const bool sending = op.kind == op_kind::send;
    mailbox& box = boxes[static_cast<std::size_t>(sending ? op.peer : op.owner)];
    auto& waiting = sending ? box.recvs : box.sends;
    const auto it = std::find_if(waiting.begin(), waiting.end(), [&](const p2p_op* other) {
      return other->owner == op.peer && other->peer == op.owner && other->tag == op.tag;
    });
    if (it == waiting.end()) {
      (sending ? box.sends : box.recvs).push_back(&op);
      return;
    }
    p2p_op* partner = *it;
    waiting.erase(it);
    op.partner = partner;
    partner->partner = &op;
    op.state = op_state::matched;
    partner->state = op_state::matched;
    const std::size_t bytes = sending ? op.bytes : partner->bytes;
    const int other = world_rank_of(partner->owner);
    const blocked_on& other_wait = w.blocked[static_cast<std::size_t>(other)];
    // The receiver sleeps in a wait on exactly this receive, so it will copy as soon as it
    // runs; the sender's wait leaves the copy to it (up to its deadline).
    op.receiver_copies = sending && bytes >= receiver_copy_bytes && other_wait.op == partner;
    const bool other_busy = other_wait.in == nullptr;
    if (!op.receiver_copies && (bytes < deferred_copy_bytes || !other_busy)) {
      deliver(op, lock);
      return;
    }
    // Left to the receiver, or to the first end that waits. Ring the partner's rank: it sleeps
    // in that wait, or may be between its last check and its sleep in a wait on this op.
    const bool asleep = w.ring(other);
    lock.unlock();
    if (asleep) w.notify(other);
  }

  /// Copies a matched message and completes both ends (lock held on entry and on return;
  /// released around the copy). Both buffers stay valid meanwhile: neither owner can finish
  /// or cancel a request while it is `copying`.
  void deliver(p2p_op& op, std::unique_lock<std::mutex>& lock) {
    world& w = *the_world;
    p2p_op& send = op.kind == op_kind::send ? op : *op.partner;
    p2p_op& recv = op.kind == op_kind::send ? *op.partner : op;
    send.state = op_state::copying;
    recv.state = op_state::copying;
    lock.unlock();

    std::string error;
    if (send.bytes != recv.bytes) {
      error = rank_text(recv.owner) + ": " + describe(recv) + ": the message has " + std::to_string(send.bytes) +
              " bytes but the receive buffer holds " + std::to_string(recv.bytes) +
              "; a message must exactly fill its receive buffer (check the shapes both ranks use)";
    } else if (send.bytes != 0) {
      std::memcpy(recv.recv_data, send.send_data, send.bytes);
    }

    lock.lock();
    send.state = op_state::done;  // the sender's data was delivered (or refused): it may reuse it
    recv.state = error.empty() ? op_state::done : op_state::failed;
    recv.error = std::move(error);
    send.partner = nullptr;
    recv.partner = nullptr;
    const int ends[] = {world_rank_of(send.owner), world_rank_of(recv.owner)};
    const bool asleep[] = {w.ring(ends[0]), w.ring(ends[1])};
    if (asleep[0] || asleep[1]) {
      lock.unlock();
      for (int k = 0; k < 2; ++k) {
        if (asleep[k]) w.notify(ends[k]);
      }
      relock(lock);
    }
  }

  /// Withdraws a posted op, delivers a matched one (its partner counts on it), or waits out a
  /// copy in progress (lock held).
  void cancel(p2p_op& op, std::unique_lock<std::mutex>& lock) {
    if (op.state == op_state::matched) deliver(op, lock);
    if (op.state == op_state::posted) {
      auto& queue = op.kind == op_kind::send ? boxes[static_cast<std::size_t>(op.peer)].sends
                                             : boxes[static_cast<std::size_t>(op.owner)].recvs;
      queue.erase(std::remove(queue.begin(), queue.end(), &op), queue.end());
      op.state = op_state::failed;
      return;
    }
    while (op.state == op_state::copying) the_world->sleep(world_rank_of(op.owner), lock, clock::time_point::max());
  }

  /// Why a posted op can never complete, or "" while it still may (lock held).
  std::string hopeless(const p2p_op& op, clock::time_point deadline, std::chrono::nanoseconds timeout) const {
    const world& w = *the_world;
    if (w.failed()) return rank_text(op.owner) + ": " + describe(op) + " " + w.abort_reason();
    const bool sending = op.kind == op_kind::send;
    if (peer_exited(op.peer)) {
      return rank_text(op.owner) + ": " + describe(op) + " cannot complete: peer " + std::to_string(op.peer) +
             " returned from its function without " +
             (sending ? "receiving this message" : "sending a matching message") +
             "; make both ranks agree on peer, tag and count";
    }
    if (clock::now() >= deadline) {
      std::string cause = stalled_text(world_rank_of(op.owner), {world_rank_of(op.peer)});
      if (cause.empty())
        cause = "peer " + std::to_string(op.peer) + " posted no matching " + (sending ? "irecv" : "isend") + " with tag " +
                std::to_string(op.tag);
      return rank_text(op.owner) + ": " + describe(op) + " timed out after " + comm::seconds_text(timeout) + ": " +
             cause + "; check that the ranks agree on peer, tag and order, or raise local_options::timeout";
    }
    return {};
  }

  /// Marks world rank `w`'s rank `rank` of this group blocked in `op` (or in a collective of
  /// `kind` when op is null), or no longer blocked (lock held).
  void set_blocked(int rank, const p2p_op* op, comm::collective_kind kind = comm::collective_kind::barrier) {
    the_world->blocked[static_cast<std::size_t>(world_rank_of(rank))] = {this, rank, op, kind};
  }
  void clear_blocked(int rank) { the_world->blocked[static_cast<std::size_t>(world_rank_of(rank))] = {}; }

  /// Why a wait of world rank `me` for `targets` (world ranks) can never end, from what every
  /// rank is blocked in (lock held): the ranks on the chain of waits that are in no wait of
  /// this world have not reached the matching call; if every rank on the chain waits, it is a
  /// deadlock. "" when nothing can be said (a rank on the chain returned or failed: the other
  /// messages say so).
  std::string stalled_text(int me, std::vector<int> targets) const {
    const world& w = *the_world;
    const auto n = w.exited.size();
    std::vector<char> seen(n, 0);
    std::vector<int> stalled, waiting;
    while (!targets.empty()) {
      const int r = targets.back();
      targets.pop_back();
      if (r < 0 || static_cast<std::size_t>(r) >= n || seen[static_cast<std::size_t>(r)] != 0 || r == me) continue;
      seen[static_cast<std::size_t>(r)] = 1;
      if (w.exited[static_cast<std::size_t>(r)] != 0) return {};
      const blocked_on& b = w.blocked[static_cast<std::size_t>(r)];
      if (b.in == nullptr) {
        stalled.push_back(r);
        continue;
      }
      waiting.push_back(r);
      for (int t : b.in->waited_for(b)) targets.push_back(t);
    }
    std::sort(stalled.begin(), stalled.end());
    std::sort(waiting.begin(), waiting.end());
    std::string others;
    for (int r : waiting)
      others += (others.empty() ? "" : ", ") + ("world rank " + std::to_string(r) + " in " +
                                                  w.blocked[static_cast<std::size_t>(r)].in->blocked_text(
                                                      w.blocked[static_cast<std::size_t>(r)]));
    if (!stalled.empty()) {
      std::string names;
      for (int r : stalled) names += (names.empty() ? "" : ", ") + std::to_string(r);
      return std::string(stalled.size() == 1 ? "world rank " : "world ranks ") + names +
             (stalled.size() == 1 ? " has" : " have") +
             " not reached the matching call: not waiting in any message or collective of this world (still "
             "computing, stuck, or it skipped the call)" +
             (others.empty() ? "" : "; waiting meanwhile: " + others);
    }
    if (!others.empty())
      return "every rank it waits for is waiting too, a deadlock: " + others +
             "; make the ranks agree on peer, tag and order of their messages and collectives";
    return {};
  }

  /// The world ranks a rank blocked as `b` in this group waits for (lock held): its message's
  /// peer, or the members of its collective that have not arrived.
  std::vector<int> waited_for(const blocked_on& b) const {
    std::vector<int> out;
    if (b.op != nullptr) {
      out.push_back(world_rank_of(b.op->peer));
    } else {
      for (int r = 0; r < size(); ++r)
        if (present[static_cast<std::size_t>(r)] == 0) out.push_back(world_rank_of(r));
    }
    return out;
  }

  /// "irecv from world rank 2 (tag 5, 64 bytes)", "barrier (missing: world ranks 3)".
  std::string blocked_text(const blocked_on& b) const {
    std::string ranks;
    for (int r : waited_for(b)) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    if (b.op != nullptr)
      return std::string(b.op->kind == op_kind::send ? "isend to" : "irecv from") + " world rank " + ranks + " (tag " +
             std::to_string(b.op->tag) + ", " + std::to_string(b.op->bytes) + " bytes)";
    return std::string(comm::collective_name(b.kind)) + " (missing: world rank" + (ranks.find(',') != std::string::npos ? "s " : " ") +
           ranks + ")";
  }

  static std::string describe(const p2p_op& op) {
    return comm::p2p_text(op.kind == op_kind::send ? "isend" : "irecv", op.peer, op.tag, op.bytes);
  }

  /// Marks `rank` arrived at the barrier (lock held); true when it was the last, which opens
  /// the barrier for everyone.
  /// The last rings the members and unlocks `lock`, then notifies the sleeping ones.
  bool arrive(int rank, std::unique_lock<std::mutex>& lock) {
    present[static_cast<std::size_t>(rank)] = 1;
    if (++arrived != size()) return false;
    arrived = 0;
    std::fill(present.begin(), present.end(), 0);
    ++generation;
    const bool sleeping = ring_members();
    lock.unlock();
    if (sleeping) notify_members();
    return true;
  }

  /// The barriers inside a collective, after every rank has entered it: between them each
  /// rank reads the others' buffers, so none may leave early, not even when the world fails
  /// meanwhile (its caller would free a buffer that a peer still copies from). Every member
  /// is past the entry and only copies memory until it arrives here, so the wait is short and
  /// needs no timeout; a failure is reported by the communicator's next operation.
  void arrive_committed(int rank) {
    world& w = *the_world;
    std::unique_lock lock(w.mutex);
    if (arrive(rank, lock)) return;
    const std::uint64_t mine_generation = generation;
    while (generation == mine_generation) w.sleep(world_rank_of(rank), lock, clock::time_point::max());
  }

  /// Arrives at the group's barrier (publishing `mine` first when given) and returns once
  /// every rank has arrived. Throws when the world failed, a member returned without
  /// arriving, or the timeout passed; the last two break the group for everyone.
  void arrive_and_wait(int rank, coll_kind kind, std::chrono::nanoseconds timeout, const coll_entry* mine) {
    world& w = *the_world;
    std::unique_lock lock(w.mutex);
    // "rank 1: barrier", formatted only when an error is raised.
    const auto who = [&] { return rank_text(rank) + ": " + comm::collective_name(kind); };
    if (w.failed()) throw comm_error(who() + " " + w.abort_reason());
    if (!broken.empty()) {
      throw comm_error(who() + " refused: an earlier collective of this communicator failed (" + broken +
                       "); create a new communicator");
    }
    if (mine != nullptr) entries[static_cast<std::size_t>(rank)] = *mine;
    if (arrive(rank, lock)) return;
    const std::uint64_t mine_generation = generation;
    const auto deadline = comm::deadline_after(timeout);
    for (;;) {
      if (generation != mine_generation) return;
      if (w.failed()) throw comm_error(who() + " " + w.abort_reason());
      if (!broken.empty()) throw comm_error(who() + " aborted: " + broken);
      std::string missing;
      std::string gone;
      for (int r = 0; r < size(); ++r) {
        if (present[static_cast<std::size_t>(r)] != 0) continue;
        missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        if (peer_exited(r)) gone += (gone.empty() ? "" : ", ") + std::to_string(r);
      }
      if (!gone.empty()) {
        broken = who() + " cannot complete: rank(s) " + gone + " returned from their function without calling " +
                 comm::collective_name(kind) + "; every rank of a communicator must call the same collectives in the same order";
      } else if (clock::now() >= deadline) {
        const std::string cause = stalled_text(world_rank_of(rank), waited_for({this, rank, nullptr, kind}));
        broken = who() + " timed out after " + comm::seconds_text(timeout) + " waiting for rank(s) " + missing +
                 " to join" + (cause.empty() ? "" : ": " + cause) +
                 "; every rank of a communicator must call the same collectives in the same order";
      }
      if (!broken.empty()) {
        clear_blocked(rank);
        wake_members();
        throw comm_error(broken);
      }
      set_blocked(rank, nullptr, kind);
      w.sleep(world_rank_of(rank), lock, deadline);
      clear_blocked(rank);
    }
  }
};

}  // namespace baton::detail::comm::local
