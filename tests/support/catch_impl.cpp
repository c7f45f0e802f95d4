// Catch2's implementation, compiled once for every test executable (it is the slowest
// translation unit of the suite); the mains in main.cpp and mpi_main.cpp call run_catch.
#define CATCH_CONFIG_RUNNER
#include "catch.hpp"
#include "catch_session.hpp"

int baton_test::run_catch(int argc, char** argv, bool report) {
  Catch::Session session;
  if (!report) session.configData().outputFilename = "%debug";
  if (const int parsed = session.applyCommandLine(argc, argv); parsed != 0) return parsed;
  return session.run();
}
