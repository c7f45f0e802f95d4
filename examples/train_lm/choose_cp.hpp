// --cp-mode auto: baton::cp::choose picks ring, Ulysses or hybrid for this model's attention on
// this machine, from a brief calibration (baton::cp::calibrate) on --cp thread ranks.
#pragma once

#include "options.hpp"

#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/config.hpp>
#include <baton/cp/choose_calibrate.hpp>
#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif

#include <cstdio>
#include <string>

namespace train_lm {

// Sets o.cp_mode (and o.ulysses for a hybrid) to the split predicted fastest for one attention
// call of a microbatch (forward + backward, causal; with --packed the documents are not known
// yet, and causal is their upper bound), and prints every prediction. Kokkos must be running.
inline void choose_cp_mode(options& o) {
  const baton::cp_choose_mesh mesh{o.cp, o.layout};
  const std::int64_t rows = std::max<std::int64_t>(1, o.batch / std::max(1, o.microbatches));
  const baton::cp_choose_shape shape{rows, o.seq, o.heads, o.kv_heads, o.d_model / o.heads, o.dtype == "double" ? 8 : 4, true};
  baton::cp_costs costs;
  baton::run_local(o.cp, [&](baton::local_communicator& comm) {
    baton::cp::calibrate_options opt;
    opt.tokens = std::max<std::int64_t>(64, std::min<std::int64_t>(1024, o.seq / 64 * 64));
    baton::cp_costs c;
#if BATON_HAS_KOKKOS()
    if (o.backend == "kokkos")
      c = baton::cp::calibrate(comm, baton::kokkos_attention{}, shape.head_dim, opt);
    else
#endif
      c = baton::cp::calibrate(comm, baton::reference_attention{}, shape.head_dim, opt);
    if (comm.rank() == 0) costs = c;
  });
  const baton::cp_choice choice = baton::cp::choose(mesh, shape, baton::causal_mask{}, costs);
  std::printf("cp-mode auto: calibrated on %d thread ranks (%s attention, float kernels%s); predicted forward + backward "
              "of one attention call (%lld rows x %lld tokens, causal):",
              o.cp, o.backend.c_str(), o.dtype == "double" ? ", the double kernels run slower" : "",
              static_cast<long long>(rows), static_cast<long long>(o.seq));
  for (const auto& p : choice.candidates)
    std::printf(" %s %.3g ms (compute %.3g, communication %.3g);", p.name().c_str(), 1e3 * p.seconds, 1e3 * p.compute,
                1e3 * p.exposed);
  std::printf(" chosen: %s\n", choice.best.name().c_str());
  std::fflush(stdout);
  if (choice.best.ulysses_degree == 1) {
    o.cp_mode = baton::nn::cp_mode::ring;
  } else if (choice.best.ring_degree == 1) {
    o.cp_mode = baton::nn::cp_mode::ulysses;
  } else {
    o.cp_mode = baton::nn::cp_mode::hybrid;
    o.ulysses = choice.best.ulysses_degree;
  }
}

}  // namespace train_lm
