// baton/train/checkpoint_error.hpp — what a checkpoint that cannot be written or loaded throws:
// the kind of problem, for a program's decisions, and a message naming the file and what is
// wrong, for its user. (The checkpoints themselves are baton/train/json/, which needs
// nlohmann-json; this error needs nothing.)
#pragma once

#include <stdexcept>
#include <string>

namespace baton::train {

class checkpoint_error : public std::runtime_error {
 public:
  enum class kind {
    missing,      ///< no checkpoint there, or a file the manifest lists is absent
    truncated,    ///< a file shorter (or longer) than the manifest says: a torn write
    damaged,      ///< bytes that are not what was written: checksum mismatch, invalid header
    other_model,  ///< the checkpoint holds another model (the first differing setting named)
    io,           ///< the operating system refused (permissions, full disk): errno's text
    usage,        ///< the call itself is wrong (ranks disagree on the step, a name twice, ...)
  };

  checkpoint_error(kind k, const std::string& message) : std::runtime_error(message), kind_(k) {}
  kind problem() const noexcept { return kind_; }

 private:
  kind kind_;
};

}  // namespace baton::train
