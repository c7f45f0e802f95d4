// Microbatch split and merge throughput of host_tensor, against a plain memcpy of the same
// bytes (the roof: a split or merge copies each byte once). Prints one "NAME: value" line per
// figure; bandwidth is tensor bytes / time (algbw, as nccl-tests counts it).
#include <baton/payload.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

namespace {

double best_seconds(int repeats, const std::function<void()>& body) {
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    const auto t1 = std::chrono::steady_clock::now();
    best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
  }
  return best;
}

}  // namespace

int main() {
  using tensor = baton::host_tensor<float>;
  // [batch 32, seq 512, hidden 256] floats: 16 MiB, cut into 8 microbatches.
  const std::vector<std::int64_t> shape{32, 512, 256};
  tensor x(shape);
  for (std::int64_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 1000);
  const auto bytes = static_cast<double>(x.size()) * sizeof(float);
  const int chunks = 8, repeats = 10;
  const double gb = 1e9;

  std::vector<float> copy(static_cast<std::size_t>(x.size()));
  const double t_memcpy = best_seconds(repeats, [&] { std::memcpy(copy.data(), x.data(), static_cast<std::size_t>(bytes)); });

  std::vector<tensor> parts;
  const double t_split0 = best_seconds(repeats, [&] { parts = baton::split_microbatches(x, chunks, 0); });
  tensor merged;
  const double t_merge0 = best_seconds(repeats, [&] { merged = baton::merge_microbatches(parts, 0); });
  const double t_split1 = best_seconds(repeats, [&] { parts = baton::split_microbatches(x, chunks, 1); });
  const double t_merge1 = best_seconds(repeats, [&] { merged = baton::merge_microbatches(parts, 1); });

  using record = baton::record<baton::field<"hidden", tensor>, baton::field<"positions", baton::constant<baton::host_tensor<std::int64_t>>>>;
  record r{x, baton::constant{baton::host_tensor<std::int64_t>({32, 512})}};
  const auto record_bytes = bytes + 32.0 * 512 * sizeof(std::int64_t);
  std::vector<record> record_parts;
  const double t_split_rec = best_seconds(repeats, [&] { record_parts = baton::split_microbatches(r, chunks); });
  record record_merged;
  const double t_merge_rec = best_seconds(repeats, [&] { record_merged = baton::merge_microbatches(record_parts); });

  std::printf("payload_bytes: %.0f\n", bytes);
  std::printf("memcpy_GBps: %.2f\n", bytes / t_memcpy / gb);
  std::printf("split_dim0_GBps: %.2f\n", bytes / t_split0 / gb);
  std::printf("merge_dim0_GBps: %.2f\n", bytes / t_merge0 / gb);
  std::printf("split_dim1_GBps: %.2f\n", bytes / t_split1 / gb);
  std::printf("merge_dim1_GBps: %.2f\n", bytes / t_merge1 / gb);
  std::printf("split_record_GBps: %.2f\n", record_bytes / t_split_rec / gb);
  std::printf("merge_record_GBps: %.2f\n", record_bytes / t_merge_rec / gb);
  // Keep the results observable so nothing is optimised away.
  return merged.size() == x.size() && baton::get<"hidden">(record_merged).size() == x.size() ? 0 : 1;
}
