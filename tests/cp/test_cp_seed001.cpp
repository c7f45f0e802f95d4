// Seed 001: a ring-attention backward that re-read the K/V saved at step 0 produced gradients
// off by 150-700 % with no error. These tests pin the three things that make it impossible
// here, and show that the tests themselves would catch that bug.
#include "catch.hpp"
#include "cp_test_support.hpp"

#include <map>

using namespace cp_test;
using baton::shard_layout;

namespace {

// Rows of a gathered [b, S, h, d] tensor that `rank` holds, in its local order.
template <class T>
std::vector<T> rows_of(const baton::sequence_sharding& s, int rank, const std::vector<T>& full, const dims& d,
                       std::int64_t heads) {
  return baton::shard_sequence<T>(s, rank, full, std::vector<std::int64_t>{d.batch, d.seq, heads, d.dim}, 1);
}

template <class T>
double norm(const std::vector<T>& v) {
  long double s = 0;
  for (T x : v) s += static_cast<long double>(x) * x;
  return static_cast<double>(std::sqrt(s));
}

// A backend with seed 001's bug: backward keeps the K/V of its first call and differentiates
// every later call against them, as a backward reading ctx.saved_tensors from ring step 0.
struct stale_kv_backend {
  baton::reference_attention inner;
  std::shared_ptr<std::map<int, std::pair<std::vector<double>, std::vector<double>>>> saved =
      std::make_shared<std::map<int, std::pair<std::vector<double>, std::vector<double>>>>();
  int rank = 0;

  template <class Q, class K, class V, class M, class O, class L>
  void forward(Q q, K k, V v, const M& mask, O out, L lse, const baton::attention_params& p) const {
    inner.forward(q, k, v, mask, out, lse, p);
  }
  template <class Q, class K, class V, class O, class L, class D, class M, class G1, class G2, class G3>
  void backward(Q q, K k, V v, O out, L lse, D dout, const M& mask, G1 dq, G2 dk, G3 dv,
                const baton::attention_params& p) const {
    auto& slot = saved->at(rank);
    if (slot.first.empty()) {  // "ctx.save_for_backward" at step 0
      slot.first.assign(k.data, k.data + k.size());
      slot.second.assign(v.data, v.data + v.size());
    }
    const auto stale_k = baton::make_tensor_view(static_cast<const double*>(slot.first.data()), k.extents());
    const auto stale_v = baton::make_tensor_view(static_cast<const double*>(slot.second.data()), v.extents());
    inner.backward(q, stale_k, stale_v, out, lse, dout, mask, dq, dk, dv, p);
  }
};

}  // namespace

TEMPLATE_TEST_CASE("seed 001: ring backward with R = 2 and 4 matches the full-sequence reference", "[cp][seed001]",
                   float, double) {
  const dims d{2, 32, 4, 2, 8};
  const auto layout = GENERATE(shard_layout::contiguous, shard_layout::zigzag);
  for (int R : {2, 4}) {
    for_each_mask(d.seq, [&](const auto& mask, const char* mask_name) {
      const problem<TestType> p = make_problem<TestType>(d, mask, 101);
      const errors e = compare(run_cp<TestType>(config{mode::ring, layout, R}, p, mask), p.reference);
      INFO("ring " << R << " " << baton::to_string(layout) << ", mask " << mask_name << ": dq " << e.dq << " dk "
                   << e.dk << " dv " << e.dv);
      CHECK(e.dq <= tolerance<TestType>());
      CHECK(e.dk <= tolerance<TestType>());
      CHECK(e.dv <= tolerance<TestType>());
    });
  }
}

TEST_CASE("seed 001: the parity test catches a backward that reuses step-0 K/V", "[cp][seed001]") {
  const dims d{1, 16, 2, 2, 4};
  const baton::no_mask mask;
  const problem<double> p = make_problem<double>(d, mask, 111);
  for (int R : {2, 4}) {
    // each rank's copy of the backend gets its own slot in the shared map (keyed by the
    // rank the test assigns below), so the "saved" K/V are per rank as in the bug
    tensors<double> result(d);
    auto saved = std::make_shared<std::map<int, std::pair<std::vector<double>, std::vector<double>>>>();
    for (int r = 0; r < R; ++r) (*saved)[r];
    baton::run_local(R, [&](baton::local_communicator& comm) {
      const baton::sequence_sharding sharding(shard_layout::contiguous, d.seq, R);
      stale_kv_backend backend{{}, saved, comm.rank()};
      baton::ring_attention attn(comm, backend, sharding);
      run_rank<double>(attn, sharding, comm.rank(), p, mask, result, 0);
    });
    const errors e = compare(result, p.reference);
    INFO("R = " << R << ": the stale backend gives dq " << e.dq << " dk " << e.dk << " dv " << e.dv);
    CHECK(e.out <= 1e-12);  // the forward is right, as in the seed
    CHECK(e.dq > 0.1);      // and the backward is caught
    CHECK(e.dk > 0.1);
  }
}

namespace {
// Queries of ring group g may attend only to keys of ring group g+1 (mod R): every key's
// gradient comes from exactly one other group's queries, so an accumulator returned to the
// wrong rank (the last holder instead of the owner) puts gradients where zeros belong.
baton::block_mask next_group_mask(const baton::sequence_sharding& s) {
  auto group = std::make_shared<std::vector<int>>(static_cast<std::size_t>(s.seq_len()));
  for (int r = 0; r < s.ranks(); ++r)
    for (std::int64_t p : s.global_positions(r)) (*group)[static_cast<std::size_t>(p)] = r / s.inner_degree();
  const int R = s.degree();
  return baton::block_mask(
      [group, R](std::int64_t q, std::int64_t k) {
        return (*group)[static_cast<std::size_t>(k)] == ((*group)[static_cast<std::size_t>(q)] + 1) % R;
      },
      s.seq_len(), s.seq_len(), 4);
}

void check_ownership(const config& c, const dims& d) {
  const baton::sequence_sharding s(c.layout, d.seq, c.degree, c.inner_degree);
  const auto mask = next_group_mask(s);
  const problem<double> p = make_problem<double>(d, mask, 121);
  const tensors<double> got = run_cp<double>(c, p, mask);
  for (int r = 0; r < s.ranks(); ++r) {
    const auto dk = rows_of(s, r, got.dk, d, d.heads_kv), dv = rows_of(s, r, got.dv, d, d.heads_kv);
    const auto want_dk = rows_of(s, r, p.reference.dk, d, d.heads_kv);
    const auto want_dv = rows_of(s, r, p.reference.dv, d, d.heads_kv);
    INFO(c.text() << ", rank " << r);
    CHECK(norm(dk) > 0);  // the keys did receive gradient
    CHECK(rel_l2(dk, want_dk) <= 1e-12);
    CHECK(rel_l2(dv, want_dv) <= 1e-12);
    // the check discriminates: the gradients of the neighbouring ranks' keys are different
    for (int other = 0; other < s.ranks(); ++other) {
      if (other == r) continue;
      CHECK(rel_l2(rows_of(s, other, p.reference.dk, d, d.heads_kv), want_dk) > 0.5);
    }
  }
}
}  // namespace

TEST_CASE("seed 001: after the final hop every rank holds the dK/dV of its own keys", "[cp][seed001]") {
  const dims d{1, 24, 4, 2, 3};
  for (const config& c : {config{mode::ring, shard_layout::contiguous, 2}, config{mode::ring, shard_layout::zigzag, 3},
                          config{mode::ring, shard_layout::striped, 4}, config{mode::ring, shard_layout::zigzag, 4}}) {
    check_ownership(c, d);
  }
}

TEST_CASE("seed 001: the hybrid path (ring 2 x Ulysses 2) matches and routes dK/dV home", "[cp][seed001][hybrid]") {
  const dims d{1, 24, 4, 2, 3};
  for (auto layout : {shard_layout::contiguous, shard_layout::zigzag}) {
    check_ownership(config{mode::hybrid, layout, 2, 2}, d);
    const baton::causal_mask mask;
    const problem<double> p = make_problem<double>(d, mask, 131);
    const errors e = compare(run_cp<double>(config{mode::hybrid, layout, 2, 2}, p, mask), p.reference);
    INFO("hybrid 2x2 " << baton::to_string(layout) << ": dq " << e.dq << " dk " << e.dk << " dv " << e.dv);
    CHECK(e.max() <= 1e-12);
  }
}
