// bench_checkpoint: saving and loading a model state of ~1 GiB (parameters and AdamW's two
// moments, float) as a checkpoint, against a plain sequential write (+ fsync) and read of the
// same bytes in one file, in interleaved pairs (bench_common.hpp):
//
//   save_vs_write = checkpoint save throughput / plain write throughput   (goal >= 0.7)
//   load_vs_read  = checkpoint load throughput / plain read throughput    (goal >= 0.7)
//
// A save writes two safetensors files (model, optimizer) with their XXH64, fsyncs them, writes
// and fsyncs the manifest, renames the directory and `latest`; a load reads the manifest and
// both files, checking every header and checksum. Both reads start from the disk: the files'
// pages are dropped from the page cache first (posix_fadvise DONTNEED after fsync), so that
// neither side is timed on memory copies the other paid the disk for.
//
// Usage: bench_checkpoint [--mib N (default 1024)] [--pairs N] [--dir D (default /tmp)] [--quick]
#include "bench_common.hpp"

#include <baton/config.hpp>

#if BATON_HAS_JSON()
#include <baton/train/json/checkpoint.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#if BATON_HAS_JSON()
namespace {

namespace fs = std::filesystem;
namespace train = baton::train;

void drop_cache(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

void drop_cache_of_tree(const fs::path& dir) {
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) drop_cache(e.path());
}

void check(bool ok, const char* what) {
  if (!ok) {
    std::perror(what);
    std::exit(1);
  }
}

// Each side writes into a file system at rest: what it replaces is deleted before its clock
// starts, and the file system is synced twice (the second sync waits for the first one's
// journal commit to finish). On a file system mounted with `discard` (ext4 on virtual disks
// often is), the blocks a deletion frees are trimmed in the next journal commit, and writes
// that meet that commit wait for it: without this, whichever side ran after the other's
// deletion paid for it, and the pair's ratio measured the order of the pair.
void settle(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  check(fd >= 0, "open");
  check(::syncfs(fd) == 0, "syncfs");
  check(::syncfs(fd) == 0, "syncfs");
  ::close(fd);
}

// The baseline: the same bytes, one new file, written in order and flushed.
double plain_write(const fs::path& file, const std::vector<train::checkpoint_tensor>& tensors) {
  fs::remove(file);
  settle(file.parent_path());
  const auto start = std::chrono::steady_clock::now();
  const int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  check(fd >= 0, "open");
  for (const auto& t : tensors) {
    for (std::size_t done = 0; done < t.bytes.size();) {
      const ::ssize_t n = ::write(fd, t.bytes.data() + done, t.bytes.size() - done);
      check(n > 0, "write");
      done += static_cast<std::size_t>(n);
    }
  }
  check(::fsync(fd) == 0, "fsync");
  check(::close(fd) == 0, "close");
  return bench::seconds_since(start);
}

double plain_read(const fs::path& file, const std::vector<train::checkpoint_tensor>& tensors) {
  drop_cache(file);
  const auto start = std::chrono::steady_clock::now();
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  check(fd >= 0, "open");
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  for (const auto& t : tensors) {
    for (std::size_t done = 0; done < t.bytes.size();) {
      const ::ssize_t n = ::read(fd, t.bytes.data() + done, t.bytes.size() - done);
      check(n > 0, "read");
      done += static_cast<std::size_t>(n);
    }
  }
  ::close(fd);
  return bench::seconds_since(start);
}

}  // namespace
#endif

int main(int argc, char** argv) {
  bench::print_build();
#if !BATON_HAS_JSON()
  (void)argc;
  (void)argv;
  std::printf("SKIPPED: bench_checkpoint needs baton::json (nlohmann-json)\n");
  return 0;
#else
  std::uint64_t mib = 1024;
  std::string where = "/tmp";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--mib" && i + 1 < argc) mib = std::stoull(argv[++i]);
    if (a == "--dir" && i + 1 < argc) where = argv[++i];
    if (a == "--quick") quick = true;
  }
  if (quick) mib = 64;
  const int pairs = bench::pairs_from_args(argc, argv, 5);

  // Two copies on the disk at a time (the checkpoint and the plain file), with room to spare.
  struct ::statvfs fsinfo {};
  check(::statvfs(where.c_str(), &fsinfo) == 0, "statvfs");
  const std::uint64_t free_mib = static_cast<std::uint64_t>(fsinfo.f_bavail) * fsinfo.f_frsize >> 20;
  if (3 * mib > free_mib) {
    const std::uint64_t fits = free_mib / 4;
    std::printf("note: %s has %llu MiB free; the state shrinks from %llu to %llu MiB\n", where.c_str(),
                static_cast<unsigned long long>(free_mib), static_cast<unsigned long long>(mib),
                static_cast<unsigned long long>(fits));
    mib = fits;
  }

  // Parameters and two moments of 64 layers' worth of tensors: 3 x 64 tensors, float.
  const std::size_t tensors_per_group = 64;
  const std::size_t elements = (mib << 20) / (3 * tensors_per_group * sizeof(float));
  std::vector<std::vector<float>> storage(3 * tensors_per_group, std::vector<float>(elements));
  std::vector<train::checkpoint_tensor> tensors;
  const char* suffix[] = {"", ".exp_avg", ".exp_avg_sq"};
  for (std::size_t g = 0; g < 3; ++g)
    for (std::size_t t = 0; t < tensors_per_group; ++t) {
      auto& v = storage[g * tensors_per_group + t];
      std::uint64_t x = 0x9e3779b97f4a7c15ULL * (g * 1000 + t + 1);
      for (auto& e : v) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        e = static_cast<float>(static_cast<double>(x >> 11) * 0x1.0p-53 - 0.5);
      }
      tensors.push_back({"layers." + std::to_string(t) + ".weight" + suffix[g], g == 0 ? "model" : "optimizer",
                         train::tensor_dtype::F32, {static_cast<std::int64_t>(elements)},
                         std::as_writable_bytes(std::span<float>(v))});
    }
  const double bytes = static_cast<double>(3 * tensors_per_group * elements * sizeof(float));

  const fs::path root = fs::path(where) / ("baton_bench_checkpoint_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path plain = root / "plain.bin";
  // keep = 0: the previous checkpoint is deleted before the clock starts (settle), as the plain
  // file is; deleting old checkpoints (keep) is not part of the timed save.
  const train::checkpoint_directory dir(root / "run", /*keep=*/0);
  const auto clear_checkpoints = [&] {
    for (const auto& [s, path] : dir.checkpoints()) fs::remove_all(path);
    settle(root);
  };

  std::printf("state_bytes: %.0f (%zu tensors in 2 files; plain: 1 file) in %s\n", bytes, tensors.size(), root.c_str());
  bench::print_load("before");
  bench::series save_ratio, load_ratio, write_gbs, save_gbs, read_gbs, load_gbs;
  std::int64_t step = 0;
  // One warm-up pair of each, untimed: the first writes of a fresh file system's blocks.
  (void)plain_write(plain, tensors);
  {
    train::checkpoint_record r;
    r.step = step++;
    (void)train::save_checkpoint(dir, r, tensors);
  }
  bench::interleave(
      pairs, [&] { return plain_write(plain, tensors); },
      [&] {
        train::checkpoint_record r;
        r.step = step++;
        clear_checkpoints();
        const auto start = std::chrono::steady_clock::now();
        (void)train::save_checkpoint(dir, r, tensors);
        return bench::seconds_since(start);
      },
      [&](int p, double write_s, double save_s) {
        std::fprintf(stderr, "pair %d: write %.3f s, save %.3f s\n", p, write_s, save_s);
        save_ratio.add(write_s / save_s);
        write_gbs.add(bytes / write_s / 1e9);
        save_gbs.add(bytes / save_s / 1e9);
      });
  bench::interleave(
      pairs, [&] { return plain_read(plain, tensors); },
      [&] {
        drop_cache_of_tree(root / "run");
        const auto start = std::chrono::steady_clock::now();
        (void)train::load_checkpoint(dir.root(), {}, tensors);
        return bench::seconds_since(start);
      },
      [&](int p, double read_s, double load_s) {
        std::fprintf(stderr, "pair %d: read %.3f s, load %.3f s\n", p, read_s, load_s);
        load_ratio.add(read_s / load_s);
        read_gbs.add(bytes / read_s / 1e9);
        load_gbs.add(bytes / load_s / 1e9);
      });
  bench::print_load("after");
  bench::print("save_vs_write", save_ratio, "%.3f");
  bench::print("load_vs_read", load_ratio, "%.3f");
  bench::print("plain_write_GBps", write_gbs, "%.3f");
  bench::print("checkpoint_save_GBps", save_gbs, "%.3f");
  bench::print("plain_read_GBps", read_gbs, "%.3f");
  bench::print("checkpoint_load_GBps", load_gbs, "%.3f");
  fs::remove_all(root);
  return 0;
#endif
}
