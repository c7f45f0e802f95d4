// The examples of docs/nn.md and of the nn headers' comments, compiled and run. Each block
// between "// [doc:NAME]" and "// [/doc:NAME]" is shown verbatim in a document (ctest -L docs
// checks it).
#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/comm/mesh.hpp>
#include <baton/config.hpp>
#include <baton/cp.hpp>
#include <baton/nn.hpp>
#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif

#include "catch.hpp"

#include "nn_test_util.hpp"
#include "skip.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace {

// [doc:lm_types]
namespace nn = baton::nn;
using attention = nn::no_cp<baton::reference_attention>;  // one rank holds whole sequences
using block = nn::transformer_block<float, attention>;     // causal mask by default
// [/doc:lm_types]

}  // namespace

TEST_CASE("nn docs: a two-block language model trained on one rank", "[nn][docs]") {
  const baton::host_tensor<std::int64_t> tokens = nn_test::random_tokens({4, 16}, 64, 1);
  baton::host_tensor<std::int64_t> targets({4, 16});
  for (std::int64_t b = 0; b < 4; ++b)
    for (std::int64_t s = 0; s < 16; ++s) targets(b, s) = tokens(b, (s + 1) % 16);  // predict the next token
  std::vector<double> losses;

  // [doc:lm_one_rank]
  const nn::transformer_config config{.d_model = 32, .heads = 4, .kv_heads = 2, .vocab = 64};
  const nn::initializer init(2024);  // same seed, same weights, on any rank layout
  nn::embedding<float> embed(config.vocab, config.d_model, init / "embed");
  std::vector<block> layers;
  for (int i = 0; i < 2; ++i) layers.emplace_back(config, init / "layers" / i, attention{});
  nn::lm_head<float> head(config, init / "head");
  const nn::cross_entropy<float> loss;

  auto params = nn::parameters_of<float>(embed, "embed");
  for (int i = 0; i < 2; ++i) nn::append_parameters(params, layers[i], "layers." + std::to_string(i));
  nn::append_parameters(params, head, "head");
  nn::adamw<float> optimizer(params, {.lr = 3e-3});

  const auto info = nn::sequence_info::whole(tokens.extent(1));  // positions 0..seq-1
  for (int step = 0; step < 20; ++step) {
    nn::zero_grad(params);
    nn::embedding<float>::saved embed_saved;
    std::vector<block::saved> layer_saved(2);
    nn::lm_head<float>::saved head_saved;
    baton::host_tensor<float> h = embed.forward(tokens, embed_saved);  // [batch, seq, d_model]
    for (int i = 0; i < 2; ++i) h = layers[i].forward(h, info, layer_saved[i]);
    const auto result = loss(head.forward(h, head_saved), targets);  // mean over tokens + dlogits
    baton::host_tensor<float> dh = head.backward(head_saved, result.grad);
    for (int i = 1; i >= 0; --i) dh = layers[i].backward(layer_saved[i], dh);
    embed.backward(embed_saved, dh);
    optimizer.step();
    losses.push_back(result.value);
  }
  // [/doc:lm_one_rank]

  REQUIRE(params.size() == 1 + 2 * 9 + 2);
  CHECK(losses.front() > 3.0);                   // about log(64) = 4.16 at the start
  CHECK(losses.back() < 0.8 * losses.front());  // and it learns
}

TEST_CASE("nn docs: the same block with ring attention over two ranks", "[nn][docs]") {
  const nn::transformer_config config{.d_model = 16, .heads = 4, .kv_heads = 2, .vocab = 8};
  const nn::initializer init(7);
  const std::int64_t seq_len = 8;
  const baton::host_tensor<float> x = nn_test::random_tensor<float>({2, seq_len, 16}, 3);

  // The unsharded block, for comparison.
  block whole(config, init / "layers" / 0, attention{});
  block::saved whole_saved;
  const baton::host_tensor<float> y_whole = whole.forward(x, nn::sequence_info::whole(seq_len), whole_saved);
  (void)whole.backward(whole_saved, y_whole);
  const auto whole_grads = nn_test::gradients_of<float>(whole);

  // Catch's assertions are not thread-safe: each rank returns its worst errors instead.
  const auto errors = baton::run_local(2, [&](baton::local_communicator& comm) {
    // [doc:block_ring]
    using ring = baton::ring_attention<baton::local_communicator, baton::reference_attention>;
    const baton::sequence_sharding sharding(baton::shard_layout::zigzag, seq_len, comm.size());
    nn::transformer_block<float, ring> layer(config, init / "layers" / 0,
                                             ring(comm, baton::reference_attention{}, sharding));

    // This rank's shard of the sequence, and its global positions as the side input.
    baton::host_tensor<float> x_shard({2, sharding.local_len(), 16});
    baton::shard_sequence<float>(sharding, comm.rank(), x.values(), x.shape(), 1, x_shard.values());
    const auto info = nn::sequence_info::shard(sharding, comm.rank());

    decltype(layer)::saved saved;
    const baton::host_tensor<float> y = layer.forward(x_shard, info, saved);  // every rank together
    const baton::host_tensor<float> dx = layer.backward(saved, y);            // loss = |y|² / 2
    auto params = nn::parameters_of<float>(layer);
    nn::all_reduce_gradients(params, comm);  // each rank holds its shard's part: sum them
    // [/doc:block_ring]

    (void)dx;
    const auto y_expected = baton::shard_sequence<float>(sharding, comm.rank(), y_whole.values(), y_whole.shape(), 1);
    double grad_error = 0;
    for (const auto& [name, g] : nn_test::gradients_of<float>(layer))
      grad_error = std::max(grad_error, nn_test::max_rel_error(g, whole_grads.at(name)));
    return std::pair{nn_test::max_rel_error(y.values(), std::span<const float>(y_expected)), grad_error};
  });
  for (const auto& [output_error, grad_error] : errors) {
    CHECK(output_error <= 1e-5);
    CHECK(grad_error <= 1e-5);
  }
}

namespace {

// A sub-module for the example of baton/nn/parameter.hpp's comment.
struct gate {
  nn::parameter<float> scale{baton::host_tensor<float>::filled({2}, 1.0f), false};
  template <class Visit>
  void visit_parameters(Visit&& visit) {
    visit("scale", scale);
  }
};

// The module of that comment: a parameter and a sub-module.
struct gated_module {
  nn::parameter<float> weight_{baton::host_tensor<float>({2, 2}), true};
  gate attention_;

  // [doc:visit_parameters]
  template <class Visit> void visit_parameters(Visit&& visit) {
    visit("weight", weight_);   // a parameter
    visit("attn", attention_);  // a sub-module: its names become "attn.<name>"
  }
  // [/doc:visit_parameters]
};

}  // namespace

TEST_CASE("nn docs: the examples of baton/nn/parameter.hpp's comments", "[nn][docs]") {
  gated_module m;
  const auto params = nn::parameters_of<float>(m, "block");
  REQUIRE(params.size() == 2);
  CHECK(params[0].name == "block.weight");
  CHECK(params[0].parameter == &m.weight_);
  CHECK(params[1].name == "block.attn.scale");
  CHECK(params[1].parameter == &m.attention_.scale);

  // [doc:initializer]
  baton::nn::initializer init(42);
  auto block_init = init / "layers" / 5;          // path "layers.5"
  auto w = block_init.normal<float>("attn.wq.weight", {512, 512}, 0.04);
  // [/doc:initializer]
  CHECK(block_init.path() == "layers.5");
  // The values depend on the seed and the full name only: the same draw from the root.
  const auto same = baton::nn::initializer(42).normal<float>("layers.5.attn.wq.weight", {512, 512}, 0.04);
  CHECK(std::equal(w.values().begin(), w.values().end(), same.values().begin(), same.values().end()));
  // 262144 draws of N(0, 0.04^2): the sample standard deviation is within 1 % of 0.04.
  double sum = 0, squares = 0;
  for (float x : w.values()) {
    sum += x;
    squares += static_cast<double>(x) * x;
  }
  const double n = static_cast<double>(w.size());
  CHECK(std::abs(std::sqrt(squares / n - (sum / n) * (sum / n)) - 0.04) < 0.0004);
}

TEST_CASE("nn docs: the example of cp_attention's comment", "[nn][docs][cp_attention_kokkos][can-skip]") {
#if !BATON_HAS_KOKKOS()
  BATON_SKIP("built without Kokkos (baton::kokkos): the example builds a cp_attention over kokkos_attention");
#else
  const std::int64_t seq_len = 16;
  const auto seen = baton::run_local(2, [&](baton::local_communicator& world) {
    baton::device_mesh mesh(world, {.cp_ring = 2});
    // [doc:cp_attention_from_mesh]
    auto attention = baton::nn::cp_attention<baton::local_communicator, baton::kokkos_attention>::from_mesh(
        mesh, baton::nn::cp_mode::ring, baton::kokkos_attention{}, baton::shard_layout::zigzag, seq_len);
    // [/doc:cp_attention_from_mesh]
    const baton::sequence_sharding* sharding = attention.sharding();
    return std::pair{attention.mode() == baton::nn::cp_mode::ring && sharding != nullptr &&
                         sharding->degree() == 2 && sharding->layout() == baton::shard_layout::zigzag,
                     attention.shard_index()};
  });
  CHECK(seen[0] == std::pair{true, 0});
  CHECK(seen[1] == std::pair{true, 1});
#endif
}
