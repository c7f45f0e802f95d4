// baton/nn/error.hpp — the exception the model layer throws on bad input.
#pragma once

#include <stdexcept>
#include <string>

namespace baton::nn {

/// Thrown by the model layer (baton/nn/) when a piece gets input it cannot use: a tensor of
/// the wrong shape, a configuration whose sizes do not divide, a side input without the
/// positions a piece needs, a token outside the vocabulary. The message names the piece, what
/// it got and what it expected.
class nn_error : public std::invalid_argument {
 public:
  explicit nn_error(const std::string& what) : std::invalid_argument(what) {}
};

}  // namespace baton::nn
