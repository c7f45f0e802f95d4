// bench_comm — the local world's point-to-point and all-reduce bandwidth for 4 KiB, 1 MiB
// and 64 MiB messages (2 ranks), against memcpy of the same bytes measured in the same run.
// A local message is copied once, from the sender's buffer into the receiver's, so 64 MiB
// point-to-point should run at memcpy speed: local_p2p_vs_memcpy_64MiB >= 0.8 is the goal.
//
//   bench_comm [--pairs N]
//
// For every figure, memcpy and the transfer alternate (--pairs, 7 by default, at least 5, the
// order flipping from pair to pair); each side of a pair is the average over the size's
// iterations. The roof is memcpy on each rank's thread in turn (the other idle), the mean of
// the two times: a transfer's copy runs on either rank's thread (whichever end finds its
// partner waiting), and the two vCPUs of a shared guest can differ by a third in memory
// bandwidth (docs/communicators.md), so a roof timed on one rank's thread alone put the same
// transfer at 0.77 or 1.38 of it, depending on which vCPU that thread had.
//   memcpy_<size>_GBps                          the roof
//   memcpy_<size>_rank1_vs_rank0                rank 1's memcpy bandwidth over rank 0's
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
      // The roof: each rank copies in turn while the other waits at the barrier (asleep).
      double copy_seconds[2] = {0, 0};
      const auto copy = [&] {
        for (int copier = 0; copier < 2; ++copier) {
          copy_seconds[copier] = bench_comm::seconds_per_op(barrier, [&] {
            if (c.rank() == copier) std::memcpy(to.data(), from.data(), s.bytes);
          }, s.iterations);
        }
        return (copy_seconds[0] + copy_seconds[1]) / 2;
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
        add(std::string("memcpy_") + s.name + "_rank1_vs_rank0", copy_seconds[0] / copy_seconds[1]);
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
