// baton/core/workspace.hpp — reusable per-call memory: the attention backends' packed
// operands, context parallelism's host buffers.
//
// A call that needs scratch of O(seq) bytes would, allocating it afresh every time, pay page
// faults and the kernel's zeroing on every call (docs/attention.md measures the cost), so the
// caller keeps a pool: a call leases a buffer, uses it, and gives it back. Several threads
// may call at once: each lease is a distinct buffer (the pool grows to the number of
// concurrent calls). Nothing in a leased buffer is assumed: callers write every byte they
// read.
//
// The buffers are cached_arrays (core/block_cache.hpp): the memory meter of the thread that
// grew the pool counts them, leased or idle, for as long as the pool keeps them — a rank's
// measured memory includes its context-parallel and attention workspaces.
#pragma once

#include <baton/core/block_cache.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace baton::detail::core {

class workspace_pool {
  struct buffer {
    cached_array<std::byte> storage;
    std::byte* data() const noexcept { return storage.get(); }
    std::size_t capacity() const noexcept { return storage.size(); }
  };

 public:
  workspace_pool() = default;
  workspace_pool(const workspace_pool&) = delete;
  workspace_pool& operator=(const workspace_pool&) = delete;
  ~workspace_pool() { release(); }

  /// A buffer of at least `bytes` bytes, 64-byte aligned, for the lifetime of the lease.
  class lease {
   public:
    lease(const lease&) = delete;
    lease& operator=(const lease&) = delete;
    lease(lease&& other) noexcept : pool_(std::exchange(other.pool_, nullptr)), buf_(std::move(other.buf_)) {}
    lease& operator=(lease&&) = delete;
    ~lease() {
      if (pool_) pool_->give_back(std::move(buf_));
    }
    [[nodiscard]] std::byte* data() const noexcept { return buf_.data(); }

   private:
    friend class workspace_pool;
    lease(workspace_pool* pool, buffer b) noexcept : pool_(pool), buf_(std::move(b)) {}
    workspace_pool* pool_;
    buffer buf_;
  };

  [[nodiscard]] lease acquire(std::size_t bytes) {
    buffer b;
    {
      std::lock_guard lock(mutex_);
      // The smallest free buffer that fits; else the largest, to be replaced by a bigger one.
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it)
        if (it->capacity() >= bytes && (best == free_.end() || it->capacity() < best->capacity())) best = it;
      if (best == free_.end() && !free_.empty())
        best = std::max_element(free_.begin(), free_.end(),
                                [](const buffer& a, const buffer& c) { return a.capacity() < c.capacity(); });
      if (best != free_.end()) {
        b = std::move(*best);
        free_.erase(best);
      }
    }
    if (b.capacity() < bytes) {
      b.storage = cached_array<std::byte>();  // free first: the peak is the new size, not old + new
      b.storage = cached_array<std::byte>(std::max<std::size_t>(bytes, 64));
    }
    return lease(this, std::move(b));
  }

  /// Frees every buffer not currently leased.
  void release() noexcept {
    std::vector<buffer> drop;
    {
      std::lock_guard lock(mutex_);
      drop.swap(free_);
    }
  }

 private:
  void give_back(buffer&& b) noexcept {
    try {
      std::lock_guard lock(mutex_);
      free_.push_back(std::move(b));
    } catch (...) {
      b.storage = cached_array<std::byte>();
    }
  }

  std::mutex mutex_;
  std::vector<buffer> free_;
};

/// Hands out consecutive 64-byte aligned arrays from one buffer: first with a null base to
/// measure the bytes needed, then with the leased buffer to place the arrays.
class workspace_carver {
 public:
  explicit workspace_carver(std::byte* base = nullptr) noexcept : base_(base) {}
  template <class T>
  T* take(std::int64_t count) noexcept {
    const std::size_t bytes = (static_cast<std::size_t>(std::max<std::int64_t>(count, 0)) * sizeof(T) + 63) / 64 * 64;
    T* p = base_ ? reinterpret_cast<T*>(base_ + offset_) : nullptr;
    offset_ += bytes;
    return p;
  }
  [[nodiscard]] std::size_t bytes() const noexcept { return offset_; }

 private:
  std::byte* base_;
  std::size_t offset_ = 0;
};

}  // namespace baton::detail::core
