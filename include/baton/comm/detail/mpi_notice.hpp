// baton/comm/detail/mpi_notice.hpp — the out-of-band notices behind mpi_communicator's fast
// failure: one `notice_board` per communicator constructed from an MPI_Comm, shared by the
// communicators split from it and by their requests.
//
// The board owns a private duplicate of the communicator on which each rank keeps one receive
// posted (any source, any tag) for fixed-size notices. Every wait loop of the MPI backend polls
// it, so a notice reaches a waiting rank within a poll interval (microseconds to a fraction of
// a millisecond):
//   failed   — a rank's run_mpi function threw (announce_failure): every wait aborts with
//              "aborted because rank N failed: <what>";
//   returned — a rank's run_mpi function returned: a wait on that rank that is still pending
//              a moment later cannot complete (as in the local world);
//   query    — a rank's wait timed out: every rank that is waiting answers `waiting` with what
//              it waits for, so the rank that timed out can name the rank that made no progress
//              (the one that did not answer) instead of blaming its own peer.
// Every notice carries the board's nonce (agreed when the board is created), so a notice meant
// for another board is ignored; the channel is never freed (see ~notice_board).
#pragma once

#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/mpi_support.hpp>
#include <baton/comm/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace baton::detail::comm::mpi {

enum class notice_kind : std::int32_t { failed = 1, returned = 2, waiting = 3, query = 4 };

/// One notice on the wire: 1 KiB, so it always travels eagerly.
struct notice {
  std::uint64_t nonce = 0;
  std::int32_t kind = 0;
  std::int32_t from = 0;     // board rank of the sender
  std::int32_t peer = -1;    // waiting / query: the board rank waited on (-1: a collective)
  std::int32_t episode = 0;  // returned: which run_mpi call of the sender returned
  std::int64_t reserved = 0;
  char text[992] = {};  // failed: the reason; waiting / query: what the sender waits for
};
static_assert(sizeof(notice) == 1024);

/// What a waiting rank waits for: the board rank of its peer (-1 for a collective) and a
/// description formatted only when someone asks ("irecv from peer 2 (tag 7, 64 bytes)").
struct waiter {
  int peer = -1;
  std::function<std::string()> what;
};

class notice_board {
 public:
  using clock = std::chrono::steady_clock;

  /// Collective over `parent`: duplicates it and agrees on a nonce.
  explicit notice_board(MPI_Comm parent) {
    if (MPI_Comm_dup(parent, &comm_) != MPI_SUCCESS) {
      throw comm_error("baton::mpi_communicator: MPI_Comm_dup of the notice channel failed");
    }
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    if (rank_ == 0) {
      std::random_device rd;
      nonce_ = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<std::uint64_t>(clock::now().time_since_epoch().count());
    }
    MPI_Bcast(&nonce_, 1, MPI_UINT64_T, 0, comm_);
    returned_.assign(static_cast<std::size_t>(size_), 0);
    status_.resize(static_cast<std::size_t>(size_));
    post_receive();
  }
  notice_board(const notice_board&) = delete;
  notice_board& operator=(const notice_board&) = delete;

  /// Lets the notices this rank sent leave (bounded: a peer that already dropped its board
  /// never takes them) and cancels the posted receive. The channel itself is not freed, on
  /// purpose: a peer may still send a notice to it (an answer to a query, a late failure), and
  /// Open MPI delivers a message for a freed communicator to the next communicator that reuses
  /// its context id — where a message from a rank the new communicator does not have crashes
  /// it (seen in MPI_Comm_split). One idle communicator per mpi_communicator constructed from an
  /// MPI_Comm is the price; its unexpected notices stay in its queue until MPI_Finalize.
  ~notice_board() {
    if (finalized()) return;
    const auto until = clock::now() + std::chrono::milliseconds(200);
    while (!sends_.empty() && clock::now() < until) test_sends();
    for (auto& s : sends_) MPI_Request_free(&s.request);
    if (receive_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&receive_);
      MPI_Wait(&receive_, MPI_STATUS_IGNORE);
    }
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  MPI_Comm channel() const noexcept { return comm_; }

  /// Why every wait must end ("because rank 2 failed: ..."), or "" while no rank failed.
  const std::string& failure() const noexcept { return failure_; }

  /// Receives the notices that arrived. `w` is what this rank waits for, or null when it
  /// only tests (then queries are answered at its next wait). Never blocks.
  void poll(const waiter* w) {
    if (finalized()) return;
    for (;;) {
      int flag = 0;
      MPI_Status status{};
      if (MPI_Test(&receive_, &flag, &status) != MPI_SUCCESS || flag == 0) break;
      const notice n = incoming_;
      post_receive();
      take(n);
    }
    if (!sends_.empty()) test_sends();
    if (w != nullptr && !unanswered_.empty()) {
      const std::string what = w->what();
      for (int r : unanswered_) send_to(r, notice_kind::waiting, w->peer, 0, what);
      unanswered_.clear();
    }
  }

  /// This rank failed with `what`: tells every other rank, unless a failure is already known
  /// (this rank's error is then a consequence of it). Gives the notices 100 ms to leave (a peer
  /// busy computing may not take them yet); later polls and the destructor keep sending them.
  void announce_failure(std::string_view what) {
    if (finalized()) return;
    poll(nullptr);
    if (!failure_.empty()) return;
    failure_ = "because rank " + std::to_string(rank_) + " failed: " + std::string(what);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) send_to(r, notice_kind::failed, -1, 0, failure_);
    }
    const auto until = clock::now() + std::chrono::milliseconds(100);
    while (!sends_.empty() && clock::now() < until) test_sends();
  }

  // ---- run_mpi calls ("episodes") -----------------------------------------------------------

  void begin_run() {
    ++episode_;
    in_run_ = true;
  }
  /// This rank's function returned: tells the others.
  void announce_return() {
    returned_[static_cast<std::size_t>(rank_)] = episode_;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) send_to(r, notice_kind::returned, -1, episode_, "");
    }
  }
  bool all_returned() const {
    return std::all_of(returned_.begin(), returned_.end(), [&](std::int32_t e) { return e >= episode_; });
  }
  void end_run() noexcept { in_run_ = false; }
  /// Whether board rank `r` returned from this run_mpi call's function.
  bool returned(int r) const noexcept { return in_run_ && returned_[static_cast<std::size_t>(r)] >= episode_; }

  // ---- a wait that timed out ------------------------------------------------------------------

  /// This rank's wait `me` timed out after `waited`: asks every rank what it waits for,
  /// collects the answers for a moment, and returns which rank is to blame — the one waited
  /// on that answered nothing — or "" when the answers name none. Returns at once with the
  /// failure when one arrives meanwhile (failure() is then set).
  std::string diagnose(const waiter& me, std::chrono::nanoseconds waited, const std::string& rank_label) {
    if (size_ < 2 || !failure_.empty()) return {};
    const auto asked = clock::now();
    const std::string what = me.what();
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) send_to(r, notice_kind::query, me.peer, 0, what);
    }
    // Answers from ranks that are in a wait loop take a poll interval; a loaded machine may
    // not run them for a while. A quarter of the timeout, between 50 ms and 1 s.
    const auto grace = std::clamp<std::chrono::nanoseconds>(waited / 4, std::chrono::milliseconds(50),
                                                              std::chrono::seconds(1));
    const auto until = asked + grace;
    const auto since = asked - waited;  // answers older than this wait are stale
    auto is_waiting = [&](int r) { return status_[static_cast<std::size_t>(r)].at >= since; };
    auto everyone_answered = [&] {
      for (int r = 0; r < size_; ++r) {
        if (r != rank_ && !is_waiting(r) && !returned(r)) return false;
      }
      return true;
    };
    while (clock::now() < until && failure_.empty() && !everyone_answered()) {
      poll(&me);
      std::this_thread::yield();
    }
    if (!failure_.empty()) return {};

    // Follow the chain of waits from my peer: the first rank on it that answered nothing is
    // the one that made no progress.
    std::vector<int> silent;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_ && !is_waiting(r) && !returned(r)) silent.push_back(r);
    }
    int cause = -1;
    std::vector<char> seen(static_cast<std::size_t>(size_), 0);
    for (int p = me.peer; p >= 0 && p < size_ && seen[static_cast<std::size_t>(p)] == 0;) {
      seen[static_cast<std::size_t>(p)] = 1;
      if (std::find(silent.begin(), silent.end(), p) != silent.end()) {
        cause = p;
        break;
      }
      if (p == rank_ || !is_waiting(p)) break;
      p = status_[static_cast<std::size_t>(p)].peer;
    }
    std::string others;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || !is_waiting(r)) continue;
      others += (others.empty() ? "" : ", ") + label(r, rank_label) + " on " + status_[static_cast<std::size_t>(r)].what;
    }
    const std::string for_text = " made no progress for " + comm::seconds_text(waited);
    const std::string why =
        ": it answered no query, so it is not waiting for any message or collective of this communicator (it is "
        "stuck in computation or elsewhere, or skipped the matching call)";
    if (cause >= 0) {
      return label(cause, rank_label) + for_text + why + (others.empty() ? "" : "; waiting: " + others);
    }
    if (!silent.empty()) {
      std::string list;
      for (int r : silent) list += (list.empty() ? "" : ", ") + std::to_string(r);
      return (silent.size() == 1 ? label(silent.front(), rank_label) : rank_label + "s " + list) + for_text + why +
             (others.empty() ? "" : "; waiting: " + others);
    }
    if (!others.empty()) {
      return "every other rank is waiting too (" + others +
             "): no rank can proceed, a deadlock; make the ranks agree on peer, tag and order of their messages and "
             "collectives";
    }
    return {};
  }

 private:
  struct peer_status {
    clock::time_point at = clock::time_point::min();  // when its last waiting/query notice arrived
    int peer = -1;
    std::string what;
  };
  struct pending_send {
    MPI_Request request = MPI_REQUEST_NULL;
    std::unique_ptr<notice> data;
  };

  static std::string label(int r, const std::string& rank_label) { return rank_label + " " + std::to_string(r); }

  void post_receive() {
    MPI_Irecv(&incoming_, static_cast<int>(sizeof(notice)), MPI_BYTE, MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &receive_);
  }

  void take(const notice& n) {
    if (n.nonce != nonce_ || n.from < 0 || n.from >= size_ || n.from == rank_) return;  // stale or foreign
    const std::string text(n.text, strnlen(n.text, sizeof(n.text)));
    switch (static_cast<notice_kind>(n.kind)) {
      case notice_kind::failed:
        if (failure_.empty()) failure_ = text;
        break;
      case notice_kind::returned:
        returned_[static_cast<std::size_t>(n.from)] = std::max(returned_[static_cast<std::size_t>(n.from)], n.episode);
        break;
      case notice_kind::query:
        if (std::find(unanswered_.begin(), unanswered_.end(), n.from) == unanswered_.end()) unanswered_.push_back(n.from);
        [[fallthrough]];  // the asker is waiting too
      case notice_kind::waiting:
        status_[static_cast<std::size_t>(n.from)] = {clock::now(), n.peer, text};
        break;
    }
  }

  void send_to(int r, notice_kind kind, int peer, std::int32_t episode, std::string_view text) {
    auto n = std::make_unique<notice>();
    n->nonce = nonce_;
    n->kind = static_cast<std::int32_t>(kind);
    n->from = rank_;
    n->peer = peer;
    n->episode = episode;
    const std::size_t len = std::min(text.size(), sizeof(n->text) - 1);
    std::memcpy(n->text, text.data(), len);
    pending_send s{MPI_REQUEST_NULL, std::move(n)};
    if (MPI_Isend(s.data.get(), static_cast<int>(sizeof(notice)), MPI_BYTE, r, 0, comm_, &s.request) == MPI_SUCCESS) {
      sends_.push_back(std::move(s));
    }
  }

  void test_sends() {
    std::erase_if(sends_, [](pending_send& s) {
      int flag = 0;
      return MPI_Test(&s.request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || flag != 0;
    });
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::uint64_t nonce_ = 0;
  notice incoming_{};
  MPI_Request receive_ = MPI_REQUEST_NULL;
  std::vector<pending_send> sends_;
  std::string failure_;
  std::vector<std::int32_t> returned_;  // by board rank: the last run_mpi call whose function returned
  std::int32_t episode_ = 0;
  bool in_run_ = false;
  std::vector<peer_status> status_;
  std::vector<int> unanswered_;  // ranks whose query this rank answers at its next wait
};

}  // namespace baton::detail::comm::mpi
