// Issue 13, context parallelism: the padding advice of sequence_sharding and the padding
// helpers (item 7), errors that every rank reports alike and masks / scales the ranks must
// agree on (item 6), and the non-finite rule through every CP mode (item 2).
#include "catch.hpp"
#include "cp_test_support.hpp"

#include "../attention/nonfinite_oracle.hpp"

#include <baton/attention/reference.hpp>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <typeinfo>
#include <vector>

// Part of test_cp's one translation unit: its own namespace keeps its helpers apart.
namespace cp_reliability_test {

using namespace cp_test;
using baton::sequence_sharding;
using baton::shard_layout;

namespace {

// A length the layout splits evenly (every rank the same number of tokens).
bool even(shard_layout layout, std::int64_t n, int degree, int inner) {
  return sequence_sharding(layout, n, degree, inner).is_even();
}

}  // namespace

// ---- item 7 --------------------------------------------------------------------------------

TEST_CASE("padding advice: padded_length is the smallest length split evenly, for every layout x degree x inner "
          "degree (any length is accepted)",
          "[cp][sharding][reliability]") {
  // Any length shards now (issue 17); padded_length remains for code that wants equal shards.
  REQUIRE_NOTHROW(sequence_sharding(shard_layout::contiguous, 33, 2, 2));
  REQUIRE(sequence_sharding::padded_length(shard_layout::contiguous, 33, 2, 2) == 36);
  std::int64_t uneven = 0;
  for (shard_layout layout : {shard_layout::contiguous, shard_layout::zigzag, shard_layout::striped})
    for (int degree = 1; degree <= 8; ++degree)
      for (int inner = 1; inner <= 8; ++inner)
        for (std::int64_t n = 1; n <= 140; ++n) {
          const std::int64_t padded = sequence_sharding::padded_length(layout, n, degree, inner);
          INFO(to_string(layout) << " " << n << " over " << degree << " x " << inner << ": padded_length " << padded);
          REQUIRE(even(layout, padded, degree, inner));
          // contiguous and striped split evenly exactly at multiples of R x U; zigzag also at
          // some other lengths (6 over 2: chunks 2 2 1 1 give both ranks 3), so the advice is a
          // sufficient length for it, not the only one
          if (padded != n && layout != shard_layout::zigzag) REQUIRE_FALSE(even(layout, n, degree, inner));
          if (padded != n) ++uneven;
        }
  CHECK(uneven > 10000);
}

namespace {

// The padded run of a problem of `real` tokens: pad q, k, v, dout to the accepted length, run
// the mode with padding_mask(mask, real), drop the padding from the results.
template <class T, class Mask>
tensors<T> run_padded(const config& c, const problem<T>& p, const Mask& mask) {
  const std::int64_t real = p.d.seq;
  dims pd = p.d;
  pd.seq = sequence_sharding::padded_length(c.layout, real, c.degree, c.inner_degree);
  problem<T> padded(pd);
  const std::vector<std::int64_t> qshape{p.d.batch, real, p.d.heads_q, p.d.dim},
      kvshape{p.d.batch, real, p.d.heads_kv, p.d.dim};
  padded.q = baton::pad_sequence<T>(p.q, qshape, 1, pd.seq);
  padded.k = baton::pad_sequence<T>(p.k, kvshape, 1, pd.seq);
  padded.v = baton::pad_sequence<T>(p.v, kvshape, 1, pd.seq);
  padded.dout = baton::pad_sequence<T>(p.dout, qshape, 1, pd.seq);
  const tensors<T> got = run_cp<T>(c, padded, baton::padding_mask(mask, real));
  const std::vector<std::int64_t> pq{pd.batch, pd.seq, pd.heads_q, pd.dim}, pkv{pd.batch, pd.seq, pd.heads_kv, pd.dim},
      pl{pd.batch, pd.heads_q, pd.seq};
  tensors<T> r(p.d);
  r.out = baton::unpad_sequence<T>(got.out, pq, 1, real);
  r.dq = baton::unpad_sequence<T>(got.dq, pq, 1, real);
  r.dk = baton::unpad_sequence<T>(got.dk, pkv, 1, real);
  r.dv = baton::unpad_sequence<T>(got.dv, pkv, 1, real);
  r.lse = baton::unpad_sequence<baton::lse_t<T>>(got.lse, pl, 2, real);
  // the padding itself: queries attend to nothing, keys are attended by nothing
  for (std::int64_t b = 0; b < pd.batch; ++b)
    for (std::int64_t h = 0; h < pd.heads_q; ++h)
      for (std::int64_t i = real; i < pd.seq; ++i)
        CHECK(got.lse[static_cast<std::size_t>((b * pd.heads_q + h) * pd.seq + i)] ==
              -std::numeric_limits<baton::lse_t<T>>::infinity());
  for (std::int64_t b = 0; b < pd.batch; ++b)
    for (std::int64_t i = real; i < pd.seq; ++i)
      for (std::int64_t x = 0; x < pd.heads_kv * pd.dim; ++x)
        CHECK(got.dk[static_cast<std::size_t>((b * pd.seq + i) * pd.heads_kv * pd.dim + x)] == T(0));
  return r;
}

}  // namespace

TEST_CASE("padding helpers: pad_sequence + padding_mask give the unpadded results on the real tokens",
          "[cp][sharding][reliability]") {
  dims d;
  d.batch = 1;
  d.seq = 33;
  d.heads_q = 4;
  d.heads_kv = 2;
  d.dim = 5;
  std::vector<std::int64_t> ids(33);
  for (std::int64_t i = 0; i < 33; ++i) ids[static_cast<std::size_t>(i)] = i < 10 ? 0 : 1;  // ids for real tokens only
  const std::vector<config> configs{
      {mode::hybrid, shard_layout::contiguous, 2, 2}, {mode::hybrid, shard_layout::zigzag, 2, 2},
      {mode::ring, shard_layout::zigzag, 4, 1},       {mode::ring, shard_layout::striped, 4, 1},
      {mode::ulysses, shard_layout::contiguous, 2, 1}};
  const auto check = [&](const auto& mask, const char* name) {
    const auto p = make_problem<double>(d, mask, 11);
    for (const config& c : configs) {
      INFO(c.text() << ", " << name);
      const auto got = run_padded<double>(c, p, mask);
      CHECK(compare(got, p.reference).max() <= tolerance<double>());
    }
  };
  check(baton::causal_mask{}, "causal");
  check(baton::no_mask{}, "no mask");
  check(baton::document_mask(ids), "document (ids for the real tokens only)");
}

TEST_CASE("padding helpers: bad arguments are named", "[cp][sharding][reliability]") {
  const std::vector<float> x(6);
  const std::vector<std::int64_t> shape{1, 3, 2};
  REQUIRE_THROWS_WITH(baton::pad_sequence<float>(x, shape, 1, 2), Catch::Contains("shorter than the sequence"));
  REQUIRE_THROWS_WITH(baton::unpad_sequence<float>(x, shape, 1, 4), Catch::Contains("outside [0, 3]"));
  REQUIRE_THROWS_AS(sequence_sharding::padded_length(shard_layout::zigzag, 5, 0), baton::cp_error);
  REQUIRE_THROWS_AS(baton::padding_mask(baton::causal_mask{}, -1), baton::attention_error);
}

// ---- item 6 --------------------------------------------------------------------------------

namespace {

struct outcome {
  std::string type, message;
};

// Runs f on every rank with exceptions propagating out of the rank's function (as in a real
// program: run_local then aborts every peer's pending operation), and records what each rank
// threw.
std::vector<outcome> propagate(int n, const std::function<void(baton::local_communicator&)>& f) {
  std::vector<outcome> seen(static_cast<std::size_t>(n));
  baton::local_options options;
  options.timeout = std::chrono::seconds(20);
  try {
    baton::run_local(
        n,
        [&](baton::local_communicator& comm) {
          try {
            f(comm);
          } catch (const baton::cp_error& e) {
            seen[static_cast<std::size_t>(comm.rank())] = {"cp_error", e.what()};
            throw;
          } catch (const baton::comm_error& e) {
            seen[static_cast<std::size_t>(comm.rank())] = {"comm_error", e.what()};
            throw;
          } catch (const std::exception& e) {
            seen[static_cast<std::size_t>(comm.rank())] = {typeid(e).name(), e.what()};
            throw;
          }
        },
        options);
  } catch (...) {
  }
  return seen;
}

void same_everywhere(const std::vector<outcome>& seen, const std::string& needle) {
  for (std::size_t r = 0; r < seen.size(); ++r) {
    INFO("rank " << r << ": " << seen[r].type << ": " << seen[r].message);
    CHECK(seen[r].type == "cp_error");
    CHECK(seen[r].message == seen[0].message);
    CHECK(seen[r].message.find(needle) != std::string::npos);
  }
}

// A shard of ones on one rank; `tweak` may change the mask / scale / shape per rank.
struct call {
  std::int64_t seq = 4;
  template <class Attention, class Mask>
  void forward(Attention& attn, const Mask& mask, double scale = 0, std::int64_t local = 4) const {
    const std::int64_t b = 1, h = 2, d = 3;
    std::vector<float> q(static_cast<std::size_t>(b * local * h * d), 0.5f), out(q.size()),
        lse(static_cast<std::size_t>(b * h * local));
    baton::cp_params params;
    params.softmax_scale = scale;
    attn.forward(cview4(q, b, local, h, d), cview4(q, b, local, h, d), cview4(q, b, local, h, d), mask,
                 view4(out, b, local, h, d), baton::make_tensor_view(lse.data(), {b, h, local}), params);
  }
};

template <class F>
void on_each_mode(F&& f) {
  f("ring", 4, [](baton::local_communicator& comm, auto&& body) {
    baton::ring_attention attn(comm, baton::reference_attention{},
                               sequence_sharding(shard_layout::zigzag, 16, comm.size()));
    body(attn, comm.rank());
  });
  f("ulysses", 2, [](baton::local_communicator& comm, auto&& body) {
    baton::ulysses_attention attn(comm, baton::reference_attention{},
                                  sequence_sharding(shard_layout::contiguous, 8, comm.size()));
    body(attn, comm.rank());
  });
  f("hybrid", 4, [](baton::local_communicator& comm, auto&& body) {
    auto mesh = baton::make_cp_mesh(comm, 2, 2);
    baton::hybrid_attention attn(mesh, baton::reference_attention{}, sequence_sharding(shard_layout::zigzag, 16, 2, 2));
    body(attn, comm.rank());
  });
}

}  // namespace

TEST_CASE("errors: a rank's bad input gives every rank the same cp_error and message, run after run",
          "[cp][errors][reliability]") {
  on_each_mode([](const char* name, int n, auto&& with_attention) {
    for (int run = 0; run < 20; ++run) {
      INFO(name << ", run " << run);
      same_everywhere(propagate(n,
                                [&](baton::local_communicator& comm) {
                                  with_attention(comm, [&](auto& attn, int rank) {
                                    call{}.forward(attn, baton::causal_mask{}, 0, rank == 1 ? 5 : 4);
                                  });
                                }),
                      "rank 1");
    }
  });
  // make_cp_mesh's own agreement, too
  for (int run = 0; run < 20; ++run)
    same_everywhere(propagate(4, [](baton::local_communicator& comm) { (void)baton::make_cp_mesh(comm, 3, 2); }),
                    "does not match the world size 4");
}

TEST_CASE("errors: ranks passing different masks or softmax scales all throw cp_error naming the mismatch",
          "[cp][errors][reliability]") {
  std::vector<std::int64_t> ids(16, 0), other_ids(16, 0);
  other_ids[9] = 1;  // one segment id differs
  on_each_mode([&](const char* name, int n, auto&& with_attention) {
    const auto expect = [&](const std::string& needle, const auto& body) {
      INFO(name << ": " << needle);
      same_everywhere(propagate(n, [&](baton::local_communicator& comm) { with_attention(comm, body); }), needle);
    };
    expect("different softmax scales", [](auto& attn, int rank) {
      call{}.forward(attn, baton::causal_mask{}, rank == 1 ? 0.25 : 0.5);
    });
    expect("different masks", [](auto& attn, int rank) {
      if (rank == 1)
        call{}.forward(attn, baton::no_mask{});
      else
        call{}.forward(attn, baton::causal_mask{});
    });
    expect("different masks", [](auto& attn, int rank) {
      call{}.forward(attn, baton::sliding_window_mask{5, rank == 1 ? 3 : 2});
    });
    expect("different masks", [&](auto& attn, int rank) {
      call{}.forward(attn, baton::document_mask(rank == 1 ? other_ids : ids));
    });
    expect("different masks", [](auto& attn, int rank) {
      call{}.forward(attn, baton::block_mask([rank](std::int64_t q, std::int64_t k) { return k <= q || (rank == 1 && k == q + 1); },
                                             16, 16, 4));
    });
    expect("softmax_scale is -1", [](auto& attn, int rank) {
      call{}.forward(attn, baton::causal_mask{}, rank == 1 ? -1.0 : 0.5);
    });
    // the same effective scale (0 selects 1/sqrt(dim)) and the same mask built apart agree
    std::vector<std::string> errors(4);
    baton::run_local(n, [&](baton::local_communicator& comm) {
      with_attention(comm, [&](auto& attn, int rank) {
        try {
          call{}.forward(attn, baton::document_mask(std::vector<std::int64_t>(ids)), rank == 1 ? 1.0 / std::sqrt(3.0) : 0);
        } catch (const std::exception& e) {
          errors[static_cast<std::size_t>(comm.rank())] = e.what();
        }
      });
    });
    for (const auto& e : errors) CHECK(e == "");
  });
}

// ---- item 2 --------------------------------------------------------------------------------

TEST_CASE("non-finite rule: every CP mode gives what the rule gives on the whole sequence",
          "[cp][nonfinite][reliability]") {
  dims d;
  d.batch = 1;
  d.seq = 24;
  d.heads_q = 4;
  d.heads_kv = 2;
  d.dim = 3;
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  std::vector<std::int64_t> ids(24);
  for (std::int64_t i = 0; i < 24; ++i) ids[static_cast<std::size_t>(i)] = i < 9 ? 0 : 1;
  const std::vector<config> configs{{mode::ring, shard_layout::contiguous, 2, 1}, {mode::ring, shard_layout::zigzag, 3, 1},
                                    {mode::ring, shard_layout::striped, 4, 1},    {mode::ulysses, shard_layout::zigzag, 2, 1},
                                    {mode::hybrid, shard_layout::zigzag, 2, 2},   {mode::hybrid, shard_layout::striped, 3, 2}};
  const auto check = [&](const auto& mask, const char* mask_name) {
    // (position of a NaN q row, of an inf k, of a NaN v, of a NaN dout) by global position
    struct pattern {
      std::int64_t q, k, v, o;
      const char* what;
    };
    for (const pattern& pt : {pattern{5, -1, -1, -1, "NaN q"}, pattern{-1, 20, -1, -1, "inf k late"},
                              pattern{-1, 2, 13, -1, "inf k early, NaN v"}, pattern{-1, -1, -1, 17, "NaN dout"},
                              pattern{-1, -1, -1, -1, "finite"}}) {
      attn_test::inputs<double> in{attn_test::shape{d.batch, d.seq, d.seq, d.heads_q, d.heads_kv, d.dim}, {}, {}, {}, {}};
      problem<double> p(d);
      p.q = random_values<double>(static_cast<std::size_t>(d.q_elems()), 3);
      p.k = random_values<double>(static_cast<std::size_t>(d.kv_elems()), 4);
      p.v = random_values<double>(static_cast<std::size_t>(d.kv_elems()), 5);
      p.dout = random_values<double>(static_cast<std::size_t>(d.q_elems()), 6);
      if (pt.q >= 0) p.q[static_cast<std::size_t>((pt.q * d.heads_q + 1) * d.dim)] = nan;
      if (pt.k >= 0) p.k[static_cast<std::size_t>((pt.k * d.heads_kv + 0) * d.dim + 2)] = inf;
      if (pt.v >= 0) p.v[static_cast<std::size_t>((pt.v * d.heads_kv + 1) * d.dim + 1)] = nan;
      if (pt.o >= 0) p.dout[static_cast<std::size_t>((pt.o * d.heads_q + 3) * d.dim)] = nan;
      in.q = p.q;
      in.k = p.k;
      in.v = p.v;
      in.dout = p.dout;
      const auto want = attn_test::nonfinite_oracle(in, mask);
      for (const config& c : configs) {
        INFO(c.text() << ", " << mask_name << ", " << pt.what);
        const auto got = run_cp<double>(c, p, mask);
        CHECK(attn_test::nan_pattern_mismatch(got.out, want.out, 1e-12) == "");
        CHECK(attn_test::nan_pattern_mismatch(got.lse, want.lse, 1e-12) == "");
        CHECK(attn_test::nan_pattern_mismatch(got.dq, want.dq, 1e-12) == "");
        CHECK(attn_test::nan_pattern_mismatch(got.dk, want.dk, 1e-12) == "");
        CHECK(attn_test::nan_pattern_mismatch(got.dv, want.dv, 1e-12) == "");
      }
    }
  };
  check(baton::causal_mask{}, "causal");
  check(baton::no_mask{}, "no mask");
  check(baton::document_mask(ids), "document");
}

TEST_CASE("merge_attention_partial: a NaN block is never hidden by the merge", "[cp][merge][nonfinite][reliability]") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), neg_inf = -std::numeric_limits<float>::infinity();
  for (float running_lse : {neg_inf, 0.5f, 80.0f}) {
    for (bool nan_first : {false, true}) {
      std::vector<float> out{nan_first ? nan : 1.0f, nan_first ? nan : 2.0f}, lse{nan_first ? nan : running_lse};
      const std::vector<float> out_b{nan_first ? 1.0f : nan, nan_first ? 1.0f : nan};
      const std::vector<float> lse_b{nan_first ? running_lse : nan};
      baton::merge_attention_partial<float, float, float>(out, lse, out_b, lse_b, 2);
      INFO("running lse " << running_lse << (nan_first ? ", NaN first" : ", NaN second"));
      CHECK(std::isnan(lse[0]));
      CHECK(std::isnan(out[0]));
      CHECK(std::isnan(out[1]));
    }
  }
}

}  // namespace cp_reliability_test
