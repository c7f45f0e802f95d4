// baton-train over MPI: every rank is a process (mpirun -np N baton-train --comm mpi ...).
#include "run.hpp"

#include <baton/comm/mpi.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace train_lm {

int run_mpi_world(const options& o) {
  baton::mpi_communicator world(MPI_COMM_WORLD);
  const bool lead = world.rank() == 0;
  if (o.ranks > 0 && o.ranks != world.size()) {
    if (lead)
      std::fprintf(stderr, "baton-train: --ranks %d but mpirun started %d processes\nbaton-train: change --ranks or -np\n",
                   o.ranks, world.size());
    return exit_code::bad_input;
  }
  // The ranks on this machine share its memory: the estimate counts them all.
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int here = 1;
  MPI_Comm_size(node, &here);
  MPI_Comm_free(&node);
  // Every process prepares the same way (the same answers), rank 0 says why it cannot run,
  // and all stop before any work.
  prepared p;
  std::FILE* metrics = nullptr;
  std::int32_t ok = 1;
  try {
    p = prepare(o, world.size(), here);
    if (lead && !o.metrics.empty() && (metrics = std::fopen(o.metrics.c_str(), o.resume.empty() ? "w" : "a")) == nullptr)
      throw input_error("cannot write --metrics " + o.metrics + ": " + std::strerror(errno), "--metrics");
  } catch (const input_error& e) {
    if (lead) std::fprintf(stderr, "baton-train: %s\nbaton-train: change %s\n", e.what(), e.fix().c_str());
    ok = 0;
  }
  world.all_reduce(std::span<std::int32_t>(&ok, 1), baton::reduce_op::min);
  if (!ok) {
    if (metrics != nullptr) std::fclose(metrics);
    return exit_code::bad_input;
  }
  // run_mpi: when one rank throws, every other rank stops within milliseconds naming it,
  // instead of waiting out the timeout.
  const int code = baton::run_mpi(world, [&](baton::mpi_communicator& comm) { return run_any(comm, o, p, metrics); });
  if (metrics != nullptr) std::fclose(metrics);
  return code;
}

}  // namespace train_lm
