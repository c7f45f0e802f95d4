// bench_comm — the local world's point-to-point and all-reduce bandwidth for 4 KiB, 1 MiB
// and 64 MiB messages (2 ranks), against memcpy measured in the same run. A local message
// is copied once, from the sender's buffer into the receiver's, so 64 MiB point-to-point
// should run at memcpy speed: local_p2p_vs_memcpy_64MiB >= 0.8 is the goal.
#include "bench_common.hpp"

#include <baton/comm/local.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

namespace {

constexpr std::size_t big = std::size_t{64} << 20;

/// Seconds per 64 MiB memcpy between two touched buffers, averaged over 8 copies like the
/// transfers are.
double memcpy_seconds(std::vector<std::byte>& from, std::vector<std::byte>& to) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i) std::memcpy(to.data(), from.data(), big);
  return bench_comm::seconds_since(start) / 8;
}

}  // namespace

int main() {
  struct result {
    std::vector<bench_comm::figure> figures;
    double memcpy_gbps = 0;
    double p2p_64_gbps = 0;
  };
  const auto results = baton::run_local(2, [](baton::local_communicator& c) {
    result out;
    out.figures = bench_comm::measure(c, "local");
    // The ratio: memcpy and 64 MiB transfers in alternating trials, best of 5 each, so that
    // load from other processes on a shared machine hits both alike.
    std::vector<std::byte> from(big, std::byte{1}), to(big, std::byte{2});
    double best_copy = 1e30, best_p2p = 1e30;
    for (int trial = 0; trial < 5; ++trial) {
      c.barrier();
      if (c.rank() == 0) best_copy = std::min(best_copy, memcpy_seconds(from, to));
      c.barrier();
      best_p2p = std::min(best_p2p, bench_comm::p2p_seconds(c, big, 8));
    }
    out.memcpy_gbps = static_cast<double>(big) / best_copy / 1e9;
    out.p2p_64_gbps = static_cast<double>(big) / best_p2p / 1e9;
    return out;
  });
  const result& r = results[0];
  bench_comm::print({"memcpy_GBps", r.memcpy_gbps});
  for (const auto& f : r.figures) bench_comm::print(f);
  bench_comm::print({"local_p2p_vs_memcpy_64MiB", r.p2p_64_gbps / r.memcpy_gbps});
  return 0;
}
