// baton/comm/detail/mpi_support.hpp — the small MPI helpers every part of the MPI backend
// uses: an MPI error's text and class, whether MPI has ended, MPI's name for an element kind.
#pragma once

#include <baton/config.hpp>

#if !BATON_HAS_MPI()
#error "baton/comm/mpi.hpp needs MPI: link baton::mpi (find_package(baton COMPONENTS mpi)); Debian: apt-get install libopenmpi-dev openmpi-bin"
#endif

#include <baton/comm/detail/elements.hpp>

#include <mpi.h>

#include <cstddef>
#include <string>

namespace baton::detail::comm::mpi {

inline std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

inline int error_class(int code) {
  int cls = code;
  MPI_Error_class(code, &cls);
  return cls;
}

inline bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

inline MPI_Datatype datatype_of(element_kind kind) {
  const MPI_Datatype types[] = {MPI_FLOAT, MPI_DOUBLE, MPI_INT32_T, MPI_INT64_T};  // element_kind's order
  return types[static_cast<std::size_t>(kind)];
}

/// A wait tests its own requests on every poll and the notice board (failures, returned
/// peers, queries) on every 16th: a notice still arrives within microseconds of a busy wait
/// (milliseconds of a long one), and a fast transfer does not pay for a second MPI_Test.
inline constexpr unsigned notice_polls = 16;

}  // namespace baton::detail::comm::mpi
