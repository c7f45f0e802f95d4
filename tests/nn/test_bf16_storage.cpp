// bf16 storage in the model layer (nn::activation_storage::bf16; docs/nn.md, "bf16 storage").
//
// Oracle: the same block in double over the reference attention (same initializer, the same
// inputs, which are float values widened exactly). Measure: nn_test::max_rel_error, the
// largest |error| over the largest |value| of the double result.
//
// The bound. bf16 keeps 8 significant bits: rounding a float to it is a relative error of at
// most u = 2^-8. To first order the errors of the roundings add along the backward, each
// scaled by how much the function it passes through amplifies a relative error. The longest
// chain, to dWq/dWk, rounds (1) the MLP's gate and up (their product enters d_gate and
// d_up: 2u), (2) the norm's x̂ (twice in its backward: 2u), (3) dO before the attention (u),
// (4) q, k, v and O (the scores are bilinear in q and k and pass through exp, whose relative
// error is the score's absolute error, |s| <= 2 for these unit-scale inputs: 4u; v and O: 2u),
// (5) dq, dk, dv after it (u), (6) the attention's input x in the projection gradient (u):
// 13u in all, which we round up to 16u = 2^-4 = 0.0625. Float storage (the same kernels,
// nothing rounded) stays within 1e-5; bf16 must show its rounding (error above u/16), so a
// storage setting that silently kept floats fails too.
//
// Bytes: after forward, each tensor the block keeps is counted at 2 bytes instead of 4,
// except 1/rms and the LSE (float) and the positions (int64): the exact sums are below.
// Around a ring, the K/V blocks a forward and a backward send are bf16: 0.50 of float's bytes,
// measured at the communicator. The backward's dK/dV blocks stay fp32 (the same bytes as
// float's): the CP layer sums the ring's partial gradients in fp32 on purpose (test_cp_bf16),
// so a backward moves (K/V / 2 + dK/dV) / (K/V + dK/dV) of float's, 0.83 here.
#include "catch.hpp"
#include "nn_test_util.hpp"
#include "skip.hpp"

#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/config.hpp>
#include <baton/core/tags.hpp>
#include <baton/cp.hpp>
#include <baton/nn.hpp>
#include <baton/nn/detail/storage.hpp>
#include <baton/pipeline/executor.hpp>
#include <baton/schedule.hpp>
#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

// Named, not anonymous: the executable is one unity translation unit with the other sources.
namespace bf16_storage_test {

namespace nn = baton::nn;
using nn::activation_storage;
using nn::recompute_policy;

constexpr double u = 0x1p-8;
constexpr std::int64_t batch = 2, seq = 40, d_model = 32, heads = 4, kv_heads = 2, head_dim = 8, hidden = 64;

nn::transformer_config config(activation_storage storage, recompute_policy policy = recompute_policy::none) {
  return {.d_model = d_model, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim, .ffn_hidden = hidden,
          .recompute = policy, .storage = storage};
}

template <class T>
struct block_run {
  baton::host_tensor<T> y, dx;
  std::map<std::string, baton::host_tensor<T>> grads;
  std::size_t kept_after_forward = 0;
};

template <class T>
baton::host_tensor<T> as(const baton::host_tensor<float>& x) {
  baton::host_tensor<T> out(x.shape());
  for (std::int64_t i = 0; i < x.size(); ++i) out[i] = static_cast<T>(x[i]);
  return out;
}

template <class T, class Backend>
block_run<T> run_block(const nn::transformer_config& c) {
  using strategy = nn::no_cp<Backend>;
  nn::transformer_block<T, strategy> block(c, nn::initializer(31), strategy{});
  const auto x = as<T>(nn_test::random_tensor<float>({batch, seq, d_model}, 5));
  const auto dy = as<T>(nn_test::random_tensor<float>({batch, seq, d_model}, 6));
  typename decltype(block)::saved st;
  block_run<T> r;
  r.y = block.forward(x, nn::sequence_info::whole(seq), st);
  r.kept_after_forward = st.bytes();
  r.dx = block.backward(st, dy);
  r.grads = nn_test::gradients_of<T>(block);
  return r;
}

// The largest error of y, dx and every weight gradient of `got` against the double run.
double worst_error(const block_run<float>& got, const block_run<double>& want, std::string& where) {
  double worst = 0;
  const auto see = [&](const std::string& name, double e) {
    if (e > worst) worst = e, where = name;
  };
  see("y", nn_test::max_rel_error(got.y, want.y));
  see("dx", nn_test::max_rel_error(got.dx, want.dx));
  for (const auto& [name, g] : want.grads) see(name, nn_test::max_rel_error(got.grads.at(name), g));
  return worst;
}

// After forward under bf16 storage, per token: norms x̂ (2 bytes) and 1/rms (4) twice;
// attention input (2), q, k, v, O (2), LSE (4 per head); MLP input, gate, up, product (2);
// selective drops the two inputs and the product; full keeps the input (2). Plus positions.
std::size_t bf16_bytes_after_forward(recompute_policy p) {
  const std::int64_t tokens = batch * seq, d = d_model, q = heads * head_dim, kv = kv_heads * head_dim, h = hidden;
  const std::size_t pos = seq * sizeof(std::int64_t);
  switch (p) {
    case recompute_policy::none:
      return static_cast<std::size_t>(tokens * (2 * (2 * d + 4) + 2 * d + 2 * (2 * q + 2 * kv) + 4 * heads + 2 * d + 6 * h)) + pos;
    case recompute_policy::selective:
      return static_cast<std::size_t>(tokens * (2 * (2 * d + 4) + 2 * (2 * q + 2 * kv) + 4 * heads + 4 * h)) + pos;
    case recompute_policy::full:
      return static_cast<std::size_t>(tokens * 2 * d) + pos;
  }
  return 0;
}

#if BATON_HAS_KOKKOS()
// A ring communicator that counts the bytes it shifts with the context-parallel data tags —
// K/V blocks (tags::cp::tag<1>) and gradient blocks (tag<2>); the agreement's descriptors
// (tag<0>) are the same in both storages and not counted — and forwards everything to the
// local world.
struct shifted_bytes {
  std::size_t kv = 0, grad = 0;
};

class counting_ring {
 public:
  counting_ring(baton::local_communicator& comm, shifted_bytes& counted) : comm_(&comm), counted_(&counted) {}
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  auto shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    if (tag == baton::tags::cp::tag<1>) counted_->kv += send.size();
    if (tag == baton::tags::cp::tag<2>) counted_->grad += send.size();
    return comm_->shift(send, recv, k, tag);
  }

 private:
  baton::local_communicator* comm_;
  shifted_bytes* counted_;  // this rank's (one thread's) counts
};
static_assert(baton::ring_communicator<counting_ring>);

struct ring_bytes {
  shifted_bytes forward, backward;
  baton::host_tensor<float> y;
};

// Rank 0's shifted bytes in one forward and one backward of a block over ring attention on 2
// ranks (zigzag), and its output.
ring_bytes run_ring(activation_storage storage) {
  constexpr std::int64_t global_seq = 128;
  std::vector<ring_bytes> per_rank(2);
  baton::run_local(2, [&](baton::local_communicator& comm) {
    shifted_bytes counted;
    counting_ring ring(comm, counted);
    using strategy = baton::ring_attention<counting_ring, baton::kokkos_attention>;
    const baton::sequence_sharding sharding(baton::shard_layout::zigzag, global_seq, 2);
    nn::transformer_block<float, strategy> block(config(storage), nn::initializer(31),
                                                 strategy(ring, baton::kokkos_attention{}, sharding));
    const auto x = nn_test::random_tensor<float>({1, sharding.local_len(), d_model}, 40 + comm.rank());
    typename decltype(block)::saved st;
    ring_bytes& r = per_rank[static_cast<std::size_t>(comm.rank())];
    r.y = block.forward(x, nn::sequence_info::shard(sharding, comm.rank()), st);
    r.forward = counted;
    (void)block.backward(st, r.y);
    r.backward = {counted.kv - r.forward.kv, counted.grad - r.forward.grad};
  });
  return per_rank[0];
}
// A communicator that counts the bytes the pipeline sends with its data tags (from
// tags::pipeline::first + 2: after its agreement and its loss) — each message's header (the
// first send on a tag: shapes) apart from its tensors — and forwards to the local world.
struct sent_bytes {
  std::size_t headers = 0, data = 0;
  std::map<int, int> sends_on_tag;
};

class counting_p2p {
 public:
  counting_p2p(baton::local_communicator& comm, sent_bytes& counted) : comm_(&comm), counted_(&counted) {}
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  auto isend(std::span<const std::byte> data, int dest, int tag) {
    if (tag >= baton::tags::pipeline::first + 2)
      (counted_->sends_on_tag[tag]++ == 0 ? counted_->headers : counted_->data) += data.size();
    return comm_->isend(data, dest, tag);
  }
  auto irecv(std::span<std::byte> data, int source, int tag) { return comm_->irecv(data, source, tag); }

 private:
  baton::local_communicator* comm_;
  sent_bytes* counted_;  // this rank's (one thread's) counts
};
static_assert(baton::point_to_point_communicator<counting_p2p>);

struct pipeline_run {
  sent_bytes sent;  // both ranks together
  double loss = 0;
};

// One 1F1B step of a 2-stage lm_stage pipeline (one block per stage) on 2 ranks, 2
// microbatches of 2 rows x 32 tokens: the activations go 0 -> 1, their gradients 1 -> 0.
pipeline_run run_pipeline(activation_storage storage) {
  constexpr std::int64_t rows = 4, tokens = 32;
  nn::transformer_config c = config(storage);
  c.vocab = 64;
  const auto input = nn_test::random_tokens({rows, tokens}, c.vocab, 8);
  const auto targets = nn_test::random_tokens({rows, tokens}, c.vocab, 9);
  std::vector<sent_bytes> per_rank(2);
  std::vector<double> losses(2, 0.0);
  baton::run_local(2, [&](baton::local_communicator& comm) {
    counting_p2p counted(comm, per_rank[static_cast<std::size_t>(comm.rank())]);
    using stage = nn::lm_stage<float, nn::no_cp<baton::kokkos_attention>>;
    const auto make_stage = [&](int s) {
      return stage(c, nn::lm_stage_layout::of(s, 2, 2), nn::initializer(3),
                   [] { return nn::no_cp<baton::kokkos_attention>{}; });
    };
    auto exec = baton::make_pipeline<baton::one_f_one_b, baton::uniform_stages<stage>>(
        counted, baton::shape_for<baton::one_f_one_b>(2, 2), make_stage, nn::lm_loss<float>{});
    const baton::step_report r = exec.step(nn::lm_input<float>(input), nn::sequence_info::whole(tokens), targets);
    if (r.loss) losses[static_cast<std::size_t>(comm.rank())] = *r.loss;
  });
  pipeline_run out;
  for (const sent_bytes& b : per_rank) {
    out.sent.headers += b.headers;
    out.sent.data += b.data;
  }
  out.loss = losses[1];
  return out;
}
#endif

TEST_CASE("bf16 storage: a block's output and gradients against the double block within 16u", "[nn][memory][can-skip][bf16_block]") {
#if BATON_HAS_KOKKOS()
  for (const recompute_policy policy : {recompute_policy::none, recompute_policy::selective, recompute_policy::full}) {
    const auto want = run_block<double, baton::reference_attention>(config(activation_storage::native, policy));
    const auto native = run_block<float, baton::kokkos_attention>(config(activation_storage::native, policy));
    const auto bf16 = run_block<float, baton::kokkos_attention>(config(activation_storage::bf16, policy));
    std::string where_native, where_bf16;
    const double e_native = worst_error(native, want, where_native), e_bf16 = worst_error(bf16, want, where_bf16);
    INFO("policy " << nn::to_string(policy) << ": float storage " << e_native << " (" << where_native << "), bf16 "
                   << e_bf16 << " (" << where_bf16 << "), bound 16u = " << 16 * u);
    CHECK(e_native <= 1e-5);
    CHECK(e_bf16 <= 16 * u);
    CHECK(e_bf16 >= u / 16);
    // What the state holds: the exact sum, about half of float's.
    CHECK(bf16.kept_after_forward == bf16_bytes_after_forward(policy));
    CHECK(static_cast<double>(bf16.kept_after_forward) < 0.56 * static_cast<double>(native.kept_after_forward));
    // Both: bf16 storage and bf16 products (--dtype bf16 in baton-train): within the products'
    // bound, their errors dominating (the storage's roundings are a subset of the operands').
    nn::transformer_config both = config(activation_storage::bf16, policy);
    both.matmul = nn::matmul_precision::bf16;
    std::string where_both;
    const double e_both = worst_error(run_block<float, baton::kokkos_attention>(both), want, where_both);
    INFO("bf16 storage and products: " << e_both << " (" << where_both << ") = " << e_both / u << "u");
    CHECK(e_both <= 32 * u);
  }
#else
  BATON_SKIP("built without Kokkos: bf16 storage runs the attention on a backend that takes bfloat16 (kokkos_attention)");
#endif
}

// bf16 matrix products (transformer_config::matmul = matmul_precision::bf16): every projection
// (q, k, v, o, gate, up, down) rounds both operands to bf16 and sums in float, forward and
// backward. Oracle and measure as above. The bound, by the same first-order count: a product
// on two rounded operands is 2u off. Forward: q and k (2u each) give the scores 4u, and
// through exp (|s| <= 2) P 8u; v 2u, so O 10u; O Wo adds 2u: the attention's output 12u; the
// MLP's gate and up add 2u on top of their input's error, and the product doubles it... but the
// residual stream carries x exactly, so the block's output is x + small terms and its error is
// that of those terms over the output's scale. Backward to dWq/dWk (the longest chain): dy Wdownᵀ,
// d_gate/d_up, the two products back to the norm (2u each: 6u), the norm (2u as in the storage
// count), dO Woᵀ (2u), dP from dO and v (4u), dS through P (8u), dq = dS k (2u), and the weight
// product x̂ᵀ dq (2u): 26u, rounded up to 32u = 2^-3. A run that kept float products would be
// within the float bound (1e-5), so e >= u/16 shows the rounding happened.
TEST_CASE("bf16 matmul: a block's output and gradients against the double block within 32u", "[nn][memory]") {
  for (const recompute_policy policy : {recompute_policy::none, recompute_policy::selective, recompute_policy::full}) {
    const auto want = run_block<double, baton::reference_attention>(config(activation_storage::native, policy));
    nn::transformer_config c = config(activation_storage::native, policy);
    // [doc:bf16_matmul]
    c.matmul = nn::matmul_precision::bf16;  // q, k, v, o, gate, up, down on bf16 operands, float sums
    // [/doc:bf16_matmul]
    const auto got = run_block<float, baton::reference_attention>(c);
    std::string where;
    const double e = worst_error(got, want, where);
    INFO("policy " << nn::to_string(policy) << ": bf16 products " << e << " (" << where << ") = " << e / u
                   << "u; bound 32u = " << 32 * u << "; kernel " << baton::detail::nn::bf16_gemm_implementation());
    CHECK(e <= 32 * u);
    CHECK(e >= u / 16);
    // Recomputation runs the same products on the same operands: the bits of policy none.
    if (policy != recompute_policy::none) {
      c.recompute = recompute_policy::none;
      const auto none = run_block<float, baton::reference_attention>(c);
      CHECK(nn_test::max_rel_error(got.dx, none.dx) == 0.0);
      for (const auto& [name, g] : none.grads) CHECK(nn_test::max_rel_error(got.grads.at(name), g) == 0.0);
    }
  }
}

TEST_CASE("bf16 matmul: refused for double blocks and for a value that is no precision", "[nn][memory]") {
  nn::transformer_config c = config(activation_storage::native);
  c.matmul = nn::matmul_precision::bf16;
  using double_block = nn::transformer_block<double, nn::no_cp<baton::reference_attention>>;
  CHECK_THROWS_WITH(double_block(c, nn::initializer(1), {}),
                    Catch::Contains("matmul_precision::bf16 rounds float operands to bf16") &&
                        Catch::Contains("use matmul_precision::native"));
  c.matmul = static_cast<nn::matmul_precision>(5);
  CHECK_THROWS_WITH(c.resolved(), Catch::Contains("matmul = 5 is not a matmul precision"));
  using float_block = nn::transformer_block<float, nn::no_cp<baton::reference_attention>>;
  float_block block(config(activation_storage::native), nn::initializer(1), {});
  CHECK(block.matmul() == nn::matmul_precision::native);
  block.set_matmul(nn::matmul_precision::bf16);
  CHECK(block.matmul() == nn::matmul_precision::bf16);
  CHECK(block.mlp().down().matmul() == nn::matmul_precision::bf16);
  CHECK(block.attention().wo().matmul() == nn::matmul_precision::bf16);
  CHECK(nn::to_string(nn::matmul_precision::bf16) == "bf16");
}

TEST_CASE("bf16 storage: K/V blocks around the ring are half of float's bytes, measured at the communicator", "[nn][cp][memory][can-skip][bf16_ring]") {
#if BATON_HAS_KOKKOS()
  const ring_bytes f = run_ring(activation_storage::native), b = run_ring(activation_storage::bf16);
  // One hop on 2 ranks: this rank's K and V shard, [1, 64, kv_heads, head_dim].
  const std::size_t kv_elements = 2 * 64 * kv_heads * head_dim;
  CHECK(f.forward.kv == kv_elements * sizeof(float));
  CHECK(b.forward.kv == kv_elements * sizeof(baton::bfloat16));
  CHECK(f.forward.grad + b.forward.grad == 0);
  const auto ratio = [](std::size_t num, std::size_t den) { return static_cast<double>(num) / static_cast<double>(den); };
  const double forward_ratio = ratio(b.forward.kv, f.forward.kv);
  const double backward_kv_ratio = ratio(b.backward.kv, f.backward.kv);
  INFO("forward K/V " << b.forward.kv << " / " << f.forward.kv << " bytes; backward K/V " << b.backward.kv << " / "
                      << f.backward.kv << ", dK/dV " << b.backward.grad << " / " << f.backward.grad);
  CHECK(std::abs(forward_ratio - 0.50) <= 0.01);
  CHECK(std::abs(backward_kv_ratio - 0.50) <= 0.01);
  CHECK(b.backward.grad == f.backward.grad);  // the dK/dV accumulators stay fp32
  CHECK(nn_test::max_rel_error(b.y, f.y) <= 16 * u);
#else
  BATON_SKIP("built without Kokkos: bf16 storage runs the attention on a backend that takes bfloat16 (kokkos_attention)");
#endif
}

// The MLP under bf16 storage writes its bf16 copies in the pass that computes the product and
// reads them widened in its backward (swiglu_mlp's bf16_copies overloads). Oracle: the route
// they replace — the float forward, each tensor rounded by detail::nn::to_bf16 afterwards, and
// the float backward over the widened copies — which must give the same bits. hidden = 37 is
// not a multiple of any vector width, so the scalar tails run too.
TEST_CASE("bf16 storage: the MLP's fused copies are the bits of rounding afterwards, forward and backward", "[nn][memory]") {
  using tensor = baton::host_tensor<float>;
  using half = baton::host_tensor<baton::bfloat16>;
  namespace dn = baton::detail::nn;
  const std::int64_t d = 24, h = 37;
  const nn::swiglu_mlp<float> mlp(d, h, nn::initializer(3));
  // Scale 3: pre-activations of several units, where sigmoid's both branches and rounding ties occur.
  const tensor x = nn_test::random_tensor<float>({3, 5, d}, 11, 3.0), dy = nn_test::random_tensor<float>({3, 5, d}, 12);
  const auto same_bits = [](const auto& a, const auto& b) {
    return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(*a.data())) == 0;
  };

  nn::swiglu_mlp<float>::saved plain, fused;
  const tensor y_plain = mlp.forward(x, plain);
  half gate16, up16, product16;
  const tensor y_fused = mlp.forward(tensor(x), fused, {&gate16, &up16, &product16});
  CHECK(same_bits(y_fused, y_plain));
  CHECK(same_bits(gate16, dn::to_bf16(plain.gate)));
  CHECK(same_bits(up16, dn::to_bf16(plain.up)));
  CHECK(same_bits(product16, dn::to_bf16(plain.product)));
  CHECK(fused.gate.size() + fused.up.size() == 0);  // no float copy of either is kept
  CHECK(same_bits(fused.product, plain.product));   // the down projection's input (in the gate's buffer)

  // Recompute selective: the product again from the bf16 copies, in bf16.
  nn::swiglu_mlp<float>::saved widened_state;
  widened_state.gate = dn::widened<float>(gate16);
  widened_state.up = dn::widened<float>(up16);
  mlp.restore_product(widened_state);
  CHECK(same_bits(mlp.restore_product(gate16, up16), dn::to_bf16(widened_state.product)));

  // The backward from the copies against the float backward over the widened copies.
  nn::swiglu_mlp<float>::saved old_route = plain;
  old_route.gate = dn::widened<float>(gate16);
  old_route.up = dn::widened<float>(up16);
  const tensor dx_old = mlp.backward_input(old_route, dy);
  const tensor dx_fused = mlp.backward_input(fused, dy, std::move(gate16), std::move(up16));
  CHECK(same_bits(dx_fused, dx_old));
  CHECK(same_bits(fused.d_gate, old_route.d_gate));
  CHECK(same_bits(fused.d_up, old_route.d_up));
  CHECK(gate16.size() + up16.size() == 0);  // freed once the gradient pass has read them

  // Copies of another width, or a gate without its up, are refused with the reason.
  nn::swiglu_mlp<float>::saved again;
  mlp.forward(tensor(x), again, {&gate16, &up16, nullptr});
  const half narrow = half::for_overwrite({3, 5, h - 1});
  CHECK_THROWS_WITH(mlp.backward_input(again, dy, half(narrow), half(narrow)),
                    Catch::Contains("needs the gate and up pre-activations"));
  CHECK_THROWS_WITH(mlp.restore_product(gate16, half::for_overwrite({3, 5, h, 1})),
                    Catch::Contains("needs the gate and up pre-activations"));
  CHECK_THROWS_WITH(mlp.forward(tensor(x), again, {&gate16, nullptr, nullptr}),
                    Catch::Contains("needs somewhere to put gate and up"));
}

// RMSNorm under bf16 storage rounds x̂ (kept in bf16 only) and a copy of its output in its row
// loop. Oracle: the float forward, then detail::nn::to_bf16 of x̂ and of the output.
TEST_CASE("bf16 storage: RMSNorm's row-loop roundings are the bits of rounding afterwards", "[nn][memory]") {
  using tensor = baton::host_tensor<float>;
  using half = baton::host_tensor<baton::bfloat16>;
  namespace dn = baton::detail::nn;
  nn::rms_norm<float> norm(37);
  const tensor gain = nn_test::random_tensor<float>({37}, 21);
  std::copy(gain.data(), gain.data() + gain.size(), norm.gain().value.data());
  const tensor x = nn_test::random_tensor<float>({3, 5, 37}, 22, 3.0);
  const auto same_bits = [](const auto& a, const auto& b) {
    return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(*a.data())) == 0;
  };
  nn::rms_norm<float>::saved plain, fused, x_hat_only;
  const tensor y_plain = norm.forward(x, plain);
  half x_hat16, y16, x_hat16_only;
  const tensor y_fused = norm.forward(x, fused, {&x_hat16, &y16});
  CHECK(same_bits(y_fused, y_plain));
  CHECK(same_bits(fused.inv_rms, plain.inv_rms));
  CHECK(same_bits(x_hat16, dn::to_bf16(plain.x_hat)));
  CHECK(same_bits(y16, dn::to_bf16(y_plain)));
  CHECK(fused.x_hat.size() == 0);  // x̂ is kept in bf16 only
  CHECK(same_bits(norm.forward(x, x_hat_only, {&x_hat16_only, nullptr}), y_plain));
  CHECK(same_bits(x_hat16_only, x_hat16));
  CHECK_THROWS_WITH(norm.forward(x, fused, {nullptr, &y16}), Catch::Contains("needs somewhere to put x̂"));
}

// RoPE under bf16 storage rotates q and k straight into bf16 and rotates dq, dk back out of
// bf16 into float. Oracle: rotating in float and rounding afterwards (forward), widening first
// and rotating in float (backward).
TEST_CASE("bf16 storage: RoPE into and out of bf16 gives the bits of converting apart", "[nn][memory]") {
  using tensor = baton::host_tensor<float>;
  using half = baton::host_tensor<baton::bfloat16>;
  namespace dn = baton::detail::nn;
  const std::int64_t rows = 2, tokens = 7, n_heads = 3, dim = 10;
  const nn::rotary_embedding<float> rope(dim);
  const std::vector<std::int64_t> positions{3, 9, 0, 15, 100, 4096, 7};  // a shard's global positions
  const std::vector<float>& table = rope.table(positions);
  const tensor x = nn_test::random_tensor<float>({rows, tokens, n_heads, dim}, 31, 3.0);
  const auto same_bits = [](const auto& a, const auto& b) {
    return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.size()) * sizeof(*a.data())) == 0;
  };
  tensor rotated = x;
  rope.apply(rotated.data(), rows, tokens, n_heads, table, false);
  half rotated16 = half::for_overwrite(x.shape());
  rope.apply(x.data(), rotated16.data(), rows, tokens, n_heads, table, false);
  CHECK(same_bits(rotated16, dn::to_bf16(rotated)));

  const half g16 = dn::to_bf16(x);
  tensor back = dn::widened<float>(g16);
  rope.apply(back.data(), rows, tokens, n_heads, table, true);
  tensor back_fused = tensor::for_overwrite(x.shape());
  rope.apply(g16.data(), back_fused.data(), rows, tokens, n_heads, table, true);
  CHECK(same_bits(back_fused, back));
  // And a rotation really happened (the inverse of the forward, up to rounding).
  CHECK(!same_bits(back_fused, dn::widened<float>(g16)));
}

#if defined(__GNUC__)
// The vector rounding and widening the fused pass uses against the scalar bfloat16 conversion,
// on every upper half (sign, exponent, the 7 kept mantissa bits) with the lower halves that
// decide the rounding: 0, just below, at and just above the tie, the largest, and two others;
// NaNs (quiet and signalling), infinities, subnormals and the values that round to infinity
// are among them.
TEST_CASE("bf16 storage: vector rounding to bf16 and widening equal the scalar conversions bit for bit", "[nn][memory]") {
  namespace simd = baton::detail::core::simd;
  constexpr int w = simd::width_v<float>;
  const std::uint32_t lows[] = {0x0000, 0x7fff, 0x8000, 0x8001, 0xffff, 0x1234, 0xc001};
  std::vector<float> in;
  for (std::uint32_t high = 0; high < 0x10000; ++high)
    for (const std::uint32_t low : lows) in.push_back(std::bit_cast<float>(high << 16 | low));
  REQUIRE(in.size() % w == 0);
  std::int64_t rounding_mismatches = 0, widening_mismatches = 0;
  for (std::size_t i = 0; i < in.size(); i += w) {
    simd::vec_t<float> v;
    std::memcpy(&v, in.data() + i, sizeof v);
    baton::bfloat16 out[w];
    baton::detail::nn::store_bf16(out, v);
    const simd::vec_t<float> back = baton::detail::nn::load_widened(out);
    for (int j = 0; j < w; ++j) {
      rounding_mismatches += out[j].bits != baton::bfloat16(in[i + j]).bits;
      widening_mismatches += std::bit_cast<std::uint32_t>(back[j]) != std::bit_cast<std::uint32_t>(out[j].to_float());
    }
  }
  INFO(in.size() << " values, " << w << " a vector");
  CHECK(rounding_mismatches == 0);
  CHECK(widening_mismatches == 0);
}
#endif

TEST_CASE("bf16 storage: refused where the attention cannot take bf16, and a bad value is refused", "[nn][memory]") {
  using ref_block = nn::transformer_block<float, nn::no_cp<baton::reference_attention>>;
  CHECK_THROWS_WITH(ref_block(config(activation_storage::bf16), nn::initializer(1), {}),
                    Catch::Contains("needs float blocks and an attention backend that takes bfloat16") &&
                        Catch::Contains("use activation_storage::native"));
  ref_block block(config(activation_storage::native), nn::initializer(1), {});
  CHECK_THROWS_WITH(block.set_storage(activation_storage::bf16), Catch::Contains("baton::kokkos_attention"));
  CHECK_THROWS_WITH(block.set_storage(static_cast<activation_storage>(7)),
                    Catch::Contains("storage = 7 is not an activation storage"));
  nn::transformer_config bad = config(activation_storage::native);
  bad.storage = static_cast<activation_storage>(9);
  CHECK_THROWS_WITH(bad.resolved(), Catch::Contains("storage = 9 is not an activation storage"));
  CHECK(block.storage() == activation_storage::native);
  CHECK(nn::to_string(activation_storage::bf16) == "bf16");
}

TEST_CASE("bf16 storage: stage-to-stage messages and their gradients are half of float's bytes", "[nn][memory][can-skip][bf16_messages]") {
#if BATON_HAS_KOKKOS()
  const pipeline_run f = run_pipeline(activation_storage::native), b = run_pipeline(activation_storage::bf16);
  // 2 microbatches x (activation + gradient) of [2, 32, d_model].
  const std::size_t elements = 2 * 2 * (2 * 32 * d_model);
  CHECK(f.sent.data == elements * sizeof(float));
  CHECK(b.sent.data == elements * sizeof(baton::bfloat16));
  const double data_ratio = static_cast<double>(b.sent.data) / static_cast<double>(f.sent.data);
  INFO("data " << b.sent.data << " / " << f.sent.data << " bytes, headers " << b.sent.headers << " / " << f.sent.headers
               << "; loss " << b.loss << " / " << f.loss);
  CHECK(std::abs(data_ratio - 0.50) <= 0.01);
  // Each message's header (its shapes, a fixed size) is the same in both: at these tiny
  // messages it is as large as the data; at the sizes (a [1, 4096, 512] activation,
  // 8 MiB in float) it is below 0.1 % of a message.
  CHECK(b.sent.headers == f.sent.headers);
  CHECK(std::abs(b.loss - f.loss) <= 16 * u * std::abs(f.loss));
#else
  BATON_SKIP("built without Kokkos: bf16 storage runs the attention on a backend that takes bfloat16 (kokkos_attention)");
#endif
}

}  // namespace bf16_storage_test
