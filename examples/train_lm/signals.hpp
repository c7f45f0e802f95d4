// SIGINT and SIGTERM for baton-train: the first one is recorded (and said on stderr), every
// rank finishes the step it is in, the ranks agree to stop (run.hpp), and the program ends
// with 128 + the signal's number. A second one ends the process at once (the handler resets
// itself), for a run whose step never finishes.
#pragma once

#include <atomic>
#include <csignal>
#include <cstring>
#include <unistd.h>

namespace train_lm::signals {

inline std::atomic<int> received_signal{0};  // lock-free, so a handler may store it

extern "C" inline void on_signal(int sig) {
  int none = 0;
  if (received_signal.compare_exchange_strong(none, sig)) {
    const char* text = sig == SIGINT ? "\nbaton-train: SIGINT: finishing the step on every rank, then stopping (again: "
                                       "stop at once)\n"
                                     : "\nbaton-train: SIGTERM: finishing the step on every rank, then stopping\n";
    const ssize_t written = ::write(STDERR_FILENO, text, std::strlen(text));  // async-signal-safe
    (void)written;
  }
}

/// Installs the handlers (once, before any rank starts).
inline void install() {
  static_assert(std::atomic<int>::is_always_lock_free, "a signal handler may only store a lock-free atomic");
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;  // the second signal takes its default action: the process ends
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

/// The signal received so far, or 0.
inline int received() noexcept { return received_signal.load(std::memory_order_relaxed); }

}  // namespace train_lm::signals
