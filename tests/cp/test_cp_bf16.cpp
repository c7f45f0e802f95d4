// The context-parallel layer with 16-bit storage (baton::bfloat16) on host memory: the path
// where the accumulators (float, cp_accumulator_t<bfloat16>) are wider than the storage. There
// each ring step's backward writes bf16 blocks that the layer adds in fp32, instead of the
// backend adding into the accumulators itself (params.accumulate, the float and double path);
// Ulysses sums replicated heads in fp32. The real bf16 backend, cuda_attention, runs the same
// modes in test_cp_nccl_gpu on a GPU; here a stand-in backend computes in double on the bf16
// values and rounds its outputs to bf16, as a 16-bit backend does.
//
// Oracle: the same stand-in on the whole sequence, one rank. The sharded run rounds each
// block's output and gradients to bf16 before the fp32 merge or sum (bf16 keeps 8 significant
// bits: relative rounding 2^-9 = 2e-3 per value), and sums up to 4 such blocks per element:
// relative L2 error below 1e-2 (measured: at most 4.0e-3; 0 where a row's keys all lie in one
// block). A lost or doubled block contribution is an error of order 1 (dropping the dV sum of
// the ring's bf16 path fails 5 of the 25 checks).
#include "catch.hpp"
#include "cp_test_support.hpp"

#include <baton/attention/cuda/storage.hpp>
#include <baton/attention/reference.hpp>
#include <baton/config.hpp>
#include <baton/cp.hpp>
#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif
#include "skip.hpp"

#include <cstddef>
#include <cstdint>
#include <vector>

namespace {

using baton::bfloat16;
using cp_test::mode;

template <class S, std::size_t N>
std::vector<double> widened(baton::tensor_view<S, N> t) {
  std::vector<double> out;
  out.reserve(static_cast<std::size_t>(t.size()));
  if constexpr (N == 4) {
    for (std::int64_t b = 0; b < t.extent(0); ++b)
      for (std::int64_t s = 0; s < t.extent(1); ++s)
        for (std::int64_t h = 0; h < t.extent(2); ++h)
          for (std::int64_t x = 0; x < t.extent(3); ++x) out.push_back(static_cast<double>(t(b, s, h, x).to_float()));
  } else {
    for (std::int64_t b = 0; b < t.extent(0); ++b)
      for (std::int64_t h = 0; h < t.extent(1); ++h)
        for (std::int64_t s = 0; s < t.extent(2); ++s) out.push_back(static_cast<double>(t(b, h, s)));
  }
  return out;
}

// Writes `values` (dense, t's extents) into t, rounded to t's element type; with `add`, onto
// what t holds, summed in float and rounded once.
template <class E, std::size_t N>
void store(const std::vector<double>& values, baton::tensor_view<E, N> t, bool add) {
  std::size_t i = 0;
  if constexpr (N == 4) {
    for (std::int64_t b = 0; b < t.extent(0); ++b)
      for (std::int64_t s = 0; s < t.extent(1); ++s)
        for (std::int64_t h = 0; h < t.extent(2); ++h)
          for (std::int64_t x = 0; x < t.extent(3); ++x, ++i) {
            E& target = t(b, s, h, x);
            const float sum = (add ? target.to_float() : 0.0f) + static_cast<float>(values[i]);
            target = bfloat16(sum);
          }
  } else {
    for (std::int64_t b = 0; b < t.extent(0); ++b)
      for (std::int64_t h = 0; h < t.extent(1); ++h)
        for (std::int64_t s = 0; s < t.extent(2); ++s, ++i) t(b, h, s) = static_cast<float>(values[i]);
  }
}

template <std::size_t N>
baton::tensor_view<double, N> dense(std::vector<double>& v, const std::array<std::int64_t, N>& extents) {
  return baton::make_tensor_view(v.data(), extents);
}
template <std::size_t N>
baton::tensor_view<const double, N> cdense(const std::vector<double>& v, const std::array<std::int64_t, N>& extents) {
  return baton::make_tensor_view(v.data(), extents);
}

// Reference attention in double on bf16 values; outputs rounded to bf16, the LSE in float.
struct bf16_reference {
  template <class Mask>
  void forward(baton::tensor_view<const bfloat16, 4> q, baton::tensor_view<const bfloat16, 4> k,
               baton::tensor_view<const bfloat16, 4> v, const Mask& mask, baton::tensor_view<bfloat16, 4> out,
               baton::tensor_view<float, 3> lse, const baton::attention_params& params) const {
    const auto qd = widened(q), kd = widened(k), vd = widened(v);
    std::vector<double> od(static_cast<std::size_t>(out.size())), ld(static_cast<std::size_t>(lse.size()));
    baton::reference_attention{}.forward(cdense(qd, q.extents()), cdense(kd, k.extents()), cdense(vd, v.extents()), mask,
                                         dense(od, out.extents()), dense(ld, lse.extents()), params);
    store(od, out, false);
    store(ld, lse, false);
  }

  template <class Mask>
  void backward(baton::tensor_view<const bfloat16, 4> q, baton::tensor_view<const bfloat16, 4> k,
                baton::tensor_view<const bfloat16, 4> v, baton::tensor_view<const bfloat16, 4> out,
                baton::tensor_view<const float, 3> lse, baton::tensor_view<const bfloat16, 4> dout, const Mask& mask,
                baton::tensor_view<bfloat16, 4> dq, baton::tensor_view<bfloat16, 4> dk, baton::tensor_view<bfloat16, 4> dv,
                const baton::attention_params& params) const {
    const auto qd = widened(q), kd = widened(k), vd = widened(v), od = widened(out), ld = widened(lse),
               dod = widened(dout);
    std::vector<double> dqd(static_cast<std::size_t>(dq.size())), dkd(static_cast<std::size_t>(dk.size())),
        dvd(static_cast<std::size_t>(dv.size()));
    baton::attention_params overwrite = params;
    overwrite.accumulate = false;
    baton::reference_attention{}.backward(cdense(qd, q.extents()), cdense(kd, k.extents()), cdense(vd, v.extents()),
                                          cdense(od, out.extents()), cdense(ld, lse.extents()), cdense(dod, dout.extents()),
                                          mask, dense(dqd, dq.extents()), dense(dkd, dk.extents()), dense(dvd, dv.extents()),
                                          overwrite);
    store(dqd, dq, params.accumulate);
    store(dkd, dk, params.accumulate);
    store(dvd, dv, params.accumulate);
  }
};
static_assert(baton::attention_backend<bf16_reference, bfloat16>);

std::vector<bfloat16> rounded(const std::vector<float>& v) {
  std::vector<bfloat16> out;
  out.reserve(v.size());
  for (const float x : v) out.emplace_back(x);
  return out;
}

std::vector<float> widened(const std::vector<bfloat16>& v) {
  std::vector<float> out;
  out.reserve(v.size());
  for (const bfloat16 x : v) out.push_back(x.to_float());
  return out;
}

cp_test::tensors<float> as_float(const cp_test::tensors<bfloat16>& t, const cp_test::dims& d) {
  cp_test::tensors<float> f(d);
  f.out = widened(t.out);
  f.dq = widened(t.dq);
  f.dk = widened(t.dk);
  f.dv = widened(t.dv);
  f.lse = t.lse;
  return f;
}

// Every mode of `configs` with `backend` on each rank, against the stand-in on the whole
// sequence on one rank (for the Kokkos kernels an independent oracle: the stand-in computes in
// double; their own float error, 1e-5 of the largest value, is far inside the bound above).
template <class Backend>
void check_modes_against_one_rank(const Backend& backend) {
  // 30 tokens: uneven zigzag shards over 4 ranks; 4 query heads over 2 kv heads (GQA).
  const cp_test::dims d{2, 30, 4, 2, 8};
  const std::vector<cp_test::config> configs{
      {mode::ring, baton::shard_layout::contiguous, 2},
      {mode::ring, baton::shard_layout::zigzag, 3},
      {mode::ring, baton::shard_layout::striped, 4},
      {mode::ulysses, baton::shard_layout::zigzag, 2},
      {mode::hybrid, baton::shard_layout::zigzag, 2, 2},
  };
  cp_test::for_each_mask(d.seq, [&](const auto& mask, const char* mask_name) {
    const auto p = cp_test::make_problem<float>(d, mask, 71);
    cp_test::problem<bfloat16> pb(d);
    pb.q = rounded(p.q);
    pb.k = rounded(p.k);
    pb.v = rounded(p.v);
    pb.dout = rounded(p.dout);
    const baton::sequence_sharding whole(baton::shard_layout::contiguous, d.seq, 1);
    const cp_test::tensors<float> oracle =
        as_float(cp_test::run_cp_sharded<bfloat16>({mode::ring, baton::shard_layout::contiguous, 1}, whole, pb, mask, 0,
                                                   bf16_reference{}),
                 d);
    for (const cp_test::config& c : configs) {
      INFO(c.text() << ", mask " << mask_name);
      const auto got = as_float(cp_test::run_cp<bfloat16>(c, pb, mask, 0, backend), d);
      const cp_test::errors e = cp_test::compare(got, oracle);
      INFO("relative L2: out " << e.out << ", lse " << e.lse << ", dq " << e.dq << ", dk " << e.dk << ", dv " << e.dv);
      CHECK(e.max() < 1e-2);
    }
  });
}

}  // namespace

TEST_CASE("cp with bfloat16 storage: ring, Ulysses and hybrid against the same backend on one rank",
          "[cp][bf16]") {
  check_modes_against_one_rank(bf16_reference{});
}

// bf16 K/V blocks around the ring through the Kokkos kernels, the layer's sums in fp32.
TEST_CASE("cp with bfloat16 storage over kokkos_attention", "[cp][bf16][can-skip][kokkos_bf16]") {
#if BATON_HAS_KOKKOS()
  static_assert(baton::attention_backend<baton::kokkos_attention, bfloat16>);
  check_modes_against_one_rank(baton::kokkos_attention{});
#else
  BATON_SKIP("built without Kokkos (or in a sanitizer build, which leaves the Kokkos pairing to the release build)");
#endif
}
