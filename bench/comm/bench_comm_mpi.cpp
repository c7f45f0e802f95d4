// bench_comm_mpi — the MPI backend against plain MPI calls on the same bytes, measured in the
// same run: point to point (baton isend/irecv + wait against MPI_Send + MPI_Recv) and float
// sum all-reduce (baton all_reduce against MPI_Allreduce, in place), 4 KiB, 1 MiB and 64 MiB.
// Run under mpiexec (ctest runs it with -n 2); rank 0 times and prints.
//
//   mpiexec -n 2 bench_comm_mpi [--pairs N]
//
// For every figure, raw MPI and baton alternate (--pairs, 7 by default, at least 5, the order
// flipping from pair to pair); each side of a pair is the average over the size's iterations.
//   mpi_{p2p,all_reduce}_<size>_busbw_GBps       baton
//   raw_mpi_{p2p,all_reduce}_<size>_busbw_GBps   plain MPI
//   mpi_{p2p,all_reduce}_<size>_vs_raw           baton / plain MPI bandwidth, per pair
// The goal: vs_raw >= 0.9 from 1 MiB, >= 0.7 at 4 KiB. baton's all_reduce also checks that
// every rank called it with the same count, type and op, and its float sums have the same bits
// on every rank and as on threads; MPI_Allreduce does neither.
// On a machine whose cores other programs share, run with OMPI_MCA_mpi_yield_when_idle=1 (the
// ctest entry does): a blocking MPI call otherwise spins through its peer's time slices, and
// single trials of plain MPI come out 100-1000x slower.
#include "comm_timing.hpp"

#include <baton/comm/mpi.hpp>

#include <mpi.h>

#include <cstdio>
#include <map>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  const int pairs = bench::pairs_from_args(argc, argv);
  {
    baton::mpi_communicator c;
    MPI_Comm raw = MPI_COMM_NULL;
    MPI_Comm_dup(MPI_COMM_WORLD, &raw);
    const bool lead = c.rank() == 0;
    if (c.size() < 2) {
      if (lead) std::printf("SKIPPED: bench_comm_mpi needs at least 2 ranks (mpiexec -n 2)\n");
    } else {
      if (lead) {
        bench::print_build();
        bench::print_load("before");
        std::printf("ranks: %d, pairs: %d (raw MPI and baton alternating)\n", c.size(), pairs);
      }
      const auto barrier = [&] { MPI_Barrier(raw); };
      std::map<std::string, bench::series> figures;
      std::vector<std::string> order;
      const auto add = [&](const std::string& name, double v) {
        if (!figures.contains(name)) order.push_back(name);
        figures[name].add(v);
      };
      for (const auto& s : bench_comm::sizes) {
        std::vector<std::byte> buffer(s.bytes, std::byte{1});  // touched: no page faults in the loop
        const int bytes = static_cast<int>(s.bytes);
        const auto raw_p2p = [&] {
          return bench_comm::seconds_per_op(barrier, [&] {
            if (c.rank() == 0) MPI_Send(buffer.data(), bytes, MPI_BYTE, 1, 0, raw);
            if (c.rank() == 1) MPI_Recv(buffer.data(), bytes, MPI_BYTE, 0, 0, raw, MPI_STATUS_IGNORE);
          }, s.iterations);
        };
        const auto baton_p2p = [&] {
          return bench_comm::seconds_per_op(barrier, [&] { bench_comm::baton_p2p(c, buffer); }, s.iterations);
        };
        bench::interleave(pairs, raw_p2p, baton_p2p, [&](int, double base, double subject) {
          add(std::string("mpi_p2p_") + s.name + "_busbw_GBps", bench_comm::gbps(s.bytes, subject));
          add(std::string("raw_mpi_p2p_") + s.name + "_busbw_GBps", bench_comm::gbps(s.bytes, base));
          add(std::string("mpi_p2p_") + s.name + "_vs_raw", base / subject);
        });
      }
      for (const auto& s : bench_comm::sizes) {
        // Zeros: the in-place sums stay finite however often they repeat.
        std::vector<float> data(s.bytes / sizeof(float), 0.0f);
        const int count = static_cast<int>(data.size());
        const auto raw_all_reduce = [&] {
          return bench_comm::seconds_per_op(barrier, [&] {
            MPI_Allreduce(MPI_IN_PLACE, data.data(), count, MPI_FLOAT, MPI_SUM, raw);
          }, s.iterations);
        };
        const auto baton_all_reduce = [&] {
          return bench_comm::seconds_per_op(barrier, [&] { c.all_reduce(std::span(data), baton::reduce_op::sum); },
                                            s.iterations);
        };
        bench::interleave(pairs, raw_all_reduce, baton_all_reduce, [&](int, double base, double subject) {
          add(std::string("mpi_all_reduce_") + s.name + "_busbw_GBps", bench_comm::all_reduce_busbw(s.bytes, subject, c.size()));
          add(std::string("raw_mpi_all_reduce_") + s.name + "_busbw_GBps",
              bench_comm::all_reduce_busbw(s.bytes, base, c.size()));
          add(std::string("mpi_all_reduce_") + s.name + "_vs_raw", base / subject);
        });
      }
      if (lead) {
        for (const auto& name : order) bench::print(name, figures[name]);
        bench::print_load("after");
      }
    }
    MPI_Comm_free(&raw);
  }
  MPI_Finalize();
  return 0;
}
