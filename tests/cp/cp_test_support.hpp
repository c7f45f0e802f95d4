// Shared by the CP tests: a full-sequence problem with its reference answer (reference
// attention on one rank, the oracle), and a driver that runs ring / Ulysses / hybrid
// attention on the local world and gathers every rank's results back to full order.
#pragma once

#include <baton/attention/masks.hpp>
#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/comm/mesh.hpp>
#include <baton/cp.hpp>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace cp_test {

enum class mode { ring, ulysses, hybrid };

inline const char* name(mode m) {
  return m == mode::ring ? "ring" : m == mode::ulysses ? "ulysses" : "hybrid";
}

struct dims {
  std::int64_t batch = 2, seq = 24, heads_q = 8, heads_kv = 2, dim = 5;
  std::int64_t q_elems() const { return batch * seq * heads_q * dim; }
  std::int64_t kv_elems() const { return batch * seq * heads_kv * dim; }
  std::int64_t lse_elems() const { return batch * heads_q * seq; }
};

template <class T>
struct tensors {
  using L = baton::lse_t<T>;
  std::vector<T> out, dq, dk, dv;
  std::vector<L> lse;
  explicit tensors(const dims& d)
      : out(static_cast<std::size_t>(d.q_elems())), dq(out.size()), dk(static_cast<std::size_t>(d.kv_elems())),
        dv(dk.size()), lse(static_cast<std::size_t>(d.lse_elems())) {}
};

template <class T>
struct problem {
  dims d;
  std::vector<T> q, k, v, dout;
  tensors<T> reference;
  explicit problem(const dims& dd) : d(dd), reference(dd) {}
};

template <class T>
std::vector<T> random_values(std::size_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(normal(gen));
  return v;
}

template <class T>
baton::tensor_view<T, 4> view4(std::vector<T>& v, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) {
  return baton::make_tensor_view(v.data(), {b, s, h, d});
}
template <class T>
baton::tensor_view<const T, 4> cview4(const std::vector<T>& v, std::int64_t b, std::int64_t s, std::int64_t h,
                                      std::int64_t d) {
  return baton::make_tensor_view(v.data(), {b, s, h, d});
}

// The oracle: reference attention over the whole sequence on one rank.
template <class T, class Mask>
problem<T> make_problem(const dims& d, const Mask& mask, std::uint32_t seed, double scale = 0) {
  problem<T> p(d);
  p.q = random_values<T>(static_cast<std::size_t>(d.q_elems()), seed);
  p.k = random_values<T>(static_cast<std::size_t>(d.kv_elems()), seed + 1);
  p.v = random_values<T>(static_cast<std::size_t>(d.kv_elems()), seed + 2);
  p.dout = random_values<T>(static_cast<std::size_t>(d.q_elems()), seed + 3);
  baton::reference_attention ref;
  baton::attention_params params;
  params.softmax_scale = scale;
  auto& r = p.reference;
  ref.forward(cview4(p.q, d.batch, d.seq, d.heads_q, d.dim), cview4(p.k, d.batch, d.seq, d.heads_kv, d.dim),
              cview4(p.v, d.batch, d.seq, d.heads_kv, d.dim), mask, view4(r.out, d.batch, d.seq, d.heads_q, d.dim),
              baton::make_tensor_view(r.lse.data(), {d.batch, d.heads_q, d.seq}), params);
  ref.backward(cview4(p.q, d.batch, d.seq, d.heads_q, d.dim), cview4(p.k, d.batch, d.seq, d.heads_kv, d.dim),
               cview4(p.v, d.batch, d.seq, d.heads_kv, d.dim), cview4(r.out, d.batch, d.seq, d.heads_q, d.dim),
               baton::make_tensor_view(static_cast<const baton::lse_t<T>*>(r.lse.data()), {d.batch, d.heads_q, d.seq}),
               cview4(p.dout, d.batch, d.seq, d.heads_q, d.dim), mask, view4(r.dq, d.batch, d.seq, d.heads_q, d.dim),
               view4(r.dk, d.batch, d.seq, d.heads_kv, d.dim), view4(r.dv, d.batch, d.seq, d.heads_kv, d.dim), params);
  return p;
}

struct config {
  mode m = mode::ring;
  baton::shard_layout layout = baton::shard_layout::contiguous;
  int degree = 2;        // ring degree (ring, hybrid) or Ulysses degree (ulysses)
  int inner_degree = 1;  // Ulysses degree of the hybrid
  int world() const { return degree * inner_degree; }
  std::string text() const {
    return std::string(name(m)) + " " + std::string(baton::to_string(layout)) + " " + std::to_string(degree) +
           (m == mode::hybrid ? "x" + std::to_string(inner_degree) : "");
  }
};

// One rank's shards of the problem's inputs, and the full shapes they were cut from (and
// that the results are written back into).
template <class T>
struct rank_inputs {
  std::vector<std::int64_t> qshape, kvshape, lshape;
  std::vector<T> q, k, v, dout;
};

template <class T>
rank_inputs<T> shard_inputs(const baton::sequence_sharding& sharding, int rank, const problem<T>& p) {
  const dims& d = p.d;
  rank_inputs<T> in;
  in.qshape = {d.batch, d.seq, d.heads_q, d.dim};
  in.kvshape = {d.batch, d.seq, d.heads_kv, d.dim};
  in.lshape = {d.batch, d.heads_q, d.seq};
  in.q = baton::shard_sequence<T>(sharding, rank, p.q, in.qshape, 1);
  in.k = baton::shard_sequence<T>(sharding, rank, p.k, in.kvshape, 1);
  in.v = baton::shard_sequence<T>(sharding, rank, p.v, in.kvshape, 1);
  in.dout = baton::shard_sequence<T>(sharding, rank, p.dout, in.qshape, 1);
  return in;
}

// One rank's part: shard the full inputs, run forward and backward, write the results into
// this rank's global positions of `result` (ranks write disjoint elements).
template <class T, class Attention, class Mask>
void run_rank(Attention& attn, const baton::sequence_sharding& sharding, int rank, const problem<T>& p,
              const Mask& mask, tensors<T>& result, double scale) {
  using L = baton::lse_t<T>;
  const dims& d = p.d;
  const std::int64_t sl = sharding.local_len(rank);
  const rank_inputs<T> in = shard_inputs(sharding, rank, p);
  const auto &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  const auto &qshape = in.qshape, &kvshape = in.kvshape, &lshape = in.lshape;
  std::vector<T> out(q.size()), dq(q.size()), dk(k.size()), dv(k.size());
  std::vector<L> lse(static_cast<std::size_t>(d.batch * d.heads_q * sl));
  const baton::cp_params params{scale};
  attn.forward(cview4(q, d.batch, sl, d.heads_q, d.dim), cview4(k, d.batch, sl, d.heads_kv, d.dim),
               cview4(v, d.batch, sl, d.heads_kv, d.dim), mask, view4(out, d.batch, sl, d.heads_q, d.dim),
               baton::make_tensor_view(lse.data(), {d.batch, d.heads_q, sl}), params);
  attn.backward(cview4(q, d.batch, sl, d.heads_q, d.dim), cview4(k, d.batch, sl, d.heads_kv, d.dim),
                cview4(v, d.batch, sl, d.heads_kv, d.dim), cview4(out, d.batch, sl, d.heads_q, d.dim),
                baton::make_tensor_view(static_cast<const L*>(lse.data()), {d.batch, d.heads_q, sl}),
                cview4(dout, d.batch, sl, d.heads_q, d.dim), mask, view4(dq, d.batch, sl, d.heads_q, d.dim),
                view4(dk, d.batch, sl, d.heads_kv, d.dim), view4(dv, d.batch, sl, d.heads_kv, d.dim), params);
  baton::unshard_sequence<T>(sharding, rank, out, qshape, 1, result.out);
  baton::unshard_sequence<L>(sharding, rank, lse, lshape, 2, result.lse);
  baton::unshard_sequence<T>(sharding, rank, dq, qshape, 1, result.dq);
  baton::unshard_sequence<T>(sharding, rank, dk, kvshape, 1, result.dk);
  baton::unshard_sequence<T>(sharding, rank, dv, kvshape, 1, result.dv);
}

// Runs the configuration on the local world with `backend` (copied to every rank) over
// `sharding` (which must match c's degrees) and returns out, lse, dq, dk, dv in full order.
template <class T, class Mask, class Backend = baton::reference_attention>
tensors<T> run_cp_sharded(const config& c, const baton::sequence_sharding& sharding, const problem<T>& p,
                          const Mask& mask, double scale = 0, Backend backend = {}) {
  tensors<T> result(p.d);
  baton::run_local(c.world(), [&](baton::local_communicator& comm) {
    if (c.m == mode::ring) {
      baton::ring_attention attn(comm, backend, sharding);
      run_rank<T>(attn, sharding, attn.shard_index(), p, mask, result, scale);
    } else if (c.m == mode::ulysses) {
      baton::ulysses_attention attn(comm, backend, sharding);
      run_rank<T>(attn, sharding, attn.shard_index(), p, mask, result, scale);
    } else {
      auto mesh = baton::make_cp_mesh(comm, c.degree, c.inner_degree);
      baton::hybrid_attention attn(mesh, backend, sharding);
      run_rank<T>(attn, sharding, attn.shard_index(), p, mask, result, scale);
    }
  });
  return result;
}

// The same over c's layout.
template <class T, class Mask, class Backend = baton::reference_attention>
tensors<T> run_cp(const config& c, const problem<T>& p, const Mask& mask, double scale = 0, Backend backend = {}) {
  const baton::sequence_sharding sharding =
      c.m == mode::hybrid ? baton::sequence_sharding(c.layout, p.d.seq, c.degree, c.inner_degree)
                          : baton::sequence_sharding(c.layout, p.d.seq, c.degree);
  return run_cp_sharded<T>(c, sharding, p, mask, scale, std::move(backend));
}

// Wraps a backend and adds the (query rows x key rows) area of every forward and backward
// call to this rank's slot of `areas` (each rank writes its own slot).
template <class Inner>
struct area_summing_backend {
  Inner inner;
  std::vector<std::int64_t>* areas = nullptr;
  int rank = 0;

  template <class Q, class K, class V, class M, class O, class L>
  void forward(Q q, K k, V v, const M& mask, O out, L lse, const baton::attention_params& p) const {
    (*areas)[static_cast<std::size_t>(rank)] += q.extent(1) * k.extent(1);
    inner.forward(q, k, v, mask, out, lse, p);
  }
  template <class Q, class K, class V, class O, class L, class D, class M, class G1, class G2, class G3>
  void backward(Q q, K k, V v, O out, L lse, D dout, const M& mask, G1 dq, G2 dk, G3 dv,
                const baton::attention_params& p) const {
    (*areas)[static_cast<std::size_t>(rank)] += q.extent(1) * k.extent(1);
    inner.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, p);
  }
};

// Ring attention through its core (detail::cp::ring_forward / ring_backward) on the local
// world, with the trimming of its block calls set by `trim` (detail::cp::trim_tile, or 0 for
// calls as the piece planner makes them) and the layout it computes in (ring_geometry::
// head_major); returns the results in full order and adds each rank's backend call area
// (forward + backward) to `area`.
template <class T, class Mask, class Backend>
tensors<T> run_ring_core(const baton::sequence_sharding& sharding, const problem<T>& p, const Mask& mask,
                         const Backend& backend, std::int64_t trim, std::int64_t& area, bool head_major = false) {
  using L = baton::lse_t<T>;
  const dims& d = p.d;
  const int R = sharding.degree();
  tensors<T> result(d);
  std::vector<std::int64_t> areas(static_cast<std::size_t>(R), 0);
  baton::run_local(R, [&](baton::local_communicator& comm) {
    const int me = comm.rank();
    baton::detail::cp::ring_geometry g;
    for (int r = 0; r < R; ++r) g.pieces.push_back(sharding.pieces(r));
    g.batch = d.batch;
    g.heads_q = d.heads_q;
    g.heads_kv = d.heads_kv;
    g.dim = d.dim;
    g.head_major = head_major;
    area_summing_backend<Backend> counted{backend, &areas, me};
    baton::host_memory mem;
    const std::int64_t sl = sharding.local_len(me);
    const rank_inputs<T> in = shard_inputs(sharding, me, p);
    std::vector<T> out(in.q.size()), dq(in.q.size()), dk(in.k.size()), dv(in.k.size());
    std::vector<L> lse(static_cast<std::size_t>(d.batch * d.heads_q * sl));
    const double scale = 1.0 / std::sqrt(static_cast<double>(d.dim));
    const auto q = cview4(in.q, d.batch, sl, d.heads_q, d.dim), k = cview4(in.k, d.batch, sl, d.heads_kv, d.dim),
               v = cview4(in.v, d.batch, sl, d.heads_kv, d.dim);
    baton::detail::cp::ring_forward<T>(comm, counted, mem, g, q, k, v, mask, view4(out, d.batch, sl, d.heads_q, d.dim),
                                       baton::make_tensor_view(lse.data(), {d.batch, d.heads_q, sl}), scale, trim);
    baton::detail::cp::ring_backward<T>(
        comm, counted, mem, g, q, k, v, cview4(out, d.batch, sl, d.heads_q, d.dim),
        baton::make_tensor_view(static_cast<const L*>(lse.data()), {d.batch, d.heads_q, sl}),
        cview4(in.dout, d.batch, sl, d.heads_q, d.dim), mask, view4(dq, d.batch, sl, d.heads_q, d.dim),
        view4(dk, d.batch, sl, d.heads_kv, d.dim), view4(dv, d.batch, sl, d.heads_kv, d.dim), scale, trim);
    baton::unshard_sequence<T>(sharding, me, out, in.qshape, 1, result.out);
    baton::unshard_sequence<L>(sharding, me, lse, in.lshape, 2, result.lse);
    baton::unshard_sequence<T>(sharding, me, dq, in.qshape, 1, result.dq);
    baton::unshard_sequence<T>(sharding, me, dk, in.kvshape, 1, result.dk);
    baton::unshard_sequence<T>(sharding, me, dv, in.kvshape, 1, result.dv);
  });
  for (const std::int64_t a : areas) area += a;
  return result;
}

// True when every element has the same bits (so -inf == -inf and NaN == NaN).
template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
template <class T>
bool same_bits(const tensors<T>& a, const tensors<T>& b) {
  return same_bits(a.out, b.out) && same_bits(a.lse, b.lse) && same_bits(a.dq, b.dq) && same_bits(a.dk, b.dk) &&
         same_bits(a.dv, b.dv);
}

// Relative L2 error ||got - want|| / ||want||, in long double. Entries where want is -inf
// (an LSE row that attends to nothing) must be -inf in got too and are left out of the sums.
template <class T>
double rel_l2(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) return std::numeric_limits<double>::infinity();
  long double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const long double w = want[i], g = got[i];
    if (std::isinf(w) || std::isinf(g)) {
      if (!(std::isinf(w) && std::isinf(g) && (w < 0) == (g < 0))) return std::numeric_limits<double>::infinity();
      continue;
    }
    if (std::isnan(g)) return std::numeric_limits<double>::infinity();
    num += (g - w) * (g - w);
    den += w * w;
  }
  if (den == 0) return num == 0 ? 0.0 : std::numeric_limits<double>::infinity();
  return static_cast<double>(std::sqrt(num / den));
}

template <class T>
constexpr double tolerance() {
  return sizeof(T) >= sizeof(double) ? 1e-12 : 1e-5;
}

struct errors {
  double out, lse, dq, dk, dv;
  double max() const { return std::max({out, lse, dq, dk, dv}); }
};

template <class T>
errors compare(const tensors<T>& got, const tensors<T>& want) {
  return {rel_l2(got.out, want.out), rel_l2(got.lse, want.lse), rel_l2(got.dq, want.dq), rel_l2(got.dk, want.dk),
          rel_l2(got.dv, want.dv)};
}

// Calls f(mask, name) for each mask of the attention core, built over a sequence of `seq`.
// The block mask has query rows that attend to nothing (q % 7 == 3), so LSE -inf rows and
// fully masked blocks go through every mode.
template <class F>
void for_each_mask(std::int64_t seq, F&& f) {
  f(baton::no_mask{}, "none");
  f(baton::causal_mask{}, "causal");
  f(baton::sliding_window_mask{5, 2}, "sliding window {5, 2}");
  std::vector<std::int64_t> ids(static_cast<std::size_t>(seq));
  for (std::int64_t i = 0; i < seq; ++i) ids[static_cast<std::size_t>(i)] = i < 7 ? 0 : i < 16 ? 1 : 2;
  f(baton::document_mask(ids), "document {7, 9, rest}");
  f(baton::block_mask([](std::int64_t q, std::int64_t k) { return k <= q && (k < 2 || q - k < 6) && q % 7 != 3; }, seq,
                      seq, 4),
    "block mask (sink + window, rows q%7==3 empty)");
}

// Runs f on every rank of an n-rank local world; returns each rank's cp_error message ("" if
// none), so that a test can assert that every rank stopped with the same message.
inline std::vector<std::string> rank_cp_errors(int n, const std::function<void(baton::local_communicator&)>& f) {
  std::vector<std::string> messages(static_cast<std::size_t>(n));
  baton::local_options options;
  options.timeout = std::chrono::seconds(20);
  baton::run_local(
      n,
      [&](baton::local_communicator& comm) {
        try {
          f(comm);
        } catch (const baton::cp_error& e) {
          messages[static_cast<std::size_t>(comm.rank())] = e.what();
        }
      },
      options);
  return messages;
}

}  // namespace cp_test
