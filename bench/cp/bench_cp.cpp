// bench_cp — how much of two ranks' worth of compute ring and Ulysses attention keep, and
// whether they send exactly the bytes their closed forms say.
//
//   efficiency = T(one rank, whole sequence) / (2 x T(2 local ranks, ring or Ulysses))
//   bytes_vs_theory = bytes each rank sent (forward + backward) / closed form
//
// Times are of forward + backward, best of --reps runs, with the Kokkos flash backend (the
// reference backend when Kokkos is absent, at a small size). Ranks are threads of this
// process (the local world), so "2 ranks" means 2 cores; on a loaded machine expect noise.
//
//   bench_cp [--quick] [--seq S] [--heads H] [--dim D] [--reps N]
#include <baton/attention.hpp>
#include <baton/comm/local.hpp>
#include <baton/cp.hpp>
#include <baton/cp/detail/agree.hpp>

#if BATON_HAS_KOKKOS()
#include <Kokkos_Core.hpp>
#endif

#include <algorithm>
#include <atomic>
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

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

struct timing {
  double seconds = 1e300;      // wall clock, best run
  double cpu_seconds = 1e300;  // CPU time summed over ranks, best run
  std::int64_t bytes_per_rank = 0;
};

template <class Mask>
timing time_single(const problem& p, const Mask& mask, int reps) {
  backend_t backend;
  std::vector<T> out(p.q.size()), dq(p.q.size()), dk(p.k.size()), dv(p.k.size());
  std::vector<L> lse(static_cast<std::size_t>(p.b * p.h * p.s));
  const auto q = baton::make_tensor_view(p.q.data(), {p.b, p.s, p.h, p.d});
  const auto k = baton::make_tensor_view(p.k.data(), {p.b, p.s, p.hkv, p.d});
  const auto v = baton::make_tensor_view(p.v.data(), {p.b, p.s, p.hkv, p.d});
  timing best;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = thread_cpu_seconds();
    backend.forward(q, k, v, mask, baton::make_tensor_view(out.data(), {p.b, p.s, p.h, p.d}),
                    baton::make_tensor_view(lse.data(), {p.b, p.h, p.s}));
    backend.backward(q, k, v, baton::make_tensor_view(static_cast<const T*>(out.data()), {p.b, p.s, p.h, p.d}),
                     baton::make_tensor_view(static_cast<const L*>(lse.data()), {p.b, p.h, p.s}),
                     baton::make_tensor_view(p.dout.data(), {p.b, p.s, p.h, p.d}), mask,
                     baton::make_tensor_view(dq.data(), {p.b, p.s, p.h, p.d}),
                     baton::make_tensor_view(dk.data(), {p.b, p.s, p.hkv, p.d}),
                     baton::make_tensor_view(dv.data(), {p.b, p.s, p.hkv, p.d}));
    best.seconds = std::min(best.seconds, seconds_since(t0));
    best.cpu_seconds = std::min(best.cpu_seconds, thread_cpu_seconds() - c0);
  }
  return best;
}

enum class cp_mode { ring, ulysses };

template <class Mask>
timing time_cp(cp_mode mode, const problem& p, const Mask& mask, baton::shard_layout layout, int reps) {
  const int R = 2;
  std::vector<double> times(static_cast<std::size_t>(reps), 0);
  std::vector<std::vector<double>> cpu(R, std::vector<double>(static_cast<std::size_t>(reps), 0));
  std::vector<std::int64_t> bytes(R, 0);
  baton::run_local(R, [&](baton::local_communicator& local) {
    std::int64_t sent = 0;
    counting_comm comm{&local, &sent};
    const baton::sequence_sharding s(layout, p.s, R);
    const std::int64_t sl = s.local_len();
    const std::vector<std::int64_t> qs{p.b, p.s, p.h, p.d}, kvs{p.b, p.s, p.hkv, p.d};
    const int me = local.rank();
    const auto q = baton::shard_sequence<T>(s, me, p.q, qs, 1), k = baton::shard_sequence<T>(s, me, p.k, kvs, 1),
               v = baton::shard_sequence<T>(s, me, p.v, kvs, 1), dout = baton::shard_sequence<T>(s, me, p.dout, qs, 1);
    std::vector<T> out(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
    std::vector<L> lse(static_cast<std::size_t>(p.b * p.h * sl));
    const auto run = [&](auto& attn) {
      attn.forward(baton::make_tensor_view(q.data(), {p.b, sl, p.h, p.d}),
                   baton::make_tensor_view(k.data(), {p.b, sl, p.hkv, p.d}),
                   baton::make_tensor_view(v.data(), {p.b, sl, p.hkv, p.d}), mask,
                   baton::make_tensor_view(out.data(), {p.b, sl, p.h, p.d}),
                   baton::make_tensor_view(lse.data(), {p.b, p.h, sl}));
      attn.backward(baton::make_tensor_view(q.data(), {p.b, sl, p.h, p.d}),
                    baton::make_tensor_view(k.data(), {p.b, sl, p.hkv, p.d}),
                    baton::make_tensor_view(v.data(), {p.b, sl, p.hkv, p.d}),
                    baton::make_tensor_view(static_cast<const T*>(out.data()), {p.b, sl, p.h, p.d}),
                    baton::make_tensor_view(static_cast<const L*>(lse.data()), {p.b, p.h, sl}),
                    baton::make_tensor_view(dout.data(), {p.b, sl, p.h, p.d}), mask,
                    baton::make_tensor_view(dq.data(), {p.b, sl, p.h, p.d}),
                    baton::make_tensor_view(dk.data(), {p.b, sl, p.hkv, p.d}),
                    baton::make_tensor_view(dv.data(), {p.b, sl, p.hkv, p.d}));
    };
    // One attention object per rank for all repetitions, as a model layer keeps it between
    // steps (its backend keeps its packing buffers, Ulysses its head-sharded buffers).
    const auto repeat = [&](auto& attn) {
      for (int r = 0; r < reps; ++r) {
        sent = 0;
        local.barrier();
        const auto t0 = std::chrono::steady_clock::now();
        const double c0 = thread_cpu_seconds();
        run(attn);
        cpu[static_cast<std::size_t>(me)][static_cast<std::size_t>(r)] = thread_cpu_seconds() - c0;
        local.barrier();  // the step ends when the slowest rank ends
        if (me == 0) times[static_cast<std::size_t>(r)] = seconds_since(t0);
      }
    };
    if (mode == cp_mode::ring) {
      baton::ring_attention attn(comm, backend_t{}, s);
      repeat(attn);
    } else {
      baton::ulysses_attention attn(comm, backend_t{}, s);
      repeat(attn);
    }
    bytes[static_cast<std::size_t>(me)] = sent;
  });
  timing t;
  t.seconds = *std::min_element(times.begin(), times.end());
  for (int r = 0; r < reps; ++r) t.cpu_seconds = std::min(t.cpu_seconds, cpu[0][static_cast<std::size_t>(r)] + cpu[1][static_cast<std::size_t>(r)]);
  t.bytes_per_rank = std::max(bytes[0], bytes[1]);
  return t;
}

double load_average() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

void figure(const char* name, double value, const char* unit = "") {
  std::printf("%s: %.4g%s\n", name, value, unit);
}

}  // namespace

int main(int argc, char** argv) {
#if BATON_HAS_KOKKOS()
  Kokkos::ScopeGuard kokkos(argc, argv);
#endif
  problem p;
  int reps = 1;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() { return i + 1 < argc ? std::atoll(argv[++i]) : 0LL; };
    if (a == "--quick") quick = true;
    else if (a == "--seq") p.s = next();
    else if (a == "--heads") p.h = p.hkv = next();
    else if (a == "--dim") p.d = next();
    else if (a == "--reps") reps = static_cast<int>(next());
  }
#if !BATON_HAS_KOKKOS()
  if (p.s > 1024) p.s = 1024;  // the reference backend is O(S^2 D) in double, one thread
#endif
  if (quick) {
    p.s = std::min<std::int64_t>(p.s, 1024);
    reps = std::max(reps, 2);
  }
  p.q = random_values(static_cast<std::size_t>(p.b * p.s * p.h * p.d), 1);
  p.k = random_values(static_cast<std::size_t>(p.b * p.s * p.hkv * p.d), 2);
  p.v = random_values(static_cast<std::size_t>(p.b * p.s * p.hkv * p.d), 3);
  p.dout = random_values(static_cast<std::size_t>(p.b * p.s * p.h * p.d), 4);
  std::printf("# bench_cp: backend %s, float, B=%lld S=%lld H=%lld D=%lld, forward+backward, best of %d, 2 local ranks\n",
              backend_name, static_cast<long long>(p.b), static_cast<long long>(p.s), static_cast<long long>(p.h),
              static_cast<long long>(p.d), reps);

  // Closed forms, bytes each rank sends in one forward + backward with R = P = 2.
  const double R = 2, sl = static_cast<double>(p.s) / R, e = sizeof(T);
  const double kv_block = 2 * static_cast<double>(p.b) * sl * static_cast<double>(p.hkv * p.d) * e;  // K and V
  const double grad_block = kv_block / e * sizeof(A);
  const double ring_theory = (R - 1) * kv_block            // forward: K/V around the ring
                             + (R - 1) * kv_block          // backward: K/V again
                             + R * grad_block;             // dK/dV accumulators, incl. the hop home
  const double off = (R - 1) / R, rows = static_cast<double>(p.b) * sl;
  const double hd = static_cast<double>(p.h * p.d), kvd = static_cast<double>(p.hkv * p.d), hl = static_cast<double>(p.h);
  const double ulysses_theory =
      off * rows * e * ((hd + 2 * kvd) + hd + hl)                       // forward: q,k,v in; out, lse back
      + off * rows * e * ((hd + 2 * kvd + hd + hd) + hl + (hd + 2 * kvd));  // backward: q,k,v,out,dout,lse in; dq,dk,dv back

  const baton::no_mask full;
  const baton::causal_mask causal;
  const timing single_full = time_single(p, full, reps);
  const timing single_causal = time_single(p, causal, reps);
  const timing ring_full = time_cp(cp_mode::ring, p, full, baton::shard_layout::contiguous, reps);
  const timing ring_causal = time_cp(cp_mode::ring, p, causal, baton::shard_layout::zigzag, reps);
  const timing uly_full = time_cp(cp_mode::ulysses, p, full, baton::shard_layout::contiguous, reps);
  const timing uly_causal = time_cp(cp_mode::ulysses, p, causal, baton::shard_layout::zigzag, reps);

  figure("single_full_seconds", single_full.seconds, " s");
  figure("single_causal_seconds", single_causal.seconds, " s");
  figure("ring2_full_seconds", ring_full.seconds, " s");
  figure("ring2_causal_seconds", ring_causal.seconds, " s");
  figure("ulysses2_full_seconds", uly_full.seconds, " s");
  figure("ulysses2_causal_seconds", uly_causal.seconds, " s");
  figure("ring2_efficiency_full", single_full.seconds / (2 * ring_full.seconds));
  figure("ring2_efficiency_causal", single_causal.seconds / (2 * ring_causal.seconds));
  figure("ulysses2_efficiency_full", single_full.seconds / (2 * uly_full.seconds));
  figure("ulysses2_efficiency_causal", single_causal.seconds / (2 * uly_causal.seconds));
  // The same ratios from CPU time (the sum over both ranks): what the layer costs in work,
  // independent of whether the machine really had 2 idle cores during the run.
  figure("ring2_work_efficiency_full", single_full.cpu_seconds / ring_full.cpu_seconds);
  figure("ring2_work_efficiency_causal", single_causal.cpu_seconds / ring_causal.cpu_seconds);
  figure("ulysses2_work_efficiency_full", single_full.cpu_seconds / uly_full.cpu_seconds);
  figure("ulysses2_work_efficiency_causal", single_causal.cpu_seconds / uly_causal.cpu_seconds);
  figure("load_average_1min", load_average());
  figure("ring_bytes_per_rank", static_cast<double>(ring_full.bytes_per_rank), " B");
  figure("ring_bytes_vs_theory", static_cast<double>(ring_full.bytes_per_rank) / ring_theory);
  figure("ring_bytes_vs_theory_causal", static_cast<double>(ring_causal.bytes_per_rank) / ring_theory);
  figure("ulysses_bytes_per_rank", static_cast<double>(uly_full.bytes_per_rank), " B");
  figure("ulysses_bytes_vs_theory", static_cast<double>(uly_full.bytes_per_rank) / ulysses_theory);
  figure("ulysses_bytes_vs_theory_causal", static_cast<double>(uly_causal.bytes_per_rank) / ulysses_theory);
  return 0;
}
