// Catch2 main for tests run under mpiexec: one Catch session per rank (Catch itself is in
// catch_impl.cpp). Only rank 0 prints the report; every rank's result is reduced so that a
// failure on any rank fails the run.
#include "catch_session.hpp"

#include <baton/config.hpp>
#include <mpi.h>
#if BATON_HAS_KOKKOS()
#include <Kokkos_Core.hpp>
#endif

#include <cstdio>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int failures = 0;
  {
#if BATON_HAS_KOKKOS()
    Kokkos::ScopeGuard kokkos_guard(argc, argv);
#endif
    failures = baton_test::run_catch(argc, argv, /*report=*/rank == 0);  // only rank 0 prints
  }
  int any_failure = 0;
  MPI_Allreduce(&failures, &any_failure, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (any_failure != 0 && failures != 0) {
    std::fprintf(stderr, "rank %d: %d test case(s) failed\n", rank, failures);
  }
  MPI_Finalize();
  return any_failure != 0 ? 1 : 0;
}
