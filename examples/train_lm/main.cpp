// baton-train: a byte-level transformer language model trained under pipeline x data x
// context parallelism, on ranks that are threads of this process (--comm local) or MPI
// processes (--comm mpi). See README.md and docs/training.md.
//
// Everything that can be checked is checked before the first rank starts (options.cpp:
// parse, prepare); exit codes are listed in options.hpp.
#include "choose_cp.hpp"
#include "native_blas.hpp"
#include "options.hpp"
#include "signals.hpp"

#include <baton/config.hpp>
#include <baton/nn/blas.hpp>
#if BATON_HAS_KOKKOS()
#include <Kokkos_Core.hpp>
#endif
#if BATON_HAS_MPI()
#include <baton/comm/mpi.hpp>
#endif

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

namespace {

int refuse(const train_lm::input_error& e) {
  std::fprintf(stderr, "baton-train: %s\nbaton-train: change %s\n", e.what(), e.fix().c_str());
  return train_lm::exit_code::bad_input;
}

}  // namespace

int main(int argc, char** argv) {
  example_support::use_native_blas_kernel(argv);  // OpenBLAS's generic kernel on a newer CPU: restart on the right one
  train_lm::options o;
  try {
    if (!train_lm::parse(argc, argv, o)) return 0;
  } catch (const train_lm::input_error& e) {
    std::fprintf(stderr, "baton-train: %s\nbaton-train: %s\n", e.what(),
                 e.fix().rfind("see ", 0) == 0 ? e.fix().c_str() : ("change " + e.fix()).c_str());
    return train_lm::exit_code::bad_input;
  }
#if !BATON_HAS_MPI()
  if (o.comm == "mpi") {
    std::fprintf(stderr, "baton-train: --comm mpi: this baton-train was built without MPI\nbaton-train: change --comm local\n");
    return train_lm::exit_code::bad_input;
  }
#endif
  // Before any rank starts: the schedule, the configuration, the data and the memory (local:
  // the ranks are this process's threads; MPI: each process checks after MPI starts).
#if BATON_HAS_KOKKOS()
  Kokkos::ScopeGuard kokkos(argc, argv);  // before --cp-mode auto, whose calibration runs the kernels
#endif
  if (o.cp_mode_auto) {
    try {
      train_lm::choose_cp_mode(o);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "baton-train: --cp-mode auto: %s\nbaton-train: change --cp-mode (ring, ulysses or hybrid)\n", e.what());
      return train_lm::exit_code::bad_input;
    }
  }
  train_lm::prepared prepared;
  std::FILE* metrics = nullptr;
  if (o.plan_memory) {  // the plan of the whole mesh, whatever --comm: nothing starts
    try {
      prepared = train_lm::prepare(o, o.world_size(), o.world_size());
    } catch (const train_lm::input_error& e) {
      return refuse(e);
    }
    std::fputs(train_lm::memory_plan_text(o, prepared).c_str(), stdout);
    return train_lm::exit_code::ok;
  }
  if (o.comm == "local") {
    try {
      prepared = train_lm::prepare(o, o.world_size(), o.world_size());
      if (!o.metrics.empty() && (metrics = std::fopen(o.metrics.c_str(), o.resume.empty() ? "w" : "a")) == nullptr)
        throw train_lm::input_error("cannot write --metrics " + o.metrics + ": " + std::strerror(errno), "--metrics");
      if (!o.trace.empty()) {  // writable? (written at the traced step; a file already there is kept until then)
        std::FILE* existing = std::fopen(o.trace.c_str(), "rb");
        const bool existed = existing != nullptr;
        if (existed) std::fclose(existing);
        std::FILE* t = std::fopen(o.trace.c_str(), "ab");
        if (t == nullptr) throw train_lm::input_error("cannot write --trace " + o.trace + ": " + std::strerror(errno), "--trace");
        std::fclose(t);
        if (!existed) std::remove(o.trace.c_str());
      }
    } catch (const train_lm::input_error& e) {
      return refuse(e);
    }
  }
  train_lm::signals::install();
  // Every rank (a thread here, or a process on a shared machine) computes on one core: one
  // BLAS thread each, unless the user chose otherwise.
  if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr) baton::nn::set_blas_threads(1);
  int code = train_lm::exit_code::failed;
  try {
    if (o.comm == "mpi") {
#if BATON_HAS_MPI()
      baton::mpi_session mpi(argc, argv);
      try {
        code = train_lm::run_mpi_world(o);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "baton-train: %s\n", e.what());
        MPI_Abort(MPI_COMM_WORLD, 1);  // the other processes may be waiting for this one
      }
#endif
    } else {
      code = train_lm::run_local_world(o, prepared, metrics);
    }
  } catch (const train_lm::input_error& e) {
    code = refuse(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "baton-train: %s\n", e.what());
    code = train_lm::exit_code::failed;
  }
  if (metrics != nullptr) std::fclose(metrics);
  return code;
}
