// baton/comm/mpi/session.hpp — mpi_session: MPI's lifetime as an object (MPI_Init_thread when
// made, MPI_Finalize when destroyed).
#pragma once

#include <baton/comm/detail/mpi_support.hpp>
#include <baton/comm/error.hpp>

#include <mpi.h>

#include <string>

namespace baton {

/// MPI's lifetime as an object: MPI_Init_thread when made, MPI_Finalize when destroyed (unless
/// the program finalised MPI itself). Make one per process before any communicator, in a
/// scope that encloses them all, so that every communicator is freed before MPI_Finalize:
///
///     baton::mpi_session mpi(argc, argv);   // MPI_THREAD_FUNNELED unless asked for more
///     baton::mpi_communicator world;
///
/// Throws comm_error when MPI is already initialised (or finalised), or when the MPI library
/// cannot give the thread level asked for (it is finalised again first).
class mpi_session {
 public:
  mpi_session(int& argc, char**& argv, int required_thread_level = MPI_THREAD_FUNNELED) {
    start(&argc, &argv, required_thread_level);
  }
  explicit mpi_session(int required_thread_level = MPI_THREAD_FUNNELED) {
    start(nullptr, nullptr, required_thread_level);
  }
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    if (!detail::comm::mpi::finalized()) MPI_Finalize();
  }

  /// The thread level MPI provides (at least the one asked for).
  [[nodiscard]] int thread_level() const noexcept { return provided_; }

 private:
  void start(int* argc, char*** argv, int required) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized != 0 || detail::comm::mpi::finalized()) {
      throw comm_error(std::string("baton::mpi_session: MPI is already ") +
                       (initialized != 0 && !detail::comm::mpi::finalized() ? "initialised" : "finalised") +
                       "; make exactly one mpi_session per process, before any other MPI call");
    }
    MPI_Init_thread(argc, argv, required, &provided_);
    if (provided_ < required) {
      const int got = provided_;
      MPI_Finalize();
      throw comm_error("baton::mpi_session: the MPI library provides thread level " + std::to_string(got) +
                       " but " + std::to_string(required) +
                       " was asked for (MPI_THREAD_SINGLE 0, FUNNELED 1, SERIALIZED 2, MULTIPLE 3); ask for "
                       "less, or use an MPI built with thread support");
    }
  }

  int provided_ = 0;
};

}  // namespace baton
