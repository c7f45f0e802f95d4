// baton/comm/error.hpp — the error type every communicator throws, and the reduction ops.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace baton {

/// Thrown by every communicator operation that cannot complete: a wait that timed out or
/// whose peer failed, a message that does not fit its receive buffer, an invalid peer or
/// tag, ranks that disagree about a collective's arguments, or an error reported by MPI
/// or NCCL. The message names the rank that saw the problem, the peer and tag involved,
/// and what to change.
class comm_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// The reductions `all_reduce` offers. Every backend supports them for float, double,
/// std::int32_t and std::int64_t.
enum class reduce_op { sum, max, min };

/// "sum", "max" or "min": for messages and logs.
constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::max: return "max";
    case reduce_op::min: return "min";
  }
  return "unknown reduce_op";
}

}  // namespace baton
