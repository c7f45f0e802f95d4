// Shared timing loops of bench_comm (local world) and bench_comm_mpi (MPI): the same code
// measures both transports. Bandwidths follow nccl-tests: algbw = bytes / time;
// busbw = algbw for send/recv and algbw x 2(n-1)/n for all-reduce.
#pragma once

#include <baton/comm/concepts.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace bench_comm {

struct message_size {
  const char* name;
  std::size_t bytes;
  int iterations;
};

inline const message_size sizes[] = {{"4KiB", std::size_t{4} << 10, 2000},
                                     {"1MiB", std::size_t{1} << 20, 200},
                                     {"64MiB", std::size_t{64} << 20, 8}};

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Rank 0 streams `iterations` messages of `bytes` to rank 1 (others idle); returns the
/// seconds per message on rank 0, measured from a common barrier to the last completion.
template <class C>
double p2p_seconds(C& c, std::size_t bytes, int iterations) {
  std::vector<std::byte> buffer(bytes, std::byte{1});  // touched: no page faults in the loop
  auto one = [&] {
    if (c.rank() == 0) c.isend(std::span<const std::byte>(buffer), 1, 0).wait();
    if (c.rank() == 1) c.irecv(std::span(buffer), 0, 0).wait();
  };
  one();  // warm up
  c.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) one();
  c.barrier();  // the last message has arrived everywhere
  return seconds_since(start) / iterations;
}

/// Seconds per all_reduce (sum) of `bytes` of floats.
template <class C>
double all_reduce_seconds(C& c, std::size_t bytes, int iterations) {
  std::vector<float> data(bytes / sizeof(float), 1.0f);
  c.all_reduce(std::span(data), baton::reduce_op::sum);  // warm up
  c.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) c.all_reduce(std::span(data), baton::reduce_op::sum);
  c.barrier();
  return seconds_since(start) / iterations;
}

struct figure {
  std::string name;
  double value;
};

/// Every figure for one transport: "<prefix>_p2p_<size>_busbw_GBps" and
/// "<prefix>_all_reduce_<size>_busbw_GBps".
template <class C>
std::vector<figure> measure(C& c, const std::string& prefix) {
  std::vector<figure> out;
  const double n = c.size();
  // Each figure is the best of 3 trials (each the average over the size's iterations), so
  // that a burst of load from other processes on a shared machine does not set it.
  auto best_of_3 = [](auto trial) { return std::min({trial(), trial(), trial()}); };
  for (const auto& s : sizes) {
    const double p2p = best_of_3([&] { return p2p_seconds(c, s.bytes, s.iterations); });
    out.push_back({prefix + "_p2p_" + s.name + "_busbw_GBps", static_cast<double>(s.bytes) / p2p / 1e9});
  }
  for (const auto& s : sizes) {
    const double t = best_of_3([&] { return all_reduce_seconds(c, s.bytes, s.iterations); });
    out.push_back({prefix + "_all_reduce_" + s.name + "_busbw_GBps", static_cast<double>(s.bytes) / t / 1e9 * 2 * (n - 1) / n});
  }
  return out;
}

inline void print(const figure& f) { std::printf("%s: %.3f\n", f.name.c_str(), f.value); }

}  // namespace bench_comm
