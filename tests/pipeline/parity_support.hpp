// Runs a pipeline of mlp_stage<T> on the local world and compares its loss and every weight
// gradient with the sequential oracle.
#pragma once

#include "test_stages.hpp"

#include <mutex>
#include <optional>

namespace pipeline_test {

template <class T>
struct stage_grads {
  tensor<T> dw, db;
};

template <class T>
struct pipeline_outcome {
  std::vector<std::optional<double>> loss_by_rank;
  std::vector<std::size_t> peak_saved_by_rank;
  std::vector<std::optional<stage_grads<T>>> grads_by_stage;
  std::vector<std::vector<baton::action_time>> times_by_rank;
  std::vector<double> compute_seconds_by_rank, wall_seconds_by_rank;
};

// Runs one step of `prog` on prog.shape.ranks threads. `make_input` etc. give the full batch;
// every rank gets the same data (ranks that do not need it ignore it).
template <class T, class Side, class Batch, class Target>
pipeline_outcome<T> run_pipeline(const baton::program& prog, std::int64_t width, const Batch& batch,
                                 const Side& side, const Target& target, baton::pipeline_options options = {},
                                 std::uint64_t seed = 100) {
  using S = mlp_stage<T, Side>;
  const int ranks = prog.shape.ranks;
  pipeline_outcome<T> out;
  out.loss_by_rank.resize(static_cast<std::size_t>(ranks));
  out.peak_saved_by_rank.resize(static_cast<std::size_t>(ranks));
  out.grads_by_stage.resize(static_cast<std::size_t>(prog.shape.num_stages()));
  out.times_by_rank.resize(static_cast<std::size_t>(ranks));
  out.compute_seconds_by_rank.resize(static_cast<std::size_t>(ranks));
  out.wall_seconds_by_rank.resize(static_cast<std::size_t>(ranks));
  std::mutex m;
  baton::run_local(ranks, [&](baton::local_communicator& comm) {
    auto exec = baton::make_pipeline<baton::uniform_stages<S>>(
        comm, prog, [&](int s) { return S(width, seed + static_cast<std::uint64_t>(s)); }, mse_loss<T>{}, options);
    baton::step_report r;
    if constexpr (std::is_same_v<Side, baton::no_side>) {
      r = exec.step(batch, target);
    } else {
      r = exec.step(batch, side, target);
    }
    std::lock_guard lock(m);
    out.loss_by_rank[static_cast<std::size_t>(comm.rank())] = r.loss;
    out.peak_saved_by_rank[static_cast<std::size_t>(comm.rank())] = r.peak_live_saved;
    out.times_by_rank[static_cast<std::size_t>(comm.rank())] = r.action_times;
    out.compute_seconds_by_rank[static_cast<std::size_t>(comm.rank())] = r.compute_seconds;
    out.wall_seconds_by_rank[static_cast<std::size_t>(comm.rank())] = r.wall_seconds;
    exec.for_each_local_stage([&](int s, S& st) { out.grads_by_stage[static_cast<std::size_t>(s)] = stage_grads<T>{st.dw, st.db}; });
  });
  return out;
}

template <class T, class Side>
std::vector<mlp_stage<T, Side>> oracle_stages(int n, std::int64_t width, std::uint64_t seed = 100) {
  std::vector<mlp_stage<T, Side>> stages;
  for (int s = 0; s < n; ++s) stages.emplace_back(width, seed + static_cast<std::uint64_t>(s));
  return stages;
}

// Largest relative error of the pipeline's loss (on the last stage's rank) and weight gradients
// against the oracle.
template <class T, class Side>
double parity_error(const pipeline_outcome<T>& got, double oracle_loss, const std::vector<mlp_stage<T, Side>>& oracle,
                    int last_rank) {
  double err = 0;
  const auto& l = got.loss_by_rank[static_cast<std::size_t>(last_rank)];
  if (!l) return 1e300;
  err = std::max(err, rel_err(*l, oracle_loss));
  for (std::size_t s = 0; s < oracle.size(); ++s) {
    if (!got.grads_by_stage[s]) return 1e300;
    err = std::max(err, rel_err(got.grads_by_stage[s]->dw, oracle[s].dw));
    err = std::max(err, rel_err(got.grads_by_stage[s]->db, oracle[s].db));
  }
  return err;
}

}  // namespace pipeline_test
