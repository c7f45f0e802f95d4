// Context parallelism through the model layer: one baton::nn::transformer_block, built on every
// rank from the same initializer, run sharded with ring / Ulysses / hybrid attention on the
// local (threads) world must give, row for row, the output and input gradient of the same block
// run unsharded with no_cp<Backend>, and its weight gradients summed over the context-parallel
// group (all_reduce_gradients) must be the unsharded block's. Both backward paths are run:
// backward, and backward_input + backward_weight.
//
// What makes it hold is that RoPE rotates by the side input's global positions
// (sequence_info::shard): with local positions (0..L-1 on every rank) q and k of different
// ranks would be rotated inconsistently and every rank but contiguous rank 0 would be off by
// order 1.
//
// Tolerances, as max |got - want| / max |want| (nn_test::max_rel_error): 1e-5 in float with the
// Kokkos flash backend, 1e-10 in double with the reference backend. Rank threads only compute
// and record errors; every Catch assertion runs on the main thread after run_local returns.
// The float cases check the Kokkos backend and skip in a build without Kokkos; the double
// cases run everywhere.
#include "catch.hpp"
#include "nn_test_util.hpp"
#include "skip.hpp"

#include <baton/attention/reference.hpp>
#include <baton/comm/local.hpp>
#include <baton/comm/mesh.hpp>
#include <baton/config.hpp>
#include <baton/cp.hpp>
#include <baton/nn.hpp>
#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif

#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace {

using baton::local_communicator;
using baton::shard_layout;

// The float cases' backend: Kokkos's flash kernels, what a CPU run uses. A build without
// Kokkos compiles those cases on the reference backend, and the ones that compare the Kokkos
// backend skip (skip_without_kokkos) instead of passing on the reference; the error cases
// check what happens before the attention runs and run on either.
#if BATON_HAS_KOKKOS()
using fast_backend = baton::kokkos_attention;
#else
using fast_backend = baton::reference_attention;
#endif
constexpr bool have_kokkos = BATON_HAS_KOKKOS();
constexpr const char* no_kokkos = "built without Kokkos (baton::kokkos): this case checks the Kokkos flash backend";

// GQA: 4 query heads over 2 kv heads, so Ulysses over 4 ranks replicates each kv head to 2 ranks.
// S = 24 divides as every case needs (zigzag over 4 ranks: 8; hybrid 2x2 zigzag: 4).
constexpr std::int64_t batch = 2, seq = 24, d_model = 32;

baton::nn::transformer_config block_config() {
  baton::nn::transformer_config c;
  c.d_model = d_model;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 8;
  c.ffn_hidden = 48;
  return c;
}

// Every rank, and the unsharded reference, builds its block from this: identical weights.
baton::nn::initializer block_init() { return baton::nn::initializer(20240611) / "layers" / std::int64_t{3}; }

template <class T>
constexpr double tolerance() {
  return std::is_same_v<T, double> ? 1e-10 : 1e-5;
}

enum class mode { ring, ulysses, hybrid };

struct cp_case {
  mode m = mode::ring;
  shard_layout layout = shard_layout::contiguous;
  int degree = 2;  // ring: ring size; ulysses: Ulysses size; hybrid: ring degree
  int inner = 1;   // hybrid: Ulysses degree
  bool device_mesh = false;  // hybrid: on a baton::device_mesh instead of make_cp_mesh
  int world() const { return degree * inner; }
  std::string text() const {
    const std::string name = m == mode::ring ? "ring" : m == mode::ulysses ? "ulysses" : "hybrid";
    return name + " " + std::string(baton::to_string(layout)) + " " + std::to_string(degree) +
           (m == mode::hybrid ? "x" + std::to_string(inner) + (device_mesh ? " (device_mesh)" : " (make_cp_mesh)")
                              : "");
  }
};

// The unsharded run: inputs, output, input gradient and weight gradients of the block under
// no_cp<Backend>, with the side input whole(seq) (and the document ids, if any).
template <class T>
struct reference_run {
  baton::host_tensor<T> x, dy, y, dx;
  std::map<std::string, baton::host_tensor<T>> grads;
  std::optional<baton::host_tensor<std::int64_t>> documents;
};

template <class T, class Backend>
reference_run<T> run_reference(std::uint32_t data_seed,
                               std::optional<baton::host_tensor<std::int64_t>> documents = std::nullopt) {
  reference_run<T> r;
  r.x = nn_test::random_tensor<T>({batch, seq, d_model}, data_seed);
  r.dy = nn_test::random_tensor<T>({batch, seq, d_model}, data_seed + 1);
  r.documents = std::move(documents);
  baton::nn::sequence_info info = baton::nn::sequence_info::whole(seq);
  if (r.documents) info = info.with_documents(*r.documents);
  using block_type = baton::nn::transformer_block<T, baton::nn::no_cp<Backend>>;
  block_type block(block_config(), block_init(), baton::nn::no_cp<Backend>{});
  typename block_type::saved st;
  r.y = block.forward(r.x, info, st);
  r.dx = block.backward(st, r.dy);
  r.grads = nn_test::gradients_of<T>(block);
  return r;
}

// Rows of `full` [batch, seq, d] that shard `index` of the sharding holds, in its local order.
template <class T>
baton::host_tensor<T> shard_of(const baton::sequence_sharding& sharding, int index, const baton::host_tensor<T>& full) {
  std::vector<std::int64_t> shape = full.shape();
  shape[1] = sharding.local_len();
  baton::host_tensor<T> local = baton::host_tensor<T>::for_overwrite(std::move(shape));
  baton::shard_sequence<T>(sharding, index, full.values(), full.shape(), 1, local.values());
  return local;
}

// What one rank measured: (what, max relative error) pairs, checked on the main thread.
struct rank_report {
  int shard = -1;
  std::vector<std::pair<std::string, double>> errors;
  void add(std::string what, double error) { errors.emplace_back(std::move(what), error); }
};

// One rank's part: the block under `strategy` on this rank's shard, both backward paths, the
// weight gradients summed over `cp_group`, everything compared with the reference's rows.
template <class T, class Strategy, class Comm>
void run_block_rank(Strategy strategy, Comm& cp_group, const reference_run<T>& ref, rank_report& report) {
  using block_type = baton::nn::transformer_block<T, Strategy>;
  block_type block(block_config(), block_init(), std::move(strategy));
  const baton::sequence_sharding& sharding = block.attention().strategy().sharding();
  const int shard = block.attention().strategy().shard_index();
  report.shard = shard;

  baton::nn::sequence_info info = baton::nn::sequence_info::shard(sharding, shard);
  if (ref.documents) info = info.with_documents(*ref.documents);
  const baton::host_tensor<T> x = shard_of(sharding, shard, ref.x);
  const baton::host_tensor<T> dy = shard_of(sharding, shard, ref.dy);
  const baton::host_tensor<T> y_want = shard_of(sharding, shard, ref.y);
  const baton::host_tensor<T> dx_want = shard_of(sharding, shard, ref.dx);
  const auto params = baton::nn::parameters_of<T>(block);

  for (const bool split : {false, true}) {
    const std::string path = split ? "backward_input + backward_weight: " : "backward: ";
    baton::nn::zero_grad(params);
    typename block_type::saved st;
    const baton::host_tensor<T> y = block.forward(x, info, st);
    baton::host_tensor<T> dx;
    if (split) {
      dx = block.backward_input(st, dy);
      block.backward_weight(st);
    } else {
      dx = block.backward(st, dy);
    }
    baton::nn::all_reduce_gradients(params, cp_group);

    report.add(path + "output", nn_test::max_rel_error(y, y_want));
    report.add(path + "dx", nn_test::max_rel_error(dx, dx_want));
    const auto grads = nn_test::gradients_of<T>(block);
    report.add(path + "number of gradients", grads.size() == ref.grads.size() ? 0.0 : INFINITY);
    for (const auto& [name, g] : grads) {
      const auto it = ref.grads.find(name);
      report.add(path + "gradient " + name, it == ref.grads.end() ? INFINITY : nn_test::max_rel_error(g, it->second));
    }
  }
}

// Runs the case on a local world of c.world() ranks; returns each rank's report.
template <class T, class Backend>
std::vector<rank_report> run_case(const cp_case& c, const reference_run<T>& ref) {
  std::vector<rank_report> reports(static_cast<std::size_t>(c.world()));
  baton::run_local(c.world(), [&](local_communicator& comm) {
    rank_report& report = reports[static_cast<std::size_t>(comm.rank())];
    switch (c.m) {
      case mode::ring: {
        const baton::sequence_sharding sharding(c.layout, seq, c.degree);
        run_block_rank<T>(baton::ring_attention<local_communicator, Backend>(comm, Backend{}, sharding), comm, ref,
                          report);
        break;
      }
      case mode::ulysses: {
        const baton::sequence_sharding sharding(c.layout, seq, c.degree);
        run_block_rank<T>(baton::ulysses_attention<local_communicator, Backend>(comm, Backend{}, sharding), comm, ref,
                          report);
        break;
      }
      case mode::hybrid: {
        using hybrid = baton::hybrid_attention<local_communicator, local_communicator, Backend>;
        const baton::sequence_sharding sharding(c.layout, seq, c.degree, c.inner);
        if (c.device_mesh) {
          baton::device_mesh<local_communicator> mesh(comm, baton::mesh_shape{.cp_ring = c.degree, .cp_ulysses = c.inner});
          run_block_rank<T>(hybrid(mesh, Backend{}, sharding), mesh.context_parallel(), ref, report);
        } else {
          auto mesh = baton::make_cp_mesh(comm, c.degree, c.inner);
          run_block_rank<T>(hybrid(mesh, Backend{}, sharding), comm, ref, report);
        }
        break;
      }
    }
  });
  return reports;
}

template <class T, class Backend>
void check_cases(const std::vector<cp_case>& cases, const reference_run<T>& ref) {
  for (const cp_case& c : cases) {
    const std::vector<rank_report> reports = run_case<T, Backend>(c, ref);
    for (std::size_t r = 0; r < reports.size(); ++r) {
      INFO(c.text() << ", rank " << r << " (shard " << reports[r].shard << ")");
      // output and dx, then the 9 gradients (norms, wq/wk/wv/wo, gate/up/down), on both paths
      CHECK(reports[r].errors.size() == 2 * (3 + ref.grads.size()));
      for (const auto& [what, error] : reports[r].errors) {
        INFO(what << ": max rel error " << error);
        CHECK(error <= tolerance<T>());
      }
    }
  }
}

std::vector<cp_case> ring_cases() {
  std::vector<cp_case> out;
  for (const int ranks : {2, 4})
    for (const auto layout : {shard_layout::contiguous, shard_layout::zigzag, shard_layout::striped})
      out.push_back({mode::ring, layout, ranks});
  return out;
}

std::vector<cp_case> ulysses_cases() {
  std::vector<cp_case> out;
  for (const int ranks : {2, 4})
    for (const auto layout : {shard_layout::contiguous, shard_layout::zigzag}) out.push_back({mode::ulysses, layout, ranks});
  return out;
}

std::vector<cp_case> hybrid_cases() {
  return {{mode::hybrid, shard_layout::zigzag, 2, 2, true},
          {mode::hybrid, shard_layout::contiguous, 2, 2, false},
          {mode::hybrid, shard_layout::zigzag, 1, 2, false},
          {mode::hybrid, shard_layout::striped, 2, 1, false}};
}

// Document ids [batch, seq] over the global sequence, different per batch row; the
// boundaries fall inside zigzag chunks (chunks of 6 over 2 ranks, of 3 over 4).
baton::host_tensor<std::int64_t> document_ids() {
  baton::host_tensor<std::int64_t> ids({batch, seq});
  for (std::int64_t s = 0; s < seq; ++s) {
    ids(std::int64_t{0}, s) = s < 5 ? 0 : s < 16 ? 1 : 2;
    ids(std::int64_t{1}, s) = s < 9 ? 10 : s < 12 ? 11 : s < 20 ? 12 : 13;
  }
  return ids;
}

// Runs f(comm) on every rank with a short timeout (a rank left waiting in a collective fails
// the test instead of hanging it); returns what each rank threw.
template <class F>
std::vector<std::exception_ptr> errors_per_rank(int ranks, const F& f) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(ranks));
  baton::local_options options;
  options.timeout = std::chrono::seconds(20);
  baton::run_local(
      ranks,
      [&](local_communicator& comm) {
        try {
          f(comm);
        } catch (...) {
          errors[static_cast<std::size_t>(comm.rank())] = std::current_exception();
        }
      },
      options);
  return errors;
}

}  // namespace

TEST_CASE("nn CP: transformer_block with ring attention on Kokkos matches the unsharded block (every layout, 2 and 4 ranks)", "[nn][cp][kokkos_ring][can-skip]") {
  if (!have_kokkos) BATON_SKIP(no_kokkos);
  const auto ref = run_reference<float, fast_backend>(101);
  check_cases<float, fast_backend>(ring_cases(), ref);
}

TEST_CASE("nn CP: transformer_block with Ulysses attention on Kokkos matches the unsharded block (contiguous, zigzag; 2 and 4 ranks)", "[nn][cp][kokkos_ulysses][can-skip]") {
  if (!have_kokkos) BATON_SKIP(no_kokkos);
  const auto ref = run_reference<float, fast_backend>(201);
  check_cases<float, fast_backend>(ulysses_cases(), ref);
}

TEST_CASE("nn CP: transformer_block with hybrid attention on Kokkos matches the unsharded block (2x2 on 4 ranks, 1x2 and 2x1 on 2)", "[nn][cp][kokkos_hybrid][can-skip]") {
  if (!have_kokkos) BATON_SKIP(no_kokkos);
  const auto ref = run_reference<float, fast_backend>(301);
  check_cases<float, fast_backend>(hybrid_cases(), ref);
}

TEST_CASE("nn CP: in double with reference attention every mode matches the unsharded block to 1e-10", "[nn][cp]") {
  const auto ref = run_reference<double, baton::reference_attention>(401);
  std::vector<cp_case> cases = ring_cases();
  for (const auto& c : ulysses_cases()) cases.push_back(c);
  for (const auto& c : hybrid_cases()) cases.push_back(c);
  check_cases<double, baton::reference_attention>(cases, ref);
}

TEST_CASE("nn CP: packed sequences (document ids over the global sequence) under ring zigzag on Kokkos match the unsharded block (float)", "[nn][cp][kokkos_packed][can-skip]") {
  if (!have_kokkos) BATON_SKIP(no_kokkos);
  const auto ref = run_reference<float, fast_backend>(501, document_ids());
  // the documents really restrict the attention: without them the output differs
  const auto plain = run_reference<float, fast_backend>(501);
  CHECK(nn_test::max_rel_error(plain.y, ref.y) > 1e-2);
  check_cases<float, fast_backend>({{mode::ring, shard_layout::zigzag, 2},
                                    {mode::hybrid, shard_layout::zigzag, 2, 2, false}},
                                   ref);
}

TEST_CASE("nn CP: packed sequences (document ids over the global sequence) under ring zigzag match the unsharded block (double, reference backend)",
          "[nn][cp]") {
  const auto ref = run_reference<double, baton::reference_attention>(601, document_ids());
  check_cases<double, baton::reference_attention>({{mode::ring, shard_layout::zigzag, 2}}, ref);
}

TEST_CASE("nn CP: a side input that is not this rank's shard makes every rank of the group throw", "[nn][cp]") {
  using Catch::Contains;
  using strategy = baton::ring_attention<local_communicator, fast_backend>;
  using block_type = baton::nn::transformer_block<float, strategy>;
  const auto ref = run_reference<float, fast_backend>(701);

  // Every check of the block runs before any communication, and a failure on any rank goes
  // through the ring's agreement, so every rank throws the same cp_error naming the first
  // failing rank and its problem. The contiguous cases fail on rank 1 only (rank 0's shard
  // *is* positions 0..11): rank 0 must throw all the same instead of waiting in the ring.
  // Afterwards the same world runs a correct forward, which a rank left inside a collective
  // would break; the world's short timeout turns a hang into a failure.
  enum class wrong { other_rank, local_positions, whole_sequence, short_documents };
  struct wrong_case {
    wrong kind;
    shard_layout layout;
    int first_failing;
    std::string message;
  };
  const std::vector<wrong_case> cases{
      {wrong::other_rank, shard_layout::zigzag, 0,
       "the side input's position 0 is 6 but this rank's shard (0 of the zigzag sharding) holds position 0 there; "
       "build it with sequence_info::shard(sharding, 0)"},
      {wrong::local_positions, shard_layout::zigzag, 0,
       "the side input's position 6 is 6 but this rank's shard (0 of the zigzag sharding) holds position 18 there"},
      {wrong::local_positions, shard_layout::contiguous, 1,
       "the side input's position 0 is 0 but this rank's shard (1 of the contiguous sharding) holds position 12 "
       "there; build it with sequence_info::shard(sharding, 1)"},
      {wrong::whole_sequence, shard_layout::zigzag, 0,
       "the side input holds 24 positions but the input's sequence axis has 12 rows; expected positions of shape "
       "[12]; build it with sequence_info::shard(sharding, 0)"},
      {wrong::short_documents, shard_layout::contiguous, 0,
       "the side input's document ids have shape [2, 12] but expected [2, 24]"},
  };
  for (const wrong_case& c : cases) {
    std::vector<double> after(2, INFINITY);
    const auto errors = errors_per_rank(2, [&](local_communicator& comm) {
      const baton::sequence_sharding sharding(c.layout, seq, comm.size());
      block_type block(block_config(), block_init(), strategy(comm, fast_backend{}, sharding));
      const int shard = block.attention().strategy().shard_index();
      const baton::host_tensor<float> x = shard_of(sharding, shard, ref.x);
      const baton::nn::sequence_info info =
          c.kind == wrong::other_rank        ? baton::nn::sequence_info::shard(sharding, (shard + 1) % comm.size())
          : c.kind == wrong::local_positions ? baton::nn::sequence_info::whole(sharding.local_len())
          : c.kind == wrong::whole_sequence  ? baton::nn::sequence_info::whole(seq)
                                             : baton::nn::sequence_info::shard(sharding, shard)
                                                  .with_documents(baton::host_tensor<std::int64_t>({batch, seq / 2}));
      block_type::saved st;
      try {
        (void)block.forward(x, info, st);
      } catch (...) {
        block_type::saved fresh;
        const auto y = block.forward(x, baton::nn::sequence_info::shard(sharding, shard), fresh);
        after[static_cast<std::size_t>(comm.rank())] = nn_test::max_rel_error(y, shard_of(sharding, shard, ref.y));
        throw;
      }
    });
    for (int r = 0; r < 2; ++r) {
      const std::exception_ptr e = errors[static_cast<std::size_t>(r)];
      INFO("wrong side input " << static_cast<int>(c.kind) << " (" << baton::to_string(c.layout) << "), rank " << r);
      REQUIRE(e);
      CHECK_THROWS_AS(std::rethrow_exception(e), baton::cp_error);
      CHECK_THROWS_WITH(std::rethrow_exception(e),
                        Contains("rank " + std::to_string(c.first_failing) + " rejected its input, so every rank stops") &&
                            Contains("baton::nn::transformer_block: " + c.message));
      CHECK(after[static_cast<std::size_t>(r)] <= tolerance<float>());
    }
  }
}

TEST_CASE("nn CP: an input whose sequence length is not the sharding's local length makes every rank throw",
          "[nn][cp]") {
  using Catch::Contains;
  const auto ref = run_reference<float, fast_backend>(801);

  SECTION("ring contiguous on 2 ranks: the whole (unsharded) input") {
    using strategy = baton::ring_attention<local_communicator, fast_backend>;
    const auto errors = errors_per_rank(2, [&](local_communicator& comm) {
      const baton::sequence_sharding sharding(shard_layout::contiguous, seq, comm.size());
      baton::nn::transformer_block<float, strategy> block(block_config(), block_init(),
                                                          strategy(comm, fast_backend{}, sharding));
      decltype(block)::saved st;
      (void)block.forward(ref.x, baton::nn::sequence_info::whole(seq), st);
    });
    for (int r = 0; r < 2; ++r) {
      INFO("rank " << r);
      REQUIRE(errors[static_cast<std::size_t>(r)]);
      CHECK_THROWS_AS(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), baton::cp_error);
      CHECK_THROWS_WITH(std::rethrow_exception(errors[static_cast<std::size_t>(r)]),
                        Contains("the input holds 24 tokens of the sequence but the context-parallel sharding "
                                 "(contiguous, 24 tokens over 2 ranks) gives this rank (shard 0) 12 tokens; "
                                 "expected input [batch, 12, "
                                 "32], this rank's shard of the sequence"));
    }
  }

  SECTION("hybrid zigzag 2x2 on 4 ranks: one rank passes a shard of the wrong length") {
    using strategy = baton::hybrid_attention<local_communicator, local_communicator, fast_backend>;
    const auto errors = errors_per_rank(4, [&](local_communicator& comm) {
      auto mesh = baton::make_cp_mesh(comm, 2, 2);
      const baton::sequence_sharding sharding(shard_layout::zigzag, seq, 2, 2);
      baton::nn::transformer_block<float, strategy> block(block_config(), block_init(),
                                                          strategy(mesh, fast_backend{}, sharding));
      const int shard = block.attention().strategy().shard_index();
      // Rank 2 alone: 8 rows with 8 matching positions where the sharding gives each rank 6.
      const baton::host_tensor<float> x =
          comm.rank() == 2 ? nn_test::random_tensor<float>({batch, 8, d_model}, 7) : shard_of(sharding, shard, ref.x);
      const auto info = comm.rank() == 2 ? baton::nn::sequence_info::whole(8) : baton::nn::sequence_info::shard(sharding, shard);
      decltype(block)::saved st;
      (void)block.forward(x, info, st);
    });
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r);
      REQUIRE(errors[static_cast<std::size_t>(r)]);
      CHECK_THROWS_AS(std::rethrow_exception(errors[static_cast<std::size_t>(r)]), baton::cp_error);
      CHECK_THROWS_WITH(std::rethrow_exception(errors[static_cast<std::size_t>(r)]),
                        Contains("rank 2 rejected its input") && Contains("holds 8 tokens") &&
                            Contains("expected input [batch, 6, 32]"));
    }
  }
}

TEST_CASE("nn CP: an output gradient of the wrong shape on one rank makes every rank's backward throw", "[nn][cp]") {
  using Catch::Contains;
  using strategy = baton::ring_attention<local_communicator, fast_backend>;
  const auto ref = run_reference<float, fast_backend>(901);
  const auto errors = errors_per_rank(2, [&](local_communicator& comm) {
    const baton::sequence_sharding sharding(shard_layout::zigzag, seq, comm.size());
    baton::nn::transformer_block<float, strategy> block(block_config(), block_init(),
                                                        strategy(comm, fast_backend{}, sharding));
    const baton::host_tensor<float> x = shard_of(sharding, comm.rank(), ref.x);
    decltype(block)::saved st;
    const auto y = block.forward(x, baton::nn::sequence_info::shard(sharding, comm.rank()), st);
    const baton::host_tensor<float> dy = comm.rank() == 1 ? baton::host_tensor<float>({batch, 5, d_model}) : y;
    (void)block.backward_input(st, dy);
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r);
    REQUIRE(errors[static_cast<std::size_t>(r)]);
    CHECK_THROWS_WITH(std::rethrow_exception(errors[static_cast<std::size_t>(r)]),
                      Contains("backward: rank 1 rejected its input") &&
                          Contains("dy has shape [2, 5, 32] but expected [2, 12, 32]"));
  }
}
