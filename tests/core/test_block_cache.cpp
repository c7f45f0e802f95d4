// The core's block cache (the host memory of host_tensor): size classes against their
// definition, reuse of a freed block by the next allocation of its class on the same thread,
// the limit, release, and blocks freed on another thread or after their thread ended.
#include "catch.hpp"

#include <baton/core/block_cache.hpp>
#include <baton/core/workspace.hpp>
#include <baton/payload/host_tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace {
using cache = baton::detail::core::block_cache;

// Restores the default limit and empties this thread's cache, whatever a test did.
struct fresh_cache {
  fresh_cache() { cache::release(); }
  ~fresh_cache() {
    cache::set_limit(std::size_t{1} << 30);
    cache::release();
  }
};
}  // namespace

TEST_CASE("core block_cache: a size class holds its request with at most 1/8 to spare", "[core][block_cache]") {
  for (std::size_t bytes = cache::min_cached_bytes; bytes < (std::size_t{1} << 34); bytes = bytes * 9 / 8 + 4093) {
    const std::size_t cls = cache::size_class(bytes);
    const std::size_t held = cache::class_bytes(cls);
    REQUIRE(held >= bytes);
    REQUIRE(static_cast<double>(held) <= 1.125 * static_cast<double>(bytes) + 1);
    // The class is the smallest that holds the request.
    if (cls > cache::size_class(cache::min_cached_bytes)) REQUIRE(cache::class_bytes(cls - 1) < bytes);
  }
  // Exact class sizes map to themselves.
  CHECK(cache::class_bytes(cache::size_class(std::size_t{1} << 20)) == std::size_t{1} << 20);
  CHECK(cache::size_class((std::size_t{1} << 20) + 1) == cache::size_class(std::size_t{1} << 20) + 1);
}

TEST_CASE("core block_cache: a freed block serves the next request of its class on the thread", "[core][block_cache]") {
  const fresh_cache guard;
  const std::size_t bytes = std::size_t{3} << 20;
  void* a = cache::allocate(bytes);
  CHECK(reinterpret_cast<std::uintptr_t>(a) % cache::alignment == 0);
  cache::deallocate(a, bytes);
  CHECK(cache::cached_bytes() == cache::class_bytes(cache::size_class(bytes)));
  void* b = cache::allocate(bytes - 1000);  // the same class
  CHECK(b == a);
  CHECK(cache::cached_bytes() == 0);
  void* c = cache::allocate(bytes * 2);  // another class: a new block
  CHECK(c != a);
  cache::deallocate(b, bytes - 1000);
  cache::deallocate(c, bytes * 2);
  cache::release();
  CHECK(cache::cached_bytes() == 0);
  // Small blocks are not kept.
  void* small = cache::allocate(1000);
  cache::deallocate(small, 1000);
  CHECK(cache::cached_bytes() == 0);
}

TEST_CASE("core block_cache: a thread keeps no more than the limit", "[core][block_cache]") {
  const fresh_cache guard;
  const std::size_t bytes = std::size_t{1} << 20;
  cache::set_limit(2 * bytes);
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(cache::allocate(bytes));
  for (void* p : blocks) cache::deallocate(p, bytes);
  CHECK(cache::cached_bytes() == 2 * bytes);
  cache::set_limit(0);
  cache::release();
  void* p = cache::allocate(bytes);
  cache::deallocate(p, bytes);
  CHECK(cache::cached_bytes() == 0);
}

TEST_CASE("core block_cache: blocks freed on another thread, or after their thread ended", "[core][block_cache]") {
  const fresh_cache guard;
  const std::size_t bytes = std::size_t{1} << 20;
  void* from_worker = nullptr;
  std::size_t worker_kept = 0;
  std::thread worker([&] {
    from_worker = cache::allocate(bytes);
    void* own = cache::allocate(bytes);
    cache::deallocate(own, bytes);  // kept by the worker, freed when the worker ends
    worker_kept = cache::cached_bytes();
  });
  worker.join();
  CHECK(worker_kept == cache::class_bytes(cache::size_class(bytes)));
  // The worker has ended; its block joins this thread's cache.
  cache::deallocate(from_worker, bytes);
  CHECK(cache::cached_bytes() == cache::class_bytes(cache::size_class(bytes)));
}

TEST_CASE("core block_cache: host_tensor reuses a freed tensor's memory and still zero-fills", "[core][block_cache]") {
  const fresh_cache guard;
  const float* first = nullptr;
  {
    auto t = baton::host_tensor<float>::filled({256, 256}, 7.0f);  // 256 KiB
    first = t.data();
  }
  baton::host_tensor<float> zeroed({256, 256});
  CHECK(zeroed.data() == first);  // the same block, dirty with 7s before the constructor
  bool all_zero = true;
  for (float v : zeroed.values()) all_zero = all_zero && v == 0.0f;
  CHECK(all_zero);
}

TEST_CASE("core memory_meter: a thread's tensors are counted until freed, wherever they are freed", "[core][block_cache]") {
  const auto before = baton::host_tensor_memory();
  {
    baton::host_tensor<float> t({1000});
    CHECK(baton::host_tensor_memory().live == before.live + 4000);
    CHECK(baton::host_tensor_memory().peak >= before.live + 4000);
    baton::host_tensor<double> u({10, 10});
    CHECK(baton::host_tensor_memory().live == before.live + 4800);
  }
  CHECK(baton::host_tensor_memory().live == before.live);
  CHECK(baton::host_tensor_memory().peak >= before.live + 4800);
  baton::host_tensor_memory_reset_peak();
  CHECK(baton::host_tensor_memory().peak == before.live);

  // Allocated on a worker, freed here: the worker's meter goes back down, this one never moved.
  std::shared_ptr<baton::detail::core::memory_meter> worker_meter;
  baton::host_tensor<float> moved;
  std::thread worker([&] {
    worker_meter = baton::detail::core::memory_meter::of_this_thread();
    moved = baton::host_tensor<float>({256, 256});
  });
  worker.join();
  REQUIRE(worker_meter != nullptr);
  CHECK(worker_meter->live() == 256 * 256 * 4);
  CHECK(baton::host_tensor_memory().live == before.live);
  moved = baton::host_tensor<float>();
  CHECK(worker_meter->live() == 0);
  CHECK(worker_meter->peak() == 256 * 256 * 4);
  CHECK(baton::host_tensor_memory().live == before.live);
}

// The workspace pool (context-parallel buffers, attention packing) allocates through the block
// cache: its buffers count in the meter of the thread that grew it, leased or kept, until the
// pool frees them (issue 29: a rank's measured memory includes its workspaces).
TEST_CASE("workspace_pool: its buffers, leased or kept for the next call, are metered", "[core][memory]") {
  const auto meter = baton::detail::core::memory_meter::of_this_thread();
  const std::int64_t before = meter->live();
  {
    baton::detail::core::workspace_pool pool;
    {
      auto a = pool.acquire(100000);
      a.data()[99999] = std::byte{1};
      CHECK(meter->live() == before + 100000);
    }
    CHECK(meter->live() == before + 100000);  // kept for the next call
    {
      auto b = pool.acquire(50000);  // fits in the kept buffer: nothing new
      CHECK(meter->live() == before + 100000);
      auto c = pool.acquire(200);  // a second lease at once: a second buffer
      CHECK(meter->live() == before + 100200);
    }
    {
      auto d = pool.acquire(300000);  // larger than any kept: the largest is replaced, not added to
      CHECK(meter->live() == before + 300200);
    }
    pool.release();
    CHECK(meter->live() == before);
    auto e = pool.acquire(1000);
    CHECK(meter->live() == before + 1000);
  }
  CHECK(meter->live() == before);  // the lease went back, and the pool's destructor freed it
}
