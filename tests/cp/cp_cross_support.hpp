// Shared by the cross-attention tests (test_cp_cross.cpp, and over the Kokkos backend
// test_cp_kokkos.cpp): a problem of Sq queries and Sk keys with its oracle (reference
// attention in double on one rank over all of q and k/v, the keys at the offset's positions),
// and a driver that runs ring / Ulysses / hybrid built with a kv_sharding on the local world
// and gathers every rank's results back to full order.
#pragma once

#include "cp_test_support.hpp"

#include <baton/cp/cross.hpp>

#include <sstream>

namespace cross_test {

using baton::shard_layout;
using cp_test::mode;

struct cross_dims {
  std::int64_t batch = 2, seq_q = 5, seq_k = 23, heads_q = 4, heads_kv = 2, dim = 3;
  std::int64_t q_elems() const { return batch * seq_q * heads_q * dim; }
  std::int64_t kv_elems() const { return batch * seq_k * heads_kv * dim; }
  std::int64_t lse_elems() const { return batch * heads_q * seq_q; }
};

struct results {
  std::vector<double> out, dq, dk, dv, lse;
  explicit results(const cross_dims& d)
      : out(static_cast<std::size_t>(d.q_elems())), dq(out.size()), dk(static_cast<std::size_t>(d.kv_elems())),
        dv(dk.size()), lse(static_cast<std::size_t>(d.lse_elems())) {}
};

struct cross_problem {
  cross_dims d;
  std::int64_t kv_offset = 0;
  std::vector<double> q, k, v, dout;
  results want;
  cross_problem(const cross_dims& dd, std::int64_t offset) : d(dd), kv_offset(offset), want(dd) {}
};

template <class T>
baton::tensor_view<T, 4> v4(std::vector<T>& x, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t e) {
  return baton::make_tensor_view(x.data(), {b, s, h, e});
}
template <class T>
baton::tensor_view<const T, 4> c4(const std::vector<T>& x, std::int64_t b, std::int64_t s, std::int64_t h,
                                  std::int64_t e) {
  return baton::make_tensor_view(x.data(), {b, s, h, e});
}

// The oracle: reference attention in double over all Sq queries and all Sk keys on one rank,
// the keys at positions kv_offset.. as the CP layer places them.
template <class Mask>
cross_problem make_cross(const cross_dims& d, std::int64_t kv_offset, const Mask& mask, std::uint32_t seed) {
  cross_problem p(d, kv_offset);
  p.q = cp_test::random_values<double>(static_cast<std::size_t>(d.q_elems()), seed);
  p.k = cp_test::random_values<double>(static_cast<std::size_t>(d.kv_elems()), seed + 1);
  p.v = cp_test::random_values<double>(static_cast<std::size_t>(d.kv_elems()), seed + 2);
  p.dout = cp_test::random_values<double>(static_cast<std::size_t>(d.q_elems()), seed + 3);
  baton::attention_params params;
  params.k_pos = baton::positions(kv_offset, d.seq_k);
  baton::reference_attention ref;
  auto& w = p.want;
  const auto q = c4(p.q, d.batch, d.seq_q, d.heads_q, d.dim), k = c4(p.k, d.batch, d.seq_k, d.heads_kv, d.dim),
             v = c4(p.v, d.batch, d.seq_k, d.heads_kv, d.dim);
  ref.forward(q, k, v, mask, v4(w.out, d.batch, d.seq_q, d.heads_q, d.dim),
              baton::make_tensor_view(w.lse.data(), {d.batch, d.heads_q, d.seq_q}), params);
  ref.backward(q, k, v, c4(w.out, d.batch, d.seq_q, d.heads_q, d.dim),
               baton::make_tensor_view(static_cast<const double*>(w.lse.data()), {d.batch, d.heads_q, d.seq_q}),
               c4(p.dout, d.batch, d.seq_q, d.heads_q, d.dim), mask, v4(w.dq, d.batch, d.seq_q, d.heads_q, d.dim),
               v4(w.dk, d.batch, d.seq_k, d.heads_kv, d.dim), v4(w.dv, d.batch, d.seq_k, d.heads_kv, d.dim), params);
  return p;
}

struct setup {
  mode m = mode::ring;
  int degree = 2, inner = 1;
  shard_layout q_layout = shard_layout::contiguous, kv_layout = shard_layout::contiguous;
  int world() const { return degree * inner; }
  baton::sequence_sharding sharding(shard_layout layout, std::int64_t seq) const {
    return baton::sequence_sharding(layout, seq, degree, inner);
  }
  std::string text() const {
    std::ostringstream s;
    s << cp_test::name(m) << " " << degree << (m == mode::hybrid ? "x" + std::to_string(inner) : "") << " q "
      << baton::to_string(q_layout) << " kv " << baton::to_string(kv_layout);
    return s.str();
  }
};

// One rank: shard q and k/v by their own shardings, forward and backward, write the results
// into this rank's positions of `got` (ranks write disjoint elements).
template <class Attention, class Mask>
void run_rank(Attention& attn, int rank, const cross_problem& p, const Mask& mask, results& got) {
  const cross_dims& d = p.d;
  const baton::sequence_sharding& qs = attn.sharding();
  const baton::sequence_sharding& ks = attn.kv().sharding;
  const std::int64_t nq = qs.local_len(rank), nk = ks.local_len(rank);
  const std::vector<std::int64_t> qshape{d.batch, d.seq_q, d.heads_q, d.dim}, kshape{d.batch, d.seq_k, d.heads_kv, d.dim},
      lshape{d.batch, d.heads_q, d.seq_q};
  const auto q = baton::shard_sequence<double>(qs, rank, p.q, qshape, 1);
  const auto dout = baton::shard_sequence<double>(qs, rank, p.dout, qshape, 1);
  const auto k = baton::shard_sequence<double>(ks, rank, p.k, kshape, 1);
  const auto v = baton::shard_sequence<double>(ks, rank, p.v, kshape, 1);
  std::vector<double> out(q.size()), dq(q.size()), dk(k.size()), dv(k.size()),
      lse(static_cast<std::size_t>(d.batch * d.heads_q * nq));
  const auto qv = c4(q, d.batch, nq, d.heads_q, d.dim), kv = c4(k, d.batch, nk, d.heads_kv, d.dim),
             vv = c4(v, d.batch, nk, d.heads_kv, d.dim);
  attn.forward(qv, kv, vv, mask, v4(out, d.batch, nq, d.heads_q, d.dim),
               baton::make_tensor_view(lse.data(), {d.batch, d.heads_q, nq}));
  attn.backward(qv, kv, vv, c4(out, d.batch, nq, d.heads_q, d.dim),
                baton::make_tensor_view(static_cast<const double*>(lse.data()), {d.batch, d.heads_q, nq}),
                c4(dout, d.batch, nq, d.heads_q, d.dim), mask, v4(dq, d.batch, nq, d.heads_q, d.dim),
                v4(dk, d.batch, nk, d.heads_kv, d.dim), v4(dv, d.batch, nk, d.heads_kv, d.dim));
  baton::unshard_sequence<double>(qs, rank, out, qshape, 1, got.out);
  baton::unshard_sequence<double>(qs, rank, lse, lshape, 2, got.lse);
  baton::unshard_sequence<double>(qs, rank, dq, qshape, 1, got.dq);
  baton::unshard_sequence<double>(ks, rank, dk, kshape, 1, got.dk);
  baton::unshard_sequence<double>(ks, rank, dv, kshape, 1, got.dv);
}

// With the given shardings (c's mode and degrees; its layouts unused).
template <class Mask, class Backend = baton::reference_attention>
results run_cross(const setup& c, const baton::sequence_sharding& qs, const baton::kv_sharding& kv,
                  const cross_problem& p, const Mask& mask, Backend backend = {}) {
  results got(p.d);
  // NaN where nothing was written, so a position no rank wrote cannot pass.
  for (auto* t : {&got.out, &got.dq, &got.dk, &got.dv, &got.lse})
    std::fill(t->begin(), t->end(), std::numeric_limits<double>::quiet_NaN());
  baton::run_local(c.world(), [&](baton::local_communicator& comm) {
    if (c.m == mode::ring) {
      baton::ring_attention attn(comm, backend, qs, kv);
      run_rank(attn, attn.shard_index(), p, mask, got);
    } else if (c.m == mode::ulysses) {
      baton::ulysses_attention attn(comm, backend, qs, kv);
      run_rank(attn, attn.shard_index(), p, mask, got);
    } else {
      auto mesh = baton::make_cp_mesh(comm, c.degree, c.inner);
      baton::hybrid_attention attn(mesh, backend, qs, kv);
      run_rank(attn, attn.shard_index(), p, mask, got);
    }
  });
  return got;
}

// Over c's layouts.
template <class Mask, class Backend = baton::reference_attention>
results run_cross(const setup& c, const cross_problem& p, const Mask& mask, Backend backend = {}) {
  return run_cross(c, c.sharding(c.q_layout, p.d.seq_q), baton::kv_sharding{c.sharding(c.kv_layout, p.d.seq_k), p.kv_offset},
                   p, mask, std::move(backend));
}

struct cross_errors {
  double out, lse, dq, dk, dv;
  double max() const { return std::max({out, lse, dq, dk, dv}); }
};
inline cross_errors compare_cross(const results& got, const results& want) {
  using cp_test::rel_l2;
  return {rel_l2(got.out, want.out), rel_l2(got.lse, want.lse), rel_l2(got.dq, want.dq), rel_l2(got.dk, want.dk),
          rel_l2(got.dv, want.dv)};
}

// Every CP mode and degree the tests run: ring 2, 3, 4; Ulysses 2, 3 (4 query heads over 3
// ranks: dealt unevenly); hybrid 2 x 2.
inline std::vector<setup> modes() {
  return {{mode::ring, 2, 1},    {mode::ring, 3, 1},    {mode::ring, 4, 1},
          {mode::ulysses, 2, 1}, {mode::ulysses, 3, 1}, {mode::hybrid, 2, 2}};
}

// The masks of cross-attention, over Sq queries and Sk keys; f(mask, kv_offset, name).
//  - none;
//  - key padding: the last 3 keys are padding (an encoder batch padded to Sk);
//  - document pairs: keys after the queries (offset Sq); query document i attends to key
//    document i only; the queries' documents 0, 1, 2 over [0, Sq/3), [Sq/3, 2Sq/3), rest;
//    the keys' documents 0, 2, 3 (key document 3 has no queries, query document 1 no keys:
//    its rows attend to nothing, out 0 and lse -inf).
template <class F>
void for_each_cross_mask(const cross_dims& d, F&& f) {
  f(baton::no_mask{}, 0, "none");
  f(baton::padding_mask(baton::no_mask{}, d.seq_q, std::max<std::int64_t>(d.seq_k - 3, 1)), 0, "key padding");
  std::vector<std::int64_t> ids;
  for (std::int64_t i = 0; i < d.seq_q; ++i) ids.push_back(3 * i < d.seq_q ? 0 : 3 * i < 2 * d.seq_q ? 1 : 2);
  for (std::int64_t j = 0; j < d.seq_k; ++j) ids.push_back(2 * j < d.seq_k ? 0 : 4 * j < 3 * d.seq_k ? 2 : 3);
  f(baton::document_mask(ids), d.seq_q, "document pairs");
}

}  // namespace cross_test
