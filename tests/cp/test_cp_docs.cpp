// The examples of docs/context-parallel.md and of the comments of the CP headers (and of
// padding_mask in baton/attention/masks.hpp), compiled and run. Each block between
// "// [doc:NAME]" and "// [/doc:NAME]" is shown verbatim in a document (ctest -L docs checks
// it); the results are compared with reference attention on the whole sequence.
#include "catch.hpp"
#include "cp_test_support.hpp"

#include <baton/attention.hpp>
#include <baton/comm/local.hpp>
#include <baton/cp.hpp>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

TEST_CASE("docs: sharding example", "[cp][docs]") {
  // [doc:sharding]
  baton::sequence_sharding sharding(baton::shard_layout::zigzag, /*seq_len=*/16, /*ranks=*/2);
  std::vector<std::int64_t> held = sharding.global_positions(1);  // chunks 1 and 2 of 4
  // held == {4, 5, 6, 7, 8, 9, 10, 11}

  std::vector<float> full(1 * 16 * 2 * 3);  // [batch 1, seq 16, heads 2, dim 3]
  const std::vector<std::int64_t> shape{1, 16, 2, 3};
  std::vector<float> mine = baton::shard_sequence<float>(sharding, /*rank=*/1, full, shape, /*seq_axis=*/1);
  baton::unshard_sequence<float>(sharding, 1, mine, shape, 1, full);  // and back
  // [/doc:sharding]
  CHECK(held == std::vector<std::int64_t>{4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(mine.size() == 8 * 2 * 3);
}

TEST_CASE("docs: ring, Ulysses and hybrid attention examples", "[cp][docs]") {
  const std::int64_t batch = 1, seq_len = 32, heads = 4, kv_heads = 2, dim = 8;
  std::vector<float> q_full(batch * seq_len * heads * dim), k_full(batch * seq_len * kv_heads * dim), v_full(k_full.size()),
      dout_full(q_full.size());
  for (std::size_t i = 0; i < q_full.size(); ++i) q_full[i] = dout_full[i] = std::sin(0.1f * static_cast<float>(i));
  for (std::size_t i = 0; i < k_full.size(); ++i) k_full[i] = v_full[i] = std::cos(0.07f * static_cast<float>(i));
  std::vector<float> dk_full(k_full.size());

  // [doc:ring]
  baton::run_local(4, [&](baton::local_communicator& comm) {
    baton::sequence_sharding sharding(baton::shard_layout::zigzag, seq_len, comm.size());
    const std::int64_t n = sharding.local_len();  // tokens on this rank
    const std::vector<std::int64_t> q_shape{batch, seq_len, heads, dim}, kv_shape{batch, seq_len, kv_heads, dim};
    // This rank's shard of the inputs (in a model they come from the previous layer).
    auto q = baton::shard_sequence<float>(sharding, comm.rank(), q_full, q_shape, 1);
    auto k = baton::shard_sequence<float>(sharding, comm.rank(), k_full, kv_shape, 1);
    auto v = baton::shard_sequence<float>(sharding, comm.rank(), v_full, kv_shape, 1);
    auto dout = baton::shard_sequence<float>(sharding, comm.rank(), dout_full, q_shape, 1);
    std::vector<float> out(q.size()), lse(batch * heads * n), dq(q.size()), dk(k.size()), dv(v.size());
    auto view = [&](std::vector<float>& t, std::int64_t h) { return baton::make_tensor_view(t.data(), {batch, n, h, dim}); };
    auto cview = [&](const std::vector<float>& t, std::int64_t h) {
      return baton::make_tensor_view(t.data(), {batch, n, h, dim});
    };

    baton::ring_attention ring(comm, baton::reference_attention{}, sharding);
    ring.forward(cview(q, heads), cview(k, kv_heads), cview(v, kv_heads), baton::causal_mask{}, view(out, heads),
                 baton::make_tensor_view(lse.data(), {batch, heads, n}));
    ring.backward(cview(q, heads), cview(k, kv_heads), cview(v, kv_heads), cview(out, heads),
                  baton::make_tensor_view(static_cast<const float*>(lse.data()), {batch, heads, n}), cview(dout, heads),
                  baton::causal_mask{}, view(dq, heads), view(dk, kv_heads), view(dv, kv_heads));
    // dk and dv are the gradients of THIS rank's keys: write them back to full order.
    baton::unshard_sequence<float>(sharding, comm.rank(), dk, kv_shape, 1, dk_full);
  });
  // [/doc:ring]

  // The same gradient from reference attention on the whole sequence.
  std::vector<float> out(q_full.size()), lse(batch * heads * seq_len), dq(q_full.size()), dk(k_full.size()), dv(k_full.size());
  baton::reference_attention ref;
  const auto q = baton::make_tensor_view(q_full.data(), {batch, seq_len, heads, dim});
  const auto k = baton::make_tensor_view(k_full.data(), {batch, seq_len, kv_heads, dim});
  const auto v = baton::make_tensor_view(v_full.data(), {batch, seq_len, kv_heads, dim});
  ref.forward(q, k, v, baton::causal_mask{}, baton::make_tensor_view(out.data(), {batch, seq_len, heads, dim}),
              baton::make_tensor_view(lse.data(), {batch, heads, seq_len}));
  ref.backward(q, k, v, baton::make_tensor_view(static_cast<const float*>(out.data()), {batch, seq_len, heads, dim}),
               baton::make_tensor_view(static_cast<const float*>(lse.data()), {batch, heads, seq_len}),
               baton::make_tensor_view(dout_full.data(), {batch, seq_len, heads, dim}), baton::causal_mask{},
               baton::make_tensor_view(dq.data(), {batch, seq_len, heads, dim}),
               baton::make_tensor_view(dk.data(), {batch, seq_len, kv_heads, dim}),
               baton::make_tensor_view(dv.data(), {batch, seq_len, kv_heads, dim}));
  double num = 0, den = 0;
  for (std::size_t i = 0; i < dk.size(); ++i) {
    num += (dk_full[i] - dk[i]) * (dk_full[i] - dk[i]);
    den += dk[i] * dk[i];
  }
  CHECK(std::sqrt(num / den) <= 1e-5);

  std::vector<float> first_value(4);
  baton::run_local(4, [&](baton::local_communicator& comm) {
    const std::int64_t n = seq_len / 4;
    std::vector<float> q4(batch * n * heads * dim, 0.5f), k4(batch * n * kv_heads * dim, 0.25f), v4(k4.size(), 1.0f),
        out4(q4.size()), lse4(batch * heads * n);
    const auto qv = baton::make_tensor_view(static_cast<const float*>(q4.data()), {batch, n, heads, dim});
    const auto kv = baton::make_tensor_view(static_cast<const float*>(k4.data()), {batch, n, kv_heads, dim});
    const auto vv = baton::make_tensor_view(static_cast<const float*>(v4.data()), {batch, n, kv_heads, dim});
    const auto ov = baton::make_tensor_view(out4.data(), {batch, n, heads, dim});
    const auto lv = baton::make_tensor_view(lse4.data(), {batch, heads, n});
    // [doc:ulysses]
    baton::sequence_sharding sharding(baton::shard_layout::zigzag, seq_len, comm.size());
    baton::ulysses_attention ulysses(comm, baton::reference_attention{}, sharding);
    ulysses.forward(qv, kv, vv, baton::causal_mask{}, ov, lv);  // 4 heads over 4 ranks; the 2 kv heads replicated
    // [/doc:ulysses]
    // [doc:hybrid]
    auto mesh = baton::make_cp_mesh(comm, /*ring_degree=*/2, /*ulysses_degree=*/2);
    baton::sequence_sharding hybrid_sharding(baton::shard_layout::zigzag, seq_len, 2, 2);
    baton::hybrid_attention hybrid(mesh, baton::reference_attention{}, hybrid_sharding);
    hybrid.forward(qv, kv, vv, baton::causal_mask{}, ov, lv);
    // [/doc:hybrid]
    first_value[static_cast<std::size_t>(comm.rank())] = out4[0];
  });
  for (float x : first_value) CHECK(std::abs(x - 1.0f) < 1e-6f);  // every value is 1: so is the output
}

TEST_CASE("docs: merge example", "[cp][docs]") {
  // [doc:merge]
  // Two partial results for one query row (dim 2) over disjoint key blocks ...
  std::vector<float> out{1.0f, 0.0f}, lse{0.0f};                      // running result
  const std::vector<float> out_b{0.0f, 1.0f}, lse_b{std::log(3.0f)};  // block b: 3x the weight
  baton::merge_attention_partial<float, float, float>(out, lse, out_b, lse_b, /*dim=*/2);
  // ... out == {0.25, 0.75}, lse == log(4)
  // [/doc:merge]
  CHECK(std::abs(out[0] - 0.25f) < 1e-6f);
  CHECK(std::abs(out[1] - 0.75f) < 1e-6f);
  CHECK(std::abs(lse[0] - std::log(4.0f)) < 1e-6f);
}

TEST_CASE("docs: padding example", "[cp][docs][reliability]") {
  std::vector<float> q_full(1 * 33 * 4 * 8);
  for (std::size_t i = 0; i < q_full.size(); ++i) q_full[i] = std::sin(0.3f * static_cast<float>(i));
  std::vector<float> out_padded(1 * 36 * 4 * 8);
  // [doc:padding]
  const std::int64_t real = 33;  // 33 tokens over 2 (ring) x 2 (Ulysses): pad to 36 for equal shards
  const std::int64_t padded = baton::sequence_sharding::padded_length(baton::shard_layout::zigzag, real, 2, 2);
  baton::sequence_sharding sharding(baton::shard_layout::zigzag, padded, 2, 2);
  const std::vector<std::int64_t> shape{1, real, 4, 8};  // [batch, seq, heads, dim]
  std::vector<float> q_padded = baton::pad_sequence<float>(q_full, shape, /*seq_axis=*/1, padded);
  baton::padding_mask mask(baton::causal_mask{}, real);  // attend with this mask
  // ... shard, attend, unshard as below; then back to the real tokens:
  const std::vector<std::int64_t> padded_shape{1, padded, 4, 8};
  std::vector<float> out_real = baton::unpad_sequence<float>(out_padded, padded_shape, 1, real);
  // [/doc:padding]
  CHECK(padded == 36);
  CHECK(sharding.local_len() == 9);
  // Attention over the padded sequence with the padding mask equals the unpadded one on the
  // real tokens (q = k = v here).
  std::vector<float> lse_padded(4 * 36), out_plain(q_full.size()), lse_plain(4 * 33);
  baton::reference_attention{}.forward(
      baton::make_tensor_view(static_cast<const float*>(q_padded.data()), {1, 36, 4, 8}),
      baton::make_tensor_view(static_cast<const float*>(q_padded.data()), {1, 36, 4, 8}),
      baton::make_tensor_view(static_cast<const float*>(q_padded.data()), {1, 36, 4, 8}), mask,
      baton::make_tensor_view(out_padded.data(), {1, 36, 4, 8}), baton::make_tensor_view(lse_padded.data(), {1, 4, 36}));
  baton::reference_attention{}.forward(
      baton::make_tensor_view(static_cast<const float*>(q_full.data()), {1, 33, 4, 8}),
      baton::make_tensor_view(static_cast<const float*>(q_full.data()), {1, 33, 4, 8}),
      baton::make_tensor_view(static_cast<const float*>(q_full.data()), {1, 33, 4, 8}), baton::causal_mask{},
      baton::make_tensor_view(out_plain.data(), {1, 33, 4, 8}), baton::make_tensor_view(lse_plain.data(), {1, 4, 33}));
  out_real = baton::unpad_sequence<float>(out_padded, padded_shape, 1, real);
  CHECK(out_real == out_plain);
}

TEST_CASE("docs: the example of padding_mask's comment", "[cp][docs]") {
  // [doc:padding_mask_comment]
  const std::int64_t padded = baton::sequence_sharding::padded_length(baton::shard_layout::zigzag, 33, 2, 2);
  baton::sequence_sharding sharding(baton::shard_layout::zigzag, padded, 2, 2);  // 36 tokens
  baton::padding_mask mask(baton::causal_mask{}, /*length=*/33);               // hides 33..35
  // [/doc:padding_mask_comment]
  CHECK(padded == 36);  // zigzag over 2 ring groups of 2 Ulysses ranks: a multiple of 2 x lcm(2, 2) x 2
  CHECK(sharding.local_len() == 9);
  CHECK(mask.allowed(32, 0));
  CHECK_FALSE(mask.allowed(34, 0));  // a padding query attends to nothing
  CHECK_FALSE(mask.allowed(35, 33));
}

namespace {

// One rank's shard of a cp_test problem and its results, as the headers' examples name them:
// q, k, v, dout (const views of the shard) and out, lse, dq, dk, dv.
struct shard_views {
  std::vector<float> q_data, k_data, v_data, dout_data, out_data, lse_data, dq_data, dk_data, dv_data;
  baton::tensor_view<const float, 4> q, k, v, dout;
  baton::tensor_view<float, 4> out, dq, dk, dv;
  baton::tensor_view<float, 3> lse;

  shard_views(const cp_test::problem<float>& p, const baton::sequence_sharding& sharding, int shard) {
    const cp_test::dims& d = p.d;
    const std::int64_t n = sharding.local_len();
    const std::vector<std::int64_t> q_shape{d.batch, d.seq, d.heads_q, d.dim}, kv_shape{d.batch, d.seq, d.heads_kv, d.dim};
    q_data = baton::shard_sequence<float>(sharding, shard, p.q, q_shape, 1);
    k_data = baton::shard_sequence<float>(sharding, shard, p.k, kv_shape, 1);
    v_data = baton::shard_sequence<float>(sharding, shard, p.v, kv_shape, 1);
    dout_data = baton::shard_sequence<float>(sharding, shard, p.dout, q_shape, 1);
    out_data.resize(q_data.size());
    dq_data.resize(q_data.size());
    dk_data.resize(k_data.size());
    dv_data.resize(k_data.size());
    lse_data.resize(static_cast<std::size_t>(d.batch * d.heads_q * n));
    q = cp_test::cview4(q_data, d.batch, n, d.heads_q, d.dim);
    k = cp_test::cview4(k_data, d.batch, n, d.heads_kv, d.dim);
    v = cp_test::cview4(v_data, d.batch, n, d.heads_kv, d.dim);
    dout = cp_test::cview4(dout_data, d.batch, n, d.heads_q, d.dim);
    out = cp_test::view4(out_data, d.batch, n, d.heads_q, d.dim);
    dq = cp_test::view4(dq_data, d.batch, n, d.heads_q, d.dim);
    dk = cp_test::view4(dk_data, d.batch, n, d.heads_kv, d.dim);
    dv = cp_test::view4(dv_data, d.batch, n, d.heads_kv, d.dim);
    lse = baton::make_tensor_view(lse_data.data(), {d.batch, d.heads_q, n});
  }

  // Writes this shard's results into their global positions of `all` (shards are disjoint).
  void unshard(const cp_test::problem<float>& p, const baton::sequence_sharding& sharding, int shard,
               cp_test::tensors<float>& all, bool with_gradients) const {
    const cp_test::dims& d = p.d;
    const std::vector<std::int64_t> q_shape{d.batch, d.seq, d.heads_q, d.dim}, kv_shape{d.batch, d.seq, d.heads_kv, d.dim},
        lse_shape{d.batch, d.heads_q, d.seq};
    baton::unshard_sequence<float>(sharding, shard, out_data, q_shape, 1, all.out);
    baton::unshard_sequence<float>(sharding, shard, lse_data, lse_shape, 2, all.lse);
    if (!with_gradients) return;
    baton::unshard_sequence<float>(sharding, shard, dq_data, q_shape, 1, all.dq);
    baton::unshard_sequence<float>(sharding, shard, dk_data, kv_shape, 1, all.dk);
    baton::unshard_sequence<float>(sharding, shard, dv_data, kv_shape, 1, all.dv);
  }
};

constexpr cp_test::dims header_dims{.batch = 1, .seq = 16, .heads_q = 4, .heads_kv = 2, .dim = 4};

}  // namespace

TEST_CASE("docs: the examples of ring_attention's and ulysses_attention's comments", "[cp][docs]") {
  const auto p = cp_test::make_problem<float>(header_dims, baton::causal_mask{}, 11);
  const std::int64_t seq_len = header_dims.seq;
  cp_test::tensors<float> ring_result(header_dims), ulysses_result(header_dims);
  baton::run_local(2, [&](baton::local_communicator& comm) {
    const baton::sequence_sharding layout(baton::shard_layout::zigzag, seq_len, comm.size());
    {
      const shard_views mine(p, layout, comm.rank());
      const auto q = mine.q, k = mine.k, v = mine.v, dout = mine.dout;
      const auto out = mine.out, dq = mine.dq, dk = mine.dk, dv = mine.dv;
      const auto lse = mine.lse;
      // [doc:ring_comment]
      baton::sequence_sharding sharding(baton::shard_layout::zigzag, seq_len, comm.size());
      baton::ring_attention ring(comm, baton::reference_attention{}, sharding);
      ring.forward(q, k, v, baton::causal_mask{}, out, lse);
      ring.backward(q, k, v, out, lse, dout, baton::causal_mask{}, dq, dk, dv);
      // [/doc:ring_comment]
      mine.unshard(p, sharding, ring.shard_index(), ring_result, true);
    }
    {
      const baton::sequence_sharding& sharding = layout;
      const shard_views mine(p, sharding, comm.rank());
      const auto q = mine.q, k = mine.k, v = mine.v, dout = mine.dout;
      const auto out = mine.out, dq = mine.dq, dk = mine.dk, dv = mine.dv;
      const auto lse = mine.lse;
      // [doc:ulysses_comment]
      baton::ulysses_attention ulysses(comm, baton::reference_attention{}, sharding);
      ulysses.forward(q, k, v, baton::causal_mask{}, out, lse);
      ulysses.backward(q, k, v, out, lse, dout, baton::causal_mask{}, dq, dk, dv);
      // [/doc:ulysses_comment]
      mine.unshard(p, sharding, ulysses.shard_index(), ulysses_result, true);
    }
  });
  CHECK(cp_test::compare(ring_result, p.reference).max() <= cp_test::tolerance<float>());
  CHECK(cp_test::compare(ulysses_result, p.reference).max() <= cp_test::tolerance<float>());
}

TEST_CASE("docs: the example of hybrid_attention's comment", "[cp][docs]") {
  const auto p = cp_test::make_problem<float>(header_dims, baton::causal_mask{}, 12);
  const std::int64_t seq_len = header_dims.seq;
  cp_test::tensors<float> result(header_dims);
  baton::run_local(4, [&](baton::local_communicator& world) {
    // make_cp_mesh numbers the shards as the world's ranks: shard index = world rank.
    const shard_views mine(p, baton::sequence_sharding(baton::shard_layout::zigzag, seq_len, 2, 2), world.rank());
    const auto q = mine.q, k = mine.k, v = mine.v;
    const auto out = mine.out;
    const auto lse = mine.lse;
    // [doc:hybrid_comment]
    auto mesh = baton::make_cp_mesh(world, /*ring=*/2, /*ulysses=*/2);
    baton::sequence_sharding sharding(baton::shard_layout::zigzag, seq_len, 2, 2);
    baton::hybrid_attention attn(mesh, baton::reference_attention{}, sharding);
    attn.forward(q, k, v, baton::causal_mask{}, out, lse);
    // [/doc:hybrid_comment]
    if (attn.shard_index() != world.rank()) throw std::runtime_error("hybrid shard index is not the world rank");
    mine.unshard(p, sharding, attn.shard_index(), result, false);
  });
  CHECK(cp_test::rel_l2(result.out, p.reference.out) <= cp_test::tolerance<float>());
  CHECK(cp_test::rel_l2(result.lse, p.reference.lse) <= cp_test::tolerance<float>());
}
