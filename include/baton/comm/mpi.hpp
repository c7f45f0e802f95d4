// baton/comm/mpi.hpp — the MPI backend: ranks are MPI processes.
//
//     baton::mpi_session mpi(argc, argv);           // MPI_Init_thread; MPI_Finalize at scope end
//     baton::mpi_communicator world;                // a private duplicate of MPI_COMM_WORLD
//     world.all_reduce(std::span(grad), baton::reduce_op::sum);
//                                                   // world is freed first: made after mpi
//
// Models every capability concept with non-blocking MPI calls (MPI_Isend/Irecv and the
// MPI-3 non-blocking collectives) polled against a deadline, so a dead or diverged peer
// ends in comm_error after mpi_options::timeout instead of a hang. The communicator is a
// duplicate with MPI_ERRORS_RETURN, so MPI errors come back as comm_error too.
// Run each rank's work through run_mpi(comm, fn) and a rank that throws tells every other
// rank at once (an out-of-band notice every wait polls): they fail within milliseconds with
// "aborted because rank N failed: <what>", as in the local world. A wait that times out asks
// the other ranks what they wait for and names the rank that made no progress.
// Before each collective every rank checks that all ranks called the same collective with
// the same sizes, type, op and root (see detail/mpi_agreement.hpp): an exchange of the core's
// agreement descriptors, so a mismatch is the same comm_error on every rank instead of a hang
// or undefined behaviour. all_reduce folds every rank's contribution in rank order, as the
// local world does: every rank holds bitwise the same result, and the same bits as a run on
// threads. A small all_reduce sends its data with its descriptor (one exchange in all); a
// large one is a reduce-scatter in segments (each folded while the next arrives) and an
// all-gather, the traffic of MPI_Allreduce's ring, whose first segments travel beside the
// descriptors when they are all it sends (detail/mpi_all_reduce.hpp, mpi_segments.hpp).
//
// The pieces: mpi/options.hpp (mpi_options), mpi/session.hpp (mpi_session),
// mpi/request.hpp (mpi_request), mpi/communicator.hpp (mpi_communicator), mpi/run.hpp
// (run_mpi).
#pragma once

#include <baton/config.hpp>

#if !BATON_HAS_MPI()
#error "baton/comm/mpi.hpp needs MPI: link baton::mpi (find_package(baton COMPONENTS mpi)); Debian: apt-get install libopenmpi-dev openmpi-bin"
#endif

#include <baton/comm/mpi/communicator.hpp>
#include <baton/comm/mpi/options.hpp>
#include <baton/comm/mpi/request.hpp>
#include <baton/comm/mpi/run.hpp>
#include <baton/comm/mpi/session.hpp>
