// Microbatch split and merge throughput of host_tensor, against a plain memcpy of the same
// bytes (the roof: a split or merge copies each byte once). Prints one `NAME: value` line per
// figure; bandwidth is tensor bytes / time (algbw, as nccl-tests counts it).
//
//   bench_payload [--pairs N]
//
// For every operation, memcpy and the operation alternate (--pairs, 7 by default, at least 5,
// the order flipping from pair to pair); each side of a pair is the best of 3 calls.
//   memcpy_GBps                    the roof, over every pair of every operation
//   <op>_GBps                      split / merge along dim 0 or 1, of a tensor or a record
//   <op>_vs_memcpy                 operation bandwidth / memcpy bandwidth, per pair
#include "bench_common.hpp"

#include <baton/payload.hpp>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace {

double best_seconds(int calls, const std::function<void()>& body) {
  double best = 1e30;
  for (int r = 0; r < calls; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    best = std::min(best, bench::seconds_since(t0));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int pairs = bench::pairs_from_args(argc, argv);
  bench::print_build();
  bench::print_load("before");
  using tensor = baton::host_tensor<float>;
  // [batch 32, seq 512, hidden 256] floats: 16 MiB, cut into 8 microbatches.
  const std::vector<std::int64_t> shape{32, 512, 256};
  tensor x(shape);
  for (std::int64_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 1000);
  const auto bytes = static_cast<double>(x.size()) * sizeof(float);
  const int chunks = 8, calls = 3;
  const double gb = 1e9;
  std::printf("payload_bytes: %.0f\n", bytes);
  std::printf("pairs: %d (memcpy and the operation alternating)\n", pairs);

  std::vector<float> copy(static_cast<std::size_t>(x.size()));
  const auto memcpy_seconds = [&] {
    return best_seconds(calls, [&] { std::memcpy(copy.data(), x.data(), static_cast<std::size_t>(bytes)); });
  };

  std::vector<tensor> parts = baton::split_microbatches(x, chunks, 0);
  tensor merged;
  using record = baton::record<baton::field<"hidden", tensor>, baton::field<"positions", baton::constant<baton::host_tensor<std::int64_t>>>>;
  record r{x, baton::constant{baton::host_tensor<std::int64_t>({32, 512})}};
  const auto record_bytes = bytes + 32.0 * 512 * sizeof(std::int64_t);
  std::vector<record> record_parts = baton::split_microbatches(r, chunks);
  record record_merged;

  struct operation {
    const char* name;
    double bytes;
    std::function<void()> body;
  };
  // Each merge runs after its split (it merges the split's parts), so the pairs of a split
  // and its merge are measured in turn.
  const std::vector<operation> operations{
      {"split_dim0", bytes, [&] { parts = baton::split_microbatches(x, chunks, 0); }},
      {"merge_dim0", bytes, [&] { merged = baton::merge_microbatches(parts, 0); }},
      {"split_dim1", bytes, [&] { parts = baton::split_microbatches(x, chunks, 1); }},
      {"merge_dim1", bytes, [&] { merged = baton::merge_microbatches(parts, 1); }},
      {"split_record", record_bytes, [&] { record_parts = baton::split_microbatches(r, chunks); }},
      {"merge_record", record_bytes, [&] { record_merged = baton::merge_microbatches(record_parts); }},
  };
  bench::series roof;
  std::vector<bench::series> rate(operations.size()), ratio(operations.size());
  for (std::size_t o = 0; o < operations.size(); ++o) {
    const operation& op = operations[o];
    bench::interleave(pairs, memcpy_seconds, [&] { return best_seconds(calls, op.body); },
                      [&](int, double base, double subject) {
                        roof.add(bytes / base / gb);
                        rate[o].add(op.bytes / subject / gb);
                        ratio[o].add((op.bytes / subject) / (bytes / base));
                      });
  }
  bench::print("memcpy_GBps", roof, "%.2f");
  for (std::size_t o = 0; o < operations.size(); ++o) {
    bench::print(std::string(operations[o].name) + "_GBps", rate[o], "%.2f");
    bench::print(std::string(operations[o].name) + "_vs_memcpy", ratio[o], "%.3f");
  }
  bench::print_load("after");
  // Keep the results observable so nothing is optimised away.
  return merged.size() == x.size() && baton::get<"hidden">(record_merged).size() == x.size() ? 0 : 1;
}
