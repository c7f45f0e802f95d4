// torch_cp_attention: ring, Ulysses and hybrid attention as a LibTorch autograd function, against
// attention written with torch::softmax on the whole sequence (in double), outputs and the
// gradients of q, k and v.
//
// Tolerance: float 1e-5 of the largest magnitude (baton's reference backend accumulates in
// double; what remains is float storage of inputs and results), double 1e-12.
#include "torch_test_util.hpp"  // first: see the comment there
#include "catch.hpp"

#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/cp/hybrid.hpp>
#include <baton/cp/ring.hpp>
#include <baton/cp/ulysses.hpp>
#include <baton/torch.hpp>

#include <cmath>
#include <mutex>
#include <string>
#include <vector>

using namespace torch_test;

namespace {

struct attention_case {
  std::int64_t batch = 2, seq = 16, heads = 4, kv_heads = 2, dim = 8;
};

// softmax(q k^T / sqrt(d) + mask) v over [batch, seq, heads, dim], k/v heads repeated for GQA.
torch::Tensor softmax_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal) {
  const auto group = q.size(2) / k.size(2);
  const auto kr = k.repeat_interleave(group, 2), vr = v.repeat_interleave(group, 2);
  auto scores = torch::einsum("bqhd,bkhd->bhqk", {q, kr}) / std::sqrt(static_cast<double>(q.size(3)));
  if (causal) {
    const auto s = q.size(1);
    const auto allowed = torch::ones({s, s}, torch::kBool).tril();
    scores = scores.masked_fill(allowed.logical_not(), -std::numeric_limits<double>::infinity());
  }
  return torch::einsum("bhqk,bkhd->bqhd", {torch::softmax(scores, -1), vr});
}

struct full_sequence {
  torch::Tensor q, k, v, dout;            // inputs, in the test's dtype
  torch::Tensor out, dq, dk, dv;          // expected, in double
};

full_sequence make_case(const attention_case& c, torch::Dtype dtype, bool causal) {
  torch::manual_seed(11);
  full_sequence f;
  f.q = torch::randn({c.batch, c.seq, c.heads, c.dim}).to(dtype);
  f.k = torch::randn({c.batch, c.seq, c.kv_heads, c.dim}).to(dtype);
  f.v = torch::randn({c.batch, c.seq, c.kv_heads, c.dim}).to(dtype);
  f.dout = torch::randn({c.batch, c.seq, c.heads, c.dim}).to(dtype);
  // Copies (to() of a double tensor would return the tensor itself, making the inputs leaves).
  auto q = f.q.to(torch::kDouble, false, true).requires_grad_(), k = f.k.to(torch::kDouble, false, true).requires_grad_(),
       v = f.v.to(torch::kDouble, false, true).requires_grad_();
  f.out = softmax_attention(q, k, v, causal);
  (f.out * f.dout.to(torch::kDouble)).sum().backward();
  f.out = f.out.detach();
  f.dq = q.grad();
  f.dk = k.grad();
  f.dv = v.grad();
  return f;
}

struct shard_result {
  torch::Tensor out, dq, dk, dv;
};

// Each rank: its shard of q, k, v as leaves, attention, backward with its shard of dout.
template <class Strategy, class Mask>
shard_result run_shard(Strategy& strategy, const Mask& mask, const full_sequence& f,
                       const baton::sequence_sharding& sharding, int shard) {
  auto q = baton::torch_shard_sequence(f.q, sharding, shard).requires_grad_();
  auto k = baton::torch_shard_sequence(f.k, sharding, shard).requires_grad_();
  auto v = baton::torch_shard_sequence(f.v, sharding, shard).requires_grad_();
  baton::torch_cp_attention attention(strategy, mask);
  torch::Tensor out = attention(q, k, v);
  (out * baton::torch_shard_sequence(f.dout, sharding, shard)).sum().backward();
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

void compare_shard(const shard_result& got, const full_sequence& f, const baton::sequence_sharding& sharding, int shard,
                   double tolerance) {
  INFO("shard " << shard);
  // Each shard is compared with the same rows of the full-sequence result, against the
  // largest magnitude of the whole expected tensor.
  const auto err = [&](const torch::Tensor& mine, const torch::Tensor& all) {
    const auto expected = baton::torch_shard_sequence(all, sharding, shard);
    const double scale = all.abs().max().item<double>();
    return (mine.to(torch::kDouble) - expected).abs().max().item<double>() / scale;
  };
  CHECK(err(got.out, f.out) <= tolerance);
  CHECK(err(got.dq, f.dq) <= tolerance);
  CHECK(err(got.dk, f.dk) <= tolerance);
  CHECK(err(got.dv, f.dv) <= tolerance);
}

double tolerance_of(torch::Dtype dtype) { return dtype == torch::kFloat ? 1e-5 : 1e-12; }

// Every rank of a local world of `ranks` runs the strategy `make(comm, sharding)` on its shard
// of one case; each shard is compared with the full-sequence attention.
template <class Mask, class MakeStrategy>
void check_strategy(int ranks, baton::shard_layout layout, torch::Dtype dtype, bool causal, MakeStrategy make) {
  const attention_case c;
  const auto f = make_case(c, dtype, causal);
  const baton::sequence_sharding sharding(layout, c.seq, ranks);
  std::vector<shard_result> results(static_cast<std::size_t>(ranks));
  baton::run_local(ranks, [&](baton::local_communicator& comm) {
    one_torch_thread();
    auto strategy = make(comm, sharding);
    results[static_cast<std::size_t>(comm.rank())] = run_shard(strategy, Mask{}, f, sharding, comm.rank());
  });
  for (int r = 0; r < ranks; ++r) compare_shard(results[static_cast<std::size_t>(r)], f, sharding, r, tolerance_of(dtype));
}

template <class Mask>
void check_ring(int ranks, baton::shard_layout layout, torch::Dtype dtype, bool causal) {
  check_strategy<Mask>(ranks, layout, dtype, causal, [](baton::local_communicator& comm, const auto& sharding) {
    return baton::ring_attention(comm, baton::reference_attention{}, sharding);
  });
}

template <class Mask>
void check_ulysses(int ranks, torch::Dtype dtype, bool causal) {
  check_strategy<Mask>(ranks, baton::shard_layout::zigzag, dtype, causal,
                       [](baton::local_communicator& comm, const auto& sharding) {
                         return baton::ulysses_attention(comm, baton::reference_attention{}, sharding);
                       });
}

}  // namespace

TEST_CASE("torch_cp_attention: ring attention equals softmax attention on the whole sequence", "[torch][cp]") {
  const auto dtype = GENERATE(torch::kFloat, torch::kDouble);
  INFO((dtype == torch::kFloat ? "float" : "double"));
  SECTION("causal, zigzag, 2 ranks") { check_ring<baton::causal_mask>(2, baton::shard_layout::zigzag, dtype, true); }
  SECTION("causal, zigzag, 4 ranks") { check_ring<baton::causal_mask>(4, baton::shard_layout::zigzag, dtype, true); }
  SECTION("causal, contiguous, 2 ranks") { check_ring<baton::causal_mask>(2, baton::shard_layout::contiguous, dtype, true); }
  SECTION("full, striped, 4 ranks") { check_ring<baton::no_mask>(4, baton::shard_layout::striped, dtype, false); }
}

TEST_CASE("torch_cp_attention: Ulysses attention (grouped-query heads) equals softmax attention", "[torch][cp]") {
  const auto dtype = GENERATE(torch::kFloat, torch::kDouble);
  INFO((dtype == torch::kFloat ? "float" : "double"));
  SECTION("causal, 2 ranks") { check_ulysses<baton::causal_mask>(2, dtype, true); }
  SECTION("full, 2 ranks") { check_ulysses<baton::no_mask>(2, dtype, false); }
}

TEST_CASE("torch_cp_attention: hybrid attention (2 x 2) equals softmax attention", "[torch][cp]") {
  const attention_case c;
  const auto f = make_case(c, torch::kFloat, true);
  const baton::sequence_sharding sharding(baton::shard_layout::zigzag, c.seq, 2, 2);
  std::vector<shard_result> results(4);
  baton::run_local(4, [&](baton::local_communicator& world) {
    one_torch_thread();
    auto mesh = baton::make_cp_mesh(world, 2, 2);
    baton::hybrid_attention hybrid(mesh.ulysses, mesh.ring, baton::reference_attention{}, sharding);
    results[static_cast<std::size_t>(world.rank())] =
        run_shard(hybrid, baton::causal_mask{}, f, sharding, hybrid.shard_index());
  });
  const baton::sequence_sharding same = sharding;
  for (int r = 0; r < 4; ++r) compare_shard(results[static_cast<std::size_t>(r)], f, same, r, 1e-5);
}

TEST_CASE("torch_cp_attention: one backend on whole sequences, and the errors for bad tensors", "[torch][cp]") {
  const attention_case c;
  const auto f = make_case(c, torch::kDouble, true);
  baton::reference_attention backend;
  const baton::sequence_sharding whole(baton::shard_layout::contiguous, c.seq, 1);
  compare_shard(run_shard(backend, baton::causal_mask{}, f, whole, 0), f, whole, 0, 1e-12);

  baton::torch_cp_attention attention(backend, baton::causal_mask{});
  CHECK_THROWS_WITH(attention(f.q.view({c.batch, c.seq, -1}), f.k, f.v),
                    Catch::Contains("[batch, seq, heads, head_dim]") && Catch::Contains("reshape"));
  CHECK_THROWS_WITH(attention(f.q.to(torch::kHalf), f.k.to(torch::kHalf), f.v.to(torch::kHalf)),
                    Catch::Contains("Half") && Catch::Contains("use float or double"));
  CHECK_THROWS_WITH(attention(f.q.to(torch::kFloat), f.k, f.v), Catch::Contains("share one dtype"));
}

TEST_CASE("torch_cp_attention: the header's example", "[torch][cp][docs]") {
  const attention_case c;
  const auto f = make_case(c, torch::kFloat, true);
  const baton::sequence_sharding sharding(baton::shard_layout::zigzag, c.seq, 2);
  std::vector<shard_result> results(2);
  baton::run_local(2, [&](baton::local_communicator& cp_comm) {
    one_torch_thread();
    const int shard = cp_comm.rank();
    const torch::Tensor q = baton::torch_shard_sequence(f.q, sharding, shard).requires_grad_();
    const torch::Tensor k = baton::torch_shard_sequence(f.k, sharding, shard).requires_grad_();
    const torch::Tensor v = baton::torch_shard_sequence(f.v, sharding, shard).requires_grad_();
    // [doc:torch_cp_attention_comment]
    baton::ring_attention ring(cp_comm, baton::reference_attention{}, sharding);
    baton::torch_cp_attention attention(ring, baton::causal_mask{});
    torch::Tensor out = attention(q, k, v);  // [batch, seq / cp, heads, head_dim]
    // [/doc:torch_cp_attention_comment]
    (out * baton::torch_shard_sequence(f.dout, sharding, shard)).sum().backward();
    results[static_cast<std::size_t>(shard)] = {out.detach(), q.grad(), k.grad(), v.grad()};
  });
  for (int r = 0; r < 2; ++r) compare_shard(results[static_cast<std::size_t>(r)], f, sharding, r, 1e-5);
}
