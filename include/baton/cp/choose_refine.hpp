// baton/cp/choose_refine.hpp — lets the clock settle what the model's error cannot: the splits
// cp::choose predicts within a factor of the fastest are run on the world at hand (forward,
// and backward when the shape asks for it, on tensors of the shape; every rank at once, in
// rotating rounds) and the fastest measured is chosen. The model still ranks the splits and
// rules out the clearly slower ones; a near tie, which a 5-10 % error can decide either way,
// is measured. Only where each rank has a core of its own (calibrate's `share`): thread ranks
// that outnumber the cores rank near-equal splits differently from one second to the next,
// and there a short measurement picks worse than the model (docs/context-parallel.md,
// "Choosing a CP mode"). Collective, like calibrate.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/cp/choose.hpp>
#include <baton/cp/choose_calibrate.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/hybrid.hpp>
#include <baton/cp/ring.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/cp/ulysses.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace baton::cp {

struct refine_options {
  // Every split predicted at most this factor slower than the fastest prediction is measured.
  // The predictions land within 0.85-1.15 of the measured times, so two splits 1.3x apart in
  // prediction can swap places; further apart they do not.
  double within = 1.3;
  int warmup = 2;  // rounds not counted: a layer's first calls size its buffers and fault its pages in
  int rounds = 3;  // rounds counted, each split once per round in a rotating order; a split's time is its median
  // Measure only when the calibration's `share` (a rank's rate with every rank computing over
  // its rate alone) is at least this: each rank has a core (or a device) of its own.
  double min_share = detail::own_cores_share;
};

/// cp::choose's answer for this mesh, shape, mask and costs, with the near ties measured: when
/// costs.share >= opt.min_share, every split predicted within opt.within of the fastest runs
/// on this world with this backend, its `measured` time is filled and `best` is the fastest
/// measured; otherwise the prediction's answer is returned as it is (every `measured` 0).
/// Call on every rank of the CP world at once (comm.size() == mesh.ranks) with the same
/// arguments (calibrate's costs are the same on every rank); every rank returns the same
/// answer (a split's time is its slowest rank's median). Tensors are float for
/// shape.element_bytes 4, double for 8. Throws cp_error on a bad option or a mismatch.
template <class Comm, class Backend, class Mask>
  requires attention_mask<Mask>
cp_choice refine(Comm& comm, Backend backend, const cp_choose_mesh& mesh, const cp_choose_shape& shape, const Mask& mask,
                 const cp_costs& costs, const refine_options& opt = {}) {
  static_assert(splittable_communicator<Comm> && all_to_all_communicator<Comm>,
                "baton::cp::refine: the communicator must model splittable_communicator and all_to_all_communicator "
                "(it builds the Ulysses and hybrid splits it measures); use cp::choose's prediction alone otherwise");
  const auto fail = [](const std::string& what) { throw cp_error("baton::cp::refine: " + what); };
  if (!(opt.within >= 1) || opt.warmup < 0 || opt.rounds < 1 || !(opt.min_share >= 0 && opt.min_share <= 1))
    fail("within >= 1, warmup >= 0, rounds >= 1 and min_share in [0, 1] are required (got within " +
         std::to_string(opt.within) + ", warmup " + std::to_string(opt.warmup) + ", rounds " + std::to_string(opt.rounds) +
         ", min_share " + std::to_string(opt.min_share) + ")");
  if (comm.size() != mesh.ranks)
    fail("the communicator has " + std::to_string(comm.size()) + " ranks and the mesh " + std::to_string(mesh.ranks) +
         "; call it on the CP world the choice is made for");
  if (shape.element_bytes != 4 && shape.element_bytes != 8)
    fail("element_bytes " + std::to_string(shape.element_bytes) + ": refine measures float (4) or double (8) tensors");
  cp_choice choice = choose(mesh, shape, mask, costs);
  if (costs.share < opt.min_share) return choice;

  const auto measure = [&](auto element) {
    using T = decltype(element);
    std::vector<std::size_t> picked;  // the candidates measured
    std::vector<std::function<void()>> runs;
    std::vector<std::shared_ptr<void>> keep;  // the layers, meshes and tensors of every measured split
    const auto add = [&](auto layer, auto tensors) {  // one split: its layer on its tensors
      keep.push_back(layer);
      keep.push_back(tensors);
      runs.emplace_back([layer, tensors, &mask, &shape] { tensors->run(*layer, mask, shape.backward); });
    };
    for (std::size_t i = 0; i < choice.candidates.size(); ++i) {
      const cp_mode_prediction& c = choice.candidates[i];
      if (c.seconds > opt.within * choice.best.seconds) continue;
      picked.push_back(i);
      if (c.ulysses_degree == 1 || c.ring_degree == 1) {
        const sequence_sharding sh(mesh.layout, shape.seq_len, mesh.ranks);
        auto t = std::make_shared<detail::attention_tensors<T>>(shape, sh.local_len(comm.rank()));
        if (c.ulysses_degree == 1)
          add(std::make_shared<ring_attention<Comm, Backend>>(comm, backend, sh), t);
        else
          add(std::make_shared<ulysses_attention<Comm, Backend>>(comm, backend, sh), t);
      } else {
        auto m = std::make_shared<cp_mesh<Comm>>(make_cp_mesh(comm, c.ring_degree, c.ulysses_degree));
        keep.push_back(m);
        const sequence_sharding sh(mesh.layout, shape.seq_len, c.ring_degree, c.ulysses_degree);
        auto a = std::make_shared<hybrid_attention<Comm, Comm, Backend>>(*m, backend, sh);
        add(a, std::make_shared<detail::attention_tensors<T>>(shape, sh.local_len(a->shard_index())));
      }
    }
    std::vector<std::vector<double>> times(runs.size());
    const auto timed = [&](std::size_t i) {
      detail::sync(comm);
      const auto t0 = std::chrono::steady_clock::now();
      runs[i]();
      detail::sync(comm);  // the split's time is its slowest rank's
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    for (int w = 0; w < opt.warmup; ++w)
      for (std::size_t i = 0; i < runs.size(); ++i) timed(i);
    for (int r = 0; r < opt.rounds; ++r)
      for (std::size_t j = 0; j < runs.size(); ++j) {
        const std::size_t i = (j + static_cast<std::size_t>(r)) % runs.size();  // no split always first
        times[i].push_back(timed(i));
      }
    std::vector<double> medians(runs.size());
    for (std::size_t i = 0; i < runs.size(); ++i) medians[i] = detail::median_of(times[i]);
    detail::max_over_ranks(comm, std::span<double>(medians));
    std::size_t best = picked.front();
    for (std::size_t i = 0; i < picked.size(); ++i) {
      choice.candidates[picked[i]].measured = medians[i];
      if (medians[i] < choice.candidates[best].measured) best = picked[i];
    }
    choice.best = choice.candidates[best];
  };
  if (shape.element_bytes == 8)
    measure(double{});
  else
    measure(float{});
  return choice;
}

}  // namespace baton::cp
