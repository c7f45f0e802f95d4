// baton/train/detail/thread_usage.hpp — the calling thread's minor page faults (a step's
// report: a steady step should fault in no fresh pages, see docs/nn.md "Memory of a step").
#pragma once

#include <cstdint>

#if defined(__linux__)
#include <sys/resource.h>
#endif

namespace baton::detail::train {

// Minor page faults of the calling thread so far; 0 where the system does not count them per
// thread (only Linux's RUSAGE_THREAD does).
inline std::int64_t thread_minor_faults() noexcept {
#if defined(__linux__) && defined(RUSAGE_THREAD)
  rusage usage{};
  if (getrusage(RUSAGE_THREAD, &usage) == 0) return static_cast<std::int64_t>(usage.ru_minflt);
#endif
  return 0;
}

}  // namespace baton::detail::train
