// Certified deadlock freedom (baton/schedule/certify.hpp): the lowered program of every
// built-in policy, over a grid of shapes, gets a certificate that check_certificate accepts;
// deadlocking programs are refused naming the cycle; forged certificates are rejected.
#include <baton/schedule.hpp>

#include "catch.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

using Catch::Matchers::Contains;

namespace {

// The grid. Release: every ranks p = 1..32 with every microbatch count m = 1..16, and with
// m in {24, 32, 48, 64, 96, 127, 128}: all p <= 32 and the m <= 128 that span small, odd,
// power-of-two and the largest counts (every m up to 128 for every p would be 30 times the
// work, over the 20 s budget on 2 cores). Under the sanitizers (BATON_CERTIFY_SMALL_GRID, about
// 4 times slower): p = 1..12, 16 and 32 with m = 1..8, 32 and 128. With the environment
// variable BATON_CERTIFY_FULL_GRID=1 (by hand: `test_schedule "[certify]"`, minutes), every
// p = 1..32 with every m = 1..128.
bool full_grid() {
  const char* v = std::getenv("BATON_CERTIFY_FULL_GRID");
  return v != nullptr && std::string(v) == "1";
}

std::vector<int> grid_ranks() {
  std::vector<int> out;
  if (full_grid()) {
    for (int p = 1; p <= 32; ++p) out.push_back(p);
    return out;
  }
#ifdef BATON_CERTIFY_SMALL_GRID
  for (int p = 1; p <= 12; ++p) out.push_back(p);
  out.push_back(16);
  out.push_back(32);
#else
  for (int p = 1; p <= 32; ++p) out.push_back(p);
#endif
  return out;
}

std::vector<int> grid_microbatches() {
  std::vector<int> out;
  if (full_grid()) {
    for (int m = 1; m <= 128; ++m) out.push_back(m);
    return out;
  }
#ifdef BATON_CERTIFY_SMALL_GRID
  for (int m = 1; m <= 8; ++m) out.push_back(m);
  for (int m : {32, 128}) out.push_back(m);
#else
  for (int m = 1; m <= 16; ++m) out.push_back(m);
  for (int m : {24, 32, 48, 64, 96, 127, 128}) out.push_back(m);
#endif
  return out;
}

// How many shapes of the grid a policy serves, from the constraints docs/schedules.md's table
// of policies lists (not from the policies' code): dual_pipe_v needs m >= 2 ranks, the
// interleaved ones m a multiple of max(1, m / ranks), every other policy serves every shape
// of the grid (its largest, 32 ranks x 2 stages x 128 microbatches, is far below the size
// limit).
long long documented_shapes(std::string_view policy) {
  const bool needs_2p = policy == "dual_pipe_v";
  const bool needs_rounds = policy == "interleaved_1f1b" || policy == "interleaved_zero_bubble";
  long long n = 0;
  for (int p : grid_ranks())
    for (int m : grid_microbatches()) {
      if (needs_2p && m < 2 * p) continue;
      if (needs_rounds && m % std::max(1, m / p) != 0) continue;
      ++n;
    }
  return n;
}

}  // namespace

TEST_CASE("the lowered program of every built-in policy is certified deadlock-free", "[schedule][certify]") {
  const auto start = std::chrono::steady_clock::now();
  long long certified = 0;
  long long actions = 0;
  for (const auto& info : baton::builtin_policies) {
    long long certified_here = 0;
    bool largest = false;
    for (int p : grid_ranks()) {
      for (int m : grid_microbatches()) {
        baton::program compute;
        try {
          compute = info.generate(info.shape(p, m));
        } catch (const baton::schedule_error&) {
          continue;  // a shape the policy refuses (test_policies.cpp checks which)
        }
        INFO(info.name << " p=" << p << " m=" << m);
        const baton::program prog = baton::lower(compute);  // throws if the policy's program is invalid
        const auto cert = baton::certify_deadlock_free(prog);
        const auto problem = baton::check_certificate(prog, cert);
        if (problem) FAIL_CHECK(*problem);
        ++certified_here;
        actions += static_cast<long long>(cert.order.size());
        largest = largest || (p == 32 && m == 128);
      }
    }
    INFO(info.name);
    // Every policy serves a good part of the grid, and the largest shape, p = 32, m = 128.
    CHECK(certified_here >= static_cast<long long>(grid_ranks().size()) * 2);
    CHECK(largest);
    // Every shape of the grid the documented constraints allow, and no other: a policy that
    // refuses a shape it should serve (or serves one it should refuse) fails here.
    CHECK(certified_here == documented_shapes(info.name));
    certified += certified_here;
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // 7404 programs in the Release grid (of 11 policies x 32 x 23 shapes = 8096), 1411 in the
  // small one (of 11 x 14 x 10 = 1540).
  if (full_grid())
    WARN("full grid: " << certified << " programs, " << actions << " actions certified in " << seconds << " s");
}

TEST_CASE("docs/schedules.md block: certify a lowered program", "[schedule][certify][docs]") {
  // [doc:deadlock_certificate]
  const baton::program prog = baton::lower(baton::v_min::generate(baton::shape_for<baton::v_min>(8, 32)));
  const baton::deadlock_certificate cert = baton::certify_deadlock_free(prog);  // throws, naming the cycle, if none
  const std::optional<std::string> flaw = baton::check_certificate(prog, cert);  // nullopt: the proof holds
  // [/doc:deadlock_certificate]
  CHECK_FALSE(flaw);
  CHECK(cert.order.size() == baton::action_count(prog));
  // 14 of the 15 boundaries of a V over 8 ranks cross ranks; each carries F and B of 32 microbatches.
  CHECK(cert.waits.size() == static_cast<std::size_t>(2 * 14 * 32));
}

TEST_CASE("a certificate orders every action after what it waits for", "[schedule][certify]") {
  const auto prog = baton::lower(baton::v_half::generate(baton::shape_for<baton::v_half>(4, 8)));
  const auto cert = baton::certify_deadlock_free(prog);
  REQUIRE(cert.order.size() == baton::action_count(prog));
  // Every receive is matched with its send: on a V of 4 ranks 6 of the 7 stage boundaries
  // cross ranks (stages 3 and 4 share rank 3), each carrying F and B of 8 microbatches.
  CHECK(cert.waits.size() == static_cast<std::size_t>(2 * 6 * 8));
  for (const auto& w : cert.waits) {
    const auto& send = prog.ranks[static_cast<std::size_t>(w.awaited[0])][static_cast<std::size_t>(w.awaited[1])];
    const auto& recv = prog.ranks[static_cast<std::size_t>(w.waiter[0])][static_cast<std::size_t>(w.waiter[1])];
    CHECK(baton::message_tag(prog.shape, send) == baton::message_tag(prog.shape, recv));
    CHECK(baton::is_communication(send.kind));
  }
  CHECK_FALSE(baton::check_certificate(prog, cert));

  SECTION("a receive moved before its send is caught") {
    auto forged = cert;
    const auto& w = forged.waits.front();
    auto at = [&](baton::action_place p) {
      for (std::size_t i = 0; i < forged.order.size(); ++i)
        if (forged.order[i] == p) return i;
      return forged.order.size();
    };
    // Swap the send's and the receive's entries: the receive now runs first.
    std::swap(forged.order[at(w.awaited)], forged.order[at(w.waiter)]);
    const auto problem = baton::check_certificate(prog, forged);
    REQUIRE(problem);
    CHECK_THAT(*problem, Contains("comes before") || Contains("the rank's next step"));
  }
  SECTION("an order that skips a step of a rank is caught") {
    auto forged = cert;
    forged.order.pop_back();
    CHECK_THAT(baton::check_certificate(prog, forged).value_or(""), Contains("the order holds"));
  }
  SECTION("a certificate of another shape is caught") {
    auto forged = cert;
    forged.shape.microbatches = 9;
    CHECK_THAT(baton::check_certificate(prog, forged).value_or(""), Contains("another shape"));
  }
}

TEST_CASE("a deadlocking program gets no certificate: the refusal names the cycle", "[schedule][certify]") {
  SECTION("compute-only, from tests/schedule/deadlock.csv") {
    const auto prog = baton::read_csv_file(std::string(BATON_SCHEDULE_TEST_DATA) + "/../deadlock.csv");
    CHECK_THROWS_WITH(baton::certify_deadlock_free(prog),
                      Contains("deadlock under blocking receives: rank 0 waits at step 1 (0B0) for rank 1") &&
                          Contains("rank 1 waits at step 0 (1F1) for rank 0, which is blocked at step 1"));
  }
  SECTION("lowered: each rank receives before it sends what the other waits for") {
    const auto prog = baton::parse_csv(
        "0F0,0SEND_F0,0RECV_B0,0B0,0F1,0SEND_F1,0RECV_B1,0B1\n"
        "1RECV_F1,1F1,1B1,1SEND_B1,1RECV_F0,1F0,1B0,1SEND_B0\n");
    CHECK_THROWS_WITH(baton::certify_deadlock_free(prog),
                      Contains("deadlock under blocking receives: rank 0 waits at step 2 (0RECV_B0) for rank 1") &&
                          Contains("rank 1 waits at step 0 (1RECV_F1) for rank 0"));
  }
  SECTION("a program wrong in another way is refused for that") {
    CHECK_THROWS_WITH(baton::certify_deadlock_free(baton::parse_csv("0F0,0B0\n1B0,1F0\n")),
                      Contains("backward before its forward"));
  }
}
