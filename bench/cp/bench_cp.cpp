// bench_cp — how much of two ranks' worth of compute ring and Ulysses attention keep, and
// whether they send exactly the bytes their closed forms say.
//
//   efficiency = T(one rank, whole sequence) / (2 x T(2 local ranks, ring or Ulysses))
//   (the one rank computes on head-major storage, as the CP layers do on the host)
//   work_efficiency = CPU time of the one rank / CPU time summed over the 2 ranks
//   bytes_vs_theory = bytes each rank sent (forward + backward) / closed form
//
// Times are of one forward + backward, with the Kokkos flash backend (the reference backend
// when Kokkos is absent, at a small size). Ranks are threads of this process (the local world),
// so "2 ranks" means 2 cores. The one-rank baseline and the 2-rank runs alternate in pairs
// (--pairs, 7 by default, at least 5; the order flips from pair to pair), in one world whose
// attention objects persist across the pairs (as a model layer keeps them between steps);
// every ratio is taken per pair and prints as `name: median (min .., max .., n ..)`, with the
// load average before and after. An efficiency above 1 would mean the baseline was timed in
// a slow moment; pairing keeps both sides in the same moment.
//
// A third mask, causal packed documents (lengths uniform in [64, S/4]), times the ring over
// balanced_sharding (baton/cp/balance.hpp, blocks of S/64) and over zigzag against the same
// baseline: ring2_efficiency_document and ring2_efficiency_document_zigzag. Its roof is
// measured too: both ranks run the whole one-rank baseline at once, and
//   ring2_roof_document = T(one rank alone) / T(each of 2 ranks, both at once)
// is the efficiency a ring with no overhead and a perfect split would reach on this machine
// (below 1 where two busy cores slow each other: shared caches, memory bandwidth, clocks);
// ring2_efficiency_document_vs_roof is the ratio of the two, per pair. The balanced sharding
// also prices each ring step's walk of a query row (balance_options::ring_row_step, 128 by
// default; --ring-row-step 0 balances the tiles alone): document_balance_ratio_R2 is its
// tile balance, document_ring_balance_ratio_R2 its balance under that model.
//
//   bench_cp [--quick] [--seq S] [--heads H] [--dim D] [--pairs N] [--balance-only] [--documents-only]
//            [--ring-row-step X]
//
// After the timed figures (or alone, with --balance-only) it prints the balance figures of
// baton/cp/balance.hpp: pure computation, no timing. balance_ratio_* = the most loaded
// rank's attention cost / the average (1 = perfect), R = 8 ranks, 32768 tokens, blocks of 64,
// costs from the masks' block classification (empty 0, full 1, partial 1). --documents-only
// times only the document mask (the baseline, its roof and both rings), for work on that figure.
#include "bench_common.hpp"

#include <baton/attention.hpp>
#include <baton/comm/local.hpp>
#include <baton/cp.hpp>
#include <baton/cp/detail/agree.hpp>

#if BATON_HAS_KOKKOS()
#include <Kokkos_Core.hpp>
#endif

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <time.h>

namespace {

#if BATON_HAS_KOKKOS()
using backend_t = baton::kokkos_attention;
constexpr const char* backend_name = "kokkos_attention";
#else
using backend_t = baton::reference_attention;
constexpr const char* backend_name = "reference_attention";
#endif

using T = float;
using L = baton::lse_t<T>;
using A = baton::cp_accumulator_t<T>;

// Wraps a local communicator and counts the payload bytes this rank sends: shifts (minus the
// fixed-size agreement descriptors) and the off-rank blocks of each typed all-to-all.
struct counting_comm {
  baton::local_communicator* inner;
  std::int64_t* bytes;

  int rank() const { return inner->rank(); }
  int size() const { return inner->size(); }
  auto shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    if (tag != baton::detail::cp::tag_agree) *bytes += static_cast<std::int64_t>(send.size());
    return inner->shift(send, recv, k, tag);
  }
  template <class E>
  void all_to_all(std::span<const std::type_identity_t<E>> send, std::span<E> recv) {
    if (!std::is_same_v<E, std::byte>)  // descriptors travel as bytes; payload as float
      *bytes += static_cast<std::int64_t>(send.size_bytes()) * (size() - 1) / size();
    inner->all_to_all(send, recv);
  }
  template <class E>
  void all_to_all_v(std::span<const std::type_identity_t<E>> send, std::span<const std::int64_t> sc, std::span<E> recv,
                    std::span<const std::int64_t> rc) {
    inner->all_to_all_v(send, sc, recv, rc);
  }
};
static_assert(baton::ring_communicator<counting_comm> && baton::all_to_all_communicator<counting_comm>);

struct problem {
  std::int64_t b = 1, s = 8192, h = 8, hkv = 8, d = 64;
  double ring_row_step = 128;  // balance_options::ring_row_step of the documents' balanced sharding
  std::vector<T> q, k, v, dout;
};

std::vector<T> random_values(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<T> out(n);
  for (auto& x : out) x = normal(gen);
  return out;
}

// CPU time of the calling thread: the work a rank did, whatever else the machine was doing.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The one-rank baseline: one forward + backward of the whole sequence on the calling thread,
// on the values stored head-major ([b][h][s][d]), as ring, Ulysses and hybrid compute on the
// host: on the dense [b, s, h, d] the same call runs 3-21 % slower (a head's rows h x d apart;
// docs/context-parallel.md, "The ring computes head-major"), which a dense baseline would
// credit to the CP layers' efficiency.
class single_rank {
 public:
  explicit single_rank(const problem& p)
      : p_(p), q_(head_major(p.q, p.h)), k_(head_major(p.k, p.hkv)), v_(head_major(p.v, p.hkv)),
        dout_(head_major(p.dout, p.h)), out_(p.q.size()), dq_(p.q.size()), dk_(p.k.size()), dv_(p.k.size()),
        lse_(static_cast<std::size_t>(p.b * p.h * p.s)) {}

  template <class Mask>
  void run(const Mask& mask) {
    const problem& p = p_;
    const auto view = [&](auto& x, std::int64_t heads) {
      return baton::detail::cp::bshd_head_major(x.data(), p.b, p.s, heads, p.d);
    };
    const auto in = [&](const std::vector<T>& x, std::int64_t heads) { return view(x, heads); };
    backend_.forward(in(q_, p.h), in(k_, p.hkv), in(v_, p.hkv), mask, view(out_, p.h),
                     baton::make_tensor_view(lse_.data(), {p.b, p.h, p.s}));
    backend_.backward(in(q_, p.h), in(k_, p.hkv), in(v_, p.hkv), in(out_, p.h),
                      baton::make_tensor_view(static_cast<const L*>(lse_.data()), {p.b, p.h, p.s}), in(dout_, p.h), mask,
                      view(dq_, p.h), view(dk_, p.hkv), view(dv_, p.hkv));
  }

 private:
  // x [b, s, heads, d] dense, copied to [b][heads][s][d].
  std::vector<T> head_major(const std::vector<T>& x, std::int64_t heads) const {
    std::vector<T> out(x.size());
    const problem& p = p_;
    baton::host_memory mem;
    mem.copy(baton::make_tensor_view(x.data(), {p.b, p.s, heads, p.d}),
             baton::detail::cp::bshd_head_major(out.data(), p.b, p.s, heads, p.d));
    return out;
  }
  const problem& p_;
  backend_t backend_;
  std::vector<T> q_, k_, v_, dout_, out_, dq_, dk_, dv_;
  std::vector<L> lse_;
};

// One rank's shards of a sequence sharding, and its output and gradient buffers.
struct shards {
  std::int64_t sl = 0;
  std::vector<T> q, k, v, dout, out, dq, dk, dv;
  std::vector<L> lse;

  shards(const problem& p, const baton::sequence_sharding& s, int me) : sl(s.local_len(me)) {
    const std::vector<std::int64_t> qs{p.b, p.s, p.h, p.d}, kvs{p.b, p.s, p.hkv, p.d};
    q = baton::shard_sequence<T>(s, me, p.q, qs, 1);
    k = baton::shard_sequence<T>(s, me, p.k, kvs, 1);
    v = baton::shard_sequence<T>(s, me, p.v, kvs, 1);
    dout = baton::shard_sequence<T>(s, me, p.dout, qs, 1);
    out.resize(q.size());
    dq.resize(q.size());
    dk.resize(k.size());
    dv.resize(k.size());
    lse.resize(static_cast<std::size_t>(p.b * p.h * sl));
  }

  template <class Attention, class Mask>
  void run(const problem& p, Attention& attn, const Mask& mask) {
    attn.forward(baton::make_tensor_view(q.data(), {p.b, sl, p.h, p.d}), baton::make_tensor_view(k.data(), {p.b, sl, p.hkv, p.d}),
                 baton::make_tensor_view(v.data(), {p.b, sl, p.hkv, p.d}), mask,
                 baton::make_tensor_view(out.data(), {p.b, sl, p.h, p.d}), baton::make_tensor_view(lse.data(), {p.b, p.h, sl}));
    attn.backward(baton::make_tensor_view(q.data(), {p.b, sl, p.h, p.d}), baton::make_tensor_view(k.data(), {p.b, sl, p.hkv, p.d}),
                  baton::make_tensor_view(v.data(), {p.b, sl, p.hkv, p.d}),
                  baton::make_tensor_view(static_cast<const T*>(out.data()), {p.b, sl, p.h, p.d}),
                  baton::make_tensor_view(static_cast<const L*>(lse.data()), {p.b, p.h, sl}),
                  baton::make_tensor_view(dout.data(), {p.b, sl, p.h, p.d}), mask,
                  baton::make_tensor_view(dq.data(), {p.b, sl, p.h, p.d}), baton::make_tensor_view(dk.data(), {p.b, sl, p.hkv, p.d}),
                  baton::make_tensor_view(dv.data(), {p.b, sl, p.hkv, p.d}));
  }
};

// Packed documents of lengths uniform in [64, longest] tokens (the last cut at seq_len).
std::vector<std::int64_t> random_documents(std::int64_t seq_len, unsigned seed, std::int64_t longest = 4096) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<std::int64_t> length(64, std::max<std::int64_t>(64, longest));
  std::vector<std::int64_t> ids;
  std::int64_t doc = 0;
  while (static_cast<std::int64_t>(ids.size()) < seq_len) {
    const std::int64_t n = std::min(length(gen), seq_len - static_cast<std::int64_t>(ids.size()));
    ids.insert(ids.end(), static_cast<std::size_t>(n), doc++);
  }
  return ids;
}

// One timed run: wall time on rank 0 from a barrier to a barrier, CPU time summed over ranks.
struct sample {
  double seconds = 0;
  double cpu_seconds = 0;
};

// The figures of one mask (full or causal): per pair, the baseline and both 2-rank layers.
struct mask_figures {
  bench::series single_s, ring_s, uly_s, ring_eff, uly_eff, ring_work, uly_work;
  std::array<std::int64_t, 2> ring_bytes{}, uly_bytes{};  // per rank, of its last run
};

// The document mask's figures: the baseline, and the ring over the balanced sharding and over
// zigzag.
struct document_figures {
  bench::series single_s, balanced_s, zigzag_s, balanced_eff, zigzag_eff, balanced_work, zigzag_work;
  bench::series both_s, roof, balanced_vs_roof;
  double balance_ratio = 0, zigzag_ratio = 0, ring_balance_ratio = 0;
};

// Causal documents of lengths uniform in [64, S/4] (several per sequence at any size), seed 1.
baton::mask_intersection<baton::document_mask, baton::causal_mask> bench_documents(const problem& p) {
  return baton::intersect(baton::document_mask(random_documents(p.s, 1, p.s / 4)), baton::causal_mask{});
}
// Blocks of the balanced sharding: S/64 tokens, so 64 blocks whatever S (32 per rank).
std::int64_t balance_block(const problem& p) { return std::max<std::int64_t>(1, p.s / 64); }

// Runs `pairs` pairs on 2 local ranks: per pair and mask, the one-rank baseline (rank 0; rank 1
// waits asleep at the barrier), then ring, then Ulysses — or the reverse order on odd pairs.
void run_pairs(const problem& p, int pairs, bool documents_only, mask_figures& full, mask_figures& causal,
               document_figures& documents) {
  const baton::no_mask no_mask;
  const baton::causal_mask causal_mask;
  const auto document_mask = bench_documents(p);
  baton::balance_options for_ring;
  for_ring.ring_row_step = p.ring_row_step;
  const baton::balanced_sharding_result plan = baton::balanced_sharding(document_mask, p.s, 2, balance_block(p), for_ring);
  documents.balance_ratio = plan.ratio;
  documents.ring_balance_ratio = plan.ring_ratio;
  documents.zigzag_ratio = plan.zigzag_ratio;
  std::array<std::array<double, 2>, 2> cpu{};  // [layer][rank] of the last run
  std::array<std::int64_t, 2> sent{};
  baton::run_local(2, [&](baton::local_communicator& local) {
    local.set_timeout(std::chrono::hours(1));  // the full size's baseline keeps rank 1 waiting for seconds
    const int me = local.rank();
    std::int64_t& my_bytes = sent[static_cast<std::size_t>(me)];
    counting_comm comm{&local, &my_bytes};
    const baton::sequence_sharding contiguous(baton::shard_layout::contiguous, p.s, 2), zigzag(baton::shard_layout::zigzag, p.s, 2);
    const baton::sequence_sharding balanced = plan.sharding();
    shards by_block(p, contiguous, me), by_zigzag(p, zigzag, me), by_balance(p, balanced, me);
    baton::ring_attention ring_full(comm, backend_t{}, contiguous), ring_causal(comm, backend_t{}, zigzag);
    baton::ring_attention ring_doc_balanced(comm, backend_t{}, balanced), ring_doc_zigzag(comm, backend_t{}, zigzag);
    baton::ulysses_attention uly_full(comm, backend_t{}, contiguous), uly_causal(comm, backend_t{}, zigzag);
    single_rank single(p);  // rank 1's runs only in the roof measurement
    // Times `work` on every rank: wall time on rank 0, CPU time of each rank's thread.
    const auto timed = [&](std::size_t layer, auto&& work) {
      local.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = thread_cpu_seconds();
      work();
      cpu[layer][static_cast<std::size_t>(me)] = thread_cpu_seconds() - c0;
      local.barrier();  // the step ends when the slowest rank ends
      return bench::seconds_since(t0);
    };
    const auto one_mask = [&](int pair, bool warmup, const auto& mask, shards& sh, auto& ring, auto& uly, mask_figures& f) {
      sample base, r, u;
      const auto run_single = [&] {
        base.seconds = timed(0, [&] {
          if (me == 0) single.run(mask);
        });
        base.cpu_seconds = cpu[0][0];
      };
      const auto run_ring = [&] {
        my_bytes = 0;
        r.seconds = timed(1, [&] { sh.run(p, ring, mask); });
        r.cpu_seconds = cpu[1][0] + cpu[1][1];
        f.ring_bytes[static_cast<std::size_t>(me)] = my_bytes;
      };
      const auto run_uly = [&] {
        my_bytes = 0;
        u.seconds = timed(1, [&] { sh.run(p, uly, mask); });
        u.cpu_seconds = cpu[1][0] + cpu[1][1];
        f.uly_bytes[static_cast<std::size_t>(me)] = my_bytes;
      };
      if (pair % 2 == 0) {
        run_single();
        run_ring();
        run_uly();
      } else {
        run_uly();
        run_ring();
        run_single();
      }
      if (warmup || me != 0) return;
      f.single_s.add(base.seconds);
      f.ring_s.add(r.seconds);
      f.uly_s.add(u.seconds);
      f.ring_eff.add(base.seconds / (2 * r.seconds));
      f.uly_eff.add(base.seconds / (2 * u.seconds));
      f.ring_work.add(base.cpu_seconds / r.cpu_seconds);
      f.uly_work.add(base.cpu_seconds / u.cpu_seconds);
    };
    // The document mask: the baseline, the ring over the balanced sharding, over zigzag.
    const auto documents_pair = [&](int pair, bool warmup) {
      sample base, bal, zz, both;
      const auto run_single = [&] {
        base.seconds = timed(0, [&] {
          if (me == 0) single.run(document_mask);
        });
        base.cpu_seconds = cpu[0][0];
        both.seconds = timed(0, [&] { single.run(document_mask); });  // the roof: both ranks at once
      };
      const auto run_ring = [&](sample& out, shards& sh, auto& ring) {
        out.seconds = timed(1, [&] { sh.run(p, ring, document_mask); });
        out.cpu_seconds = cpu[1][0] + cpu[1][1];
      };
      if (pair % 2 == 0) {
        run_single();
        run_ring(bal, by_balance, ring_doc_balanced);
        run_ring(zz, by_zigzag, ring_doc_zigzag);
      } else {
        run_ring(zz, by_zigzag, ring_doc_zigzag);
        run_ring(bal, by_balance, ring_doc_balanced);
        run_single();
      }
      if (warmup || me != 0) return;
      documents.single_s.add(base.seconds);
      documents.balanced_s.add(bal.seconds);
      documents.zigzag_s.add(zz.seconds);
      documents.balanced_eff.add(base.seconds / (2 * bal.seconds));
      documents.zigzag_eff.add(base.seconds / (2 * zz.seconds));
      documents.balanced_work.add(base.cpu_seconds / bal.cpu_seconds);
      documents.zigzag_work.add(base.cpu_seconds / zz.cpu_seconds);
      documents.both_s.add(both.seconds);
      documents.roof.add(base.seconds / both.seconds);
      documents.balanced_vs_roof.add((base.seconds / (2 * bal.seconds)) / (base.seconds / both.seconds));
    };
    // One untimed round first: packing buffers, Ulysses' head-sharded buffers, first touches.
    for (int pair = -1; pair < pairs; ++pair) {
      if (!documents_only) {
        one_mask(pair, pair < 0, no_mask, by_block, ring_full, uly_full, full);
        one_mask(pair, pair < 0, causal_mask, by_zigzag, ring_causal, uly_causal, causal);
      }
      documents_pair(pair, pair < 0);
    }
  });
}

// The balance figures: how evenly balanced_sharding, zigzag and per-document zigzag spread
// the attention cost over R = 8 ranks. Pure computation: it needs no timing and runs apart
// from the timed part.
void balance_figures() {
  constexpr std::int64_t seq = 32768, block = 64;
  constexpr int ranks = 8;
  std::printf("# balance: S=%lld, R=%d, blocks of %lld tokens, cost weights full 1 partial 1; documents are causal "
              "(document_mask x causal_mask), lengths uniform in [64, 4096]\n",
              static_cast<long long>(seq), ranks, static_cast<long long>(block));
  bench::series balanced_s, zigzag_s, per_doc_s;
  for (unsigned seed = 1; seed <= 20; ++seed) {
    const auto ids = random_documents(seq, seed);
    const auto mask = baton::intersect(baton::document_mask(ids), baton::causal_mask{});
    const auto r = baton::balanced_sharding(mask, seq, ranks, block);
    const double per_doc = baton::balance_ratio(
        baton::sharding_costs(mask, baton::per_document_zigzag_positions(ids, ranks, block), seq, block));
    balanced_s.add(r.ratio);
    zigzag_s.add(r.zigzag_ratio);
    per_doc_s.add(per_doc);
    if (seed != 1) continue;
    const double per_doc_tokens =
        baton::balance_ratio(baton::sharding_costs(mask, baton::per_document_zigzag_positions(ids, ranks), seq, block));
    bench::print_value("balance_ratio_document_R8", r.ratio, "%.4f");
    bench::print_value("balance_ratio_document_R8_zigzag", r.zigzag_ratio, "%.4f");
    bench::print_value("balance_ratio_document_R8_per_document_zigzag", per_doc, "%.4f");
    bench::print_value("balance_ratio_document_R8_per_document_zigzag_tokens", per_doc_tokens, "%.4f");
    bench::print_value("balance_ratio_document_R8_guaranteed", r.guaranteed_ratio, "%.4f");
    // Runs of consecutive blocks over all ranks (pieces a shard is gathered from), with and
    // without the pass that swaps equal-cost blocks to join them.
    const auto runs = [](const baton::balanced_sharding_result& b) {
      std::int64_t count = 0;
      for (const auto& mine : b.blocks)
        for (std::size_t i = 0; i < mine.size(); ++i) count += i == 0 || mine[i] != mine[i - 1] + 1 ? 1 : 0;
      return static_cast<double>(count);
    };
    baton::balance_options no_ties;
    no_ties.contiguous_ties = false;
    bench::print_value("balance_runs_document_R8", runs(r), "%.0f");
    bench::print_value("balance_runs_document_R8_without_tie_swaps", runs(baton::balanced_sharding(mask, seq, ranks, block, no_ties)),
                       "%.0f");
  }
  bench::print("balance_ratio_document_R8_seeds", balanced_s, "%.4f");
  bench::print("balance_ratio_document_R8_zigzag_seeds", zigzag_s, "%.4f");
  bench::print("balance_ratio_document_R8_per_document_zigzag_seeds", per_doc_s, "%.4f");

  const auto sliding = baton::balanced_sharding(baton::sliding_window_mask{4096, 0}, seq, ranks, block);
  bench::print_value("balance_ratio_sliding_R8", sliding.ratio, "%.4f");
  bench::print_value("balance_ratio_sliding_R8_zigzag", sliding.zigzag_ratio, "%.4f");
  const auto causal = baton::balanced_sharding(baton::causal_mask{}, seq, ranks, block);
  bench::print_value("balance_ratio_causal_R8", causal.ratio, "%.4f");
  bench::print_value("balance_ratio_causal_R8_zigzag", causal.zigzag_ratio, "%.4f");
  // 3 sliding-window layers per global causal layer: the sum balanced at once.
  const std::vector<baton::attention_cost> model{{baton::sliding_window_mask{4096, 0}, 3}, {baton::causal_mask{}, 1}};
  const auto mixed = baton::balanced_sharding(model, seq, ranks, block);
  bench::print_value("balance_ratio_sliding3_causal1_R8", mixed.ratio, "%.4f");
  bench::print_value("balance_ratio_sliding3_causal1_R8_zigzag", mixed.zigzag_ratio, "%.4f");
}

}  // namespace

int main(int argc, char** argv) {
#if BATON_HAS_KOKKOS()
  Kokkos::ScopeGuard kokkos(argc, argv);
#endif
  problem p;
  bool quick = false, balance_only = false, documents_only = false;
  const int pairs = bench::pairs_from_args(argc, argv);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() { return i + 1 < argc ? std::atoll(argv[++i]) : 0LL; };
    if (a == "--quick") quick = true;
    else if (a == "--seq") p.s = next();
    else if (a == "--heads") p.h = p.hkv = next();
    else if (a == "--dim") p.d = next();
    else if (a == "--balance-only") balance_only = true;
    else if (a == "--documents-only") documents_only = true;
    else if (a == "--ring-row-step") p.ring_row_step = std::atof(i + 1 < argc ? argv[++i] : "0");
  }
  if (balance_only) {
    bench::print_build();
    balance_figures();
    return 0;
  }
#if !BATON_HAS_KOKKOS()
  if (p.s > 1024) p.s = 1024;  // the reference backend is O(S^2 D) in double, one thread
#endif
  if (quick) p.s = std::min<std::int64_t>(p.s, 1024);
  bench::print_build();
  bench::print_load("before");
  p.q = random_values(static_cast<std::size_t>(p.b * p.s * p.h * p.d), 1);
  p.k = random_values(static_cast<std::size_t>(p.b * p.s * p.hkv * p.d), 2);
  p.v = random_values(static_cast<std::size_t>(p.b * p.s * p.hkv * p.d), 3);
  p.dout = random_values(static_cast<std::size_t>(p.b * p.s * p.h * p.d), 4);
  std::printf("# bench_cp: backend %s, float, B=%lld S=%lld H=%lld D=%lld, forward+backward, %d interleaved pairs, "
              "2 local ranks\n",
              backend_name, static_cast<long long>(p.b), static_cast<long long>(p.s), static_cast<long long>(p.h),
              static_cast<long long>(p.d), pairs);

  // Closed forms, bytes each rank sends in one forward + backward with R = P = 2.
  const double R = 2, sl = static_cast<double>(p.s) / R, e = sizeof(T);
  const double kv_block = 2 * static_cast<double>(p.b) * sl * static_cast<double>(p.hkv * p.d) * e;  // K and V
  const double grad_block = kv_block / e * sizeof(A);
  const double ring_theory = (R - 1) * kv_block            // forward: K/V around the ring
                             + (R - 1) * kv_block          // backward: K/V again
                             + (R - 1) * grad_block;       // dK/dV accumulators (the owner's own part stays home)
  const double off = (R - 1) / R, rows = static_cast<double>(p.b) * sl;
  const double hd = static_cast<double>(p.h * p.d), kvd = static_cast<double>(p.hkv * p.d), hl = static_cast<double>(p.h);
  const double ulysses_theory =
      off * rows * e * ((hd + 2 * kvd) + hd + hl)                       // forward: q,k,v in; out, lse back
      + off * rows * e * ((hd + 2 * kvd + hd + hd) + hl + (hd + 2 * kvd));  // backward: q,k,v,out,dout,lse in; dq,dk,dv back

  mask_figures full, causal;
  document_figures documents;
  run_pairs(p, pairs, documents_only, full, causal, documents);

  if (!documents_only) {
    bench::print("single_full_seconds", full.single_s);
    bench::print("single_causal_seconds", causal.single_s);
    bench::print("ring2_full_seconds", full.ring_s);
    bench::print("ring2_causal_seconds", causal.ring_s);
    bench::print("ulysses2_full_seconds", full.uly_s);
    bench::print("ulysses2_causal_seconds", causal.uly_s);
    bench::print("ring2_efficiency_full", full.ring_eff, "%.3f");
    bench::print("ring2_efficiency_causal", causal.ring_eff, "%.3f");
    bench::print("ulysses2_efficiency_full", full.uly_eff, "%.3f");
    bench::print("ulysses2_efficiency_causal", causal.uly_eff, "%.3f");
    // The same ratios from CPU time (the sum over both ranks): what the layer costs in work,
    // independent of whether the machine really had 2 idle cores during the run.
    bench::print("ring2_work_efficiency_full", full.ring_work, "%.3f");
    bench::print("ring2_work_efficiency_causal", causal.ring_work, "%.3f");
    bench::print("ulysses2_work_efficiency_full", full.uly_work, "%.3f");
    bench::print("ulysses2_work_efficiency_causal", causal.uly_work, "%.3f");
  }
  // Causal documents (lengths uniform in [64, S/4], seed 1): ring over balanced_sharding
  // (blocks of S/64) against ring over zigzag, each against the same one-rank baseline.
  bench::print_value("document_balance_ratio_R2", documents.balance_ratio, "%.4f");
  bench::print_value("document_balance_ratio_R2_zigzag", documents.zigzag_ratio, "%.4f");
  bench::print_value("document_ring_balance_ratio_R2", documents.ring_balance_ratio, "%.4f");
  bench::print("single_document_seconds", documents.single_s);
  bench::print("ring2_document_seconds", documents.balanced_s);
  bench::print("ring2_document_zigzag_seconds", documents.zigzag_s);
  bench::print("ring2_efficiency_document", documents.balanced_eff, "%.3f");
  bench::print("ring2_efficiency_document_zigzag", documents.zigzag_eff, "%.3f");
  bench::print("ring2_work_efficiency_document", documents.balanced_work, "%.3f");
  bench::print("ring2_work_efficiency_document_zigzag", documents.zigzag_work, "%.3f");
  bench::print("single_document_both_ranks_seconds", documents.both_s);
  bench::print("ring2_roof_document", documents.roof, "%.3f");
  bench::print("ring2_efficiency_document_vs_roof", documents.balanced_vs_roof, "%.3f");
  const auto most = [](const std::array<std::int64_t, 2>& b) { return static_cast<double>(std::max(b[0], b[1])); };
  if (!documents_only) {
    bench::print_value("ring_bytes_per_rank", most(full.ring_bytes), "%.0f");
    bench::print_value("ring_bytes_vs_theory", most(full.ring_bytes) / ring_theory);
    bench::print_value("ring_bytes_vs_theory_causal", most(causal.ring_bytes) / ring_theory);
    bench::print_value("ulysses_bytes_per_rank", most(full.uly_bytes), "%.0f");
    bench::print_value("ulysses_bytes_vs_theory", most(full.uly_bytes) / ulysses_theory);
    bench::print_value("ulysses_bytes_vs_theory_causal", most(causal.uly_bytes) / ulysses_theory);
  }
  bench::print_load("after");
  if (documents_only) return 0;
  balance_figures();  // after the timed part and its load reading: it must not disturb them
  return 0;
}
