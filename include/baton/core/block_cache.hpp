// baton/core/block_cache.hpp — the host memory of tensors: large blocks kept per thread for
// the next allocation of the same size class, so a training step after the first makes
// almost no page faults.
//
// A step allocates its activations, gradients and saved state afresh and frees them by its
// end. glibc hands blocks of more than its mmap threshold (128 KiB, raised adaptively up to
// 32 MiB) back to the kernel when they are freed, or trims the top of its heap, so the next
// step touches fresh pages: one page fault and a kernel zero-fill per 4 KiB, which costs
// from a few percent to a third of a transformer block's time depending on the machine
// (docs/nn.md, "Memory of a step"). Here a freed block of at least `min_cached_bytes` goes
// to a free list of the freeing thread, by size class (eight per power of two, so a block
// is at most 12.5 % larger than asked), and the next allocation of that class on that
// thread takes it back. Smaller blocks go to operator new as before: glibc's own bins keep
// them mapped.
//
// Bounded: a thread keeps at most `limit()` bytes of free blocks (set_limit; 0 turns the
// cache off); a block freed beyond that goes back to the system. release() frees what the
// calling thread keeps. A block may be freed on another thread than the one that allocated
// it (it then joins that thread's lists), or after its thread ended.
//
// Under AddressSanitizer a kept block is poisoned, so a use after free is still reported.
//
// cached_array<T> is the owning array over it, and memory_meter counts, per thread, the bytes
// its arrays hold (a rank's measured memory where ranks are threads).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define BATON_DETAIL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define BATON_DETAIL_ASAN 1
#endif
#endif
#if defined(BATON_DETAIL_ASAN)
#include <sanitizer/asan_interface.h>
#endif

namespace baton::detail::core {

class block_cache {
 public:
  static constexpr std::size_t alignment = 64;
  /// Blocks below this go straight to operator new (glibc keeps them mapped).
  static constexpr std::size_t min_cached_bytes = std::size_t{64} << 10;

  /// At least `bytes` bytes, 64-byte aligned, uninitialised; give it back with deallocate
  /// and the same `bytes`.
  static void* allocate(std::size_t bytes) {
    if (bytes < min_cached_bytes) return ::operator new(bytes, std::align_val_t{alignment});
    const std::size_t cls = size_class(bytes);
    if (block_cache* cache = of_this_thread()) {
      if (void* p = cache->take(cls)) return p;
    }
    return ::operator new(class_bytes(cls), std::align_val_t{alignment});
  }

  static void deallocate(void* p, std::size_t bytes) noexcept {
    if (p == nullptr) return;
    if (bytes < min_cached_bytes) {
      ::operator delete(p, std::align_val_t{alignment});
      return;
    }
    const std::size_t cls = size_class(bytes);
    block_cache* cache = of_this_thread();
    if (cache == nullptr || !cache->keep(cls, p)) ::operator delete(p, std::align_val_t{alignment});
  }

  /// Frees every block the calling thread keeps.
  static void release() noexcept {
    if (block_cache* cache = of_this_thread()) cache->drop_all();
  }
  /// Bytes of free blocks the calling thread keeps now.
  static std::size_t cached_bytes() noexcept {
    const block_cache* cache = of_this_thread();
    return cache ? cache->cached_ : 0;
  }
  /// The most bytes of free blocks each thread keeps (every thread's cache, from its next
  /// free on); 0 keeps none. Default 1 GiB.
  static void set_limit(std::size_t bytes) noexcept { limit_bytes().store(bytes, std::memory_order_relaxed); }
  static std::size_t limit() noexcept { return limit_bytes().load(std::memory_order_relaxed); }

  /// The size class of a request of `bytes` (>= min_cached_bytes) and the bytes a block of
  /// that class has: eight classes per power of two.
  static constexpr std::size_t size_class(std::size_t bytes) noexcept {
    const int octave = static_cast<int>(std::bit_width(bytes - 1)) - 1;  // 2^octave < bytes <= 2^(octave+1)
    const std::size_t step = std::size_t{1} << (octave - 3);
    const std::size_t eighths = (bytes - (std::size_t{1} << octave) + step - 1) / step;  // 1..8
    return static_cast<std::size_t>(octave) * 8 + eighths - 1;
  }
  static constexpr std::size_t class_bytes(std::size_t cls) noexcept {
    const int octave = static_cast<int>(cls / 8);
    return (std::size_t{1} << octave) + (cls % 8 + 1) * (std::size_t{1} << (octave - 3));
  }

  block_cache(const block_cache&) = delete;
  block_cache& operator=(const block_cache&) = delete;

 private:
  static constexpr std::size_t class_count = 64 * 8;

  block_cache() = default;
  ~block_cache() {
    drop_all();
    destroyed_flag() = true;
  }

  static std::atomic<std::size_t>& limit_bytes() noexcept {
    static std::atomic<std::size_t> limit{std::size_t{1} << 30};
    return limit;
  }
  // This thread's cache; null once it was destroyed (a tensor freed by another thread_local's
  // destructor at thread exit goes back to the system).
  static bool& destroyed_flag() noexcept {
    thread_local bool destroyed = false;
    return destroyed;
  }
  static block_cache* of_this_thread() noexcept {
    if (destroyed_flag()) return nullptr;
    thread_local block_cache cache;
    return &cache;
  }

  void* take(std::size_t cls) noexcept {
    std::vector<void*>& list = free_[cls];
    if (list.empty()) return nullptr;
    void* p = list.back();
    list.pop_back();
    cached_ -= class_bytes(cls);
#if defined(BATON_DETAIL_ASAN)
    __asan_unpoison_memory_region(p, class_bytes(cls));
#endif
    return p;
  }

  bool keep(std::size_t cls, void* p) noexcept {
    const std::size_t bytes = class_bytes(cls);
    if (cached_ + bytes > limit()) return false;
    try {
      free_[cls].push_back(p);
    } catch (...) {
      return false;
    }
    cached_ += bytes;
#if defined(BATON_DETAIL_ASAN)
    __asan_poison_memory_region(p, bytes);
#endif
    return true;
  }

  void drop_all() noexcept {
    for (std::size_t cls = 0; cls < class_count; ++cls) {
      for (void* p : free_[cls]) {
#if defined(BATON_DETAIL_ASAN)
        __asan_unpoison_memory_region(p, class_bytes(cls));
#endif
        ::operator delete(p, std::align_val_t{alignment});
      }
      free_[cls].clear();
      free_[cls].shrink_to_fit();
    }
    cached_ = 0;
  }

  std::array<std::vector<void*>, class_count> free_{};
  std::size_t cached_ = 0;
};

/// The bytes a thread's arrays (cached_array: host_tensor's elements, plans, buckets) hold:
/// what it allocated and has not freed yet, wherever they are freed, and the most since the
/// last reset_peak. A rank's own measurement where ranks are threads.
class memory_meter {
 public:
  void add(std::int64_t bytes) noexcept {
    const std::int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::int64_t seen = peak_.load(std::memory_order_relaxed);
    while (now > seen && !peak_.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  void subtract(std::int64_t bytes) noexcept { live_.fetch_sub(bytes, std::memory_order_relaxed); }
  std::int64_t live() const noexcept { return live_.load(std::memory_order_relaxed); }
  std::int64_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }
  void reset_peak() noexcept { peak_.store(live(), std::memory_order_relaxed); }

  /// The calling thread's meter; null while the thread is exiting (its arrays are then not
  /// counted). An array keeps its meter alive, so it may be freed on any thread, at any time.
  static std::shared_ptr<memory_meter> of_this_thread() {
    struct holder {
      std::shared_ptr<memory_meter> meter = std::make_shared<memory_meter>();
      ~holder() { exited() = true; }
    };
    if (exited()) return nullptr;
    thread_local holder h;
    return h.meter;
  }

 private:
  static bool& exited() noexcept {
    thread_local bool gone = false;
    return gone;
  }
  std::atomic<std::int64_t> live_{0}, peak_{0};
};

/// An owning array of `size()` T (uninitialised) from the block cache, counted by the meter of
/// the thread that allocated it.
template <class T>
class cached_array {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T> && alignof(T) <= 64,
                "cached_array holds plain numbers");

 public:
  cached_array() = default;
  explicit cached_array(std::size_t count)
      : data_(static_cast<T*>(block_cache::allocate(count * sizeof(T)))), count_(count),
        meter_(memory_meter::of_this_thread()) {
    if (meter_) meter_->add(static_cast<std::int64_t>(count * sizeof(T)));
  }
  cached_array(cached_array&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)), meter_(std::move(other.meter_)) {}
  cached_array& operator=(cached_array&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
      meter_ = std::move(other.meter_);
    }
    return *this;
  }
  cached_array(const cached_array&) = delete;
  cached_array& operator=(const cached_array&) = delete;
  ~cached_array() { reset(); }

  T* get() const noexcept { return data_; }
  std::size_t size() const noexcept { return count_; }
  T& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  void reset() noexcept {
    if (data_ == nullptr) return;
    block_cache::deallocate(data_, count_ * sizeof(T));
    if (meter_) meter_->subtract(static_cast<std::int64_t>(count_ * sizeof(T)));
    data_ = nullptr;
    count_ = 0;
    meter_.reset();
  }
  T* data_ = nullptr;
  std::size_t count_ = 0;
  std::shared_ptr<memory_meter> meter_;
};

}  // namespace baton::detail::core
