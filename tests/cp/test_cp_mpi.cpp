// CP parity across processes: ring 4, Ulysses 4 and hybrid 2 x 2 on MPI_COMM_WORLD
// (mpiexec -n 4), against reference attention on the whole sequence, which every rank
// computes for itself; each rank checks the rows it holds. And bad input: every process
// gets the error, none hangs.
#include "catch.hpp"
#include "cp_test_support.hpp"
#include "skip.hpp"

#include <baton/comm/mpi.hpp>

#include <chrono>

using namespace cp_test;
using baton::shard_layout;

namespace {

template <class T>
std::vector<T> rows(const baton::sequence_sharding& s, int rank, const std::vector<T>& full,
                    std::vector<std::int64_t> shape, int axis) {
  return baton::shard_sequence<T>(s, rank, full, shape, axis);
}

template <class T, class Attention, class Mask>
void check_rank(Attention& attn, const baton::sequence_sharding& s, int rank, const problem<T>& p, const Mask& mask) {
  tensors<T> got(p.d);
  run_rank<T>(attn, s, rank, p, mask, got, 0);
  const dims& d = p.d;
  const std::vector<std::int64_t> qs{d.batch, d.seq, d.heads_q, d.dim}, kvs{d.batch, d.seq, d.heads_kv, d.dim},
      ls{d.batch, d.heads_q, d.seq};
  CHECK(rel_l2(rows(s, rank, got.out, qs, 1), rows(s, rank, p.reference.out, qs, 1)) <= tolerance<T>());
  CHECK(rel_l2(rows(s, rank, got.lse, ls, 2), rows(s, rank, p.reference.lse, ls, 2)) <= tolerance<T>());
  CHECK(rel_l2(rows(s, rank, got.dq, qs, 1), rows(s, rank, p.reference.dq, qs, 1)) <= tolerance<T>());
  CHECK(rel_l2(rows(s, rank, got.dk, kvs, 1), rows(s, rank, p.reference.dk, kvs, 1)) <= tolerance<T>());
  CHECK(rel_l2(rows(s, rank, got.dv, kvs, 1), rows(s, rank, p.reference.dv, kvs, 1)) <= tolerance<T>());
}

}  // namespace

TEMPLATE_TEST_CASE("MPI: ring, Ulysses and hybrid attention match the reference", "[cp][mpi][parity][can-skip]", float,
                   double) {
  baton::mpi_communicator world;
  if (world.size() != 4) BATON_SKIP("this test needs mpiexec -n 4 (got " + std::to_string(world.size()) + " ranks)");
  const dims d{};
  for_each_mask(d.seq, [&](const auto& mask, const char* mask_name) {
    INFO("mask " << mask_name);
    const problem<TestType> p = make_problem<TestType>(d, mask, 201);
    {
      const baton::sequence_sharding s(shard_layout::zigzag, d.seq, 4);
      baton::ring_attention ring(world, baton::reference_attention{}, s);
      INFO("ring 4 zigzag");
      check_rank<TestType>(ring, s, world.rank(), p, mask);
    }
    {
      const baton::sequence_sharding s(shard_layout::striped, d.seq, 4);
      baton::ulysses_attention ulysses(world, baton::reference_attention{}, s);
      INFO("ulysses 4 striped");
      check_rank<TestType>(ulysses, s, world.rank(), p, mask);
    }
    {
      auto mesh = baton::make_cp_mesh(world, 2, 2);
      const baton::sequence_sharding s(shard_layout::zigzag, d.seq, 2, 2);
      baton::hybrid_attention hybrid(mesh, baton::reference_attention{}, s);
      INFO("hybrid 2x2 zigzag");
      check_rank<TestType>(hybrid, s, world.rank(), p, mask);
    }
  });
}

TEST_CASE("MPI: a rank with a different shard shape stops every process with the same error", "[cp][mpi]") {
  baton::mpi_communicator world;
  const baton::sequence_sharding s(shard_layout::contiguous, 4 * world.size(), world.size());
  const std::int64_t seq = world.rank() == world.size() - 1 ? 5 : 4;
  std::vector<float> q(static_cast<std::size_t>(seq * 2 * 3), 1.0f), out(q.size()), lse(static_cast<std::size_t>(2 * seq));
  baton::ring_attention ring(world, baton::reference_attention{}, s);
  std::string message;
  try {
    ring.forward(cview4(q, 1, seq, 2, 3), cview4(q, 1, seq, 2, 3), cview4(q, 1, seq, 2, 3), baton::causal_mask{},
                 view4(out, 1, seq, 2, 3), baton::make_tensor_view(lse.data(), {1, 2, seq}));
  } catch (const baton::cp_error& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("rank " + std::to_string(world.size() - 1)) != std::string::npos);
}
