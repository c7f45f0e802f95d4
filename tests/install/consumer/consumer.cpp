// Built against the installed package only: proves the exported targets carry the include
// directories, the C++20 requirement and each component's BATON_HAS_* macro.
#include <baton/baton.hpp>

#include <cstdio>

int main() {
  std::printf("baton %d.%d.%d kokkos=%d mpi=%d cuda=%d nccl=%d\n", BATON_VERSION_MAJOR,
              BATON_VERSION_MINOR, BATON_VERSION_PATCH, BATON_HAS_KOKKOS(), BATON_HAS_MPI(),
              BATON_HAS_CUDA(), BATON_HAS_NCCL());
  return 0;
}
