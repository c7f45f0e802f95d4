// baton::nn::cross_attention (issue 31): the piece on one rank against central finite
// differences (x, the memory and a weight), and under ring, Ulysses and hybrid attention
// built for cross-attention (queries and memory each sharded by its own layout, Sq != Sk)
// against the same piece on one rank with no_cp: outputs and input gradients row for row,
// weight gradients summed over the ranks. Double, reference backend; rank threads record,
// the main thread asserts.
#include "catch.hpp"
#include "nn_test_util.hpp"

#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/cp.hpp>
#include <baton/nn.hpp>

#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace nn_cross_test {

using one_rank = baton::nn::no_cp<baton::reference_attention>;

inline baton::nn::transformer_config cross_config() {
  baton::nn::transformer_config c;
  c.d_model = 8;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.qkv_bias = true;
  return c;
}
constexpr std::int64_t cx_batch = 2, cx_seq_q = 5, cx_seq_k = 11, cx_mem = 6;

// sum(y * g): the scalar whose gradients the pieces compute for dy = g.
template <class Piece>
double loss(Piece& p, const baton::host_tensor<double>& x, const baton::host_tensor<double>& m,
            const baton::host_tensor<double>& g) {
  typename Piece::saved st;
  const baton::host_tensor<double> y = p.forward(x, m, st);
  double s = 0;
  for (std::int64_t i = 0; i < y.size(); ++i) s += y[i] * g[i];
  return s;
}

// Key padding: the memory's last 2 positions are padding.
inline baton::padding_mask<baton::no_mask> key_padding() { return {baton::no_mask{}, cx_seq_q, cx_seq_k - 2}; }

}  // namespace nn_cross_test

using namespace nn_cross_test;

TEST_CASE("nn::cross_attention: gradients against central finite differences (one rank, double)",
          "[nn][cross_attention]") {
  const baton::nn::initializer init(5);
  baton::nn::cross_attention<double, one_rank, baton::padding_mask<baton::no_mask>> piece(
      cross_config(), init / "cross", one_rank{}, key_padding(), cx_mem);
  baton::nn::zero_grad(baton::nn::parameters_of<double>(piece));  // (gradients start uninitialised)
  baton::host_tensor<double> x = nn_test::random_tensor<double>({cx_batch, cx_seq_q, 8}, 1),
                             m = nn_test::random_tensor<double>({cx_batch, cx_seq_k, cx_mem}, 2);
  const baton::host_tensor<double> g = nn_test::random_tensor<double>({cx_batch, cx_seq_q, 8}, 3);
  decltype(piece)::saved st;
  piece.forward(x, m, st);
  const auto grads = piece.backward_input(st, g);
  piece.backward_weight(st);
  // Central differences with h = 1e-5 in double: truncation O(h^2) ~ 1e-10 and rounding
  // ~1e-16 / h ~ 1e-11 relative to entries of order 1, so 1e-6 is a wide margin; a wrong
  // gradient (a transposed projection, a missing dv term) is off by order 1.
  const double h = 1e-5;
  const auto numeric = [&](baton::host_tensor<double>& t, std::int64_t i) {
    const double keep = t[i];
    t[i] = keep + h;
    const double up = loss(piece, x, m, g);
    t[i] = keep - h;
    const double down = loss(piece, x, m, g);
    t[i] = keep;
    return (up - down) / (2 * h);
  };
  double worst = 0;
  for (std::int64_t i = 0; i < x.size(); i += 7) worst = std::max(worst, std::abs(numeric(x, i) - grads.dx[i]));
  // Memory rows past the padding get no gradient: the finite difference sees that too.
  for (std::int64_t i = 0; i < m.size(); i += 5) worst = std::max(worst, std::abs(numeric(m, i) - grads.dmemory[i]));
  baton::nn::parameter<double>& wk = piece.wk().weight();
  for (std::int64_t i = 0; i < wk.value.size(); i += 3)
    worst = std::max(worst, std::abs(numeric(wk.value, i) - wk.grad[i]));
  CHECK(worst < 1e-6);
  double padded = 0;  // the padding rows of dmemory are exactly 0
  for (std::int64_t b = 0; b < cx_batch; ++b)
    for (std::int64_t j = cx_seq_k - 2; j < cx_seq_k; ++j)
      for (std::int64_t f = 0; f < cx_mem; ++f)
        padded = std::max(padded, std::abs(grads.dmemory[(b * cx_seq_k + j) * cx_mem + f]));
  CHECK(padded == 0.0);
}

TEST_CASE("nn::cross_attention: ring, Ulysses and hybrid with queries and memory sharded apart equal the one-rank "
          "piece",
          "[nn][cross_attention][cp]") {
  using nn_test::max_rel_error;
  const baton::nn::initializer init(9);
  const baton::host_tensor<double> x = nn_test::random_tensor<double>({cx_batch, cx_seq_q, 8}, 11),
                                   m = nn_test::random_tensor<double>({cx_batch, cx_seq_k, cx_mem}, 12),
                                   g = nn_test::random_tensor<double>({cx_batch, cx_seq_q, 8}, 13);
  baton::nn::cross_attention<double, one_rank, baton::padding_mask<baton::no_mask>> whole(
      cross_config(), init / "cross", one_rank{}, key_padding(), cx_mem);
  baton::nn::zero_grad(baton::nn::parameters_of<double>(whole));
  decltype(whole)::saved st;
  const baton::host_tensor<double> y_want = whole.forward(x, m, st);
  const auto want = whole.backward_input(st, g);
  whole.backward_weight(st);
  const auto w_want = nn_test::gradients_of<double>(whole);

  struct outcome {
    std::string what;
    double y, dx, dm, dw;
  };
  std::vector<outcome> outcomes;
  // (mode, degree, inner, q layout, memory layout). Ulysses 3: 4 query heads dealt unevenly;
  // 5 queries over 4 ranks and 11 keys over 2, 3, 4: uneven shards everywhere.
  enum class kind { ring, ulysses, hybrid };
  struct setup {
    kind k;
    int degree, inner;
    baton::shard_layout ql, kl;
    const char* text;
  };
  using L = baton::shard_layout;
  for (const setup& c : {setup{kind::ring, 2, 1, L::zigzag, L::contiguous, "ring 2, q zigzag, memory contiguous"},
                         setup{kind::ring, 3, 1, L::striped, L::zigzag, "ring 3, q striped, memory zigzag"},
                         setup{kind::ulysses, 3, 1, L::contiguous, L::striped, "Ulysses 3, q contiguous, memory striped"},
                         setup{kind::hybrid, 2, 2, L::zigzag, L::zigzag, "hybrid 2x2, zigzag both"}}) {
    const baton::sequence_sharding qs(c.ql, cx_seq_q, c.degree, c.inner);
    const baton::kv_sharding kv{baton::sequence_sharding(c.kl, cx_seq_k, c.degree, c.inner), 0};
    baton::host_tensor<double> y({cx_batch, cx_seq_q, 8}), dx({cx_batch, cx_seq_q, 8}), dm({cx_batch, cx_seq_k, cx_mem});
    std::vector<std::map<std::string, baton::host_tensor<double>>> rank_grads(static_cast<std::size_t>(c.degree * c.inner));
    baton::run_local(c.degree * c.inner, [&](baton::local_communicator& comm) {
      const auto run = [&](auto strategy) {
        baton::nn::cross_attention<double, decltype(strategy), baton::padding_mask<baton::no_mask>> piece(
            cross_config(), init / "cross", std::move(strategy), key_padding(), cx_mem);
        baton::nn::zero_grad(baton::nn::parameters_of<double>(piece));
        const int r = piece.strategy().shard_index();
        const std::vector<std::int64_t> xs{cx_batch, cx_seq_q, 8}, ms{cx_batch, cx_seq_k, cx_mem};
        const auto shard = [&](const baton::sequence_sharding& s, const baton::host_tensor<double>& t,
                               const std::vector<std::int64_t>& shape) {
          baton::host_tensor<double> out({cx_batch, s.local_len(r), shape[2]});
          baton::shard_sequence<double>(s, r, t.values(), shape, 1, std::span<double>(out.data(), out.size()));
          return out;
        };
        typename decltype(piece)::saved rst;
        const baton::host_tensor<double> yl = piece.forward(shard(qs, x, xs), shard(kv.sharding, m, ms), rst);
        const auto gl = piece.backward_input(rst, shard(qs, g, xs));
        piece.backward_weight(rst);
        baton::unshard_sequence<double>(qs, r, yl.values(), xs, 1, std::span<double>(y.data(), y.size()));
        baton::unshard_sequence<double>(qs, r, gl.dx.values(), xs, 1, std::span<double>(dx.data(), dx.size()));
        baton::unshard_sequence<double>(kv.sharding, r, gl.dmemory.values(), ms, 1, std::span<double>(dm.data(), dm.size()));
        rank_grads[static_cast<std::size_t>(r)] = nn_test::gradients_of<double>(piece);
      };
      if (c.k == kind::ring) {
        run(baton::ring_attention(comm, baton::reference_attention{}, qs, kv));
      } else if (c.k == kind::ulysses) {
        run(baton::ulysses_attention(comm, baton::reference_attention{}, qs, kv));
      } else {
        auto mesh = baton::make_cp_mesh(comm, c.degree, c.inner);
        run(baton::hybrid_attention(mesh.ulysses, mesh.ring, baton::reference_attention{}, qs, kv));
      }
    });
    // Each weight gradient summed over the ranks against the whole piece's, relative to the
    // largest weight gradient: wk's bias has a true gradient of 0 (a shift of every key
    // shifts a row's logits alike), so its own scale is rounding noise.
    double diff = 0, scale = 0;
    std::string worst;
    for (const auto& [name, want_grad] : w_want) {
      baton::host_tensor<double> sum(want_grad.shape());
      for (const auto& rg : rank_grads)
        for (std::int64_t i = 0; i < sum.size(); ++i) sum[i] += rg.at(name)[i];
      for (std::int64_t i = 0; i < sum.size(); ++i) {
        scale = std::max(scale, std::abs(want_grad[i]));
        if (std::abs(sum[i] - want_grad[i]) > diff) worst = name;
        diff = std::max(diff, std::abs(sum[i] - want_grad[i]));
      }
    }
    const double dw = scale > 0 ? diff / scale : INFINITY;
    outcomes.push_back({std::string(c.text) + " (worst weight gradient: " + worst + ")", max_rel_error(y, y_want), max_rel_error(dx, want.dx), max_rel_error(dm, want.dmemory), dw});
  }
  for (const outcome& o : outcomes) {
    INFO(o.what << ": y " << o.y << " dx " << o.dx << " dmemory " << o.dm << " weights " << o.dw);
    // Double on both sides, differing only in the order of the softmax sums over key blocks
    // and of the weight-gradient sums over ranks (the nn CP tests' 1e-10).
    CHECK(std::max({o.y, o.dx, o.dm, o.dw}) < 1e-10);
  }
}

TEST_CASE("nn::cross_attention: a memory of the wrong shape is an error, on every rank under CP",
          "[nn][cross_attention][errors]") {
  const baton::nn::initializer init(4);
  // One rank: nn_error naming the memory's shape.
  baton::nn::cross_attention<double, one_rank> whole(cross_config(), init, one_rank{}, {}, cx_mem);
  decltype(whole)::saved st;
  std::string one_rank_message;
  try {
    whole.forward(nn_test::random_tensor<double>({cx_batch, cx_seq_q, 8}, 1),
                  nn_test::random_tensor<double>({cx_batch, cx_seq_k, cx_mem + 1}, 2), st);
  } catch (const baton::nn::nn_error& e) {
    one_rank_message = e.what();
  }
  CHECK(one_rank_message.find("memory has shape [2, 11, 7] but expected [2, seq_k, 6]") != std::string::npos);

  // Ring of 2: rank 1 passes a memory shard one row too long; both ranks throw its problem.
  std::vector<std::string> messages(2);
  baton::run_local(2, [&](baton::local_communicator& comm) {
    const baton::sequence_sharding qs(baton::shard_layout::zigzag, cx_seq_q, 2);
    const baton::kv_sharding kv{baton::sequence_sharding(baton::shard_layout::contiguous, cx_seq_k, 2), 0};
    baton::nn::cross_attention<double, baton::ring_attention<baton::local_communicator, baton::reference_attention>>
        piece(cross_config(), init, baton::ring_attention(comm, baton::reference_attention{}, qs, kv), {}, cx_mem);
    const int r = comm.rank();
    const std::int64_t nk = kv.sharding.local_len(r) + (r == 1 ? 1 : 0);
    decltype(piece)::saved rst;
    try {
      piece.forward(nn_test::random_tensor<double>({cx_batch, qs.local_len(r), 8}, 1),
                    nn_test::random_tensor<double>({cx_batch, nk, cx_mem}, 2), rst);
    } catch (const baton::cp_error& e) {
      messages[static_cast<std::size_t>(r)] = e.what();
    }
  });
  INFO("rank 0: " << messages[0] << "\nrank 1: " << messages[1]);
  CHECK(messages[0] == messages[1]);
  CHECK(messages[0].find("this rank (shard 1) holds 2 queries and 5 keys of the shardings, but x has 2 rows and "
                         "memory 6") != std::string::npos);
}
