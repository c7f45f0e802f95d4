// baton-train: a byte-level transformer language model trained under pipeline x data x
// context parallelism, on ranks that are threads of this process (--comm local) or MPI
// processes (--comm mpi). See README.md and docs/training.md.
#include "native_blas.hpp"
#include "options.hpp"

#include <baton/config.hpp>
#include <baton/nn/blas.hpp>
#if BATON_HAS_KOKKOS()
#include <Kokkos_Core.hpp>
#endif
#if BATON_HAS_MPI()
#include <baton/comm/mpi.hpp>
#endif

#include <cstdio>
#include <cstdlib>
#include <exception>

int main(int argc, char** argv) {
  example_support::use_native_blas_kernel(argv);  // OpenBLAS's generic kernel on a newer CPU: restart on the right one
  train_lm::options o;
  try {
    if (!train_lm::parse(argc, argv, o)) return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton-train: %s\n", e.what());
    return 2;
  }
#if BATON_HAS_KOKKOS()
  Kokkos::ScopeGuard kokkos(argc, argv);
#endif
  // Every rank (a thread here, or a process on a shared machine) computes on one core: one
  // BLAS thread each, unless the user chose otherwise.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) baton::nn::set_blas_threads(1);
  try {
    if (o.comm == "mpi") {
#if BATON_HAS_MPI()
      baton::mpi_session mpi(argc, argv);
      int code = 1;
      try {
        code = train_lm::run_mpi_world(o);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "baton-train: %s\n", e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);  // the other processes may be waiting for this one
      }
      return code;
#else
      std::fprintf(stderr, "baton-train: built without MPI; use --comm local\n");
      return 2;
#endif
    }
    return train_lm::run_local_world(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton-train: %s\n", e.what());
    return 1;
  }
}
