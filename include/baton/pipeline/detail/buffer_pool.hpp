// baton/pipeline/detail/buffer_pool.hpp — the receive buffers of one payload type, reused
// across microbatches and steps, and found by the shapes a message header announces.
#pragma once

#include <baton/pipeline/detail/wire.hpp>
#include <baton/pipeline/options.hpp>

#include <cstddef>
#include <utility>
#include <vector>

namespace baton::detail::pipeline {

// Receive buffers of one payload type, reused across microbatches and steps. A buffer is only
// storage: the stage is handed the payload for one microbatch, and everything attached to that
// microbatch (its hooks) lives elsewhere and dies with it — so reusing the storage cannot
// carry anything from one microbatch to the next (seed 002).
template <class P>
class buffer_pool {
 public:
  // A buffer of the shapes header h announces. `built` says whether it was made now (from the
  // header) rather than reused: a reused buffer was stored under a key equal to the header's,
  // a new one may not fit P (other element types or tensor ranks).
  P acquire(const wire_header& h, bool& built) {
    for (std::size_t i = 0; i < idle_.size(); ++i) {
      if (header_has_key(h, idle_[i].key)) {
        P p = std::move(idle_[i].payload);
        retire(i);
        ++stats_.reuses;
        built = false;
        return p;
      }
    }
    ++stats_.allocations;
    built = true;
    return make_payload<P>(h);
  }

  void release(P&& p) {
    // Bounded so that a long run of changing shapes (variable sequence lengths) cannot grow the
    // pool without limit: the oldest idle buffers go first.
    if (idle_.size() >= max_idle_) {
      spare_keys_.push_back(std::move(idle_.front().key));
      idle_.erase(idle_.begin());
    }
    // Keys are reused too: computing one into fresh storage cost an allocation per receive.
    pool_key key;
    if (!spare_keys_.empty()) {
      key = std::move(spare_keys_.back());
      spare_keys_.pop_back();
    }
    fill_payload_key(p, key);
    idle_.push_back({std::move(key), std::move(p)});
  }

  [[nodiscard]] buffer_pool_stats stats() const noexcept {
    auto s = stats_;
    s.idle = idle_.size();
    return s;
  }

 private:
  struct entry {
    pool_key key;
    P payload;
  };

  void retire(std::size_t i) {
    spare_keys_.push_back(std::move(idle_[i].key));
    if (i + 1 != idle_.size()) std::swap(idle_[i], idle_.back());
    idle_.pop_back();
  }

  std::vector<entry> idle_;
  std::vector<pool_key> spare_keys_;
  buffer_pool_stats stats_;
  std::size_t max_idle_ = 64;
};

}  // namespace baton::detail::pipeline
