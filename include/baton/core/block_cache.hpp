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
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <new>
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

/// std::unique_ptr's deleter for a block_cache array of `count` T.
template <class T>
struct block_cache_delete {
  std::size_t count = 0;
  void operator()(T* p) const noexcept { block_cache::deallocate(p, count * sizeof(T)); }
};

}  // namespace baton::detail::core
