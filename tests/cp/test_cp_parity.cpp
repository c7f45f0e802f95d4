// Parity of every CP mode against reference attention on the unsharded sequence: out, lse,
// dq, dk, dv gathered back to full order, for every layout and every mask, float and double.
// Tolerances (relative L2, per tensor): 1e-5 float, 1e-12 double. The oracle accumulates in
// double; a CP run adds per-block rounding of the outputs to T and fp32-or-better merging, a
// few ulps of T per element, far below either bound — while a wrong block, position or
// gradient route gives errors of order 1 (seed 001 saw 1.5 to 7).
#include "catch.hpp"
#include "cp_test_support.hpp"
#include "cp_trim_check.hpp"

#include <array>
#include <cstring>
#include <sstream>
#include <vector>

using namespace cp_test;
using baton::shard_layout;

namespace {

template <class T>
void check_configs(const std::vector<config>& configs, const dims& d, std::uint32_t seed) {
  for_each_mask(d.seq, [&](const auto& mask, const char* mask_name) {
    const problem<T> p = make_problem<T>(d, mask, seed);
    for (const config& c : configs) {
      const errors e = compare(run_cp<T>(c, p, mask), p.reference);
      INFO(c.text() << ", mask " << mask_name << ": rel L2 out " << e.out << " lse " << e.lse << " dq " << e.dq
                    << " dk " << e.dk << " dv " << e.dv);
      CHECK(e.out <= tolerance<T>());
      CHECK(e.lse <= tolerance<T>());
      CHECK(e.dq <= tolerance<T>());
      CHECK(e.dk <= tolerance<T>());
      CHECK(e.dv <= tolerance<T>());
    }
  });
}

std::vector<config> all_layouts(mode m, std::initializer_list<int> degrees, int inner = 1) {
  std::vector<config> out;
  for (int degree : degrees)
    for (auto layout : {shard_layout::contiguous, shard_layout::zigzag, shard_layout::striped})
      out.push_back(config{m, layout, degree, inner});
  return out;
}

}  // namespace

// S = 24 divides as every configuration needs (zigzag over 4: 8; hybrid 2x2: 4); b = 2;
// GQA 8 query heads over 2 kv heads; head dim 5 (odd).
TEMPLATE_TEST_CASE("ring attention matches the reference: R in {2,3,4}, every layout and mask", "[cp][ring]", float,
                   double) {
  check_configs<TestType>(all_layouts(mode::ring, {2, 3, 4}), dims{}, 11);
}

TEMPLATE_TEST_CASE("Ulysses attention matches the reference: P in {2,4} (P=4 replicates the 2 kv heads)",
                   "[cp][ulysses]", float, double) {
  check_configs<TestType>(all_layouts(mode::ulysses, {2, 4}), dims{}, 21);
}

TEMPLATE_TEST_CASE("hybrid attention (ring 2 x Ulysses 2) matches the reference", "[cp][hybrid]", float, double) {
  check_configs<TestType>(all_layouts(mode::hybrid, {2}, 2), dims{}, 31);
}

TEST_CASE("CP parity holds for plain multi-head attention, batch 1, even head dim and a custom scale", "[cp]") {
  const dims d{1, 16, 4, 4, 8};
  const baton::causal_mask mask;
  const problem<double> p = make_problem<double>(d, mask, 41, 0.3);
  for (const config& c : {config{mode::ring, shard_layout::zigzag, 4}, config{mode::ulysses, shard_layout::striped, 4},
                          config{mode::hybrid, shard_layout::zigzag, 2, 2}, config{mode::ring, shard_layout::striped, 1}}) {
    const errors e = compare(run_cp<double>(c, p, mask, 0.3), p.reference);
    INFO(c.text() << ": max rel L2 " << e.max());
    CHECK(e.max() <= 1e-12);
  }
  // and the scale is really used: the default scale gives a different answer
  const errors wrong = compare(run_cp<double>(config{mode::ring, shard_layout::zigzag, 2}, p, mask, 0.0), p.reference);
  CHECK(wrong.out > 1e-3);
}

TEST_CASE("hybrid attention with replicated kv heads (Hkv = 1 over Ulysses 2) and a causal document mask", "[cp][hybrid]") {
  const dims d{1, 16, 4, 1, 3};
  std::vector<std::int64_t> ids(16);
  for (int i = 0; i < 16; ++i) ids[static_cast<std::size_t>(i)] = i < 5 ? 0 : i < 12 ? 1 : 2;
  const auto mask = baton::intersect(baton::document_mask(ids), baton::causal_mask{});
  const problem<double> p = make_problem<double>(d, mask, 51);
  for (const config& c : {config{mode::hybrid, shard_layout::zigzag, 2, 2}, config{mode::ulysses, shard_layout::zigzag, 2},
                          config{mode::ring, shard_layout::zigzag, 2}}) {
    const errors e = compare(run_cp<double>(c, p, mask), p.reference);
    INFO(c.text() << ": max rel L2 " << e.max());
    CHECK(e.max() <= 1e-12);
  }
}

TEST_CASE("hybrid attention on the context-parallel groups of a device_mesh (dp 2 x ring 2 x Ulysses 2)",
          "[cp][hybrid]") {
  const dims d{};
  const baton::causal_mask mask;
  const problem<float> p = make_problem<float>(d, mask, 81);
  std::vector<tensors<float>> results(2, tensors<float>(d));  // one per data-parallel replica
  baton::run_local(8, [&](baton::local_communicator& world) {
    baton::device_mesh mesh(world, baton::mesh_shape{.pp = 1, .dp = 2, .cp_ring = 2, .cp_ulysses = 2});
    const baton::sequence_sharding sharding(shard_layout::zigzag, d.seq, 2, 2);
    baton::hybrid_attention attn(mesh, baton::reference_attention{}, sharding);
    run_rank<float>(attn, sharding, attn.shard_index(), p, mask,
                    results[static_cast<std::size_t>(mesh.coord(baton::mesh_dim::dp))], 0);
  });
  for (const auto& r : results) {
    const errors e = compare(r, p.reference);
    INFO("max rel L2 " << e.max());
    CHECK(e.max() <= tolerance<float>());
  }
}

namespace {
// Wraps the reference backend and records the (query rows x key rows) area of every call,
// per rank, to see what work each ring step really does.
struct area_counting_backend {
  baton::reference_attention inner;
  std::vector<std::vector<std::int64_t>>* areas = nullptr;  // [rank] -> areas in call order
  int rank = 0;

  template <class Q, class K, class V, class M, class O, class L>
  void forward(Q q, K k, V v, const M& mask, O out, L lse, const baton::attention_params& p) const {
    (*areas)[static_cast<std::size_t>(rank)].push_back(q.extent(1) * k.extent(1));
    inner.forward(q, k, v, mask, out, lse, p);
  }
  template <class Q, class K, class V, class O, class L, class D, class M, class G1, class G2, class G3>
  void backward(Q q, K k, V v, O out, L lse, D dout, const M& mask, G1 dq, G2 dk, G3 dv,
                const baton::attention_params& p) const {
    inner.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, p);
  }
};
}  // namespace

TEST_CASE("zigzag ring under a causal mask: every step after the first is half a block of work", "[cp][ring]") {
  const int R = 4;
  const dims d{1, 32, 2, 2, 3};
  const baton::causal_mask mask;
  const problem<float> p = make_problem<float>(d, mask, 61);
  const auto per_rank_total = [&](shard_layout layout) {
    std::vector<std::vector<std::int64_t>> areas(R);
    baton::run_local(R, [&](baton::local_communicator& comm) {
      const baton::sequence_sharding sharding(layout, d.seq, R);
      area_counting_backend backend{{}, &areas, comm.rank()};
      baton::ring_attention attn(comm, backend, sharding);
      const std::int64_t sl = sharding.local_len();
      const auto q = baton::shard_sequence<float>(sharding, comm.rank(), p.q, std::vector<std::int64_t>{1, 32, 2, 3}, 1);
      std::vector<float> out(q.size()), lse(static_cast<std::size_t>(2 * sl));
      attn.forward(cview4(q, 1, sl, 2, 3), cview4(q, 1, sl, 2, 3), cview4(q, 1, sl, 2, 3), mask,
                   view4(out, 1, sl, 2, 3), baton::make_tensor_view(lse.data(), {1, 2, sl}));
    });
    std::vector<std::int64_t> totals;
    for (const auto& a : areas) totals.push_back(std::accumulate(a.begin(), a.end(), std::int64_t{0}));
    return std::make_pair(areas, totals);
  };
  const std::int64_t L = 8, C = 4;
  const auto [zz_areas, zz_totals] = per_rank_total(shard_layout::zigzag);
  for (int r = 0; r < R; ++r) {
    // step 0: chunk r x chunk r (C^2) and chunk 2R-1-r x both chunks (2C^2); then R-1 halves
    REQUIRE(zz_totals[static_cast<std::size_t>(r)] == 3 * C * C + (R - 1) * L * L / 2);
    const auto& a = zz_areas[static_cast<std::size_t>(r)];
    REQUIRE(a.size() == 2 + (R - 1));  // two calls at step 0, one per later step
    for (std::size_t i = 2; i < a.size(); ++i) REQUIRE(a[i] == L * L / 2);
  }
  // contiguous: the last rank does R-1 full blocks more than the first
  const auto [c_areas, c_totals] = per_rank_total(shard_layout::contiguous);
  REQUIRE(c_totals[0] == L * L);
  REQUIRE(c_totals[R - 1] == R * L * L);
}

// (float only: the reference backend computes in double whatever T, so T changes only the
// storage; test_cp_kokkos.cpp runs both types through the flash backend.)
TEST_CASE("ring: block calls trimmed to the mask's non-empty tiles give the untrimmed bits, every layout", "[cp][ring]") {
  check_trimmed_ring<float>(baton::reference_attention{});
}

TEST_CASE("determinism: two runs give bitwise identical outputs and gradients", "[cp]") {
  const dims d{};
  const baton::causal_mask mask;
  const problem<float> p = make_problem<float>(d, mask, 71);
  for (const config& c : {config{mode::ring, shard_layout::zigzag, 3}, config{mode::ulysses, shard_layout::zigzag, 4},
                          config{mode::hybrid, shard_layout::zigzag, 2, 2}}) {
    const tensors<float> a = run_cp<float>(c, p, mask), b = run_cp<float>(c, p, mask);
    INFO(c.text());
    CHECK(a.out == b.out);
    CHECK(a.dq == b.dq);
    CHECK(a.dk == b.dk);
    CHECK(a.dv == b.dv);
    CHECK(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(float)) == 0);
  }
}

TEST_CASE("Ulysses and hybrid keep their buffers between calls: a reused object gives a fresh object's bits",
          "[cp][ulysses][hybrid]") {
  // The buffers grow to the largest call and keep stale contents of earlier (larger, other
  // type) calls; every result must still equal that of a fresh object, bit for bit.
  const baton::causal_mask mask;
  const dims big{}, small{1, 24, 4, 4, 3};  // same sequence (the sharding is fixed), smaller tensors
  const problem<float> pb = make_problem<float>(big, mask, 81), ps = make_problem<float>(small, mask, 82);
  const problem<double> pd = make_problem<double>(big, mask, 83);
  for (const config& c : {config{mode::ulysses, shard_layout::zigzag, 2}, config{mode::hybrid, shard_layout::zigzag, 2, 2}}) {
    INFO(c.text());
    const tensors<float> fresh_big = run_cp<float>(c, pb, mask), fresh_small = run_cp<float>(c, ps, mask);
    const tensors<double> fresh_double = run_cp<double>(c, pd, mask);
    tensors<float> big1(big), small1(small), big2(big);
    tensors<double> double1(big);
    const auto reuse = [&](auto& attn, const baton::sequence_sharding& sharding) {
      run_rank<float>(attn, sharding, attn.shard_index(), pb, mask, big1, 0);
      run_rank<float>(attn, sharding, attn.shard_index(), ps, mask, small1, 0);
      run_rank<double>(attn, sharding, attn.shard_index(), pd, mask, double1, 0);
      attn.release_workspace();
      run_rank<float>(attn, sharding, attn.shard_index(), pb, mask, big2, 0);
    };
    baton::run_local(c.world(), [&](baton::local_communicator& comm) {
      if (c.m == mode::ulysses) {
        const baton::sequence_sharding sharding(c.layout, big.seq, c.degree);
        baton::ulysses_attention attn(comm, baton::reference_attention{}, sharding);
        reuse(attn, sharding);
      } else {
        auto mesh = baton::make_cp_mesh(comm, c.degree, c.inner_degree);
        const baton::sequence_sharding sharding(c.layout, big.seq, c.degree, c.inner_degree);
        baton::hybrid_attention attn(mesh, baton::reference_attention{}, sharding);
        reuse(attn, sharding);
      }
    });
    const auto same = [](const auto& a, const auto& b) {
      CHECK(a.out == b.out);
      CHECK(a.dq == b.dq);
      CHECK(a.dk == b.dk);
      CHECK(a.dv == b.dv);
      CHECK(std::memcmp(a.lse.data(), b.lse.data(), a.lse.size() * sizeof(a.lse[0])) == 0);
    };
    same(big1, fresh_big);
    same(small1, fresh_small);
    same(double1, fresh_double);
    same(big2, fresh_big);
  }
}

namespace {
// Logs, per rank, when transfers start and end and when the backend computes, to show that
// the transfers of the next K/V block (and of the dK/dV accumulator) are in flight while a
// block is being computed.
struct event_log {
  std::vector<std::string> events;
};

struct logged_request {
  baton::local_request inner;
  event_log* log;
  int tag;
  void wait() {
    inner.wait();
    log->events.push_back("wait " + std::to_string(tag));
  }
  bool test() { return inner.test(); }
};

struct logging_comm {
  baton::local_communicator* inner;
  event_log* log;
  int rank() const { return inner->rank(); }
  int size() const { return inner->size(); }
  logged_request shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    log->events.push_back("shift " + std::to_string(tag));
    return {inner->shift(send, recv, k, tag), log, tag};
  }
};

struct logging_backend {
  baton::reference_attention inner;
  event_log* log;
  template <class Q, class K, class V, class M, class O, class L>
  void forward(Q q, K k, V v, const M& mask, O out, L lse, const baton::attention_params& p) const {
    log->events.push_back("compute");
    inner.forward(q, k, v, mask, out, lse, p);
  }
  template <class Q, class K, class V, class O, class L, class D, class M, class G1, class G2, class G3>
  void backward(Q q, K k, V v, O out, L lse, D dout, const M& mask, G1 dq, G2 dk, G3 dv,
                const baton::attention_params& p) const {
    log->events.push_back("compute");
    inner.backward(q, k, v, out, lse, dout, mask, dq, dk, dv, p);
  }
};
}  // namespace

TEST_CASE("ring: the next K/V transfer and the dK/dV transfer overlap a block's compute", "[cp][ring]") {
  const int R = 3;
  const dims d{1, 12, 2, 2, 3};
  const baton::no_mask mask;
  const problem<double> p = make_problem<double>(d, mask, 91);
  std::vector<event_log> logs(R);
  tensors<double> result(d);
  baton::run_local(R, [&](baton::local_communicator& local) {
    event_log& log = logs[static_cast<std::size_t>(local.rank())];
    logging_comm comm{&local, &log};
    const baton::sequence_sharding sharding(shard_layout::contiguous, d.seq, R);
    baton::ring_attention attn(comm, logging_backend{{}, &log}, sharding);
    run_rank<double>(attn, sharding, attn.shard_index(), p, mask, result, 0);
  });
  CHECK(compare(result, p.reference).max() <= 1e-12);
  const std::string kv = std::to_string(baton::detail::cp::tag_kv), grad = std::to_string(baton::detail::cp::tag_grad);
  for (const event_log& log : logs) {
    std::vector<std::string> e;  // without the agreement's traffic
    for (const auto& x : log.events)
      if (x.find(std::to_string(baton::detail::cp::tag_agree)) == std::string::npos) e.push_back(x);
    // forward: R-1 times [start K/V shifts (K and V), compute, wait for both], then the last
    // block
    std::vector<std::string> forward;
    for (int s = 0; s < R - 1; ++s)
      forward.insert(forward.end(), {"shift " + kv, "shift " + kv, "compute", "wait " + kv, "wait " + kv});
    forward.push_back("compute");
    // backward: the own block's dK/dV stays home, so the first accumulator shift starts after
    // the second step's compute; each is waited for only after the NEXT step's compute; the
    // last one (the hop home) after the loop
    std::vector<std::string> backward{"shift " + kv, "shift " + kv, "compute", "wait " + kv, "wait " + kv};
    for (int s = 1; s < R - 1; ++s) {
      backward.insert(backward.end(), {"shift " + kv, "shift " + kv, "compute"});
      if (s > 1) backward.push_back("wait " + grad);
      backward.insert(backward.end(), {"shift " + grad, "wait " + kv, "wait " + kv});
    }
    backward.insert(backward.end(), {"compute", "wait " + grad, "shift " + grad, "wait " + grad});
    std::vector<std::string> expected = forward;
    expected.insert(expected.end(), backward.begin(), backward.end());
    CHECK(e == expected);
  }
}

namespace {
// run_rank with every output a strided view into padded storage (head dim padded by 2, LSE
// rows by 3), so that the ring accumulates in buffers of its own and copies at the end,
// where dense float and double outputs are accumulated in place. The padding holds a
// sentinel the ring must leave alone.
template <class T, class Attention, class Mask>
void run_rank_padded(Attention& attn, const baton::sequence_sharding& sharding, int rank, const problem<T>& p,
                     const Mask& mask, tensors<T>& result, std::int64_t& padding_changed) {
  using L = baton::lse_t<T>;
  const dims& d = p.d;
  const std::int64_t sl = sharding.local_len(rank), pd = d.dim + 2, ps = sl + 3;
  const rank_inputs<T> in = shard_inputs(sharding, rank, p);
  const auto &q = in.q, &k = in.k, &v = in.v, &dout = in.dout;
  const auto &qshape = in.qshape, &kvshape = in.kvshape, &lshape = in.lshape;
  const T sentinel = T(-12345);
  std::vector<T> out(static_cast<std::size_t>(d.batch * sl * d.heads_q * pd), sentinel), dq(out),
      dk(static_cast<std::size_t>(d.batch * sl * d.heads_kv * pd), sentinel), dv(dk);
  std::vector<L> lse(static_cast<std::size_t>(d.batch * d.heads_q * ps), L(sentinel));
  const auto padded = [&](auto* data, std::int64_t heads) {
    return baton::make_tensor_view(data, std::array<std::int64_t, 4>{d.batch, sl, heads, d.dim},
                                   std::array<std::int64_t, 4>{sl * heads * pd, heads * pd, pd, 1});
  };
  const auto lse_view = [&](auto* data) {
    return baton::make_tensor_view(data, std::array<std::int64_t, 3>{d.batch, d.heads_q, sl},
                                   std::array<std::int64_t, 3>{d.heads_q * ps, ps, 1});
  };
  attn.forward(cview4(q, d.batch, sl, d.heads_q, d.dim), cview4(k, d.batch, sl, d.heads_kv, d.dim),
               cview4(v, d.batch, sl, d.heads_kv, d.dim), mask, padded(out.data(), d.heads_q), lse_view(lse.data()));
  attn.backward(cview4(q, d.batch, sl, d.heads_q, d.dim), cview4(k, d.batch, sl, d.heads_kv, d.dim),
                cview4(v, d.batch, sl, d.heads_kv, d.dim), padded(static_cast<const T*>(out.data()), d.heads_q),
                lse_view(static_cast<const L*>(lse.data())), cview4(dout, d.batch, sl, d.heads_q, d.dim), mask,
                padded(dq.data(), d.heads_q), padded(dk.data(), d.heads_kv), padded(dv.data(), d.heads_kv));
  // Back to dense, counting the padding elements that lost their sentinel.
  const auto dense = [&](const std::vector<T>& src, std::int64_t heads) {
    std::vector<T> o(static_cast<std::size_t>(d.batch * sl * heads * d.dim));
    for (std::size_t row = 0; row < static_cast<std::size_t>(d.batch * sl * heads); ++row)
      for (std::size_t x = 0; x < static_cast<std::size_t>(pd); ++x) {
        const T value = src[row * static_cast<std::size_t>(pd) + x];
        if (x < static_cast<std::size_t>(d.dim)) o[row * static_cast<std::size_t>(d.dim) + x] = value;
        else padding_changed += value != sentinel;
      }
    return o;
  };
  std::vector<L> lse_dense(static_cast<std::size_t>(d.batch * d.heads_q * sl));
  for (std::size_t row = 0; row < static_cast<std::size_t>(d.batch * d.heads_q); ++row)
    for (std::size_t s = 0; s < static_cast<std::size_t>(ps); ++s) {
      const L value = lse[row * static_cast<std::size_t>(ps) + s];
      if (s < static_cast<std::size_t>(sl)) lse_dense[row * static_cast<std::size_t>(sl) + s] = value;
      else padding_changed += value != L(sentinel);
    }
  baton::unshard_sequence<T>(sharding, rank, dense(out, d.heads_q), qshape, 1, result.out);
  baton::unshard_sequence<L>(sharding, rank, lse_dense, lshape, 2, result.lse);
  baton::unshard_sequence<T>(sharding, rank, dense(dq, d.heads_q), qshape, 1, result.dq);
  baton::unshard_sequence<T>(sharding, rank, dense(dk, d.heads_kv), kvshape, 1, result.dk);
  baton::unshard_sequence<T>(sharding, rank, dense(dv, d.heads_kv), kvshape, 1, result.dv);
}

template <class T>
void check_padded_outputs() {
  const dims d{};
  for_each_mask(d.seq, [&](const auto& mask, const char* mask_name) {
    const problem<T> p = make_problem<T>(d, mask, 97);
    for (const config& c : {config{mode::ring, shard_layout::zigzag, 3}, config{mode::hybrid, shard_layout::striped, 2, 2}}) {
      INFO(c.text() << ", mask " << mask_name);
      const tensors<T> dense = run_cp<T>(c, p, mask);
      const baton::sequence_sharding sharding = c.m == mode::hybrid
                                                    ? baton::sequence_sharding(c.layout, d.seq, c.degree, c.inner_degree)
                                                    : baton::sequence_sharding(c.layout, d.seq, c.degree);
      tensors<T> strided(d);
      std::vector<std::int64_t> changed(static_cast<std::size_t>(c.world()), 0);
      baton::run_local(c.world(), [&](baton::local_communicator& comm) {
        std::int64_t& mine = changed[static_cast<std::size_t>(comm.rank())];
        if (c.m == mode::ring) {
          baton::ring_attention attn(comm, baton::reference_attention{}, sharding);
          run_rank_padded<T>(attn, sharding, attn.shard_index(), p, mask, strided, mine);
        } else {
          auto mesh = baton::make_cp_mesh(comm, c.degree, c.inner_degree);
          baton::hybrid_attention attn(mesh, baton::reference_attention{}, sharding);
          run_rank_padded<T>(attn, sharding, attn.shard_index(), p, mask, strided, mine);
        }
      });
      for (std::int64_t n : changed) CHECK(n == 0);
      CHECK(strided.out == dense.out);
      CHECK(std::memcmp(strided.lse.data(), dense.lse.data(), dense.lse.size() * sizeof(dense.lse[0])) == 0);
      CHECK(strided.dq == dense.dq);
      CHECK(strided.dk == dense.dk);
      CHECK(strided.dv == dense.dv);
    }
  });
}
}  // namespace

// Dense float and double outputs are the ring's accumulators themselves; strided ones get
// accumulators of their own and a copy at the end. Both must give the same bits.
TEST_CASE("ring and hybrid write strided outputs with the bits of dense ones, and leave the padding alone",
          "[cp][ring][hybrid]") {
  check_padded_outputs<float>();
  check_padded_outputs<double>();
}
