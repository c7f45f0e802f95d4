// baton/attention/error.hpp — the exception every attention entry point throws on bad input.
#pragma once

#include <stdexcept>
#include <string>

namespace baton {

/// Thrown by attention backends (and masks) when the tensors they are given cannot be
/// attended: shapes that disagree, heads that do not divide, an LSE of the wrong shape, a
/// stride the backend cannot read. The message names the tensor, the shape it has and the
/// shape it should have, so the fix is visible without a debugger.
class attention_error : public std::invalid_argument {
 public:
  explicit attention_error(const std::string& what) : std::invalid_argument(what) {}
};

}  // namespace baton
