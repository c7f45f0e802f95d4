// Bad input to the model layer: each ends in an nn_error (or the cp layer's cp_error) whose
// message names the piece, what it got and what it expected. Plus the compile-time facts
// users rely on: a block is a split-backward pipeline stage, sequence_info an opaque side
// input that splits its document ids per microbatch.
#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/cp.hpp>
#include <baton/nn.hpp>
#include <baton/pipeline/stage.hpp>

#include "catch.hpp"

#include "nn_test_util.hpp"

#include <cstdint>
#include <vector>

namespace nn = baton::nn;
using Catch::Contains;
using tensor = baton::host_tensor<double>;
using reference_cp = nn::no_cp<baton::reference_attention>;
using block_type = nn::transformer_block<double, reference_cp>;

static_assert(baton::split_backward_stage<block_type>, "a transformer block is a zero-bubble pipeline stage");
static_assert(baton::split_backward_stage<nn::transformer_block<float, nn::no_cp<baton::reference_attention>,
                                                                baton::sliding_window_mask>>);
static_assert(baton::opaque_payload<nn::sequence_info> && baton::splittable_opaque<nn::sequence_info>);
static_assert(nn::module_with_parameters<block_type> && nn::module_with_parameters<nn::lm_head<float>>);
static_assert(nn::attention_strategy<reference_cp> &&
              nn::attention_strategy<baton::ring_attention<baton::local_communicator, baton::reference_attention>> &&
              !nn::attention_strategy<baton::reference_attention>);

namespace {
nn::transformer_config config() { return {.d_model = 8, .heads = 4, .kv_heads = 2, .ffn_hidden = 12, .vocab = 11}; }
}  // namespace

TEST_CASE("nn errors: configurations whose sizes do not fit name the field", "[nn][errors]") {
  auto c = config();
  c.kv_heads = 3;
  CHECK_THROWS_WITH(c.resolved(), Contains("heads = 4 is not a multiple of kv_heads = 3"));
  c = config();
  c.d_model = 10;
  CHECK_THROWS_WITH(c.resolved(), Contains("d_model = 10 is not divisible by heads = 4"));
  c = config();
  c.heads = 8;
  c.kv_heads = 8;  // head_dim 1: RoPE needs pairs
  CHECK_THROWS_WITH(c.resolved(), Contains("head_dim = 1 must be even"));
  c = config();
  c.kv_heads = 0;
  CHECK_THROWS_AS(block_type(c, nn::initializer(1), {}), nn::nn_error);
  CHECK(config().resolved().head_dim == 2);
  CHECK(nn::transformer_config{.d_model = 512}.resolved().ffn_hidden == 1408);  // 8/3 d rounded up to 64
}

TEST_CASE("nn errors: wrong shapes name the piece and the expected shape", "[nn][errors]") {
  nn::linear<double> l(5, 4, false, nn::initializer(1));
  nn::linear<double>::saved ls;
  CHECK_THROWS_WITH(l.forward(tensor({2, 3, 6}), ls),
                    "baton::nn::linear: input has shape [2, 3, 6] but expected [..., 5] (in_features = 5)");

  block_type block(config(), nn::initializer(1), {});
  block_type::saved bs;
  CHECK_THROWS_WITH(block.forward(tensor({2, 5, 7}), nn::sequence_info::whole(5), bs),
                    "baton::nn::transformer_block: input has shape [2, 5, 7] but expected [batch, seq, 8] (d_model = 8)");
  CHECK_THROWS_WITH(block.forward(tensor({10, 8}), nn::sequence_info::whole(5), bs),
                    Contains("input has shape [10, 8] but expected [batch, seq, 8]"));

  nn::rms_norm<double> norm(8);
  nn::rms_norm<double>::saved ns;
  (void)norm.forward(tensor({2, 8}), ns);
  CHECK_THROWS_WITH(norm.backward_input(ns, tensor({3, 8})),
                    Contains("baton::nn::rms_norm: dy has shape [3, 8] but expected [2, 8]"));

  const nn::rotary_embedding<double> rope(4);
  nn::rotary_embedding<double>::saved rs;
  CHECK_THROWS_WITH(rope.forward(tensor({1, 2, 3, 6}), std::vector<std::int64_t>{0, 1}, rs),
                    Contains("input has shape [1, 2, 3, 6] but expected [batch, seq, heads, 4]"));
  CHECK_THROWS_WITH(nn::rotary_embedding<double>(5), Contains("head_dim 5 must be even"));

  const nn::cross_entropy<double> ce;
  CHECK_THROWS_WITH(ce(tensor({2, 3, 5}), baton::host_tensor<std::int64_t>({2, 4})),
                    Contains("baton::nn::cross_entropy: logits has shape [2, 3, 5] but expected [2, 4, vocab]"));
  CHECK_THROWS_WITH(ce(tensor({1, 5}), baton::host_tensor<std::int64_t>({1}, {5})),
                    Contains("target 5 at flat index 0 is outside the vocabulary [0, 5)"));

  nn::embedding<double> emb(7, 4, nn::initializer(1));
  nn::embedding<double>::saved es;
  CHECK_THROWS_WITH(emb.forward(baton::host_tensor<std::int64_t>({1, 3}, {0, 7, 1}), es),
                    Contains("token 7 at flat index 1 of tokens [1, 3] is outside the vocabulary [0, 7)"));
}

TEST_CASE("nn errors: a missing or wrong position side input is named", "[nn][errors]") {
  block_type block(config(), nn::initializer(1), {});
  block_type::saved st;
  const tensor x({2, 5, 8});
  CHECK_THROWS_WITH(block.forward(x, nn::sequence_info{}, st),
                    "baton::nn::transformer_block: the side input holds no positions; expected [5] global positions, "
                    "one per row of the input's sequence axis (sequence_info::whole(5) for a whole sequence)");
  CHECK_THROWS_WITH(block.forward(x, nn::sequence_info::whole(4), st),
                    Contains("the side input holds 4 positions but the input's sequence axis has 5 rows; expected "
                             "positions of shape [5]"));
  const auto wrong_docs = nn::sequence_info::whole(5).with_documents(baton::host_tensor<std::int64_t>({3, 5}));
  CHECK_THROWS_WITH(block.forward(x, wrong_docs, st),
                    Contains("the side input's document ids have shape [3, 5] but expected [2, 5] (one row per batch "
                             "row, one id per global position of the sequence)"));
  const auto short_docs = nn::sequence_info::whole(5).with_documents(baton::host_tensor<std::int64_t>({2, 4}));
  CHECK_THROWS_WITH(block.forward(x, short_docs, st), Contains("document ids have shape [2, 4] but expected [2, 5]"));
  CHECK_THROWS_WITH(block.forward(x, nn::sequence_info{{0, 1, -2, 3, 4}, nullptr}, st),
                    Contains("the side input holds the negative position -2"));
  CHECK_THROWS_WITH(nn::sequence_info::whole(5).with_documents(baton::host_tensor<std::int64_t>({5})),
                    Contains("document ids have shape [5] but expected [batch, seq_len]"));
  // backward without a forward to go with it
  block_type::saved fresh;
  CHECK_THROWS_WITH(block.attention().backward_input(fresh.attention, x), Contains("needs the saved state of a forward"));
  (void)block.forward(x, nn::sequence_info::whole(5), st);
  CHECK_THROWS_WITH(block.backward_input(st, tensor({2, 4, 8})),
                    "baton::nn::transformer_block: dy has shape [2, 4, 8] but expected [2, 5, 8] (the output gradient "
                    "has the input's shape)");
}

TEST_CASE("nn errors: a sequence no layout divides shards unevenly, and asking for one shard length says which",
          "[nn][errors]") {
  const baton::sequence_sharding sharding(baton::shard_layout::zigzag, 10, 4);  // chunks 2 2 1 1 1 1 1 1
  CHECK(sharding.local_len(0) == 3);
  CHECK(sharding.local_len(3) == 2);
  CHECK_THROWS_WITH(sharding.local_len(), Contains("different lengths") && Contains("local_len(rank)"));
}

TEST_CASE("nn sequence_info: splits its document ids along the batch like the microbatches", "[nn]") {
  baton::host_tensor<std::int64_t> ids({5, 3});
  for (std::int64_t i = 0; i < ids.size(); ++i) ids[i] = i;
  const auto info = nn::sequence_info::whole(3).with_documents(ids);
  const auto parts = baton::split_microbatches(info, 2);  // rows 3 + 2, as tensors split
  REQUIRE(parts.size() == 2);
  CHECK(parts[0].positions == info.positions);
  CHECK(parts[1].documents->shape() == std::vector<std::int64_t>{2, 3});
  CHECK((*parts[1].documents)(0, 0) == 9);
  const auto shard = nn::sequence_info::shard(baton::sequence_sharding(baton::shard_layout::zigzag, 8, 2), 1);
  CHECK(shard.positions == std::vector<std::int64_t>{2, 3, 4, 5});
}
