// baton/comm/mpi/request.hpp — mpi_request: a pending isend, irecv or shift on MPI, and how
// its wait ends (completion, a timeout that names the rank that made no progress, a failure
// announced by another rank, or a peer that returned without the matching call).
#pragma once

#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/mpi_notice.hpp>
#include <baton/comm/detail/mpi_support.hpp>
#include <baton/comm/detail/unique_state.hpp>
#include <baton/comm/error.hpp>

#include <mpi.h>

#include <array>
#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

namespace baton {

class mpi_communicator;

/// A pending isend, irecv or shift on MPI. Move-only. Destroying it before it completes
/// cancels a pending receive; a pending send is detached (MPI may still read its buffer).
class mpi_request {
 public:
  /// Blocks until complete, or throws comm_error (timeout, MPI error, size mismatch) naming
  /// rank, peer and tag. Completes (or throws) once; later calls return at once.
  /// Ends early with comm_error when a rank announced a failure (run_mpi) or the peer's
  /// run_mpi function returned without the matching call.
  void wait() {
    if (active() == 0) return;
    const auto deadline = detail::comm::deadline_after(s_->timeout);
    const detail::comm::mpi::waiter me = waiting_for();
    std::string stop;
    unsigned polls = 0;
    const bool done = detail::comm::poll_until(
        [&] {
          if (progress()) return true;
          if (++polls % detail::comm::mpi::notice_polls != 0) return false;
          stop = interruption(me);
          return !stop.empty();
        },
        deadline);
    if (done && stop.empty()) return;
    if (!stop.empty()) {
      abandon();
      throw comm_error(stop);
    }
    const part& p = pending();
    std::string cause = s_->board ? s_->board->diagnose(me, s_->timeout, s_->board_label) : std::string();
    if (s_->board && !s_->board->failure().empty()) {
      const std::string what = s_->rank_text + ": " + describe(p) + " aborted " + s_->board->failure();
      abandon();
      throw comm_error(what);
    }
    if (cause.empty()) {
      cause = std::string("peer ") + std::to_string(p.peer) + " posted no matching " + (p.is_recv ? "isend" : "irecv") +
              " with tag " + std::to_string(p.tag) + "; check that both ranks agree on peer, tag and order";
    }
    const std::string what = s_->rank_text + ": " + describe(p) + " timed out after " +
                             detail::comm::seconds_text(s_->timeout) + ": " + cause + ", or raise mpi_options::timeout";
    abandon();
    throw comm_error(what);
  }

  /// True once complete; never blocks. Throws like wait() on an MPI error or size mismatch,
  /// or when a rank announced a failure.
  bool test() {
    if (active() == 0 || progress()) return true;
    if (s_->board) {
      s_->board->poll(nullptr);
      if (!s_->board->failure().empty()) {
        const std::string what = s_->rank_text + ": " + describe(pending()) + " aborted " + s_->board->failure();
        abandon();
        throw comm_error(what);
      }
    }
    return false;
  }

 private:
  friend class mpi_communicator;

  struct part {
    MPI_Request request = MPI_REQUEST_NULL;
    bool is_recv = false;
    int peer = 0;
    int tag = 0;
    std::size_t bytes = 0;
    int board_peer = -1;  // the peer's rank on the notice board
  };

  // Everything a request holds, moved as a whole (a moved-from request is an empty one) and
  // abandoned when the request is destroyed.
  struct state {
    std::array<part, 2> parts{};
    std::string rank_text;
    std::chrono::nanoseconds timeout{};
    std::shared_ptr<detail::comm::mpi::notice_board> board;
    std::string board_label;  // "rank" or "world rank": how diagnoses name board ranks
    std::chrono::steady_clock::time_point returned_seen{};

    int active() const noexcept {
      int n = 0;
      for (const part& p : parts) n += p.request != MPI_REQUEST_NULL;
      return n;
    }

    /// Cancels pending receives (and waits for the cancellation, which MPI completes at
    /// once); detaches pending sends, which MPI cannot reliably cancel.
    void abandon() noexcept {
      if (active() == 0 || detail::comm::mpi::finalized()) {
        for (part& p : parts) p.request = MPI_REQUEST_NULL;
        return;
      }
      for (part& p : parts) {
        if (p.request == MPI_REQUEST_NULL) continue;
        if (p.is_recv) {
          MPI_Cancel(&p.request);
          MPI_Wait(&p.request, MPI_STATUS_IGNORE);
        } else {
          MPI_Request_free(&p.request);
        }
        p.request = MPI_REQUEST_NULL;
      }
    }
  };

  /// The first part still pending (the receive of a shift before its send).
  const part& pending() const {
    for (const part& p : s_->parts) {
      if (p.request != MPI_REQUEST_NULL && p.is_recv) return p;
    }
    for (const part& p : s_->parts) {
      if (p.request != MPI_REQUEST_NULL) return p;
    }
    return s_->parts[0];
  }

  detail::comm::mpi::waiter waiting_for() {
    return {pending().board_peer, [this] { return describe(pending()); }};
  }

  /// Why this wait must end now — a failure announced by some rank, or a peer whose run_mpi
  /// function returned while the transfer is still pending — or "" to go on waiting.
  std::string interruption(const detail::comm::mpi::waiter& me) {
    if (!s_->board) return {};
    s_->board->poll(&me);
    const part& p = pending();
    if (!s_->board->failure().empty()) return s_->rank_text + ": " + describe(p) + " aborted " + s_->board->failure();
    if (!s_->board->returned(p.board_peer)) return {};
    // What the peer sent before returning may still be on its way: give it a moment.
    const auto now = std::chrono::steady_clock::now();
    if (s_->returned_seen == std::chrono::steady_clock::time_point{}) s_->returned_seen = now;
    if (now - s_->returned_seen < std::chrono::milliseconds(250)) return {};
    return s_->rank_text + ": " + describe(p) + " cannot complete: peer " + std::to_string(p.peer) +
           " returned from its run_mpi function without " +
           (p.is_recv ? "sending a matching message" : "receiving this message") +
           "; make both ranks agree on peer, tag and count";
  }

  std::string describe(const part& p) const {
    return detail::comm::p2p_text(p.is_recv ? "irecv" : "isend", p.peer, p.tag, p.bytes);
  }

  /// Tests every active part once; true when all are complete.
  bool progress() {
    for (part& p : s_->parts) {
      if (p.request == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status status{};
      const int rc = MPI_Test(&p.request, &flag, &status);
      if (rc != MPI_SUCCESS) {
        std::string what = s_->rank_text + ": " + describe(p) + ": ";
        if (detail::comm::mpi::error_class(rc) == MPI_ERR_TRUNCATE) {
          what += "the message is larger than the receive buffer of " + std::to_string(p.bytes) +
                  " bytes; a message must exactly fill its receive buffer (check the shapes both ranks use)";
        } else {
          what += "MPI error: " + detail::comm::mpi::error_text(rc);
        }
        p.request = MPI_REQUEST_NULL;  // MPI has completed (and freed) it on error
        abandon();
        throw comm_error(what);
      }
      if (flag == 0) return false;
      if (p.is_recv) {
        int received = 0;
        MPI_Get_count(&status, MPI_BYTE, &received);
        if (static_cast<std::size_t>(received) != p.bytes) {
          const std::string what = s_->rank_text + ": " + describe(p) + ": the message has " + std::to_string(received) +
                                   " bytes but the receive buffer holds " + std::to_string(p.bytes) +
                                   "; a message must exactly fill its receive buffer (check the shapes both ranks use)";
          abandon();
          throw comm_error(what);
        }
      }
    }
    return true;
  }

  int active() const noexcept { return s_->active(); }
  void abandon() noexcept { s_->abandon(); }

  detail::comm::unique_state<state, &state::abandon> s_;
};

}  // namespace baton
