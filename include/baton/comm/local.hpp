// baton/comm/local.hpp — the local world: ranks are threads of one process. Its one job is the
// local world's public face, the pieces a program uses together: local_options, local_request
// (a pending transfer), local_communicator (every capability concept) and run_local (the
// world's threads and failure handling); the shared state behind them is detail/local_world.hpp.
//
//     baton::run_local(4, [](baton::local_communicator& comm) {
//       std::vector<float> grad(1024, float(comm.rank()));
//       comm.all_reduce(std::span(grad), baton::reduce_op::sum);
//     });
//
// Used by the tests, the demo and single-machine runs. It models every capability concept
// (point-to-point, all collectives, split, ring shift). Messages are copied once, straight
// from the sender's buffer into the receiver's (a large one, paired while its partner
// computes, by whichever end waits first). Floating-point reductions are computed in a fixed
// rank order, each element by one rank, so every rank gets bitwise the same result.
// Nothing hangs: every wait ends within local_options::timeout, and when one rank throws,
// every other rank's pending and later operations end with comm_error at once and
// run_local rethrows the first (root-cause) error.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/elements.hpp>
#include <baton/comm/detail/local_world.hpp>
#include <baton/comm/detail/reduce.hpp>
#include <baton/comm/error.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// How a rank of the local world waits for another: spin briefly, then block, or block at
/// once. A hand-off that blocks costs each side a trip through the kernel (microseconds);
/// one caught while spinning costs a cache line.
enum class local_wait : std::uint8_t {
  automatic,  ///< spin while the world's running ranks leave a core of the machine spare
  spin,       ///< spin first whenever another rank runs (ranks pinned to otherwise idle cores)
  block,      ///< never spin (a machine shared with other work)
};

/// Settings of a run_local world.
struct local_options {
  /// The longest any wait may block (a request's wait(), a collective) before it ends with
  /// comm_error naming rank, peer and tag. Each rank can change its own with set_timeout().
  std::chrono::nanoseconds timeout = std::chrono::seconds(60);
  /// Whether waits spin before blocking. Spins are short and adaptive (they back off where
  /// they do not pay); timeouts, failures and dead peers end a wait either way.
  local_wait wait = local_wait::automatic;
};

class local_communicator;

namespace detail::comm::local {
/// Lets run_local create the world's communicators (the constructor is not public).
struct access {
  static local_communicator make(std::shared_ptr<group> g, int rank, std::chrono::nanoseconds timeout);
};
}  // namespace detail::comm::local

/// A pending isend, irecv or shift of the local world. Move-only. Destroying it before it
/// completes cancels the parts not yet matched (a withdrawn send is never delivered) and
/// delivers the parts already matched (their partner counts on them).
class local_request {
 public:
  local_request() = default;
  local_request(local_request&&) noexcept = default;
  local_request& operator=(local_request&& other) noexcept {
    if (this != &other) {
      cancel();
      group_ = std::move(other.group_);
      ops_ = std::move(other.ops_);
      timeout_ = other.timeout_;
    }
    return *this;
  }
  local_request(const local_request&) = delete;
  local_request& operator=(const local_request&) = delete;
  ~local_request() { cancel(); }

  /// Blocks until the transfer completed. Throws comm_error when it cannot: the timeout
  /// passed, the peer returned or failed, or the message does not fit the receive buffer.
  /// Completes (or throws) once; later calls return at once.
  void wait() {
    if (empty()) return;
    detail::comm::local::world& w = *group_->the_world;
    std::unique_lock lock(w.mutex);
    const auto deadline = detail::comm::deadline_after(timeout_);
    for (auto& op : ops_) {
      if (!op) continue;
      while (op->state == op_state::posted || op->state == op_state::matched || op->state == op_state::copying) {
        if (op->state == op_state::matched && op->receiver_copies &&
            detail::comm::local::clock::now() < deadline) {  // handed to the waiting receiver
          w.sleep(group_->world_rank_of(op->owner), lock, deadline);
          continue;
        }
        if (op->state == op_state::matched) {  // paired, nobody copying yet: this end copies
          group_->deliver(*op, lock);
          continue;
        }
        if (op->state == op_state::copying) {  // a memcpy in progress: bounded, no timeout
          w.sleep(group_->world_rank_of(op->owner), lock, detail::comm::local::clock::time_point::max());
          continue;
        }
        std::string why = group_->hopeless(*op, deadline, timeout_);
        if (!why.empty()) {
          release(lock);
          throw comm_error(why);
        }
        // Blocked in this op while asleep: a peer's wait that times out reads it (see
        // detail::comm::local::blocked_on).
        group_->set_blocked(op->owner, op.get());
        w.sleep(group_->world_rank_of(op->owner), lock, deadline);
        group_->clear_blocked(op->owner);
      }
    }
    finish(lock);
  }

  /// True once the transfer completed; never blocks on the peer. Throws like wait() when
  /// the transfer failed or can no longer complete (it does not apply the timeout).
  bool test() {
    if (empty()) return true;
    std::unique_lock lock(group_->the_world->mutex);
    for (auto& op : ops_) {
      if (!op) continue;
      // Paired but not copied: copy now (bounded work, not a wait on the peer). Were test()
      // to leave it, two ranks that only poll would never finish. A send handed to its
      // receiver is the exception: that rank sleeps in a wait on it and copies when it runs.
      if (op->state == op_state::matched && !op->receiver_copies) group_->deliver(*op, lock);
      if (op->state == op_state::done || op->state == op_state::failed) continue;
      if (op->state == op_state::posted) {
        std::string why = group_->hopeless(*op, detail::comm::local::clock::time_point::max(), timeout_);
        if (!why.empty()) {
          release(lock);
          throw comm_error(why);
        }
      }
      return false;
    }
    finish(lock);
    return true;
  }

 private:
  friend class local_communicator;
  using op_state = detail::comm::local::op_state;

  bool empty() const noexcept { return !ops_[0] && !ops_[1]; }

  void finish(std::unique_lock<std::mutex>& lock) {
    std::string error;
    for (auto& op : ops_) {
      if (op && op->state == op_state::failed && error.empty()) error = op->error;
    }
    release(lock);
    if (!error.empty()) throw comm_error(error);
  }

  void release(std::unique_lock<std::mutex>& lock) {
    for (auto& op : ops_) {
      if (op) group_->cancel(*op, lock);
    }
    lock.unlock();
    for (auto& op : ops_) op.reset();
  }

  void cancel() noexcept {
    if (empty()) return;
    std::unique_lock lock(group_->the_world->mutex);
    release(lock);
  }

  std::shared_ptr<detail::comm::local::group> group_;
  std::array<std::unique_ptr<detail::comm::local::p2p_op>, 2> ops_{};
  std::chrono::nanoseconds timeout_{};
};

/// One rank's handle on a local world (or on a group split from it). Use it from the
/// thread run_local gave it to; copies share the rank.
class local_communicator {
 public:
  using request_type = local_request;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return group_->size(); }
  /// This rank in the run_local world (differs from rank() in a split group).
  int world_rank() const noexcept { return group_->world_ranks[static_cast<std::size_t>(rank_)]; }

  std::chrono::nanoseconds timeout() const noexcept { return timeout_; }
  /// Changes how long this rank's later waits may block. Must not be negative.
  void set_timeout(std::chrono::nanoseconds timeout) {
    if (timeout < std::chrono::nanoseconds::zero()) {
      throw comm_error(rank_text() + ": set_timeout(" + detail::comm::seconds_text(timeout) +
                       "): a timeout must not be negative");
    }
    timeout_ = timeout;
  }

  // ---- point to point ---------------------------------------------------------------

  /// Starts sending `data` to `dest` with `tag`. The buffer must stay unchanged until the
  /// request completes: the message is copied straight from it.
  [[nodiscard]] local_request isend(std::span<const std::byte> data, int dest, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size(), "isend", dest, tag, data.size());
    local_request r = make_request();
    r.ops_[0] = make_op(detail::comm::local::op_kind::send, dest, tag, data.data(), nullptr, data.size());
    group_->post(*r.ops_[0]);
    return r;
  }

  /// Starts receiving into `data` the next message from `source` with `tag`. The message
  /// must have exactly data.size() bytes.
  [[nodiscard]] local_request irecv(std::span<std::byte> data, int source, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size(), "irecv", source, tag, data.size());
    local_request r = make_request();
    r.ops_[0] = make_op(detail::comm::local::op_kind::recv, source, tag, nullptr, data.data(), data.size());
    group_->post(*r.ops_[0]);
    return r;
  }

  /// Ring shift: sends `send` to rank()+k and receives `recv` from rank()-k (mod size()).
  [[nodiscard]] local_request shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    const auto peers = detail::comm::ring_peers_of(rank_, size(), k);
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size(), "shift: isend", peers.dest, tag,
                                     send.size());
    local_request r = make_request();
    r.ops_[0] = make_op(detail::comm::local::op_kind::send, peers.dest, tag, send.data(), nullptr, send.size());
    r.ops_[1] = make_op(detail::comm::local::op_kind::recv, peers.source, tag, nullptr, recv.data(), recv.size());
    group_->post(*r.ops_[0]);
    group_->post(*r.ops_[1]);
    return r;
  }

  // ---- collectives (blocking; every rank of the group must call them in the same order) ----
  //
  // Each collective publishes its arguments, waits for every rank, then checks that all
  // ranks agree. The checks read only what all ranks published, so either every rank
  // throws the same error (after one more barrier, so nobody is still reading) or none.

  /// Element-wise reduction over all ranks, in place. Each element is reduced by one rank
  /// in rank order 0, 1, ..., size()-1, so float results are bitwise identical everywhere.
  template <class T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    coll_entry mine = entry(coll_kind::all_reduce, std::span<const T>(), inout);
    mine.element = detail::comm::element_kind_of<T>();
    mine.op = op;
    std::string problem = enter(mine);
    if (problem.empty()) {
      problem = differing("element type",
                          [](const coll_entry& x) { return std::string(detail::comm::element_name(x.element)); });
    }
    if (problem.empty()) {
      problem = differing("element count",
                          [](const coll_entry& x) { return std::to_string(x.recv_bytes / x.element_size); });
    }
    if (problem.empty()) problem = differing("reduce_op", [](const coll_entry& x) { return std::string(to_string(x.op)); });
    fail_together(problem);

    const auto& e = group_->entries;
    const int n = size();
    const std::size_t count = inout.size();
    auto chunk_begin = [&](int r) { return detail::comm::chunk_begin(count, n, r); };
    reduce_chunk<T>(e, inout.data(), chunk_begin(rank_), chunk_begin(rank_ + 1), op);
    sync();  // every chunk reduced by its owner; inputs no longer read
    for (int r = 0; r < n; ++r) {
      if (r == rank_) continue;
      const T* owner = static_cast<const T*>(e[static_cast<std::size_t>(r)].recv);
      copy_bytes(inout.data() + chunk_begin(r), owner + chunk_begin(r), (chunk_begin(r + 1) - chunk_begin(r)) * sizeof(T));
    }
    sync();  // nobody reads my buffer any more
  }

  /// recv = the concatenation of every rank's send, in rank order.
  template <class T>
  void all_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_gather moves elements as bytes; T must be trivially copyable");
    const coll_entry mine = entry(coll_kind::all_gather, send, recv);
    std::string problem = enter(mine);
    if (problem.empty()) problem = differing("send size in bytes", [](const coll_entry& x) { return std::to_string(x.send_bytes); });
    if (problem.empty()) {
      problem = first_problem([&](const coll_entry& x) -> std::string {
        if (x.recv_bytes == x.send_bytes * static_cast<std::size_t>(size())) return {};
        return "its receive buffer holds " + std::to_string(x.recv_bytes) + " bytes but must hold size() x send = " +
               std::to_string(x.send_bytes * static_cast<std::size_t>(size())) + " bytes";
      });
    }
    fail_together(problem);
    const auto& e = group_->entries;
    auto* out = reinterpret_cast<std::byte*>(recv.data());
    for (int r = 0; r < size(); ++r) {
      copy_bytes(out + static_cast<std::size_t>(r) * send.size_bytes(), e[static_cast<std::size_t>(r)].send,
                 send.size_bytes());
    }
    sync();
  }

  /// send holds size() equal blocks, block j for rank j; recv block i comes from rank i.
  template <class T>
  void all_to_all(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_to_all moves elements as bytes; T must be trivially copyable");
    const coll_entry mine = entry(coll_kind::all_to_all, send, recv);
    const auto n = static_cast<std::size_t>(size());
    std::string problem = enter(mine);
    if (problem.empty()) problem = differing("send size in bytes", [](const coll_entry& x) { return std::to_string(x.send_bytes); });
    if (problem.empty()) {
      problem = first_problem([&](const coll_entry& x) -> std::string {
        if ((x.send_bytes / x.element_size) % n != 0) {
          return "its send buffer holds " + std::to_string(x.send_bytes / x.element_size) +
                 " elements, which is not a multiple of the " + std::to_string(n) + " ranks";
        }
        if (x.recv_bytes != x.send_bytes) {
          return "its receive buffer holds " + std::to_string(x.recv_bytes) + " bytes but its send buffer " +
                 std::to_string(x.send_bytes) + "; they must be equal";
        }
        return {};
      });
    }
    fail_together(problem);
    const auto& e = group_->entries;
    const std::size_t block = send.size_bytes() / n;
    auto* out = reinterpret_cast<std::byte*>(recv.data());
    for (std::size_t r = 0; r < n; ++r) {
      copy_bytes(out + r * block, static_cast<const std::byte*>(e[r].send) + static_cast<std::size_t>(rank_) * block,
                 block);
    }
    sync();
  }

  /// all_to_all with per-rank element counts: send_counts[j] elements of send go to rank j,
  /// recv_counts[i] elements of recv come from rank i (blocks contiguous, in rank order).
  /// recv_counts[i] on this rank must equal send_counts[rank()] on rank i.
  template <class T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> send, std::span<const std::int64_t> send_counts,
                    std::span<T> recv, std::span<const std::int64_t> recv_counts) {
    static_assert(communicable_element<T>, "baton: all_to_all_v moves elements as bytes; T must be trivially copyable");
    coll_entry mine = entry(coll_kind::all_to_all_v, send, recv);
    mine.send_counts = send_counts;
    mine.recv_counts = recv_counts;
    const int n = size();
    std::string problem = enter(mine);
    if (problem.empty()) {
      problem = differing("element size in bytes", [](const coll_entry& x) { return std::to_string(x.element_size); });
    }
    const auto& e = group_->entries;
    for (int r = 0; r < n && problem.empty(); ++r) {  // every rank checks every rank: all throw alike
      const auto& x = e[static_cast<std::size_t>(r)];
      const auto whose = [&] { return group_->rank_text(r); };  // names the rank whose counts are wrong
      problem = detail::comm::counts_problem(whose, "send_counts", x.send_counts, n, x.send_bytes / sizeof(T));
      if (problem.empty()) {
        problem = detail::comm::counts_problem(whose, "recv_counts", x.recv_counts, n, x.recv_bytes / sizeof(T));
      }
    }
    for (int r = 0; r < n && problem.empty(); ++r) {
      for (int s = 0; s < n && problem.empty(); ++s) {
        const auto expected = e[static_cast<std::size_t>(r)].recv_counts[static_cast<std::size_t>(s)];
        const auto sent = e[static_cast<std::size_t>(s)].send_counts[static_cast<std::size_t>(r)];
        if (expected != sent) {
          problem = rank_text() + ": all_to_all_v: rank " + std::to_string(r) + " expects " + std::to_string(expected) +
                    " elements from rank " + std::to_string(s) + ", which sends " + std::to_string(sent) +
                    "; recv_counts[i] on rank j must equal send_counts[j] on rank i";
        }
      }
    }
    fail_together(problem);
    auto* out = recv.data();
    std::size_t recv_offset = 0;
    for (int s = 0; s < n; ++s) {
      const auto& x = e[static_cast<std::size_t>(s)];
      std::size_t send_offset = 0;
      for (int j = 0; j < rank_; ++j) send_offset += static_cast<std::size_t>(x.send_counts[static_cast<std::size_t>(j)]);
      const auto count = static_cast<std::size_t>(recv_counts[static_cast<std::size_t>(s)]);
      copy_bytes(out + recv_offset, static_cast<const T*>(x.send) + send_offset, count * sizeof(T));
      recv_offset += count;
    }
    sync();
  }

  /// Every rank ends with root's `data`.
  template <class T>
  void broadcast(std::span<T> data, int root) {
    static_assert(communicable_element<T>, "baton: broadcast moves elements as bytes; T must be trivially copyable");
    coll_entry mine = entry(coll_kind::broadcast, std::span<const T>(), data);
    mine.root = root;
    std::string problem = enter(mine);
    if (problem.empty()) problem = differing("root", [](const coll_entry& x) { return std::to_string(x.root); });
    if (problem.empty()) problem = detail::comm::root_problem([this] { return rank_text(); }, root, size());
    if (problem.empty()) problem = differing("size in bytes", [](const coll_entry& x) { return std::to_string(x.recv_bytes); });
    fail_together(problem);
    if (rank_ != root) copy_bytes(data.data(), group_->entries[static_cast<std::size_t>(root)].recv, data.size_bytes());
    sync();
  }

  /// Returns once every rank of the group has called barrier().
  void barrier() {
    coll_entry mine{};
    mine.kind = coll_kind::barrier;
    fail_together(enter(mine));
    sync();  // everyone has checked the others' entries
  }

  /// The ranks that pass the same color form a new communicator, ranked by (key, rank()).
  /// Collective. Colors must be >= 0 on every rank (otherwise every rank throws).
  [[nodiscard]] local_communicator split(int color, int key) {
    coll_entry mine{};
    mine.kind = coll_kind::split;
    mine.color = color;
    mine.key = key;
    std::string problem = enter(mine);
    auto& e = group_->entries;
    if (problem.empty()) {
      problem = detail::comm::colors_problem([this] { return rank_text(); }, size(),
                                             [&](int r) { return e[static_cast<std::size_t>(r)].color; });
    }
    fail_together(problem);
    std::vector<int> members;  // old ranks with my color, in new-rank order
    for (int r = 0; r < size(); ++r) {
      if (e[static_cast<std::size_t>(r)].color == color) members.push_back(r);
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return e[static_cast<std::size_t>(a)].key < e[static_cast<std::size_t>(b)].key;
    });
    const int leader = *std::min_element(members.begin(), members.end());
    if (leader == rank_) {
      std::vector<int> world_ranks;
      for (int r : members) world_ranks.push_back(group_->world_ranks[static_cast<std::size_t>(r)]);
      e[static_cast<std::size_t>(rank_)].created =
          std::make_shared<detail::comm::local::group>(group_->the_world, std::move(world_ranks));
    }
    sync();  // the leaders have published the new groups
    auto created = std::static_pointer_cast<detail::comm::local::group>(e[static_cast<std::size_t>(leader)].created);
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
    sync();  // everyone has read the leaders' entries
    return local_communicator(std::move(created), new_rank, timeout_);
  }

 private:
  friend struct detail::comm::local::access;

  using coll_kind = detail::comm::local::coll_kind;
  using coll_entry = detail::comm::local::coll_entry;

  local_communicator(std::shared_ptr<detail::comm::local::group> group, int rank, std::chrono::nanoseconds timeout)
      : group_(std::move(group)), rank_(rank), timeout_(timeout) {}

  std::string rank_text() const { return group_->rank_text(rank_); }

  local_request make_request() const {
    local_request r;
    r.group_ = group_;
    r.timeout_ = timeout_;
    return r;
  }

  std::unique_ptr<detail::comm::local::p2p_op> make_op(detail::comm::local::op_kind kind, int peer, int tag,
                                                      const std::byte* send, std::byte* recv,
                                                      std::size_t bytes) const {
    auto op = std::make_unique<detail::comm::local::p2p_op>();
    op->kind = kind;
    op->owner = rank_;
    op->peer = peer;
    op->tag = tag;
    op->send_data = send;
    op->recv_data = recv;
    op->bytes = bytes;
    return op;
  }

  /// Publishes this rank's arguments and waits for every rank. Returns the problem when the
  /// ranks called different collectives ("" when they agree).
  std::string enter(const coll_entry& mine) {
    current_ = mine.kind;
    group_->arrive_and_wait(rank_, mine.kind, timeout_, &mine);
    const auto& e = group_->entries;
    for (const auto& x : e) {
      if (x.kind == mine.kind) continue;
      std::string calls;
      for (int s = 0; s < size(); ++s) {
        calls += (s == 0 ? "" : ", ") +
                 ("rank " + std::to_string(s) + " called " + detail::comm::collective_name(e[static_cast<std::size_t>(s)].kind));
      }
      return rank_text() + ": collective mismatch: " + calls +
             "; every rank of a communicator must call the same collectives in the same order";
    }
    return {};
  }

  /// A barrier inside a collective, after enter(): see group::arrive_committed.
  void sync() { group_->arrive_committed(rank_); }

  /// Every rank found the same `problem` in what all ranks published: one more barrier so
  /// that nobody still reads the entries when a rank moves on, then all throw it.
  void fail_together(const std::string& problem) {
    if (problem.empty()) return;
    sync();
    throw comm_error(problem);
  }

  /// The problem when `value(entry)` differs between ranks, else "".
  template <class Value>
  std::string differing(const char* what, Value value) const {
    const auto& e = group_->entries;
    const std::string first = value(e[0]);
    bool same = true;
    for (const auto& x : e) same = same && value(x) == first;
    if (same) return {};
    std::string listing;
    for (int r = 0; r < size() && r < 8; ++r) {
      listing += (r == 0 ? "" : ", ") + ("rank " + std::to_string(r) + ": " + value(e[static_cast<std::size_t>(r)]));
    }
    if (size() > 8) listing += ", ...";
    return rank_text() + ": " + detail::comm::collective_name(current_) + " called with different " + what +
           " on different ranks (" + listing + "); every rank must pass the same " + what;
  }

  /// The first rank's problem as reported by `problem(entry)`, else "".
  template <class Problem>
  std::string first_problem(Problem problem) const {
    const auto& e = group_->entries;
    for (int r = 0; r < size(); ++r) {
      const std::string p = problem(e[static_cast<std::size_t>(r)]);
      if (!p.empty()) return rank_text() + ": " + detail::comm::collective_name(current_) + ": on rank " + std::to_string(r) + ", " + p;
    }
    return {};
  }

  static void copy_bytes(void* to, const void* from, std::size_t bytes) {
    if (bytes != 0 && to != from) std::memcpy(to, from, bytes);
  }

  /// This rank's entry for a collective that reads `send` and writes `recv`.
  template <class T>
  static coll_entry entry(coll_kind kind, std::span<const T> send, std::span<T> recv) {
    coll_entry e{};
    e.kind = kind;
    e.send = send.data();
    e.recv = recv.data();
    e.send_bytes = send.size_bytes();
    e.recv_bytes = recv.size_bytes();
    e.element_size = sizeof(T);
    return e;
  }

  /// out[begin, end) = in_0 op in_1 op ... op in_{n-1}, reading every rank's buffer; blocked
  /// so the accumulator stays in cache.
  template <class T>
  void reduce_chunk(const std::vector<coll_entry>& e, T* out, std::size_t begin, std::size_t end, reduce_op op) const {
    constexpr std::size_t block = 2048;
    T acc[block];
    for (std::size_t b = begin; b < end; b += block) {
      const std::size_t len = std::min(block, end - b);
      const auto piece = [&](int r) { return static_cast<const T*>(e[static_cast<std::size_t>(r)].recv) + b; };
      detail::comm::fold_in_rank_order(acc, len, static_cast<int>(e.size()), piece, op);  // as every transport
      std::memcpy(out + b, acc, len * sizeof(T));
    }
  }

  std::shared_ptr<detail::comm::local::group> group_;
  int rank_ = 0;
  std::chrono::nanoseconds timeout_{};
  coll_kind current_ = coll_kind::barrier;  // the collective in progress, for messages
};

namespace detail::comm::local {
inline local_communicator access::make(std::shared_ptr<group> g, int rank, std::chrono::nanoseconds timeout) {
  return local_communicator(std::move(g), rank, timeout);
}
}  // namespace detail::comm::local

/// Runs `fn(local_communicator&)` on `n` threads, one per rank (rank 0 on the calling
/// thread), and returns when all have finished. If `fn` returns a value, run_local returns
/// them as a std::vector indexed by rank.
///
/// When a rank throws, the world is marked failed: every other rank's pending and later
/// communicator operations end at once with comm_error, and after every rank has stopped
/// run_local rethrows the first error — the root cause, not the aborts it caused.
/// `fn` is called concurrently through a const reference: share state by reference and
/// synchronise it yourself.
template <class F>
auto run_local(int n, F&& fn, local_options options = {}) {
  using fn_type = std::remove_reference_t<F>;
  static_assert(std::is_invocable_v<const fn_type&, local_communicator&>,
                "baton::run_local(n, fn): fn must be callable as fn(baton::local_communicator&) through a const "
                "reference, because n threads call it at once; take the communicator by reference and, if fn is a "
                "mutable lambda, keep the mutable state outside it (captured by reference)");
  using result = std::decay_t<std::invoke_result_t<const fn_type&, local_communicator&>>;
  if (n < 1) {
    throw comm_error("baton::run_local: n = " + std::to_string(n) + "; a world needs at least one rank");
  }
  if (options.timeout < std::chrono::nanoseconds::zero()) {
    throw comm_error("baton::run_local: local_options::timeout is negative; pass a duration >= 0");
  }
  using wait_mode = detail::comm::local::wait_mode;
  const wait_mode mode = options.wait == local_wait::spin    ? wait_mode::spin
                         : options.wait == local_wait::block ? wait_mode::block
                                                             : wait_mode::automatic;
  auto world = std::make_shared<detail::comm::local::world>(n, mode);
  std::vector<int> ranks(static_cast<std::size_t>(n));
  std::iota(ranks.begin(), ranks.end(), 0);
  auto group = std::make_shared<detail::comm::local::group>(world, std::move(ranks));

  constexpr bool returns_value = !std::is_void_v<result>;
  using slot = std::conditional_t<returns_value, std::optional<std::conditional_t<returns_value, result, int>>, char>;
  std::vector<slot> results(static_cast<std::size_t>(n));
  const fn_type& shared_fn = fn;

  auto run_rank = [&](int r) {
    try {
      local_communicator comm = detail::comm::local::access::make(group, r, options.timeout);
      if constexpr (returns_value) {
        results[static_cast<std::size_t>(r)].emplace(std::invoke(shared_fn, comm));
      } else {
        std::invoke(shared_fn, comm);
      }
      world->mark_exited(r);
    } catch (...) {
      world->fail(r, std::current_exception());
    }
  };

  std::vector<std::thread> threads;
  try {
    threads.reserve(static_cast<std::size_t>(n - 1));
    for (int r = 1; r < n; ++r) threads.emplace_back(run_rank, r);
  } catch (...) {  // could not start every rank: let the started ones abort, then report
    world->fail(-1, std::current_exception());
  }
  run_rank(0);
  for (auto& t : threads) t.join();

  if (world->first_error) std::rethrow_exception(world->first_error);
  if constexpr (returns_value) {
    std::vector<result> out;
    out.reserve(results.size());
    for (auto& r : results) out.push_back(std::move(*r));
    return out;
  }
}

}  // namespace baton
