// Recomputation in the model layer (nn::recompute_policy; docs/nn.md, "Recomputation").
//
// What each policy promises, checked on transformer_block with I and W split and interleaved
// across microbatches (F0 F1 I1 F2 I0 W1 I2 W0 W2: states of three microbatches alive at
// once, I and W of one microbatch far apart):
//  - the input gradients and every weight gradient are those of `none`, bit for bit (the
//    recomputation runs the forward's own code on the same values; no tolerance is needed
//    and none is allowed), in float and double, with and without packed documents, and with
//    the policy changed between microbatches (each state follows the policy it was kept with);
//  - saved.bytes() is, after forward, exactly the sum stated in the block's comment for each
//    policy (full < selective < none), and after backward_input the same for every policy
//    (the state backward_weight reads);
//  - the policy is honoured: an attention backend that counts its calls sees the forward
//    called again in backward_input under full only, and nothing called in backward_weight;
//  - under context parallelism (ring, Ulysses, hybrid on local ranks), the same on every
//    rank, and full's recomputed forward makes exactly the attention calls of the forward
//    (the same ring steps and all-to-alls), selective none; a bad output gradient on one
//    rank under full stops every rank with that rank's message.
// Rank threads record; every Catch assertion runs on the main thread.
#include "catch.hpp"
#include "doc_output.hpp"
#include "nn_test_util.hpp"

#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/cp.hpp>
#include <baton/nn.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <iomanip>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

// Named, not anonymous: the executable is one unity translation unit with the other sources.
namespace recompute_test {

namespace nn = baton::nn;
using nn::recompute_policy;
using baton::local_communicator;
using baton::shard_layout;

constexpr std::array<recompute_policy, 3> all_policies{recompute_policy::none, recompute_policy::selective,
                                                       recompute_policy::full};

// An attention backend that counts its calls (shared by its copies: the strategy holds one)
// and computes with the reference backend.
struct call_counts {
  std::atomic<long> forward{0}, backward{0};
};

class counting_attention {
 public:
  counting_attention() : counts_(std::make_shared<call_counts>()) {}

  template <class... A>
  void forward(A&&... args) {
    counts_->forward.fetch_add(1);
    inner_.forward(std::forward<A>(args)...);
  }
  template <class... A>
  void backward(A&&... args) {
    counts_->backward.fetch_add(1);
    inner_.backward(std::forward<A>(args)...);
  }
  long forwards() const { return counts_->forward.load(); }
  long backwards() const { return counts_->backward.load(); }

 private:
  std::shared_ptr<call_counts> counts_;
  baton::reference_attention inner_;
};
static_assert(baton::attention_backend<counting_attention, float> && baton::attention_backend<counting_attention, double>);

// Sizes chosen so that every term of the byte accounting differs: d_model 16, 4 query heads
// and 2 kv heads of dim 4 (q 16 and k, v 8 features per token), ffn_hidden 24.
constexpr std::int64_t batch = 2, seq = 6, d_model = 16, heads = 4, kv_heads = 2, head_dim = 4, hidden = 24;

nn::transformer_config config(recompute_policy policy = recompute_policy::none) {
  return {.d_model = d_model, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim, .ffn_hidden = hidden,
          .recompute = policy};
}

// What the block keeps, from its comment, per token (N = batch x seq tokens), in T elements;
// the LSE (heads per token, lse_t<T> = T for float and double) and the positions (seq int64)
// added by each formula.
template <class T>
std::size_t bytes_after_forward(recompute_policy p, std::int64_t tokens = batch * seq, std::int64_t positions = seq) {
  const std::int64_t d = d_model, q = heads * head_dim, kv = kv_heads * head_dim, h = hidden;
  const std::size_t pos = static_cast<std::size_t>(positions) * sizeof(std::int64_t);
  switch (p) {
    case recompute_policy::none:  // norms x̂ + 1/rms twice; attention input, q, k, v, O, LSE; MLP input, gate, up, product
      return static_cast<std::size_t>(tokens * (2 * (d + 1) + d + 2 * q + 2 * kv + heads + d + 3 * h)) * sizeof(T) + pos;
    case recompute_policy::selective:  // less the attention's and the MLP's inputs and the product
      return static_cast<std::size_t>(tokens * (2 * (d + 1) + 2 * q + 2 * kv + heads + 2 * h)) * sizeof(T) + pos;
    case recompute_policy::full:  // the block's input
      return static_cast<std::size_t>(tokens * d) * sizeof(T) + pos;
  }
  return 0;
}

// After backward_input, for every policy: norms x̂, 1/rms, dy; attention input, O, dy, dq, dk,
// dv (q, k, v and the LSE freed); MLP input, product, dy, d_gate, d_up.
template <class T>
std::size_t bytes_after_input(std::int64_t tokens = batch * seq, std::int64_t positions = seq) {
  const std::int64_t d = d_model, q = heads * head_dim, kv = kv_heads * head_dim, h = hidden;
  return static_cast<std::size_t>(tokens * (2 * (2 * d + 1) + (2 * d + 2 * q + 2 * kv) + (2 * d + 3 * h))) * sizeof(T) +
         static_cast<std::size_t>(positions) * sizeof(std::int64_t);
}

template <class T>
using grads_t = std::map<std::string, baton::host_tensor<T>>;

template <class T>
bool same_bits(const baton::host_tensor<T>& a, const baton::host_tensor<T>& b) {
  if (a.shape() != b.shape()) return false;
  for (std::int64_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i])) return false;
  return true;
}

template <class T>
bool same_bits(const grads_t<T>& a, const grads_t<T>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, g] : b) {
    const auto it = a.find(name);
    if (it == a.end() || !same_bits(it->second, g)) return false;
  }
  return true;
}

template <class T>
struct interleaved_run {
  std::vector<baton::host_tensor<T>> dx;
  grads_t<T> grads;
  std::vector<std::size_t> after_forward, after_input, after_weight;
  long forwards_in_forward = 0, forwards_in_input = 0, backwards_in_input = 0, calls_in_weight = 0;
};

// F0 F1 I1 F2 I0 W1 I2 W0 W2 on one block, microbatch m kept under policies[m].
template <class T>
interleaved_run<T> run_interleaved(const std::array<recompute_policy, 3>& policies, bool documents) {
  using strategy = nn::no_cp<counting_attention>;
  using block_type = nn::transformer_block<T, strategy>;
  const counting_attention backend;
  block_type layer(config(), nn::initializer(31) / "layers" / 0, strategy(backend));
  nn::sequence_info info = nn::sequence_info::whole(seq);
  if (documents) {
    baton::host_tensor<std::int64_t> ids({batch, seq});
    for (std::int64_t s = 0; s < seq; ++s) {
      ids(std::int64_t{0}, s) = s < 2 ? 0 : 1;
      ids(std::int64_t{1}, s) = s < 4 ? 5 : 6;
    }
    info = info.with_documents(std::move(ids));
  }
  std::array<typename block_type::saved, 3> st;
  std::vector<baton::host_tensor<T>> x, dy;
  for (std::uint32_t m = 0; m < 3; ++m) {
    x.push_back(nn_test::random_tensor<T>({batch, seq, d_model}, 100 + m));
    dy.push_back(nn_test::random_tensor<T>({batch, seq, d_model}, 200 + m));
  }
  interleaved_run<T> r;
  r.dx.resize(3);
  r.after_forward.resize(3);
  r.after_input.resize(3);
  r.after_weight.resize(3);
  const auto F = [&](int m) {
    layer.set_recompute(policies[static_cast<std::size_t>(m)]);
    const long before = backend.forwards();
    (void)layer.forward(x[static_cast<std::size_t>(m)], info, st[static_cast<std::size_t>(m)]);
    r.forwards_in_forward += backend.forwards() - before;
    r.after_forward[static_cast<std::size_t>(m)] = st[static_cast<std::size_t>(m)].bytes();
  };
  const auto I = [&](int m) {
    const long f = backend.forwards(), b = backend.backwards();
    r.dx[static_cast<std::size_t>(m)] = layer.backward_input(st[static_cast<std::size_t>(m)], dy[static_cast<std::size_t>(m)]);
    r.forwards_in_input += backend.forwards() - f;
    r.backwards_in_input += backend.backwards() - b;
    r.after_input[static_cast<std::size_t>(m)] = st[static_cast<std::size_t>(m)].bytes();
  };
  const auto W = [&](int m) {
    const long calls = backend.forwards() + backend.backwards();
    layer.backward_weight(st[static_cast<std::size_t>(m)]);
    r.calls_in_weight += backend.forwards() + backend.backwards() - calls;
    r.after_weight[static_cast<std::size_t>(m)] = st[static_cast<std::size_t>(m)].bytes();
  };
  F(0), F(1), I(1), F(2), I(0), W(1), I(2), W(0), W(2);
  r.grads = nn_test::gradients_of<T>(layer);
  return r;
}

template <class T>
void check_policies_agree(bool documents) {
  const long calls_per_forward = documents ? batch : 1;  // one attention call per batch row with documents
  const interleaved_run<T> none = run_interleaved<T>({recompute_policy::none, recompute_policy::none, recompute_policy::none},
                                                     documents);
  // The run is not trivial: every gradient has a nonzero element.
  for (const auto& [name, g] : none.grads) {
    bool nonzero = false;
    for (std::int64_t i = 0; i < g.size(); ++i) nonzero = nonzero || g[i] != T(0);
    INFO(name);
    CHECK(nonzero);
  }
  for (recompute_policy p : all_policies) {
    INFO("policy " << nn::to_string(p) << (documents ? ", packed documents" : ""));
    const interleaved_run<T> r = run_interleaved<T>({p, p, p}, documents);
    for (std::size_t m = 0; m < 3; ++m) {
      INFO("microbatch " << m);
      CHECK(same_bits(r.dx[m], none.dx[m]));
      CHECK(r.after_forward[m] == bytes_after_forward<T>(p));
      CHECK(r.after_input[m] == bytes_after_input<T>());
      CHECK(r.after_weight[m] == 0);
    }
    CHECK(same_bits(r.grads, none.grads));
    CHECK(r.forwards_in_forward == 3 * calls_per_forward);
    CHECK(r.forwards_in_input == (p == recompute_policy::full ? 3 * calls_per_forward : 0));
    CHECK(r.backwards_in_input == 3 * calls_per_forward);
    CHECK(r.calls_in_weight == 0);
  }
  // Each state follows the policy it was kept with, whatever the block's policy is by then.
  const interleaved_run<T> mixed =
      run_interleaved<T>({recompute_policy::full, recompute_policy::selective, recompute_policy::none}, documents);
  for (std::size_t m = 0; m < 3; ++m) CHECK(same_bits(mixed.dx[m], none.dx[m]));
  CHECK(same_bits(mixed.grads, none.grads));
  CHECK(mixed.after_forward[0] == bytes_after_forward<T>(recompute_policy::full));
  CHECK(mixed.after_forward[1] == bytes_after_forward<T>(recompute_policy::selective));
  CHECK(mixed.forwards_in_input == calls_per_forward);
}


TEST_CASE("recompute: none, selective and full give the same gradients bit for bit, I and W interleaved", "[nn][memory]") {
  // The accounting's order, from the formulas themselves (and so the sizes above make it strict).
  CHECK(bytes_after_forward<float>(recompute_policy::full) < bytes_after_forward<float>(recompute_policy::selective));
  CHECK(bytes_after_forward<float>(recompute_policy::selective) < bytes_after_forward<float>(recompute_policy::none));
  SECTION("float") { check_policies_agree<float>(false); }
  SECTION("double") { check_policies_agree<double>(false); }
  SECTION("double, packed documents") { check_policies_agree<double>(true); }
}

TEST_CASE("recompute: the policy is a value of the config, of a block and of a stage, and a bad one is refused", "[nn][memory]") {
  using Catch::Contains;
  for (recompute_policy p : all_policies) CHECK(nn::parse_recompute_policy(nn::to_string(p)) == p);
  CHECK_THROWS_WITH(nn::parse_recompute_policy("fulll"),
                    Contains("'fulll' is not a recompute policy; choose none, selective or full"));
  const auto bad = static_cast<recompute_policy>(7);
  CHECK_THROWS_WITH(config(bad).resolved(), Contains("transformer_config: recompute = 7 is not a recompute policy"));
  CHECK(config(recompute_policy::selective).resolved().recompute == recompute_policy::selective);

  using strategy = nn::no_cp<baton::reference_attention>;
  nn::transformer_block<double, strategy> layer(config(recompute_policy::full), nn::initializer(1), strategy{});
  CHECK(layer.recompute() == recompute_policy::full);
  CHECK_THROWS_WITH(layer.set_recompute(bad), Contains("transformer_block: recompute = 7 is not a recompute policy"));
  CHECK(layer.recompute() == recompute_policy::full);

  // A stage: the config's policy reaches every block; set_recompute changes this stage's.
  auto model = config(recompute_policy::selective);
  model.vocab = 32;
  nn::lm_stage<double, strategy> stage(model, nn::lm_stage_layout::of(0, 2, 4), nn::initializer(1),
                                       [] { return strategy{}; });
  REQUIRE(stage.blocks().size() == 2);
  for (auto& b : stage.blocks()) CHECK(b.recompute() == recompute_policy::selective);
  stage.set_recompute(recompute_policy::full);
  CHECK(stage.recompute() == recompute_policy::full);
  for (auto& b : stage.blocks()) CHECK(b.recompute() == recompute_policy::full);
  CHECK_THROWS_WITH(stage.set_recompute(bad), Contains("lm_stage: recompute = 7 is not a recompute policy"));

  // Misuse under each policy is the same error as without recomputation.
  for (recompute_policy p : all_policies) {
    INFO("policy " << nn::to_string(p));
    layer.set_recompute(p);
    decltype(layer)::saved st;
    const auto x = nn_test::random_tensor<double>({batch, seq, d_model}, 5);
    (void)layer.forward(x, nn::sequence_info::whole(seq), st);
    CHECK_THROWS_WITH(layer.backward_weight(st), Contains("backward_weight(saved) on a saved state that backward_input has not processed"));
    CHECK_THROWS_WITH(layer.backward_input(st, nn_test::random_tensor<double>({batch, seq + 1, d_model}, 6)),
                      Contains("transformer_block: dy has shape [2, 7, 16] but expected [2, 6, 16] (the output gradient "
                               "has the input's shape)"));
    (void)layer.backward_input(st, x);
    CHECK_THROWS_WITH(layer.backward_input(st, x),
                      Contains("transformer_block: backward_input needs the saved state of a forward that has not been "
                               "backpropagated yet"));
    layer.backward_weight(st);
  }
}

// A stage's fused backward (what a schedule's B runs) makes each piece's weight gradients and
// frees it before the next piece's backward_input: the same bits as backward_input then
// backward_weight, holding one block's backward state at a time instead of every block's.
TEST_CASE("recompute: a stage's fused backward equals backward_input then backward_weight, and holds less", "[nn][memory]") {
  using strategy = nn::no_cp<baton::reference_attention>;
  using stage_type = nn::lm_stage<double, strategy>;
  using activation = nn::lm_activation<double>;
  for (recompute_policy p : all_policies) {
    INFO("policy " << nn::to_string(p));
    std::vector<baton::host_tensor<double>> dx;
    std::vector<std::map<std::string, baton::host_tensor<double>>> grads;
    std::vector<std::int64_t> held;  // the most the meter saw above the forward's state
    for (bool fused : {true, false}) {
      auto model = config(p);
      model.vocab = 32;
      stage_type stage(model, nn::lm_stage_layout::of(1, 3, 9), nn::initializer(7), [] { return strategy{}; });
      REQUIRE(stage.blocks().size() == 3);
      const auto rows_only = [](std::int64_t rows) {
        return baton::constant<baton::host_tensor<std::int64_t>>(baton::host_tensor<std::int64_t>({rows, 0}));
      };
      const activation x(rows_only(batch), nn_test::random_tensor<double>({batch, seq, d_model}, 11),
                         baton::host_tensor<baton::bfloat16>({batch, 0}));
      const baton::grad_t<activation> dy(nn_test::random_tensor<double>({batch, seq, d_model}, 12),
                                         baton::host_tensor<baton::bfloat16>({batch, 0}));
      stage_type::saved st;
      (void)stage.forward(x, nn::sequence_info::whole(seq), st);
      baton::host_tensor_memory_reset_peak();
      const std::int64_t before = baton::host_tensor_memory().live;
      if (fused) {
        dx.push_back(get<"hidden">(stage.backward(st, dy)));
      } else {
        dx.push_back(get<"hidden">(stage.backward_input(st, dy)));
        stage.backward_weight(st);
      }
      held.push_back(baton::host_tensor_memory().peak - before);
      CHECK(st.bytes() == 0);
      grads.push_back(nn_test::gradients_of<double>(stage));
    }
    CHECK(same_bits(dx[0], dx[1]));
    CHECK(same_bits(grads[0], grads[1]));
    // Split: every block grown to what W reads at once; fused: one block at a time (3 blocks).
    CHECK(held[0] < held[1]);
    // At least two blocks' growth from their forward's state to what W reads is never held.
    CHECK(held[1] - held[0] >= 2 * static_cast<std::int64_t>(bytes_after_input<double>() - bytes_after_forward<double>(p)));
  }
}

// A block's own backward fuses piece by piece (MLP, its norm, the attention, its norm): the
// same bits as backward_input then backward_weight, and the MLP's backward state (its input,
// the product, the gate's and up's gradients and its dy) is freed before the attention's
// backward grows its own, so the two are never held at once.
TEST_CASE("recompute: a block's fused backward frees each piece before the next and equals the split one", "[nn][memory]") {
  using block_type = nn::transformer_block<double, nn::no_cp<baton::reference_attention>>;
  for (recompute_policy p : all_policies) {
    INFO("policy " << nn::to_string(p));
    std::vector<baton::host_tensor<double>> dx;
    std::vector<grads_t<double>> grads;
    std::vector<std::int64_t> held;  // the most the meter saw above the forward's state
    for (bool fused : {true, false}) {
      block_type layer(config(p), nn::initializer(5), {});
      const auto x = nn_test::random_tensor<double>({batch, seq, d_model}, 21);
      const auto dy = nn_test::random_tensor<double>({batch, seq, d_model}, 22);
      block_type::saved st;
      (void)layer.forward(x, nn::sequence_info::whole(seq), st);
      baton::host_tensor_memory_reset_peak();
      const std::int64_t before = baton::host_tensor_memory().live;
      if (fused) {
        dx.push_back(layer.backward(st, dy));
      } else {
        dx.push_back(layer.backward_input(st, dy));
        layer.backward_weight(st);
      }
      held.push_back(baton::host_tensor_memory().peak - before);
      CHECK(st.bytes() == 0);
      grads.push_back(nn_test::gradients_of<double>(layer));
    }
    CHECK(same_bits(dx[0], dx[1]));
    CHECK(same_bits(grads[0], grads[1]));
    // At the split backward's peak the MLP's product, d_gate and d_up (3 ffn_hidden values a
    // token) are held beside the attention's gradients; at the fused one they are gone
    // (measured: exactly that much less under every policy).
    CHECK(held[1] - held[0] >= 3 * hidden * batch * seq * static_cast<std::int64_t>(sizeof(double)));
  }
}

enum class cp_kind { ring, ulysses, hybrid };

struct cp_rank_run {
  std::map<recompute_policy, std::vector<baton::host_tensor<double>>> dx;
  std::map<recompute_policy, grads_t<double>> grads;
  std::map<recompute_policy, std::size_t> bytes;
  std::map<recompute_policy, long> forwards_in_forward, forwards_in_input, calls_in_weight;
};

// One rank: for each policy, the block on this rank's shard, two microbatches F0 F1 I1 I0 W1 W0,
// its local (not reduced) gradients and what the backend was called for.
template <class Strategy>
cp_rank_run run_cp_rank(Strategy strategy, const counting_attention& backend) {
  using block_type = nn::transformer_block<double, Strategy>;
  block_type layer(config(), nn::initializer(47) / "layers" / 1, std::move(strategy));
  const auto& sharding = layer.attention().strategy().sharding();
  const int shard = layer.attention().strategy().shard_index();
  const nn::sequence_info info = nn::sequence_info::shard(sharding, shard);
  const std::int64_t local = sharding.local_len(shard);
  cp_rank_run r;
  for (recompute_policy p : all_policies) {
    layer.set_recompute(p);
    nn::zero_grad(nn::parameters_of<double>(layer));
    std::array<typename block_type::saved, 2> st;
    std::vector<baton::host_tensor<double>> dx(2);
    const long f0 = backend.forwards();
    for (std::uint32_t m = 0; m < 2; ++m)
      (void)layer.forward(nn_test::random_tensor<double>({1, local, d_model}, 10 * m + static_cast<std::uint32_t>(shard)),
                          info, st[m]);
    r.bytes[p] = st[0].bytes();
    const long f1 = backend.forwards();
    for (const std::size_t m : {1u, 0u})
      dx[m] = layer.backward_input(st[m], nn_test::random_tensor<double>({1, local, d_model}, 50 + 10 * static_cast<std::uint32_t>(m) +
                                                                                               static_cast<std::uint32_t>(shard)));
    const long f2 = backend.forwards(), calls = backend.forwards() + backend.backwards();
    layer.backward_weight(st[1]);
    layer.backward_weight(st[0]);
    r.calls_in_weight[p] = backend.forwards() + backend.backwards() - calls;
    r.forwards_in_forward[p] = f1 - f0;
    r.forwards_in_input[p] = f2 - f1;
    r.dx[p] = std::move(dx);
    r.grads[p] = nn_test::gradients_of<double>(layer);
  }
  return r;
}

std::vector<cp_rank_run> run_cp(cp_kind kind) {
  constexpr std::int64_t global_seq = 16;
  const int ranks = kind == cp_kind::hybrid ? 4 : 2;
  std::vector<cp_rank_run> runs(static_cast<std::size_t>(ranks));
  baton::run_local(ranks, [&](local_communicator& comm) {
    const counting_attention backend;
    cp_rank_run& r = runs[static_cast<std::size_t>(comm.rank())];
    switch (kind) {
      case cp_kind::ring:
        r = run_cp_rank(baton::ring_attention<local_communicator, counting_attention>(
                            comm, backend, baton::sequence_sharding(shard_layout::zigzag, global_seq, 2)),
                        backend);
        break;
      case cp_kind::ulysses:
        r = run_cp_rank(baton::ulysses_attention<local_communicator, counting_attention>(
                            comm, backend, baton::sequence_sharding(shard_layout::contiguous, global_seq, 2)),
                        backend);
        break;
      case cp_kind::hybrid: {
        auto mesh = baton::make_cp_mesh(comm, 2, 2);
        r = run_cp_rank(baton::hybrid_attention<local_communicator, local_communicator, counting_attention>(
                            mesh, backend, baton::sequence_sharding(shard_layout::zigzag, global_seq, 2, 2)),
                        backend);
        break;
      }
    }
  });
  return runs;
}


TEST_CASE("recompute under context parallelism: gradients through recomputed ring, Ulysses and hybrid attention are bit for bit", "[nn][cp][memory]") {
  for (const cp_kind kind : {cp_kind::ring, cp_kind::ulysses, cp_kind::hybrid}) {
    const char* name = kind == cp_kind::ring ? "ring zigzag 2" : kind == cp_kind::ulysses ? "Ulysses 2" : "hybrid 2x2";
    const std::vector<cp_rank_run> runs = run_cp(kind);
    for (std::size_t rank = 0; rank < runs.size(); ++rank) {
      const cp_rank_run& r = runs[rank];
      const auto none = recompute_policy::none;
      for (recompute_policy p : all_policies) {
        INFO(name << ", rank " << rank << ", policy " << nn::to_string(p));
        CHECK(same_bits(r.dx.at(p)[0], r.dx.at(none)[0]));
        CHECK(same_bits(r.dx.at(p)[1], r.dx.at(none)[1]));
        CHECK(same_bits(r.grads.at(p), r.grads.at(none)));
        CHECK(r.forwards_in_forward.at(p) > 0);
        // full runs the forward's attention again (every ring step, every all-to-all's share);
        // selective keeps O and the LSE and runs none.
        CHECK(r.forwards_in_input.at(p) == (p == recompute_policy::full ? r.forwards_in_forward.at(p) : 0));
        CHECK(r.calls_in_weight.at(p) == 0);
      }
      CHECK(r.bytes.at(recompute_policy::full) < r.bytes.at(recompute_policy::selective));
      CHECK(r.bytes.at(recompute_policy::selective) < r.bytes.at(none));
    }
  }
}

TEST_CASE("recompute under context parallelism: a bad output gradient on one rank under full stops every rank with its message", "[nn][cp][memory]") {
  using ring = baton::ring_attention<local_communicator, baton::reference_attention>;
  std::vector<std::string> messages(2);
  baton::local_options options;
  options.timeout = std::chrono::seconds(20);  // a rank left waiting fails instead of hanging
  baton::run_local(
      2,
      [&](local_communicator& comm) {
        const baton::sequence_sharding sharding(shard_layout::zigzag, 8, 2);
        nn::transformer_block<double, ring> layer(config(recompute_policy::full), nn::initializer(3),
                                                  ring(comm, baton::reference_attention{}, sharding));
        const auto info = nn::sequence_info::shard(sharding, comm.rank());
        decltype(layer)::saved st;
        const auto x = nn_test::random_tensor<double>({1, 4, d_model}, 9);
        (void)layer.forward(x, info, st);
        try {
          // rank 1's gradient has a row too many: it must join its peer's recomputed forward
          (void)layer.backward_input(st, nn_test::random_tensor<double>({1, comm.rank() == 1 ? 5 : 4, d_model}, 8));
        } catch (const std::exception& e) {
          messages[static_cast<std::size_t>(comm.rank())] = e.what();
        }
      },
      options);
  for (std::size_t r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << messages[r]);
    CHECK(messages[r].find("rank 1 rejected its input") != std::string::npos);
    CHECK(messages[r].find("dy has shape [1, 5, 16] but expected [1, 4, 16]") != std::string::npos);
  }
}

// docs/nn.md, "Recomputation": what each policy keeps, from saved.bytes(), for one block of
// 128 tokens in float; the printed figures are the formulas of bytes_after_forward /
// bytes_after_input for these sizes (d 64, q 64, kv 32, h 192: 1030, 710 and 64 values per
// token after forward, 1282 between I and W, plus 128 positions), and dx is the same bits
// under every policy.
TEST_CASE("recompute docs: what each policy keeps", "[nn][memory][docs]") {
  namespace nn = baton::nn;
  const auto x = nn_test::random_tensor<float>({1, 128, 64}, 1);
  const auto dy = nn_test::random_tensor<float>({1, 128, 64}, 2);
  std::vector<baton::host_tensor<float>> dxs;
  baton_test::capture_cout capture;
  // [doc:recompute_policies]
  using attention = nn::no_cp<baton::reference_attention>;
  nn::transformer_config config{.d_model = 64, .heads = 4, .kv_heads = 2, .vocab = 64};
  for (const auto policy : {nn::recompute_policy::none, nn::recompute_policy::selective, nn::recompute_policy::full}) {
    config.recompute = policy;  // or block.set_recompute(policy) between microbatches
    nn::transformer_block<float, attention> block(config, nn::initializer(7), attention{});
    decltype(block)::saved saved;
    const baton::host_tensor<float> y = block.forward(x, nn::sequence_info::whole(128), saved);  // [1, 128, 64]
    const std::size_t kept = saved.bytes();                          // until backward_input
    const baton::host_tensor<float> dx = block.backward_input(saved, dy);  // recomputes what was dropped
    std::cout << std::left << std::setw(9) << nn::to_string(policy) << " keeps " << std::right << std::setw(6) << kept
              << " bytes after forward, " << saved.bytes() << " between I and W\n";
    block.backward_weight(saved);  // reads only what backward_input left: nothing is recomputed twice
    dxs.push_back(dx);             // the same bits under every policy
  }
  // [/doc:recompute_policies]
  const std::string printed = capture.finish();
  // [doc-output:recompute_policies]
  const std::string expected = baton_test::doc_output(R"(
none      keeps 528384 bytes after forward, 657408 between I and W
selective keeps 364544 bytes after forward, 657408 between I and W
full      keeps  33792 bytes after forward, 657408 between I and W
)");
  // [/doc-output:recompute_policies]
  CHECK(printed == expected);
  REQUIRE(dxs.size() == 3);
  CHECK(same_bits(dxs[1], dxs[0]));
  CHECK(same_bits(dxs[2], dxs[0]));
}

}  // namespace recompute_test
