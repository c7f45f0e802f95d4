// Catch2 main for every non-MPI test (Catch itself is in catch_impl.cpp). Initialises Kokkos
// once per process when the test links baton::kokkos (Kokkos 3.4 must be initialised before
// any View is made).
#include "catch_session.hpp"

#include <baton/config.hpp>
#if BATON_HAS_KOKKOS()
#include <Kokkos_Core.hpp>
#endif

int main(int argc, char** argv) {
#if BATON_HAS_KOKKOS()
  Kokkos::ScopeGuard kokkos_guard(argc, argv);
#endif
  return baton_test::run_catch(argc, argv);
}
