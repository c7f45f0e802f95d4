// baton/pipeline/error.hpp — the one exception type the pipeline runtime throws.
#pragma once

#include <stdexcept>
#include <string>

namespace baton {

/// Everything the pipeline runtime reports at run time: a stage that threw (the message names
/// the pipeline rank, the action such as `2F1` and the step), a transfer that failed, ranks
/// that disagree on the schedule or on shapes, a batch that cannot be split into the
/// schedule's microbatches or a target whose rows differ from the batch's, a gradient whose
/// shape or element type differs from its activation's. The message always says what to change.
class pipeline_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace baton
