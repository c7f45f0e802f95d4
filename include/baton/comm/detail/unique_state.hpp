// baton/comm/detail/unique_state.hpp — how a backend's handle (a communicator, a request)
// owns its members: all of them in one plain struct that moves as a whole and is released
// exactly once, so that a member added to the struct cannot be forgotten by a hand-written
// move, and a moved-from handle holds a default struct, which releases nothing.
#pragma once

#include <functional>
#include <utility>

namespace baton::detail::comm {

/// Holds a State and calls Release(state) when destroyed and before a move assigns it
/// another one. A move leaves State{} behind; Release must accept it (and do nothing).
template <class State, auto Release>
class unique_state {
 public:
  unique_state() = default;
  unique_state(unique_state&& other) noexcept : state_(std::exchange(other.state_, State{})) {}
  unique_state& operator=(unique_state&& other) noexcept {
    if (this != &other) {
      std::invoke(Release, state_);
      state_ = std::exchange(other.state_, State{});
    }
    return *this;
  }
  unique_state(const unique_state&) = delete;
  unique_state& operator=(const unique_state&) = delete;
  ~unique_state() { std::invoke(Release, state_); }

  State& operator*() noexcept { return state_; }
  const State& operator*() const noexcept { return state_; }
  State* operator->() noexcept { return &state_; }
  const State* operator->() const noexcept { return &state_; }

 private:
  State state_;
};

}  // namespace baton::detail::comm
