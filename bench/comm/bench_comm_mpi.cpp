// bench_comm_mpi — the MPI backend's point-to-point and all-reduce bandwidth for 4 KiB,
// 1 MiB and 64 MiB messages. Run under mpiexec (ctest runs it with -n 2); rank 0 prints.
#include "bench_common.hpp"

#include <baton/comm/mpi.hpp>

#include <mpi.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  {
    baton::mpi_communicator c;
    if (c.size() < 2) {
      if (c.rank() == 0) std::printf("SKIPPED: bench_comm_mpi needs at least 2 ranks (mpiexec -n 2)\n");
    } else {
      // Rank 0 times both loops; its figures are the ones printed.
      const auto figures = bench_comm::measure(c, "mpi");
      if (c.rank() == 0) {
        for (const auto& f : figures) bench_comm::print(f);
      }
    }
  }
  MPI_Finalize();
  return 0;
}
