// baton/comm/detail/wakeup.hpp — how a rank of the local world waits for another rank: spin
// briefly on its doorbell, then block (on Linux on the doorbell's own futex, elsewhere a
// condition variable).
//
// Blocking costs two trips through the kernel (the waiter's futex wait and context switch,
// the waker's futex wake), more in a virtual machine. Between ranks that both run, a
// hand-off often comes sooner than the waiter would get into the kernel, so a waiter first
// watches its doorbell — a counter every state change that concerns it bumps — for a short,
// adaptive budget, and only then sleeps. A ring while it spins costs the waker no system
// call at all. Measured: docs/pipeline.md and docs/communicators.md.
//
// Spinning only pays while the rank that will ring has a core of its own. A world keeps
// count of its ranks that are awake (not returned, not asleep); a rank spins only while they
// fit the machine's cores, so on a machine with fewer cores than ranks a waiter sleeps at
// once and leaves the core to the peer it waits for. Spins that keep failing back off.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <ctime>
#endif

namespace baton::detail::comm::local {

/// Tells the core that this is a spin-wait loop (x86 pause, ARM yield): the sibling
/// hyper-thread gets the pipeline, and leaving the loop does not flush it.
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield");
#endif
}

/// Takes `lock`'s mutex, trying a little before blocking: a spinning waiter that saw its ring
/// usually finds the mutex held by the ringer for a few more instructions.
inline void relock(std::unique_lock<std::mutex>& lock) {
  for (int i = 0; i < 64; ++i) {
    if (lock.try_lock()) return;
    cpu_relax();
  }
  lock.lock();
}

/// Whether waits spin before blocking: as the machine allows, always, or never.
enum class wait_mode : std::uint8_t { automatic, spin, block };

/// Where one rank waits. `rings` is bumped, with the world's mutex held, by every change a
/// waiter of this rank may be waiting for; the rest is the owner's or guarded by the mutex.
struct alignas(64) doorbell {
  std::atomic<std::uint32_t> rings{0};
  bool asleep = false;  // in block(), not yet rung (guarded by the world's mutex): a ring must wake()
  std::atomic<bool> wake_owed{false};  // rung while asleep, the wake() not yet sent
#if !defined(__linux__)
  std::condition_variable cv;
#endif

  /// Sleeps until `rings` moves past `seen` or `deadline` passes; may return early. Called
  /// with `lock` held (and `asleep` set), returns with it held. On Linux the sleeper waits on
  /// the doorbell's own futex: no condition variable's bookkeeping on either side, and the
  /// kernel refuses the wait if a ring came in between unlocking and sleeping.
  void block(std::unique_lock<std::mutex>& lock, std::uint32_t seen, std::chrono::steady_clock::time_point deadline) {
    using clock = std::chrono::steady_clock;
#if defined(__linux__)
    timespec left{};
    const timespec* timeout = nullptr;
    if (deadline != clock::time_point::max()) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - clock::now()).count();
      if (ns <= 0) return;
      left.tv_sec = static_cast<std::time_t>(ns / 1'000'000'000);
      left.tv_nsec = static_cast<long>(ns % 1'000'000'000);
      timeout = &left;
    }
    static_assert(sizeof(rings) == sizeof(std::uint32_t), "the futex is the atomic's 32-bit word");
    lock.unlock();
    // FUTEX_WAIT's timeout is relative, on CLOCK_MONOTONIC (steady_clock's clock).
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&rings), FUTEX_WAIT_PRIVATE, seen, timeout, nullptr, 0);
    relock(lock);
#else
    const auto rung = [&] { return rings.load(std::memory_order_relaxed) != seen; };
    if (deadline == clock::time_point::max()) {
      cv.wait(lock, rung);
    } else {
      cv.wait_until(lock, deadline, rung);
    }
#endif
  }

  /// Wakes the owner from block() (called without the world's mutex, after a ring).
  void wake() {
#if defined(__linux__)
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&rings), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
#else
    cv.notify_all();
#endif
  }

  // The spin budget adapts to what this rank's waits take: it doubles after a spin that saw
  // the ring, halves after one that did not, between bounds: at most about what a blocking
  // hand-off costs in CPU (a longer spin only burns it), at least enough to notice a change of
  // pattern. After a failed spin the next `backoff` waits block at once, `backoff` doubling
  // with each failure in a row: where spins rarely pay (a virtual machine whose host
  // deschedules the peer's vCPU; other programs on the cores) they cost almost nothing.
  static constexpr std::int64_t min_spin_ns = 500;
  static constexpr std::int64_t max_spin_ns = 8'000;
  static constexpr std::int32_t max_backoff = 64;
  // Atomic only so that no thread can tear them; the owner's thread is the only user.
  std::atomic<std::int64_t> spin_ns{2'000};
  std::atomic<std::int32_t> backoff{0}, skip{0};

  /// Whether this wait may spin first (the owner's call).
  bool should_spin() noexcept {
    const std::int32_t s = skip.load(std::memory_order_relaxed);
    if (s == 0) return true;
    skip.store(s - 1, std::memory_order_relaxed);
    return false;
  }

  /// Spins until the doorbell rings past `seen` (true) or the budget or `deadline` runs out
  /// (false). Called without the world's mutex. It does not yield: the budget is far shorter
  /// than a time slice, and a waiter that must leave the core to its peer blocks instead.
  bool spin(std::uint32_t seen, std::chrono::steady_clock::time_point deadline) noexcept {
    using clock = std::chrono::steady_clock;
    const std::int64_t budget = spin_ns.load(std::memory_order_relaxed);
    const auto stop = std::min(deadline, clock::now() + std::chrono::nanoseconds(budget));
    for (unsigned i = 1;; ++i) {
      if (rings.load(std::memory_order_acquire) != seen) {
        spin_ns.store(std::min(max_spin_ns, budget * 2), std::memory_order_relaxed);
        backoff.store(0, std::memory_order_relaxed);
        return true;
      }
      cpu_relax();
      if (i % 16 == 0 && clock::now() >= stop) break;  // the clock only every 16 pauses: cheaper
    }
    spin_ns.store(std::max(min_spin_ns, budget / 2), std::memory_order_relaxed);
    const std::int32_t b = std::min(max_backoff, std::max(1, backoff.load(std::memory_order_relaxed) * 2));
    backoff.store(b, std::memory_order_relaxed);
    skip.store(b, std::memory_order_relaxed);
    return false;
  }
};

}  // namespace baton::detail::comm::local
