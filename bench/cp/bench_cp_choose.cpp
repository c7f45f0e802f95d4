// bench_cp_choose — does baton::cp::choose predict CP step times and pick the fastest split?
//
// On 6 shapes (sequence length, heads, mask, CP ranks) it calibrates the costs on the world
// at hand (baton::cp::calibrate, at the shape's rank count, so 4 thread ranks on 2 cores are
// calibrated oversubscribed as they then run), predicts forward + backward of every legal
// split (ring, Ulysses, hybrid), then measures every split: two warm-up rounds, then --pairs
// rounds (7 by default, at least 5) in which every split runs once, the order rotating from
// round to round; a run is timed on rank 0 from a barrier to a barrier. Per shape and split:
//   choose_pred_over_measured_<shape>_<mode>: prediction / measured time, per round
//   choose_measured_s_<shape>_<mode>, choose_pred_s_<shape>_<mode>
//   choose_pick_<shape>: the split chosen and the measured-fastest one
//   choose_regret_<shape>: measured time of the chosen split / of the measured-fastest (1 = best)
//   choose_margin_<shape>: the measured runner-up's time / the fastest's, and in how many rounds
//     the fastest beat it (how far the measured ranking itself can be trusted)
// and at the end `choose_picked_fastest: k/6`, `choose_picked_fastest_where_clear: k/n` (over
// the shapes whose fastest beat the runner-up in every round but at most one), the spread of
// the ratios and of the regrets. After the calibration, before the measured rounds, each shape
// also runs baton::cp::refine as a training run would before its first step (where each rank
// has a core of its own, the splits predicted within 1.3x of the fastest measured for 2 + 3
// rounds; with ranks sharing cores the prediction's pick): choose_refined_pick_<shape>,
// choose_refine_s_<shape> (its time) and choose_refined_picked_fastest: k/6 (and where clear).
// With the Kokkos flash backend (the reference one where Kokkos
// is absent: slow at these sizes, use --quick).
//
//   bench_cp_choose [--quick] [--pairs N] [--compute-only] [--tokens N] [--heads N] [--copies N] [--window S]
//                   [--refine-rounds N] [--refine-within X] [--refine-min-share X]
// --quick (the ctest entry) is a smoke run: tiny sizes, 20 ms calibration windows; its
// figures say nothing about the model. --compute-only checks the model's compute term alone,
// on one thread (compute_check below): choose_compute_pred_over_measured_<shape>_<mode> per
// round, and how many splits' medians lie within 0.85-1.15. --tokens, --heads, --copies and
// --window set those calibrate_options (to compare calibrations; the defaults otherwise), --refine-*
// those refine_options (--refine-min-share 0 measures on shared cores too).
#include "bench_common.hpp"

#include <baton/attention.hpp>
#include <baton/comm/local.hpp>
#include <baton/cp.hpp>
#include <baton/cp/choose_calibrate.hpp>
#include <baton/cp/choose_refine.hpp>

#if BATON_HAS_KOKKOS()
#include <Kokkos_Core.hpp>
#endif

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <variant>
#include <vector>

namespace {

#if BATON_HAS_KOKKOS()
using backend_t = baton::kokkos_attention;
#else
using backend_t = baton::reference_attention;
#endif
using T = float;

using doc_mask = baton::mask_intersection<baton::document_mask, baton::causal_mask>;
using any_mask = std::variant<baton::no_mask, baton::causal_mask, doc_mask>;

struct shape_case {
  std::string name;
  int ranks;
  std::int64_t s, h, hkv, d;
  any_mask mask;
};

std::vector<std::int64_t> documents(std::int64_t seq_len, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> length(64, std::max<std::int64_t>(64, seq_len / 4));
  std::vector<std::int64_t> ids;
  std::int64_t doc = 0;
  while (static_cast<std::int64_t>(ids.size()) < seq_len) {
    const std::int64_t n = std::min(length(gen), seq_len - static_cast<std::int64_t>(ids.size()));
    ids.insert(ids.end(), static_cast<std::size_t>(n), doc++);
  }
  return ids;
}

std::vector<T> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> out(n);
  for (auto& x : out) x = normal(gen);
  return out;
}

// One rank's shards and outputs for one split: the tensors refine runs (baton/cp/choose_calibrate.hpp),
// holding this rank's shards of the bench's data instead of refine's made-up values.
struct rank_tensors : baton::cp::detail::attention_tensors<T> {
  rank_tensors(const shape_case& c, const baton::sequence_sharding& sh, int index, const std::vector<T>& qf,
               const std::vector<T>& kf, const std::vector<T>& vf, const std::vector<T>& df)
      : attention_tensors(baton::cp_choose_shape{1, c.s, c.h, c.hkv, c.d, sizeof(T), true}, sh.local_len(index)) {
    const std::vector<std::int64_t> qs{1, c.s, c.h, c.d}, ks{1, c.s, c.hkv, c.d};
    q = baton::shard_sequence<T>(sh, index, qf, qs, 1);
    k = baton::shard_sequence<T>(sh, index, kf, ks, 1);
    v = baton::shard_sequence<T>(sh, index, vf, ks, 1);
    dout = baton::shard_sequence<T>(sh, index, df, qs, 1);
  }
  template <class Attention, class Mask>
  void run(Attention& attn, const Mask& mask) {
    attention_tensors::run(attn, mask, /*backward=*/true);
  }
};

struct case_result {
  baton::cp_choice choice, refined;
  double refine_s = 0;
  baton::cp_costs costs;
  std::vector<bench::series> measured, ratio;  // per candidate
  double calibrate_s = 0;
};

case_result run_case(const shape_case& c, int rounds, const baton::cp::calibrate_options& calibration,
                     const baton::cp::refine_options& refinement) {
  case_result res;
  const auto qf = random_values(static_cast<std::size_t>(c.s * c.h * c.d), 1);
  const auto kf = random_values(static_cast<std::size_t>(c.s * c.hkv * c.d), 2);
  const auto vf = random_values(static_cast<std::size_t>(c.s * c.hkv * c.d), 3);
  const auto df = random_values(static_cast<std::size_t>(c.s * c.h * c.d), 4);
  const baton::cp_choose_mesh mesh{c.ranks, baton::shard_layout::zigzag};
  const baton::cp_choose_shape shape{1, c.s, c.h, c.hkv, c.d, 4, true};
  const auto splits = baton::cp::legal_splits(mesh, shape);
  std::vector<std::vector<double>> times(splits.size());
  baton::cp_costs costs;
  baton::run_local(c.ranks, [&](baton::local_communicator& local) {
    local.set_timeout(std::chrono::hours(1));
    const int me = local.rank();
    const auto t0 = std::chrono::steady_clock::now();
    const baton::cp_costs mine =
        std::visit([&](const auto& mask) { return baton::cp::calibrate(local, backend_t{}, c.d, calibration, mask); }, c.mask);
    if (me == 0) {
      costs = mine;
      res.calibrate_s = bench::seconds_since(t0);
    }
    const auto t1 = std::chrono::steady_clock::now();
    const baton::cp_choice refined = std::visit(
        [&](const auto& mask) { return baton::cp::refine(local, backend_t{}, mesh, shape, mask, mine, refinement); }, c.mask);
    if (me == 0) {
      res.refined = refined;
      res.refine_s = bench::seconds_since(t1);
    }
    std::vector<std::function<void()>> runs;
    std::vector<std::shared_ptr<void>> keep;  // attention objects, meshes and tensors of every split
    for (const auto& [ring, uly] : splits) {
      std::visit(
          [&](const auto& mask) {
            if (uly == 1 || ring == 1) {
              const baton::sequence_sharding sh(baton::shard_layout::zigzag, c.s, c.ranks);
              auto t = std::make_shared<rank_tensors>(c, sh, me, qf, kf, vf, df);
              keep.push_back(t);
              if (uly == 1) {
                auto a = std::make_shared<baton::ring_attention<baton::local_communicator, backend_t>>(local, backend_t{}, sh);
                keep.push_back(a);
                runs.emplace_back([t, a, &mask] { t->run(*a, mask); });
              } else {
                auto a = std::make_shared<baton::ulysses_attention<baton::local_communicator, backend_t>>(local, backend_t{}, sh);
                keep.push_back(a);
                runs.emplace_back([t, a, &mask] { t->run(*a, mask); });
              }
            } else {
              auto m = std::make_shared<baton::cp_mesh<baton::local_communicator>>(baton::make_cp_mesh(local, ring, uly));
              const baton::sequence_sharding sh(baton::shard_layout::zigzag, c.s, ring, uly);
              auto a = std::make_shared<baton::hybrid_attention<baton::local_communicator, baton::local_communicator, backend_t>>(
                  *m, backend_t{}, sh);
              auto t = std::make_shared<rank_tensors>(c, sh, a->shard_index(), qf, kf, vf, df);
              keep.push_back(m);
              keep.push_back(a);
              keep.push_back(t);
              runs.emplace_back([t, a, &mask] { t->run(*a, mask); });
            }
          },
          c.mask);
    }
    const auto timed = [&](std::size_t i) {
      local.barrier();
      const auto start = std::chrono::steady_clock::now();
      runs[i]();
      local.barrier();
      return bench::seconds_since(start);
    };
    // Warm-up, two rounds: the layers' host buffers come from per-thread caches that the
    // other splits' first calls also draw on, so a split's second call may still fault pages
    // in (a ring after Ulysses' first call: 3,343 faults, 2.7x its steady time); from each
    // split's third call on, none does.
    for (int warm = 0; warm < 2; ++warm)
      for (std::size_t i = 0; i < runs.size(); ++i) timed(i);
    for (int r = 0; r < rounds; ++r) {
      for (std::size_t j = 0; j < runs.size(); ++j) {
        const std::size_t i = (j + static_cast<std::size_t>(r)) % runs.size();
        const double t = timed(i);
        if (me == 0) times[i].push_back(t);
      }
    }
  });
  std::visit([&](const auto& mask) { res.choice = baton::cp::choose(mesh, shape, mask, costs); }, c.mask);
  res.costs = costs;
  res.measured.resize(splits.size());
  res.ratio.resize(splits.size());
  for (std::size_t i = 0; i < splits.size(); ++i) {
    for (double t : times[i]) {
      res.measured[i].add(t);
      res.ratio[i].add(res.choice.candidates[i].seconds / t);
    }
  }
  return res;
}

// choose_costs_<shape>: what a shape's predictions rest on (microseconds, ps per byte).
void print_costs(const std::string& shape, const baton::cp_costs& k) {
  std::printf("choose_costs_%s: full tile %.3g us (backward %.3g, partial %.3g / %.3g + its area, row panel %.3g / %.3g, "
              "column panel %.3g / %.3g, call %.3g; link %.3g ps/B, all-to-all %.3g, copy %.3g, Ulysses exchange %.3g / %.3g, "
              "latency %.3g us; share %.3f, wake-up %.3g us)\n",
              shape.c_str(), k.full_tile_forward * 1e6, k.full_tile_backward * 1e6, k.partial_tile_forward * 1e6,
              k.partial_tile_backward * 1e6, k.row_panel_forward * 1e6, k.row_panel_backward * 1e6, k.column_panel_forward * 1e6,
              k.column_panel_backward * 1e6, k.per_call * 1e6, k.link_per_byte * 1e12, k.all_to_all_per_byte * 1e12,
              k.copy_per_byte * 1e12, k.ulysses_forward_per_byte * 1e12, k.ulysses_backward_per_byte * 1e12, k.latency * 1e6,
              k.share, k.wake_up * 1e6);
}

// --compute-only: the model's compute term alone, on one thread. Every rank's backend calls of
// a split (the ring's planned and trimmed calls of each active step, with the split's local
// heads; Ulysses' one call over the whole sequence) run one after another on this thread,
// against the model's price of the same calls from a one-rank calibration: no communication
// and no ranks sharing cores, so what is left is the model's account of the kernel.
struct split_calls {
  struct call {
    baton::detail::cp::block_call c;
    baton::attention_params params;
    std::vector<std::int64_t> q_store, k_store;  // params' positions point into these
  };
  std::string name;
  std::int64_t rows = 0, hq = 0, hkv = 0;
  std::vector<std::vector<std::unique_ptr<call>>> ranks;  // the calls of each rank
  double predicted = 0;                                   // forward + backward, every rank
};

template <class Mask>
split_calls plan_split(const shape_case& c, const Mask& mask, const baton::cp_costs& costs, int ring, int uly) {
  namespace d = baton::detail::cp;
  split_calls out;
  out.name = baton::cp_mode_prediction{ring, uly}.name();
  const d::head_splits hs = d::split_heads(c.h, c.hkv, uly);
  out.hq = hs.q.max_count();
  out.hkv = hs.kv.max_count();
  const double bh = static_cast<double>(out.hq), bkv = static_cast<double>(out.hkv);  // batch 1
  const auto add = [&](std::vector<std::unique_ptr<split_calls::call>>& rank, std::unique_ptr<split_calls::call> call) {
    const d::tile_count t = d::count_call_tiles(mask, call->params.q_pos, call->params.k_pos, call->c.q_count, call->c.k_count);
    out.predicted += d::work_seconds(costs, t, bh, bkv, 0) + d::work_seconds(costs, t, bh, bkv, 1);
    rank.push_back(std::move(call));
  };
  if (ring == 1) {  // as predict_split: one call, every rank's positions in rank order
    auto call = std::make_unique<split_calls::call>();
    call->q_store = d::ulysses_call_positions(baton::shard_layout::zigzag, c.s, uly);
    call->params.q_pos = baton::positions{std::span<const std::int64_t>(call->q_store)};
    call->params.k_pos = call->params.q_pos;
    call->c.q_count = call->c.k_count = c.s;
    out.rows = c.s;
    out.ranks.emplace_back();
    add(out.ranks.back(), std::move(call));
    return out;
  }
  const baton::sequence_sharding sh(baton::shard_layout::zigzag, c.s, ring);
  std::vector<std::vector<baton::shard_piece>> groups;
  for (int g = 0; g < ring; ++g) groups.push_back(sh.pieces(g));
  out.rows = sh.max_local_len();
  for (int r = 0; r < ring; ++r) {
    out.ranks.emplace_back();
    for (int step : d::needed_steps(mask, groups))
      d::for_each_ring_call(mask, groups, r, step,
                            [&](const d::block_call& bc, const baton::attention_params& params, std::vector<std::int64_t>& qs,
                                std::vector<std::int64_t>& ks) {
                              auto call = std::make_unique<split_calls::call>();
                              call->c = bc;
                              call->params = params;  // its positions stay in the moved stores
                              call->q_store = std::move(qs);
                              call->k_store = std::move(ks);
                              call->params.accumulate = true;  // as the ring's backward (the forward ignores it)
                              add(out.ranks.back(), std::move(call));
                            });
  }
  return out;
}

// Times every rank's calls of `split` (forward, then backward) on this thread: seconds.
template <class Mask>
double run_split(backend_t& backend, const split_calls& split, const Mask& mask, rank_tensors& t) {
  const auto start = std::chrono::steady_clock::now();
  for (const auto& rank : split.ranks) {
    for (int bwd = 0; bwd < 2; ++bwd)
      for (const auto& call : rank) {
        const auto& bc = call->c;
        const auto rows = [&](std::vector<T>& x, std::int64_t heads, std::int64_t off, std::int64_t n) {
          return baton::make_tensor_view(x.data(), {1, split.rows, heads, t.d}).slice(1, off, n);
        };
        const auto q = rows(t.q, split.hq, bc.q_offset, bc.q_count).as_const();
        const auto k = rows(t.k, split.hkv, bc.k_offset, bc.k_count).as_const();
        const auto v = rows(t.v, split.hkv, bc.k_offset, bc.k_count).as_const();
        const auto out = rows(t.out, split.hq, bc.q_offset, bc.q_count);
        const auto lse = baton::make_tensor_view(t.lse.data(), {1, split.hq, bc.q_count});
        if (bwd == 0) {
          backend.forward(q, k, v, mask, out, lse, call->params);
          continue;
        }
        backend.backward(q, k, v, out.as_const(), lse.as_const(), rows(t.dout, split.hq, bc.q_offset, bc.q_count).as_const(), mask,
                         rows(t.dq, split.hq, bc.q_offset, bc.q_count), rows(t.dk, split.hkv, bc.k_offset, bc.k_count),
                         rows(t.dv, split.hkv, bc.k_offset, bc.k_count), call->params);
      }
  }
  return bench::seconds_since(start);
}

// The figures of --compute-only for one shape: per split, predicted / measured per round.
std::vector<std::pair<std::string, bench::series>> compute_check(const shape_case& c, int rounds,
                                                                const baton::cp::calibrate_options& calibration) {
  return std::visit(
      [&](const auto& mask) {
        baton::cp_costs costs;
        baton::run_local(1, [&](baton::local_communicator& local) {
          costs = baton::cp::calibrate(local, backend_t{}, c.d, calibration, mask);
        });
        print_costs(c.name, costs);
        const baton::sequence_sharding whole(baton::shard_layout::zigzag, c.s, 1);
        const auto qf = random_values(static_cast<std::size_t>(c.s * c.h * c.d), 1);
        const auto kf = random_values(static_cast<std::size_t>(c.s * c.hkv * c.d), 2);
        rank_tensors t(c, whole, 0, qf, kf, kf, qf);  // buffers as large as any split's calls need
        backend_t backend;
        std::vector<split_calls> splits;
        const baton::cp_choose_mesh mesh{c.ranks, baton::shard_layout::zigzag};
        for (const auto& [ring, uly] : baton::cp::legal_splits(mesh, baton::cp_choose_shape{1, c.s, c.h, c.hkv, c.d, 4, true}))
          splits.push_back(plan_split(c, mask, costs, ring, uly));
        for (const split_calls& sp : splits) run_split(backend, sp, mask, t);  // warm-up
        std::vector<std::pair<std::string, bench::series>> out;
        for (const split_calls& sp : splits) out.emplace_back(sp.name, bench::series{});
        for (int r = 0; r < rounds; ++r)
          for (std::size_t j = 0; j < splits.size(); ++j) {
            const std::size_t i = (j + static_cast<std::size_t>(r)) % splits.size();
            out[i].second.add(splits[i].predicted / run_split(backend, splits[i], mask, t));
          }
        return out;
      },
      c.mask);
}

}  // namespace

int main(int argc, char** argv) {
#if BATON_HAS_KOKKOS()
  Kokkos::ScopeGuard kokkos(argc, argv);
#endif
  bool quick = false, compute_only = false;
  for (int i = 1; i < argc; ++i) {
    quick = quick || std::strcmp(argv[i], "--quick") == 0;
    compute_only = compute_only || std::strcmp(argv[i], "--compute-only") == 0;
  }
  const int rounds = bench::pairs_from_args(argc, argv, 7);
  bench::print_build();
  bench::print_load("before");
  const std::int64_t s1 = quick ? 256 : 1024, s2 = quick ? 512 : 2048, d = quick ? 32 : 64;
  const std::vector<shape_case> cases{
      {"S" + std::to_string(s2) + "_h8_causal_cp2", 2, s2, 8, 8, d, baton::causal_mask{}},
      {"S" + std::to_string(s2) + "_h8_document_cp2", 2, s2, 8, 8, d, baton::intersect(baton::document_mask(documents(s2, 1)), baton::causal_mask{})},
      {"S" + std::to_string(s1) + "_h4_full_cp2", 2, s1, 4, 4, d, baton::no_mask{}},
      {"S" + std::to_string(s2) + "_h8_causal_cp4", 4, s2, 8, 8, d, baton::causal_mask{}},
      {"S" + std::to_string(s2) + "_h4_document_cp4", 4, s2, 4, 4, d, baton::intersect(baton::document_mask(documents(s2, 2)), baton::causal_mask{})},
      {"S" + std::to_string(s1) + "_h8_kv2_full_cp4", 4, s1, 8, 2, d, baton::no_mask{}},
  };
  baton::cp::calibrate_options calibration;  // the defaults; --quick (the ctest smoke run) shorter
  if (quick) calibration.window = 0.02;
  baton::cp::refine_options refinement;  // the defaults
  for (int i = 1; i + 1 < argc; ++i) {  // calibrate_options other than the defaults, to compare them
    if (std::strcmp(argv[i], "--tokens") == 0) calibration.tokens = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--heads") == 0) calibration.heads = std::atoll(argv[i + 1]);
    if (std::strcmp(argv[i], "--copies") == 0) calibration.copies = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--window") == 0) calibration.window = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--refine-rounds") == 0) refinement.rounds = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--refine-within") == 0) refinement.within = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--refine-min-share") == 0) refinement.min_share = std::atof(argv[i + 1]);
  }
  std::printf("choose_calibration: tokens %lld, heads %lld, copies %d, window %g s; refine within %g, %d + %d rounds, "
              "min share %g\n",
              static_cast<long long>(calibration.tokens), static_cast<long long>(calibration.heads), calibration.copies,
              calibration.window, refinement.within, refinement.warmup, refinement.rounds, refinement.min_share);
  if (compute_only) {
    int within = 0, splits = 0;
    bench::series medians;
    for (const shape_case& c : cases) {
      for (const auto& [mode, ratio] : compute_check(c, rounds, calibration)) {
        bench::print("choose_compute_pred_over_measured_" + c.name + "_" + mode, ratio);
        medians.add(ratio.median());
        within += ratio.median() >= 0.85 && ratio.median() <= 1.15 ? 1 : 0;
        ++splits;
      }
      std::fflush(stdout);
    }
    std::printf("choose_compute_within_0.85_1.15: %d/%d\n", within, splits);
    bench::print("choose_compute_pred_over_measured_all_medians", medians);
    bench::print_load("after");
    return 0;
  }
  int picked = 0, clear = 0, clear_picked = 0, refined_picked = 0, clear_refined = 0;
  bench::series all_ratios, regrets;
  for (const shape_case& c : cases) {
    const case_result r = run_case(c, rounds, calibration, refinement);
    bench::print_value("choose_calibrate_s_" + c.name, r.calibrate_s);
    print_costs(c.name, r.costs);
    std::size_t fastest = 0, chosen = 0;
    for (std::size_t i = 0; i < r.measured.size(); ++i) {
      const auto& p = r.choice.candidates[i];
      const std::string mode = p.name();
      bench::print("choose_measured_s_" + c.name + "_" + mode, r.measured[i]);
      std::printf("choose_pred_s_%s_%s: %.4g (compute %.4g, communication %.4g, exposed %.4g)\n", c.name.c_str(), mode.c_str(),
                  p.seconds, p.compute, p.communication, p.exposed);
      bench::print("choose_pred_over_measured_" + c.name + "_" + mode, r.ratio[i]);
      all_ratios.add(r.ratio[i].median());
      if (r.measured[i].median() < r.measured[fastest].median()) fastest = i;
      if (p.name() == r.choice.best.name()) chosen = i;
    }
    std::printf("choose_pick_%s: %s (measured fastest %s)\n", c.name.c_str(), r.choice.best.name().c_str(),
                r.choice.candidates[fastest].name().c_str());
    picked += chosen == fastest ? 1 : 0;
    const bool refined_right = r.refined.best.name() == r.choice.candidates[fastest].name();
    std::printf("choose_refined_pick_%s: %s (measured fastest %s; measured in the refinement:", c.name.c_str(),
                r.refined.best.name().c_str(), r.choice.candidates[fastest].name().c_str());
    bool any = false;
    for (const auto& p : r.refined.candidates)
      if (p.measured > 0) {
        std::printf(" %s %.4g s", p.name().c_str(), p.measured);
        any = true;
      }
    if (!any) std::printf(" none, share %.3f below %.3g: the prediction's pick", r.costs.share, refinement.min_share);
    std::printf(")\n");
    bench::print_value("choose_refine_s_" + c.name, r.refine_s);
    refined_picked += refined_right ? 1 : 0;
    // How clear the measured ranking is: the runner-up's median over the fastest's, and in how
    // many rounds (every split ran once in each, next to the others) the fastest beat it. Every
    // shape above has at least two splits.
    std::size_t runner_up = fastest == 0 ? 1 : 0;
    for (std::size_t i = 0; i < r.measured.size(); ++i)
      if (i != fastest && r.measured[i].median() < r.measured[runner_up].median()) runner_up = i;
    const std::vector<double>& fast_rounds = r.measured[fastest].values;
    const std::vector<double>& next_rounds = r.measured[runner_up].values;
    std::size_t ahead = 0;
    for (std::size_t j = 0; j < fast_rounds.size(); ++j) ahead += fast_rounds[j] < next_rounds[j] ? 1 : 0;
    if (ahead + 1 >= fast_rounds.size()) {  // clear: a coin toss wins 6 or 7 rounds of 7 one time in 16
      ++clear;
      clear_picked += chosen == fastest ? 1 : 0;
      clear_refined += refined_right ? 1 : 0;
    }
    std::printf("choose_margin_%s: %.4g (%s ahead of %s in %zu/%zu rounds)\n", c.name.c_str(),
                r.measured[runner_up].median() / r.measured[fastest].median(), r.choice.candidates[fastest].name().c_str(),
                r.choice.candidates[runner_up].name().c_str(), ahead, fast_rounds.size());
    const double regret = r.measured[chosen].median() / r.measured[fastest].median();
    regrets.add(regret);
    bench::print_value("choose_regret_" + c.name, regret);
    std::fflush(stdout);
  }
  std::printf("choose_picked_fastest: %d/%zu\n", picked, cases.size());
  std::printf("choose_picked_fastest_where_clear: %d/%d\n", clear_picked, clear);
  std::printf("choose_refined_picked_fastest: %d/%zu\n", refined_picked, cases.size());
  std::printf("choose_refined_picked_fastest_where_clear: %d/%d\n", clear_refined, clear);
  bench::print("choose_pred_over_measured_all_medians", all_ratios);
  bench::print("choose_regret_all", regrets);
  bench::print_load("after");
  return 0;
}
