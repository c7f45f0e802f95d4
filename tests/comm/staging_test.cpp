// The NCCL communicator's host staging logic (detail/staging_pool.hpp) driven through a fake
// device runtime on the host: streams are queues the test completes in the order it likes,
// events pass once their stream got past them, and every allocation is logged with the
// receives pending at that moment. A second model kept by the test itself (which transfer
// used which buffer, which are complete) judges the pool, so the assertions do not trust the
// pool's own bookkeeping.
#include "catch.hpp"

#include <baton/comm/detail/staging_pool.hpp>
#include <baton/comm/error.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {

using baton::comm_error;
using baton::detail::comm::staging_limits;

// The fake GPU: streams 0, 1, 2 (the main lane, up, down).
struct fake_gpu {
  struct stream_state {
    std::size_t enqueued = 0, completed = 0;
  };
  struct event_state {
    int stream = -1;  // never recorded: passed
    std::size_t at = 0;
    bool alive = true;
  };
  struct transfer {
    int stream;
    std::size_t seq;
    bool receive;
  };
  struct allocation {
    std::size_t bytes;
    std::size_t receives_pending;
    std::size_t transfers_pending;
  };

  std::vector<stream_state> streams = std::vector<stream_state>(3);
  std::vector<event_state> events;
  std::vector<transfer> transfers;
  std::vector<allocation> allocations;
  std::vector<std::unique_ptr<std::byte[]>> blocks;
  std::size_t frees = 0;
  bool fail_record = false;
  std::optional<std::size_t> fail_allocation_at;  // the n-th allocation throws

  std::size_t enqueue(int s) { return ++streams[static_cast<std::size_t>(s)].enqueued; }
  bool done(int s, std::size_t seq) const { return streams[static_cast<std::size_t>(s)].completed >= seq; }
  // The GPU gets through the next `n` operations of stream `s` (streams are in order).
  void complete(int s, std::size_t n = 1) {
    auto& st = streams[static_cast<std::size_t>(s)];
    st.completed = std::min(st.enqueued, st.completed + n);
  }
  void complete_all() {
    for (int s = 0; s < 3; ++s) complete(s, streams[static_cast<std::size_t>(s)].enqueued);
  }
  std::size_t pending(bool receives_only) const {
    return static_cast<std::size_t>(std::count_if(transfers.begin(), transfers.end(), [&](const transfer& t) {
      return (!receives_only || t.receive) && !done(t.stream, t.seq);
    }));
  }
};

struct fake_runtime {
  struct memory {
    std::byte* device = nullptr;
    std::byte* pinned = nullptr;
  };
  using event = int;
  using stream = int;

  fake_gpu* gpu = nullptr;

  memory allocate(std::size_t bytes) {
    if (gpu->fail_allocation_at && *gpu->fail_allocation_at == gpu->allocations.size()) {
      throw comm_error("fake: out of pinned memory");
    }
    gpu->allocations.push_back({bytes, gpu->pending(true), gpu->pending(false)});
    gpu->blocks.push_back(std::make_unique<std::byte[]>(bytes));
    std::byte* device = gpu->blocks.back().get();
    gpu->blocks.push_back(std::make_unique<std::byte[]>(bytes));
    return {device, gpu->blocks.back().get()};
  }
  void free(memory) noexcept { ++gpu->frees; }
  event make_event() {
    gpu->events.push_back({});
    return static_cast<event>(gpu->events.size() - 1);
  }
  void destroy_event(event e) noexcept { gpu->events[static_cast<std::size_t>(e)].alive = false; }
  void record(event e, stream s) {
    if (!try_record(e, s)) throw comm_error("fake: cudaEventRecord failed");
  }
  bool try_record(event e, stream s) noexcept {
    if (gpu->fail_record) return false;
    gpu->events[static_cast<std::size_t>(e)] = {s, gpu->streams[static_cast<std::size_t>(s)].enqueued, true};
    return true;
  }
  bool passed(event e) const {
    const auto& ev = gpu->events[static_cast<std::size_t>(e)];
    REQUIRE(ev.alive);  // the pool never queries a destroyed event (main thread only)
    return ev.stream < 0 || gpu->done(ev.stream, ev.at);
  }
  void to_device(const memory& m, std::span<const std::byte> bytes, stream s) {
    std::copy(bytes.begin(), bytes.end(), m.pinned);
    gpu->enqueue(s);
  }
  void to_pinned(const memory&, std::size_t, stream s) { gpu->enqueue(s); }
  std::byte* pinned(const memory& m) const { return m.pinned; }
  std::byte* device(const memory& m) const { return m.device; }
};

using pool_t = baton::detail::comm::staging_pool<fake_runtime>;
using lease_t = pool_t::lease;

// What the communicator does around the pool, and the test's own judgement of it: which
// transfer used which device buffer, and whether the pool handed out a buffer whose last
// transfer the GPU had not finished.
struct transport {
  fake_gpu gpu;
  pool_t pool;
  std::map<std::byte*, std::vector<fake_gpu::transfer>> uses;
  std::vector<std::string> reused_in_flight;

  explicit transport(staging_limits limits) { pool.make_in_advance(fake_runtime{&gpu}, limits, 3, "rank 1"); }
  ~transport() { pool.release(); }

  void check_not_in_flight(const lease_t& slot) {
    for (const auto& t : uses[slot.device()]) {
      if (!gpu.done(t.stream, t.seq)) reused_in_flight.push_back("stream " + std::to_string(t.stream) + " op " + std::to_string(t.seq));
    }
  }
  // irecv: acquire, enqueue the receive, move the marker, copy back, mark the slot.
  lease_t recv(std::size_t bytes, int lane) {
    lease_t slot = pool.acquire(bytes, lane, "irecv from peer 2 (tag 0, " + std::to_string(bytes) + " bytes)");
    check_not_in_flight(slot);
    const std::size_t seq = gpu.enqueue(lane);
    gpu.transfers.push_back({lane, seq, true});
    uses[slot.device()].push_back({lane, seq, true});
    pool.posted(static_cast<std::size_t>(lane), lane);
    pool.copy_back(slot, bytes, lane);
    slot.mark(lane);
    return slot;
  }
  // isend: stage (copy in), enqueue the send, move the marker, mark the slot.
  lease_t send(std::size_t bytes, int lane) {
    std::vector<std::byte> data(bytes, std::byte{7});
    lease_t slot = pool.stage_send(data, lane, "isend to peer 0 (tag 0, " + std::to_string(bytes) + " bytes)");
    check_not_in_flight(slot);
    const std::size_t seq = gpu.enqueue(lane);
    gpu.transfers.push_back({lane, seq, false});
    uses[slot.device()].push_back({lane, seq, false});
    pool.posted(static_cast<std::size_t>(lane), lane);
    slot.mark(lane);
    return slot;
  }
};

std::string error_of(auto&& f) {
  try {
    f();
  } catch (const comm_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("nccl staging: every slot is made in advance, before anything is posted", "[comm][staging]") {
  transport t({.slots = 4, .slot_bytes = 1024});
  REQUIRE(t.gpu.allocations.size() == 4);
  for (const auto& a : t.gpu.allocations) CHECK(a.bytes == 1024);
  auto a = t.recv(1000, 1);
  auto b = t.send(1024, 2);
  auto c = t.recv(1, 2);
  CHECK(t.gpu.allocations.size() == 4);  // fitting transfers take slots made in advance
  CHECK(t.pool.slot_count() == 4);
}

TEST_CASE("nccl staging: no allocation while a receive is posted; growth at a quiescent point", "[comm][staging]") {
  transport t({.slots = 4, .slot_bytes = 1024});
  auto posted = t.recv(512, 1);
  // A send larger than every slot while the receive is posted: refused, nothing allocated.
  const std::string e = error_of([&] { (void)t.send(4096, 2); });
  CHECK(t.gpu.allocations.size() == 4);
  CHECK_THAT(e, Catch::Contains("rank 1: isend to peer 0"));
  CHECK_THAT(e, Catch::Contains("needs a host staging slot of 4096 bytes"));
  CHECK_THAT(e, Catch::Contains("4 slots x 1024 bytes"));
  CHECK_THAT(e, Catch::Contains("could deadlock"));
  CHECK_THAT(e, Catch::Contains("raise nccl_options::staging_slots"));
  CHECK_THAT(e, Catch::Contains("staging_slot_bytes"));
  // A send still pending (its receive done) keeps the pool from growing too.
  t.gpu.complete(1, 2);  // the receive and its copy back
  posted.reset();
  auto pending_send = t.send(800, 2);
  CHECK_THROWS_AS(t.send(4096, 0), comm_error);
  CHECK(t.gpu.allocations.size() == 4);
  // Quiescent: nothing of this communicator is pending, so the pool grows, once.
  t.gpu.complete_all();
  auto big = t.send(4096, 2);
  REQUIRE(t.gpu.allocations.size() == 5);
  CHECK(t.gpu.allocations.back().bytes == 4096);
  CHECK(t.gpu.allocations.back().transfers_pending == 0);
  CHECK(big.capacity() == 4096);
  t.gpu.complete_all();
  big.reset();
  auto again = t.send(3000, 1);  // the grown slot is reused, nothing new
  CHECK(t.gpu.allocations.size() == 5);
}

TEST_CASE("nccl staging: an exhausted pool mid-flight throws; completed transfers free their slots", "[comm][staging]") {
  transport t({.slots = 3, .slot_bytes = 256});
  std::vector<lease_t> held;
  for (int i = 0; i < 3; ++i) held.push_back(t.recv(100, 1));
  const std::string e = error_of([&] { (void)t.recv(100, 2); });
  CHECK_THAT(e, Catch::Contains("irecv from peer 2 (tag 0, 100 bytes) needs a host staging slot of 100 bytes"));
  CHECK_THAT(e, Catch::Contains("3 held by pending requests"));
  CHECK(t.gpu.allocations.size() == 3);
  // The first receive completes (with its copy back) and its request ends: its slot serves the next.
  t.gpu.complete(1, 2);
  held.erase(held.begin());
  auto next = t.recv(100, 2);
  CHECK(t.gpu.allocations.size() == 3);
  CHECK(t.reused_in_flight.empty());
}

TEST_CASE("nccl staging: a slot whose transfer has not completed is never handed out again", "[comm][staging]") {
  transport t({.slots = 2, .slot_bytes = 256});
  // Dropped requests (or shift's send slot): the leases end while the sends are in flight.
  std::byte* first = nullptr;
  {
    auto a = t.send(64, 2);
    first = a.device();
    auto b = t.send(64, 2);
  }
  const std::string e = error_of([&] { (void)t.send(64, 1); });
  CHECK_THAT(e, Catch::Contains("none of the staging pool's 2 slots x 256 bytes"));
  CHECK_THAT(e, Catch::Contains("0 held by pending requests"));
  t.gpu.complete(2, 2);  // the first send (and its staging copy) passed; the second did not
  auto c = t.send(64, 1);
  CHECK(c.device() == first);
  CHECK(t.gpu.allocations.size() == 2);
  CHECK(t.reused_in_flight.empty());
}

TEST_CASE("nccl staging: a lease dropped on an exception path keeps its memory from reuse", "[comm][staging]") {
  transport t({.slots = 1, .slot_bytes = 256});
  SECTION("unmarked: the stream it was acquired for is marked when it ends") {
    std::byte* used = nullptr;
    {
      auto slot = t.pool.acquire(64, 1, "irecv");
      used = slot.device();
      t.gpu.enqueue(1);  // the receive was enqueued, then the code threw before mark()
      t.pool.posted(1, 1);
    }
    CHECK_THROWS_AS(t.pool.acquire(64, 2, "isend"), comm_error);  // in flight: not reused, not grown
    CHECK(t.gpu.allocations.size() == 1);
    t.gpu.complete(1);
    auto again = t.pool.acquire(64, 2, "isend");
    CHECK(again.device() == used);
  }
  SECTION("unmarkable: the slot is lost, never reused") {
    std::byte* used = nullptr;
    {
      auto slot = t.pool.acquire(64, 1, "irecv");
      used = slot.device();
      t.gpu.fail_record = true;  // e.g. the context is broken
    }
    t.gpu.fail_record = false;
    t.gpu.complete_all();
    auto fresh = t.pool.acquire(64, 2, "isend");  // quiescent: grows instead of reusing
    CHECK(fresh.device() != used);
    CHECK(t.gpu.allocations.size() == 2);
  }
}

TEST_CASE("nccl staging: mixed sizes, lanes and completion orders keep the discipline", "[comm][staging]") {
  // Random traffic on three lanes: receives and sends of 1 byte to 3 KiB against slots of
  // 1 KiB, the GPU finishing lanes in random order, requests ending before or after their
  // transfer completes. Whatever happens: no allocation with a transfer pending, no buffer
  // handed out while its last transfer is in flight, and a refusal only while one is pending.
  for (std::uint32_t seed = 1; seed <= 8; ++seed) {
    CAPTURE(seed);
    std::mt19937 rng(seed);
    transport t({.slots = 6, .slot_bytes = 1024});
    std::vector<lease_t> open;
    std::size_t refused = 0, grown_before = t.gpu.allocations.size();
    bool refused_while_quiescent = false;
    for (int step = 0; step < 400; ++step) {
      const int lane = static_cast<int>(rng() % 3);
      const std::size_t bytes = rng() % 4 == 0 ? 1 + rng() % 3072 : 1 + rng() % 1024;
      switch (rng() % 5) {
        case 0:
        case 1: {
          const bool quiet = t.gpu.pending(false) == 0;
          try {
            open.push_back(rng() % 2 ? t.recv(bytes, lane) : t.send(bytes, lane));
          } catch (const comm_error&) {
            ++refused;
            if (quiet) refused_while_quiescent = true;
          }
          break;
        }
        case 2: t.gpu.complete(lane, 1 + rng() % 3); break;
        case 3:
          if (!open.empty()) open.erase(open.begin() + static_cast<std::ptrdiff_t>(rng() % open.size()));
          break;
        default:
          if (rng() % 8 == 0) t.gpu.complete_all();
      }
    }
    CHECK(t.reused_in_flight.empty());
    CHECK_FALSE(refused_while_quiescent);
    for (std::size_t i = grown_before; i < t.gpu.allocations.size(); ++i) {
      CHECK(t.gpu.allocations[i].receives_pending == 0);
      CHECK(t.gpu.allocations[i].transfers_pending == 0);
    }
    CHECK(refused > 0);                                  // the traffic did exhaust the pool mid-flight
    CHECK(t.gpu.allocations.size() > grown_before);      // and grew it at quiescent points
  }
}

TEST_CASE("nccl staging: limits, growth switched off, allocation failure, leases outliving the pool", "[comm][staging]") {
  SECTION("bad limits name the option") {
    pool_t pool;
    fake_gpu gpu;
    const std::string zero = error_of([&] { pool.make_in_advance(fake_runtime{&gpu}, {.slots = 2, .slot_bytes = 0}, 3, "rank 0"); });
    CHECK_THAT(zero, Catch::Contains("rank 0: nccl_options::staging_slot_bytes is 0"));
    const std::string none = error_of([&] { pool.make_in_advance(fake_runtime{&gpu}, {.slots = 0, .slot_bytes = 64, .grow = false}, 3, "rank 0"); });
    CHECK_THAT(none, Catch::Contains("staging_slots is 0 and staging_growth is false"));
    CHECK(gpu.allocations.empty());
  }
  SECTION("growth off: a quiescent pool refuses too") {
    transport t({.slots = 1, .slot_bytes = 64, .grow = false});
    const std::string e = error_of([&] { (void)t.send(65, 0); });
    CHECK_THAT(e, Catch::Contains("nccl_options::staging_growth is false"));
    CHECK(t.gpu.allocations.size() == 1);
  }
  SECTION("a failed allocation in advance frees what was made") {
    fake_gpu gpu;
    gpu.fail_allocation_at = 2;
    pool_t pool;
    CHECK_THROWS_WITH(pool.make_in_advance(fake_runtime{&gpu}, {.slots = 4, .slot_bytes = 64}, 3, "rank 0"),
                      "fake: out of pinned memory");
    pool.release();
    CHECK(gpu.frees == 2);
    CHECK(std::none_of(gpu.events.begin(), gpu.events.end(), [](const auto& e) { return e.alive; }));
  }
  SECTION("abandoned after a timeout: nothing freed, a held lease orphaned") {
    fake_gpu gpu;
    pool_t pool;
    pool.make_in_advance(fake_runtime{&gpu}, {.slots = 2, .slot_bytes = 64}, 3, "rank 0");
    lease_t stuck = pool.acquire(8, 0, "all_reduce");
    pool.abandon();
    CHECK(gpu.frees == 0);
    CHECK(stuck.orphaned());
    CHECK_THROWS_AS(stuck.device(), comm_error);
  }
  SECTION("a request kept past its communicator") {
    fake_gpu gpu;
    lease_t kept;
    {
      pool_t pool;
      pool.make_in_advance(fake_runtime{&gpu}, {.slots = 2, .slot_bytes = 64}, 3, "rank 0");
      kept = pool.acquire(8, 0, "irecv");
      pool.release();
    }
    CHECK(kept.orphaned());
    CHECK_THROWS_WITH(kept.pinned(), Catch::Contains("after its communicator was destroyed"));
    kept.reset();  // touches nothing (ASan would report a use after free)
    CHECK_FALSE(kept.orphaned());
    CHECK(gpu.frees == 2);
  }
}
