// Catch2 main for every non-MPI test. Initialises Kokkos once per process when the test
// links baton::kokkos (Kokkos 3.4 must be initialised before any View is made).
#define CATCH_CONFIG_RUNNER
#include "catch.hpp"

#include <baton/config.hpp>
#if BATON_HAS_KOKKOS()
#include <Kokkos_Core.hpp>
#endif

int main(int argc, char** argv) {
#if BATON_HAS_KOKKOS()
  Kokkos::ScopeGuard kokkos_guard(argc, argv);
#endif
  return Catch::Session().run(argc, argv);
}
