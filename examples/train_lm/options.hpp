// baton-train's command line: the options, their defaults, and how a configuration error of
// the trainer maps back to the flag to change.
#pragma once

#include <baton/train.hpp>

#include <cstdint>
#include <string>

namespace train_lm {

struct options {
  int ranks = 0;  // local world size; 0: pp x dp x cp
  int pp = 2, dp = 1, cp = 2, ulysses = 0;
  baton::nn::cp_mode cp_mode = baton::nn::cp_mode::ring;
  baton::shard_layout layout = baton::shard_layout::zigzag;
  std::string schedule = "zbv";
  std::int64_t layers = 4, d_model = 128, heads = 4, kv_heads = 2, seq = 128, batch = 8;
  int microbatches = 4, steps = 240;
  double lr = 3e-3, clip = 1.0;
  std::string backend = "kokkos", comm = "local", dtype = "float";
  std::uint64_t seed = 1;
  std::string data = "/usr/share/common-licenses/GPL-3";
  bool packed = false, check = false;
  int generate = 200, log_every = 10, loss_digits = 4;

  baton::mesh_shape mesh() const;
  int world_size() const { return ranks > 0 ? ranks : pp * dp * cp; }
  baton::train::lm_config config() const;
  baton::train::lm_parallelism parallelism() const { return {mesh(), cp_mode, layout}; }
};

/// Parses argv; throws std::invalid_argument naming the flag on a bad value. Returns false
/// (after printing the usage) for --help.
bool parse(int argc, char** argv, options& o);

/// The flag(s) to change for a config_error's setting.
std::string flags_for(const std::string& setting);

/// "1F1B" or a CSV file's program for o.pp ranks and o.microbatches.
baton::program make_schedule(const options& o);

/// Runs the whole program on this rank of `world` (templated on the communicator in run.hpp).
int run_local_world(const options& o);
int run_mpi_world(const options& o);

}  // namespace train_lm
