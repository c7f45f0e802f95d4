// What the checkpoint tests on threads (test_checkpoint.cpp) and on MPI processes
// (test_checkpoint_mpi.cpp) share: the text, a small model, the three meshes of issue 28's
// exact-resume line, and one rank's run "train N steps, save, train M more" beside "a new
// trainer (another seed) loads the checkpoint and trains the same M steps".
#pragma once

#include <baton/config.hpp>
#include <baton/schedule.hpp>
#include <baton/train.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

namespace checkpoint_test {

namespace train = baton::train;
namespace fs = std::filesystem;

inline std::string test_text() {
  std::string t;
  const char* words[] = {"checkpoint", "resume", "shard", "manifest", "stage", "ring", "replica", "step"};
  for (int i = 0; i < 700; ++i) {
    t += words[(i * 5 + i / 7) % 8];
    t += (i % 19 == 18) ? "\n\n" : (i % 7 == 6 ? ". " : " ");
  }
  return t;
}

inline const train::byte_corpus& corpus() {
  static const train::byte_corpus c(test_text());
  return c;
}

template <class T>
train::lm_config small_config(std::int64_t layers = 4) {
  train::lm_config c;
  c.model = {.d_model = 16, .heads = 4, .kv_heads = 2, .vocab = train::byte_corpus::vocab};
  c.layers = layers;
  c.seq = 16;
  c.batch = 4;
  c.optimizer.lr = 1e-2;
  c.optimizer.eps = std::is_same_v<T, float> ? 1e-5 : 1e-8;
  c.seed = 5;
  return c;
}

template <class Policy>
baton::program schedule_of(int pp, int microbatches = 4) {
  return Policy::generate(baton::shape_for<Policy>(pp, microbatches));
}

struct mesh_case {
  std::string name;
  train::lm_parallelism parallelism;
  baton::program schedule;
};

/// Issue 28's three meshes for exact resume (4 ranks each).
inline std::vector<mesh_case> resume_meshes() {
  using baton::shard_layout;
  using baton::nn::cp_mode;
  return {
      {"ZBV pp2 x cp2 ring", {{.pp = 2, .cp_ring = 2}, cp_mode::ring, shard_layout::zigzag}, schedule_of<baton::zbv>(2)},
      {"1F1B pp2 x dp2", {{.pp = 2, .dp = 2}, cp_mode::none, shard_layout::zigzag}, schedule_of<baton::one_f_one_b>(2)},
      {"hybrid cp4 (2 x 2)", {{.pp = 1, .cp_ring = 2, .cp_ulysses = 2}, cp_mode::hybrid, shard_layout::zigzag},
       schedule_of<baton::gpipe>(1)},
  };
}

template <class T>
using parameters = std::map<std::string, baton::host_tensor<T>>;

/// The first parameter whose bits differ ("" when every one is equal bit for bit).
template <class T>
std::string first_bitwise_difference(const parameters<T>& a, const parameters<T>& b) {
  if (a.size() != b.size()) return "(the parameter counts differ)";
  for (const auto& [name, x] : a) {
    const auto it = b.find(name);
    if (it == b.end() || it->second.shape() != x.shape() ||
        std::memcmp(x.data(), it->second.data(), static_cast<std::size_t>(x.size()) * sizeof(T)) != 0)
      return name;
  }
  return "";
}

#if BATON_HAS_JSON()
template <class T>
struct resume_outcome {
  std::vector<double> straight_losses, resumed_losses;  // steps N .. N+M-1
  parameters<T> straight, resumed;                      // after N+M steps (gathered on every rank)
  std::int64_t steps_after_load = -1, data_position = -1;
  std::vector<std::string> changed;
  fs::path saved;
};

/// One rank's part: N steps, save, M more; then a new trainer of another seed loads and trains
/// the same M steps. Collective over `world`.
template <class T, class Backend, class Comm>
resume_outcome<T> train_save_resume(Comm& world, const mesh_case& mesh, const fs::path& dir, int n, int m) {
  const train::lm_config config = small_config<T>();
  const std::int64_t rows = config.batch * mesh.parallelism.mesh.dp;
  const auto batch = [&](std::int64_t step) { return corpus().train_batch(step, rows, config.seq, false); };
  resume_outcome<T> out;
  {
    train::lm_trainer<T, Comm, Backend> a(world, config, mesh.parallelism, mesh.schedule);
    for (std::int64_t s = 0; s < n; ++s) a.step(batch(s));
    out.saved = train::save_checkpoint(a, train::checkpoint_directory(dir));
    for (std::int64_t s = n; s < n + m; ++s) out.straight_losses.push_back(a.step(batch(s)).loss);
    out.straight = a.parameters();
  }
  train::lm_config other = config;
  other.seed = config.seed + 1000;  // other initial weights: only the checkpoint can make them equal
  train::lm_trainer<T, Comm, Backend> b(world, other, mesh.parallelism, mesh.schedule);
  const train::lm_checkpoint_info info = train::load_checkpoint(b, dir);
  out.steps_after_load = b.steps();
  out.data_position = info.data_position;
  out.changed = info.changed;
  for (std::int64_t s = info.data_position; s < n + m; ++s) out.resumed_losses.push_back(b.step(batch(s)).loss);
  out.resumed = b.parameters();
  return out;
}
#endif

/// A fresh directory under the system's temporary one, removed with this object.
class scratch_dir {
 public:
  explicit scratch_dir(const std::string& name) {
    std::string pattern = (fs::temp_directory_path() / ("baton_" + name + "_XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a scratch directory " + pattern);
    path_ = pattern;
  }
  ~scratch_dir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  const fs::path& path() const noexcept { return path_; }

 private:
  fs::path path_;
};

}  // namespace checkpoint_test
