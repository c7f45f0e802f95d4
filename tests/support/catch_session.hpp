// The one entry into Catch2 the test mains need. Catch declares its Session only where its
// implementation is compiled (catch_impl.cpp, once for the whole suite), so the mains call
// this instead of including that implementation each.
#pragma once

namespace baton_test {

/// Parses the command line and runs the test cases; the number of failed cases (or non-zero
/// when the command line is bad). With report false the report is written nowhere (the
/// ranks of an MPI test other than 0).
int run_catch(int argc, char** argv, bool report = true);

}  // namespace baton_test
