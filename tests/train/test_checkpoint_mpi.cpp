// Exact resume on MPI processes (mpiexec -n 4): on each mesh of issue 28 (ZBV pp2 x cp2 ring,
// 1F1B pp2 x dp2, hybrid cp4), float and double, "train 2 steps, save, train 2 more" gives the
// losses and every parameter of "a new trainer of another seed loads the checkpoint and trains
// the same 2 steps", bit for bit. Every rank checks what it holds (the MPI Catch main reduces
// the verdicts).
#include "catch.hpp"
#include "checkpoint_support.hpp"
#include "skip.hpp"

#include <baton/attention/reference.hpp>
#include <baton/comm/mpi.hpp>
#include <baton/config.hpp>

#include <array>
#include <cstring>
#include <span>
#include <string>

TEMPLATE_TEST_CASE("checkpoint: train N, save, resume, train M equals N + M steps bit for bit (MPI)",
                   "[checkpoint][resume][mpi][can-skip]", double, float) {
#if !BATON_HAS_JSON()
  BATON_SKIP("checkpoints need nlohmann-json: link baton::json (Debian: apt-get install nlohmann-json3-dev)");
#else
  using namespace checkpoint_test;
  using T = TestType;
  baton::mpi_communicator world;
  REQUIRE(world.size() == 4);
  for (const mesh_case& mesh : resume_meshes()) {
    // One directory for every process: rank 0 makes it and sends its name.
    std::optional<scratch_dir> dir;
    std::array<char, 512> name{};
    if (world.rank() == 0) {
      dir.emplace("resume_mpi");
      std::strncpy(name.data(), dir->path().c_str(), name.size() - 1);
    }
    world.broadcast(std::as_writable_bytes(std::span<char>(name)), 0);
    const auto o = train_save_resume<T, baton::reference_attention>(world, mesh, fs::path(name.data()), 2, 2);
    INFO(mesh.name << ", rank " << world.rank());
    CHECK(o.steps_after_load == 2);
    CHECK(o.data_position == 2);
    CHECK(o.resumed_losses == o.straight_losses);
    CHECK(first_bitwise_difference(o.straight, o.resumed).empty());
    CHECK(o.straight_losses[0] != o.straight_losses[1]);
    world.barrier();  // every rank is done with the directory before rank 0 removes it
  }
#endif
}
