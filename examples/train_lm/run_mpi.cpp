// baton-train over MPI: every rank is a process (mpirun -np N baton-train --comm mpi ...).
#include "run.hpp"

#include <baton/comm/mpi.hpp>

#include <cstdio>

namespace train_lm {

int run_mpi_world(const options& o) {
  baton::mpi_communicator world(MPI_COMM_WORLD);
  if (o.ranks > 0 && o.ranks != world.size()) {
    if (world.rank() == 0)
      std::fprintf(stderr, "baton-train: --ranks %d but mpirun started %d processes; change --ranks or -np\n", o.ranks,
                   world.size());
    return 2;
  }
  // run_mpi: when one rank throws, every other rank stops within milliseconds naming it,
  // instead of waiting out the timeout.
  return baton::run_mpi(world, [&](baton::mpi_communicator& comm) { return run_any(comm, o); });
}

}  // namespace train_lm
