// baton/comm/detail/mpi_state.hpp — everything one mpi_communicator holds, in one struct that
// moves as a whole (a moved-from communicator holds a default one, which frees nothing), and
// how its collectives wait: polled against the deadline, ended early by a failure another rank
// announced or by a rank that returned without the call, and the communicator refused for
// collectives once one was abandoned.
#pragma once

#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/mpi_notice.hpp>
#include <baton/comm/detail/mpi_support.hpp>
#include <baton/comm/error.hpp>
#include <baton/comm/mpi/options.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace baton::detail::comm::mpi {

/// A buffer that grows and is kept between calls, so a repeated collective neither
/// allocates nor page-faults. `leak()` abandons it (MPI may still write into it after a
/// collective timed out) and starts a new one.
class scratch_buffer {
 public:
  [[nodiscard]] std::byte* get(std::size_t bytes) {
    if (bytes > size_ || !data_) {
      data_.reset();  // freed before the larger one is taken: the peak stays one buffer
      data_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
      size_ = bytes;
    }
    return data_.get();
  }
  void leak() noexcept {
    static_cast<void>(data_.release());
    size_ = 0;
  }

 private:
  std::unique_ptr<std::byte[]> data_;
  std::size_t size_ = 0;
};

/// One mpi_communicator's handles, settings and kept buffers.
struct comm_state {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Comm coll = MPI_COMM_NULL;  // a duplicate for baton's own point-to-point collective traffic
  int rank = 0;
  int size = 0;
  int world_rank = 0;
  int tag_ub = 32767;
  mpi_options options;
  std::string broken;                                 // why collectives are refused ("": they are not)
  std::shared_ptr<notice_board> board;                // shared by the family (see announce_failure)
  std::shared_ptr<const std::vector<int>> board_ranks;  // rank -> board rank; null: the same
  scratch_buffer scratch;                             // agreement descriptors and all_reduce pieces
  std::vector<MPI_Request> requests;                  // of the point-to-point collective in progress
  std::vector<int> agreement_bytes;                   // a large all_reduce's descriptors' sizes
  std::vector<int> completed_at;                      // MPI_Testsome's indices and statuses
  std::vector<MPI_Status> statuses;
  unsigned started = 0;                               // operations started (see refuse_if_aborted)

  /// Frees the communicator, unless a collective on it timed out: MPI still progresses that
  /// collective and would touch a freed communicator, so a broken one is leaked on purpose.
  void release() noexcept {
    if (broken.empty() && !finalized()) {
      if (coll != MPI_COMM_NULL) MPI_Comm_free(&coll);
      if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
    }
    comm = MPI_COMM_NULL;
    coll = MPI_COMM_NULL;
  }

  void check_options() const {
    if (options.timeout < std::chrono::nanoseconds::zero()) {
      throw comm_error("baton::mpi_communicator: the timeout is negative; pass a duration >= 0");
    }
  }

  std::string rank_text() const {
    return "rank " + std::to_string(rank) + (world_rank == rank ? "" : " (world rank " + std::to_string(world_rank) + ")");
  }

  void check(int rc, const char* call) const {
    if (rc != MPI_SUCCESS) throw comm_error(rank_text() + ": " + call + " failed: " + error_text(rc));
  }

  int int_count(std::size_t n, const char* what) const {
    if (n > static_cast<std::size_t>(INT_MAX)) {
      throw comm_error(rank_text() + ": " + what + ": " + std::to_string(n) +
                       " exceeds the int counts MPI takes; split the transfer into pieces below 2 GiB");
    }
    return static_cast<int>(n);
  }

  /// This communicator's rank `r` on the notice board.
  int board_rank(int r) const { return board_ranks ? (*board_ranks)[static_cast<std::size_t>(r)] : r; }
  /// How diagnoses name board ranks: "rank" on the communicator itself, "world rank" on a split.
  std::string board_label() const { return board_ranks ? "world rank" : "rank"; }

  /// Whether the agreement is an exchange of descriptors (see mpi_options).
  bool exchange_agreement() const noexcept { return size <= options.exchange_agreement_max_ranks; }

  /// Refuses a new operation once a failure was announced: "rank 1: isend to peer 2 (...)
  /// aborted because rank 3 failed: ...".
  template <class What>
  void refuse_if_aborted(const What& what) {
    if (!board) return;
    // Every 16th new operation reads the notices (every wait reads them too): one between is
    // refused by its wait instead, microseconds later, and a fast one pays no extra MPI_Test.
    if (++started % notice_polls == 0) board->poll(nullptr);
    if (!board->failure().empty()) throw comm_error(rank_text() + ": " + what() + " aborted " + board->failure());
  }

  void refuse_if_broken(const char* what) const {
    if (!broken.empty()) {
      throw comm_error(rank_text() + ": " + what + " refused: an earlier collective of this communicator timed out (" +
                       broken + "); this communicator cannot be used for collectives any more");
    }
  }

  /// Polls `done()` with the timeout until it returns true. A collective cannot be
  /// cancelled, so after a timeout the communicator refuses further collectives, and
  /// `abandon()` leaks what MPI may still write into (and frees what it may still use).
  /// A collective also ends early when a rank announced a failure, or when a member's
  /// run_mpi function returned without calling it; the communicator is then broken likewise.
  /// An exception from `done()` (an MPI error) breaks it too.
  template <class Done, class Abandon>
  void await(Done&& done, const char* what, Abandon&& abandon) {
    const auto deadline = deadline_after(options.timeout);
    const waiter me{-1, [what] { return std::string(what) + " (a collective)"; }};
    std::string stop;
    std::chrono::steady_clock::time_point returned_seen{};
    bool completed = false;
    unsigned polls = 0;
    try {
      completed = poll_until(
          [&] {
            if (done()) return true;
            if (++polls % notice_polls != 0) return false;
            stop = interruption(me, what, returned_seen);
            return !stop.empty();
          },
          deadline);
    } catch (const std::exception& e) {
      broken = e.what();
      abandon();
      throw;
    }
    if (completed && stop.empty()) return;
    abandon();
    if (!stop.empty()) {
      broken = stop;
      throw comm_error(stop);
    }
    broken = rank_text() + ": " + what + " timed out after " + seconds_text(options.timeout);
    std::string cause = board->diagnose(me, options.timeout, board_label());
    if (!board->failure().empty()) {
      broken = rank_text() + ": " + what + " aborted " + board->failure();
      throw comm_error(broken);
    }
    if (cause.empty()) cause = "some rank did not call " + std::string(what) + " (every rank must call the same collectives in the same order)";
    throw comm_error(broken + "; " + cause + ", or raise mpi_options::timeout");
  }

  /// Waits for an MPI collective request (see await); the internal buffers given as
  /// `buffers` (unique_ptrs) are leaked on a timeout.
  template <class... Buffers>
  void finish(MPI_Request& request, const char* what, Buffers&... buffers) {
    int rc = MPI_SUCCESS;
    await(
        [&] {
          int flag = 0;
          rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
          return rc != MPI_SUCCESS || flag != 0;
        },
        what, [&] { (static_cast<void>(buffers.release()), ...); });
    if (rc != MPI_SUCCESS) throw comm_error(rank_text() + ": " + what + ": MPI error: " + error_text(rc));
  }

  /// Waits until every request of `pending` (a range of `requests`) is complete, calling
  /// `completed(index, rc, status)` for each as it completes (rc: MPI_SUCCESS or the error
  /// it completed with). See await: on a timeout the scratch buffer is leaked and every
  /// pending request of `requests` is freed.
  template <class Completed>
  void await_requests(std::span<MPI_Request> pending, const char* what, Completed&& completed) {
    // One MPI_Testsome per poll: one pass of MPI's progress engine, however many requests
    // (with mpi_yield_when_idle, every idle pass also gives the core away).
    completed_at.resize(pending.size());
    statuses.resize(pending.size());
    await(
        [&] {
          int count = 0;
          const int rc = MPI_Testsome(static_cast<int>(pending.size()), pending.data(), &count, completed_at.data(),
                                      statuses.data());
          if (count == MPI_UNDEFINED) return true;  // none was active
          if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
            throw comm_error(rank_text() + ": " + what + ": MPI error: " + error_text(rc));
          }
          for (int k = 0; k < count; ++k) {
            const MPI_Status& status = statuses[static_cast<std::size_t>(k)];
            const auto at = static_cast<std::size_t>(completed_at[static_cast<std::size_t>(k)]);
            const int error = rc == MPI_ERR_IN_STATUS ? status.MPI_ERROR : MPI_SUCCESS;
            // Open MPI leaves a request that completed with an error allocated: free it.
            if (error != MPI_SUCCESS && pending[at] != MPI_REQUEST_NULL) MPI_Request_free(&pending[at]);
            completed(at, error, status);
          }
          return std::all_of(pending.begin(), pending.end(), [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
        },
        what,
        [&] {
          scratch.leak();
          for (MPI_Request& r : requests) {
            if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
          }
        });
  }

  /// Why a collective must end now, or "" to go on waiting (see mpi_request's interruption).
  std::string interruption(const waiter& me, const char* what, std::chrono::steady_clock::time_point& returned_seen) {
    board->poll(&me);
    if (!board->failure().empty()) return rank_text() + ": " + what + " aborted " + board->failure();
    std::string gone;
    for (int r = 0; r < size; ++r) {
      if (board->returned(board_rank(r))) gone += (gone.empty() ? "" : ", ") + std::to_string(r);
    }
    if (gone.empty()) return {};
    const auto now = std::chrono::steady_clock::now();
    if (returned_seen == std::chrono::steady_clock::time_point{}) returned_seen = now;
    if (now - returned_seen < std::chrono::milliseconds(250)) return {};
    return rank_text() + ": " + what + " cannot complete: rank(s) " + gone +
           " returned from their run_mpi function without calling " + what +
           "; every rank of a communicator must call the same collectives in the same order";
  }
};

}  // namespace baton::detail::comm::mpi
