// baton/comm/mpi/run.hpp — run_mpi: one rank's part of a job on MPI, with the local world's
// failure handling (a rank that throws tells every other rank at once; a rank that returns
// early ends the waits on it).
#pragma once

#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/mpi_notice.hpp>
#include <baton/comm/detail/mpi_state.hpp>
#include <baton/comm/error.hpp>
#include <baton/comm/mpi/communicator.hpp>

#include <exception>
#include <functional>
#include <string>
#include <type_traits>

namespace baton {

namespace detail::comm::mpi {
/// run_mpi: this rank's function returned; waits (with the timeout) until every rank's has.
inline void join_run(comm_state& s) {
  s.board->announce_return();
  const waiter me{-1, [] { return std::string("run_mpi (its function returned)"); }};
  const bool done = poll_until(
      [&] {
        s.board->poll(&me);
        return s.board->all_returned() || !s.board->failure().empty();
      },
      deadline_after(s.options.timeout));
  if (!s.board->failure().empty()) throw comm_error(s.rank_text() + ": run_mpi aborted " + s.board->failure());
  if (done) return;
  std::string cause = s.board->diagnose(me, s.options.timeout, s.board_label());
  if (!s.board->failure().empty()) throw comm_error(s.rank_text() + ": run_mpi aborted " + s.board->failure());
  if (cause.empty()) cause = "some rank's function did not return";
  throw comm_error(s.rank_text() + ": run_mpi: the other ranks' functions did not return within " +
                   seconds_text(s.options.timeout) + ": " + cause + ", or raise mpi_options::timeout");
}
}  // namespace detail::comm::mpi

/// Runs this rank's part of a job: call it on every rank of `comm`, as run_local calls fn
/// on every thread. Returns fn's result once every rank's fn has returned.
///
/// When fn throws, every other rank learns at once (announce_failure): its pending and later
/// operations on `comm` and on the communicators split from it end within milliseconds with
/// comm_error "aborted because rank N failed: <what>", and its run_mpi throws too. This rank's
/// run_mpi rethrows its own error. When fn returns while another rank still waits for a
/// message or collective from it, that wait ends (after a moment for messages in flight) with
/// "returned from its run_mpi function without ...". A wait that times out names the rank
/// that made no progress. After a failure the family of communicators is unusable: report the
/// error and end the job (see docs/communicators.md for MPI_Finalize and MPI_Abort).
template <class F>
auto run_mpi(mpi_communicator& comm, F&& fn) {
  static_assert(std::is_invocable_v<F&, mpi_communicator&>,
                "baton::run_mpi(comm, fn): fn must be callable as fn(baton::mpi_communicator&)");
  using result = std::invoke_result_t<F&, mpi_communicator&>;
  detail::comm::mpi::comm_state& s = *comm.s_;
  if (!s.board) throw comm_error("baton::run_mpi: the communicator is empty (moved from)");
  if (s.board_ranks) {
    throw comm_error(s.rank_text() + ": run_mpi: pass the communicator constructed from an MPI_Comm, not one "
                     "split from it (the split communicators share its failure notices already)");
  }
  struct end_run {
    detail::comm::mpi::notice_board& board;
    ~end_run() { board.end_run(); }
  };
  s.board->begin_run();
  const end_run guard{*s.board};
  try {
    if constexpr (std::is_void_v<result>) {
      std::invoke(fn, comm);
      detail::comm::mpi::join_run(s);
    } else {
      result value = std::invoke(fn, comm);
      detail::comm::mpi::join_run(s);
      return value;
    }
  } catch (const std::exception& e) {
    comm.announce_failure(e.what());
    throw;
  } catch (...) {
    comm.announce_failure("an exception not derived from std::exception");
    throw;
  }
}

}  // namespace baton
