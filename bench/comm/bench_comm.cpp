// bench_comm — the local world's point-to-point and all-reduce bandwidth for 4 KiB, 1 MiB
// and 64 MiB messages (2 ranks), against memcpy of the same bytes measured in the same run.
// A local message is copied once, from the sender's buffer into the receiver's, so 64 MiB
// point-to-point should run at memcpy speed: local_p2p_vs_memcpy_64MiB >= 0.8 is the goal.
//
//   bench_comm [--pairs N]
//
// For every figure, memcpy (rank 0 alone, the other rank idle) and the transfer alternate
// (--pairs, 7 by default, at least 5, the order flipping from pair to pair); each side of a
// pair is the average over the size's iterations.
//   memcpy_<size>_GBps                          the roof
//   local_{p2p,all_reduce}_<size>_busbw_GBps    the transfers
//   local_{p2p,all_reduce}_vs_memcpy_<size>     transfer busbw / memcpy bandwidth, per pair
#include "comm_timing.hpp"

#include <baton/comm/local.hpp>

#include <cstring>
#include <map>

int main(int argc, char** argv) {
  const int pairs = bench::pairs_from_args(argc, argv);
  bench::print_build();
  bench::print_load("before");
  std::printf("ranks: 2 threads, pairs: %d (memcpy and transfer alternating)\n", pairs);
  struct result {
    std::map<std::string, bench::series> figures;
    std::vector<std::string> order;
  };
  const auto results = baton::run_local(2, [&](baton::local_communicator& c) {
    result out;
    const auto add = [&](const std::string& name, double v) {
      if (!out.figures.contains(name)) out.order.push_back(name);
      out.figures[name].add(v);
    };
    const auto barrier = [&] { c.barrier(); };
    for (const auto& s : bench_comm::sizes) {
      // Touched buffers: no page faults in the loops.
      std::vector<std::byte> from(s.bytes, std::byte{1}), to(s.bytes, std::byte{2});
      std::vector<float> data(s.bytes / sizeof(float), 0.0f);
      // The roof: rank 0 copies while rank 1 waits at the barrier (asleep).
      const auto copy = [&] {
        return bench_comm::seconds_per_op(barrier, [&] {
          if (c.rank() == 0) std::memcpy(to.data(), from.data(), s.bytes);
        }, s.iterations);
      };
      const auto p2p = [&] {
        return bench_comm::seconds_per_op(barrier, [&] { bench_comm::baton_p2p(c, from); }, s.iterations);
      };
      const auto all_reduce = [&] {
        return bench_comm::seconds_per_op(barrier, [&] { c.all_reduce(std::span(data), baton::reduce_op::sum); },
                                          s.iterations);
      };
      bench::interleave(pairs, copy, p2p, [&](int, double roof, double subject) {
        add(std::string("memcpy_") + s.name + "_GBps", bench_comm::gbps(s.bytes, roof));
        add(std::string("local_p2p_") + s.name + "_busbw_GBps", bench_comm::gbps(s.bytes, subject));
        add(std::string("local_p2p_vs_memcpy_") + s.name, roof / subject);
      });
      bench::interleave(pairs, copy, all_reduce, [&](int, double roof, double subject) {
        add(std::string("local_all_reduce_") + s.name + "_busbw_GBps", bench_comm::all_reduce_busbw(s.bytes, subject, 2));
        add(std::string("local_all_reduce_vs_memcpy_") + s.name,
            bench_comm::all_reduce_busbw(s.bytes, subject, 2) / bench_comm::gbps(s.bytes, roof));
      });
    }
    return out;
  });
  const result& r = results[0];
  for (const auto& name : r.order) bench::print(name, r.figures.at(name));
  bench::print_load("after");
  return 0;
}
