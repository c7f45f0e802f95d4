// baton::cp::choose (the CP mode chooser's cost model) on hand-computed cases, its refusal of
// bad input, baton::cp::calibrate on two thread ranks (every rank the same costs), and
// baton::cp::refine deciding near ties by measurement.
#include "catch.hpp"

#include <baton/attention.hpp>
#include <baton/comm/local.hpp>
#include <baton/cp/choose.hpp>
#include <baton/cp/choose_calibrate.hpp>
#include <baton/cp/choose_refine.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

// The costs of the hand computations: a full tile 1 s, a partial one 3 s, 1 ms per byte shifted,
// 2 ms per byte exchanged, nothing else.
baton::cp_costs hand_costs() {
  baton::cp_costs c;
  c.full_tile_forward = 1;
  c.partial_tile_forward = 3;
  c.full_tile_backward = 2;
  c.partial_tile_backward = 6;
  c.link_per_byte = 0.001;
  c.all_to_all_per_byte = 0.002;
  return c;
}

// Whether `call` throws a cp_error whose message holds `words`.
template <class F>
bool refused(F&& call, const std::string& words) {
  try {
    call();
  } catch (const baton::cp_error& e) {
    return std::string(e.what()).find(words) != std::string::npos;
  }
  return false;
}

const baton::cp_mode_prediction& find(const baton::cp_choice& c, const std::string& name) {
  for (const auto& p : c.candidates)
    if (p.name() == name) return p;
  FAIL("no candidate " << name);
  return c.best;
}

}  // namespace

TEST_CASE("cp::choose: hand-computed ring and Ulysses times, forward", "[cp][choose]") {
  // S = 128 over 2 ranks, contiguous: one 64 x 64 tile per (rank, step); 2 heads, dim 1,
  // 4-byte elements, so a K or V block of a rank is 64 x 2 x 4 = 512 bytes.
  const baton::cp_choose_mesh mesh{2, baton::shard_layout::contiguous};
  const baton::cp_choose_shape shape{1, 128, 2, 2, 1, 4, false};
  baton::cp_costs costs = hand_costs();

  SECTION("no mask") {
    const baton::cp_choice c = baton::cp::choose(mesh, shape, baton::no_mask{}, costs);
    REQUIRE(c.candidates.size() == 2);
    // Ring: 2 steps x (2 heads x 1 full tile) = 4 s; one hop of K and V, 1024 bytes = 1.024 s.
    CHECK(find(c, "ring2").compute == Approx(4.0));
    CHECK(find(c, "ring2").seconds == Approx(5.024));
    // Ulysses: 1 head x 4 full tiles = 4 s; q, k, v in and out back, 4 x 512 bytes, half
    // off-rank, at 2 ms a byte = 2.048 s.
    CHECK(find(c, "ulysses2").compute == Approx(4.0));
    CHECK(find(c, "ulysses2").seconds == Approx(6.048));
    CHECK(c.best.name() == "ring2");
  }
  SECTION("causal, the ring's transfer hidden (overlap 1)") {
    costs.overlap = 1;
    const baton::cp_choice c = baton::cp::choose(mesh, shape, baton::causal_mask{}, costs);
    // Ring step 0: a diagonal (partial) tile on each rank, 2 x 3 = 6 s; step 1: rank 1 one full
    // tile (2 s), rank 0 nothing, and the step waits for rank 1. The 1.024 s hop hides under 6 s.
    CHECK(find(c, "ring2").compute == Approx(8.0));
    CHECK(find(c, "ring2").communication == Approx(1.024));
    CHECK(find(c, "ring2").seconds == Approx(8.0));
    // Ulysses: 2 partial + 1 full tile of one head = 7 s, plus 2.048 s exchange.
    CHECK(find(c, "ulysses2").seconds == Approx(9.048));
    CHECK(c.best.name() == "ring2");
    costs.all_to_all_per_byte = 0;  // a free exchange makes Ulysses' better balance win
    CHECK(baton::cp::choose(mesh, shape, baton::causal_mask{}, costs).best.name() == "ulysses2");
  }
  SECTION("a measured exchange prices Ulysses by its bytes, and replaces the composed price") {
    costs.ulysses_forward_per_byte = 0.003;
    const baton::cp_choice c = baton::cp::choose(mesh, shape, baton::no_mask{}, costs);
    // The same 4 x 512 bytes at 3 ms each, all of them (the rate was measured on these 2 ranks).
    CHECK(find(c, "ulysses2").communication == Approx(6.144));
    CHECK(find(c, "ulysses2").seconds == Approx(10.144));
    CHECK(find(c, "ring2").seconds == Approx(5.024));  // the ring's price does not use it
  }
  SECTION("ranks that share cores pay a wake-up per wait") {
    costs.wake_up = 0.5;
    const baton::cp_choice c = baton::cp::choose(mesh, shape, baton::no_mask{}, costs);
    // Ring: the wait for step 1's K and V and the agreement, 2 x 0.5 s.
    CHECK(find(c, "ring2").communication == Approx(1.024 + 1.0));
    CHECK(find(c, "ring2").seconds == Approx(6.024));
    // Ulysses: five all-to-alls (q, k, v in; out, lse back) and the agreement, 6 x 0.5 s.
    CHECK(find(c, "ulysses2").seconds == Approx(6.048 + 3.0));
    // Forward + backward: the ring waits for K and V once a pass, for the dK and dV sent home
    // and for each pass's agreement (5); Ulysses for 5 + 9 all-to-alls and 2 agreements (16).
    baton::cp_choose_shape step = shape;
    step.backward = true;
    costs.full_tile_backward = 2;
    const baton::cp_choice without = baton::cp::choose(mesh, step, baton::no_mask{}, hand_costs());
    const baton::cp_choice with = baton::cp::choose(mesh, step, baton::no_mask{}, costs);
    CHECK(find(with, "ring2").seconds - find(without, "ring2").seconds == Approx(5 * 0.5));
    CHECK(find(with, "ulysses2").seconds - find(without, "ulysses2").seconds == Approx(16 * 0.5));
    CHECK(find(with, "ring2").compute == find(without, "ring2").compute);  // waits are not compute
  }
  SECTION("the ring's head-major copies are priced as local passes, none with one head") {
    costs.copy_per_byte = 0.001;
    const baton::cp_choice c = baton::cp::choose(mesh, shape, baton::no_mask{}, costs);
    // The hop (1.024 s), step 1's merge (read + write of the 512-byte fp32 output: 1.024 s), and
    // the copies: q, k, v in and out back, 4 x 512 bytes, each read and written (4.096 s).
    CHECK(find(c, "ring2").communication == Approx(1.024 + 1.024 + 4.096));
    // One head, one kv head: the dense layout is head-major already, nothing is copied.
    const baton::cp_choose_shape one_head{1, 128, 1, 1, 1, 4, false};
    const baton::cp_choice single = baton::cp::choose(mesh, one_head, baton::no_mask{}, costs);
    CHECK(find(single, "ring2").communication == Approx(0.512 + 0.512));
  }
}

TEST_CASE("cp::choose: a partial tile costs its fixed part plus the area the kernel computes in it", "[cp][choose]") {
  // One rank, S = 128, one head, forward: documents of 32 tokens leave the two diagonal tiles
  // partial and the other two empty. Each 4-row group of a diagonal tile computes the 32 key
  // columns of its document (a whole number of vectors at any vector width): half a tile each.
  std::vector<std::int64_t> ids(128);
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>(i / 32);
  const baton::document_mask docs(std::move(ids));
  const baton::positions all(0, 128);
  const auto tiles = baton::detail::cp::count_call_tiles(docs, all, all, 128, 128);
  CHECK(tiles.full == 0);
  CHECK(tiles.partial == 2);
  CHECK(tiles.partial_area == 1.0);
  baton::flash_tile_coverage coverage;  // the attention layer's count of one tile, which the model sums
  CHECK(coverage.of(docs, baton::position_block(all, 0, 64), baton::position_block(all, 0, 64)) == 0.5);
  CHECK(coverage.of(docs, baton::position_block(all, 64, 64), baton::position_block(all, 64, 64)) == 0.5);
  try {  // a block longer than a tile is refused, not read past the kernel's tile scratch
    (void)coverage.of(docs, baton::position_block(all, 0, 128), baton::position_block(all, 0, 64));
    FAIL("a 128-query block was accepted");
  } catch (const baton::attention_error& e) {
    CHECK(std::string(e.what()).find("at most 64 queries and keys (got 128 x 64)") != std::string::npos);
  }
  baton::cp_costs costs = hand_costs();
  costs.partial_area_forward = 2;
  const baton::cp_choose_mesh one{1, baton::shard_layout::contiguous};
  const baton::cp_choose_shape shape{1, 128, 1, 1, 1, 4, false};
  // 2 x (3 s fixed + 0.5 x 2 s) = 8 s; without the area term 6 s.
  CHECK(find(baton::cp::choose(one, shape, docs, costs), "ring1").compute == Approx(8.0));
  costs.partial_area_forward = 0;
  CHECK(find(baton::cp::choose(one, shape, docs, costs), "ring1").compute == Approx(6.0));
  // A causal diagonal tile: row group g computes keys [0, 4g + 4) rounded up to whole vectors.
  const std::int64_t width = baton::detail::core::simd::width_v<float>;  // the kernel rounds a row group's keys out to whole vectors
  double area = 0;
  for (std::int64_t g = 0; g < 16; ++g) area += static_cast<double>((4 * g + 4 + width - 1) / width * width * 4) / 4096.0;
  const auto causal = baton::detail::cp::count_call_tiles(baton::causal_mask{}, all, all, 128, 128);
  CHECK(causal.full == 1);
  CHECK(causal.partial == 2);
  CHECK(causal.partial_area == Approx(2 * area));
  CHECK(area > 0.5);
  CHECK(area < 0.7);
}

TEST_CASE("cp::choose: a measured Ulysses exchange, scaled to a hybrid's group", "[cp][choose]") {
  // S = 128 over 4 ranks, 4 heads, dim 1, forward: Ulysses4 and hybrid 2x2 each exchange 4
  // tensors of 32 tokens x 4 heads x 4 bytes = 512 bytes per rank. Only the exchange costs.
  const baton::cp_choose_mesh mesh{4, baton::shard_layout::contiguous};
  const baton::cp_choose_shape shape{1, 128, 4, 4, 1, 4, false};
  baton::cp_costs costs;
  costs.full_tile_forward = 1e-9;
  costs.ulysses_forward_per_byte = 0.003;
  const baton::cp_choice c = baton::cp::choose(mesh, shape, baton::no_mask{}, costs);
  CHECK(find(c, "ulysses4").communication == Approx(2048 * 0.003));
  // Half of a hybrid's bytes leave the rank against three quarters on the 4 ranks it was
  // measured on: 2/3 of the price.
  CHECK(find(c, "hybrid2x2").communication == Approx(2048 * 0.003 * (0.5 / 0.75)));
  CHECK(find(c, "ring4").communication == Approx(0.0));
}

TEST_CASE("cp::choose: zigzag tiles, edge tiles, the backward and the legal splits", "[cp][choose]") {
  baton::cp_costs costs = hand_costs();
  costs.partial_tile_forward = 10;
  costs.link_per_byte = 0;
  SECTION("zigzag under a causal mask: the ring's planned calls") {
    // S = 256, 2 ranks, chunks of 64: rank 0 holds chunks 0 and 3. Step 0: 2 partial + 1 full
    // = 21 s on each rank; step 1: two full tiles on each = 2 s.
    const baton::cp_choice c = baton::cp::choose(baton::cp_choose_mesh{2, baton::shard_layout::zigzag},
                                                 baton::cp_choose_shape{1, 256, 1, 1, 1, 4, false}, baton::causal_mask{}, costs);
    REQUIRE(c.candidates.size() == 1);  // one head cannot be split over 2 Ulysses ranks
    CHECK(c.best.name() == "ring2");
    CHECK(c.best.compute == Approx(23.0));
  }
  SECTION("a tile at the edge costs its area; a call its fixed cost") {
    costs.per_call = 0.5;
    // One rank, S = 96: tiles of 64x64, 64x32, 32x64 and 32x32 = 2.25 full tiles, one call.
    const baton::cp_choice c = baton::cp::choose(baton::cp_choose_mesh{1}, baton::cp_choose_shape{1, 96, 1, 1, 1, 4, false},
                                                 baton::no_mask{}, costs);
    CHECK(c.best.seconds == Approx(2.75));
  }
  SECTION("a call pays per 64-row panel; empty tiles are skipped, and the ring skips empty steps") {
    costs.row_panel_forward = 100;
    // One rank, S = 128, documents [0, 64) and [64, 128): Ulysses' one call over the sequence
    // holds 2 full tiles (2 empty, free) and 2 row panels: 2 + 200 s.
    const baton::document_mask docs([] {
      std::vector<std::int64_t> ids(128, 0);
      for (std::size_t i = 64; i < 128; ++i) ids[i] = 1;
      return ids;
    }());
    const baton::cp_choose_shape one_head{1, 128, 1, 1, 1, 4, false};
    CHECK(baton::cp::choose(baton::cp_choose_mesh{1}, one_head, docs, costs).best.seconds == Approx(202.0));
    // A ring of 2 over contiguous shards computes only the diagonal: step 0 one tile and one
    // panel per rank (101 s); step 1 is empty for every rank and skipped.
    const baton::cp_choice ring = baton::cp::choose(baton::cp_choose_mesh{2, baton::shard_layout::contiguous}, one_head, docs, costs);
    CHECK(ring.best.name() == "ring2");
    CHECK(ring.best.seconds == Approx(101.0));
  }
  SECTION("a call pays per 64-key column panel and kv head: GQA groups share theirs") {
    costs.column_panel_forward = 10;
    // One rank, S = 128, no mask, 4 query heads: 4 x 4 full tiles = 16 s; the call's 2 key
    // blocks cost 2 x 10 s per kv head: 80 s for 4 kv heads, 20 s for one shared by all 4.
    const baton::cp_choice mha = baton::cp::choose(baton::cp_choose_mesh{1}, baton::cp_choose_shape{1, 128, 4, 4, 1, 4, false},
                                                   baton::no_mask{}, costs);
    CHECK(mha.best.seconds == Approx(96.0));
    const baton::cp_choice gqa = baton::cp::choose(baton::cp_choose_mesh{1}, baton::cp_choose_shape{1, 128, 4, 1, 1, 4, false},
                                                   baton::no_mask{}, costs);
    CHECK(gqa.best.seconds == Approx(36.0));
    // A ring of 2 (contiguous) under a causal mask: step 0 one diagonal tile (10 s partial) and
    // one key block per rank; step 1 rank 1 one full tile and one key block, rank 0 none:
    // (4 x 10 + 1 x 10) + (4 x 1 + 1 x 10) = 64 s with one kv head.
    const baton::cp_choice ring = baton::cp::choose(baton::cp_choose_mesh{2, baton::shard_layout::contiguous},
                                                    baton::cp_choose_shape{1, 128, 4, 1, 1, 4, false}, baton::causal_mask{}, costs);
    CHECK(find(ring, "ring2").compute == Approx(64.0));
  }
  SECTION("forward + backward of the ring") {
    // The forward as in the first case (5.024 s); the backward: 2 steps x 2 heads x 2 s = 8 s,
    // K/V hop 1.024 s, and step 1's dK/dV (fp32, 1024 bytes) returning home 1.024 s: the
    // owner's own part of step 0 stays home.
    const baton::cp_choice c = baton::cp::choose(baton::cp_choose_mesh{2, baton::shard_layout::contiguous},
                                                 baton::cp_choose_shape{1, 128, 2, 2, 1, 4, true}, baton::no_mask{}, hand_costs());
    CHECK(find(c, "ring2").seconds == Approx(5.024 + 8 + 2 * 1.024));
  }
  SECTION("legal splits follow the heads") {
    const auto s1 = baton::cp::legal_splits(baton::cp_choose_mesh{4}, baton::cp_choose_shape{1, 64, 6, 2, 8});
    CHECK(s1 == std::vector<std::pair<int, int>>{{4, 1}, {2, 2}});
    const auto s2 = baton::cp::legal_splits(baton::cp_choose_mesh{4}, baton::cp_choose_shape{1, 64, 8, 2, 8});
    CHECK(s2 == std::vector<std::pair<int, int>>{{4, 1}, {2, 2}, {1, 4}});  // kv heads replicated at 4
  }
}

TEST_CASE("cp::choose and cp::calibrate refuse bad input", "[cp][choose]") {
  const baton::cp_costs good = hand_costs();
  const baton::cp_choose_shape shape{1, 128, 2, 2, 8, 4, true};
  CHECK(refused([&] { baton::cp::choose(baton::cp_choose_mesh{0}, shape, baton::no_mask{}, good); }, "ranks 0"));
  CHECK(refused([&] { baton::cp::choose(baton::cp_choose_mesh{2}, baton::cp_choose_shape{1, 0, 2, 2, 8}, baton::no_mask{}, good); },
                "seq_len"));
  CHECK(refused([&] { baton::cp::choose(baton::cp_choose_mesh{2}, baton::cp_choose_shape{1, 128, 4, 3, 8}, baton::no_mask{}, good); },
                "must divide heads"));
  baton::cp_costs bad = good;
  bad.link_per_byte = -1;
  CHECK(refused([&] { baton::cp::choose(baton::cp_choose_mesh{2}, shape, baton::no_mask{}, bad); }, "finite and >= 0"));
  bad = good;
  bad.latency = std::numeric_limits<double>::quiet_NaN();
  CHECK(refused([&] { baton::cp::choose(baton::cp_choose_mesh{2}, shape, baton::no_mask{}, bad); }, "finite and >= 0"));
  bad = good;
  bad.ulysses_backward_per_byte = std::numeric_limits<double>::infinity();
  CHECK(refused([&] { baton::cp::choose(baton::cp_choose_mesh{2}, shape, baton::no_mask{}, bad); }, "finite and >= 0"));
  bad = good;
  bad.wake_up = -1e-6;
  CHECK(refused([&] { baton::cp::choose(baton::cp_choose_mesh{2}, shape, baton::no_mask{}, bad); }, "finite and >= 0"));
  bad = good;
  bad.overlap = 1.5;
  CHECK(refused([&] { baton::cp::choose(baton::cp_choose_mesh{2}, shape, baton::no_mask{}, bad); }, "overlap"));
  CHECK(refused([&] { baton::cp::choose(baton::cp_choose_mesh{2}, shape, baton::no_mask{}, baton::cp_costs{}); },
                "calibrate"));
  const baton::document_mask short_docs(std::vector<std::int64_t>(10, 0));  // ids for 10 of 128 tokens
  CHECK(refused([&] { baton::cp::choose(baton::cp_choose_mesh{2}, shape, short_docs, good); }, "mask"));
  baton::run_local(1, [&](baton::local_communicator& comm) {
    baton::cp::calibrate_options opt;
    opt.tokens = 100;
    CHECK(refused([&] { baton::cp::calibrate(comm, baton::reference_attention{}, 8, opt); }, "multiple of 64"));
    CHECK(refused([&] { baton::cp::calibrate(comm, baton::reference_attention{}, 0); }, "head_dim"));
    opt.tokens = 64;
    opt.copies = 0;
    CHECK(refused([&] { baton::cp::calibrate(comm, baton::reference_attention{}, 8, opt); }, "copies 0"));
    opt.copies = 1;
    opt.shared_below = -0.5;
    CHECK(refused([&] { baton::cp::calibrate(comm, baton::reference_attention{}, 8, opt); }, "shared_below in [0, 2]"));
  });
}

namespace {

// A calibration of a few milliseconds (its figures mean nothing; the tests check their form).
baton::cp::calibrate_options tiny_calibration(std::int64_t tokens) {
  baton::cp::calibrate_options opt;
  opt.tokens = tokens;
  opt.repeats = 1;
  opt.window = 0.002;
  opt.link_bytes = 4096;
  return opt;
}

}  // namespace

TEST_CASE("cp::calibrate: positive costs, the same on every rank", "[cp][choose][threads]") {
  baton::cp::calibrate_options opt = tiny_calibration(64);
  opt.heads = 1;
  std::vector<baton::cp_costs> got(2);
  baton::run_local(2, [&](baton::local_communicator& comm) {
    got[static_cast<std::size_t>(comm.rank())] = baton::cp::calibrate(comm, baton::reference_attention{}, 4, opt);
  });
  for (const baton::cp_costs& c : got) {
    CHECK(c.full_tile_forward > 0);
    CHECK(c.full_tile_backward > 0);
    // The fixed part's floor, up to the rounding of the ranks' fold (a floored rank's figure
    // can read one ulp under a tenth of the folded full-tile figure).
    CHECK(c.partial_tile_forward >= 0.1 * c.full_tile_forward * (1 - 1e-12));
    CHECK(c.partial_area_forward == c.full_tile_forward);          // the computed area at the full tiles' rate
    CHECK(c.partial_area_backward == c.full_tile_backward);
    CHECK(c.link_per_byte > 0);
    CHECK(c.all_to_all_per_byte > 0);
    CHECK(c.copy_per_byte > 0);
    CHECK(c.ulysses_forward_per_byte > 0);  // the layer's own exchanges, timed
    CHECK(c.ulysses_backward_per_byte > 0);
    CHECK(c.overlap == 0);
    if (c.share >= 0.9) CHECK(c.wake_up == 0);  // measured only where ranks share cores
  }
  CHECK(got[0].ulysses_backward_per_byte == got[1].ulysses_backward_per_byte);
  CHECK(got[0].full_tile_forward == got[1].full_tile_forward);
  CHECK(got[0].link_per_byte == got[1].link_per_byte);
  CHECK(got[0].latency == got[1].latency);
  // The costs it returns are what choose accepts.
  CHECK_NOTHROW(baton::cp::choose(baton::cp_choose_mesh{2}, baton::cp_choose_shape{1, 128, 2, 2, 4}, baton::causal_mask{}, got[0]));
}

TEST_CASE("cp::calibrate: ranks that share cores get a wake-up price and the mean kernel terms, the same on every rank",
          "[cp][choose][threads]") {
  // shared_below 2 takes the path of ranks that share cores whatever share this machine reads
  // (a backend that slowed with the ranks inside it read a share of 1.0 under a loaded CI).
  std::vector<baton::cp_costs> got(2);
  baton::run_local(2, [&](baton::local_communicator& comm) {
    baton::cp::calibrate_options opt = tiny_calibration(128);
    opt.shared_below = 2;
    got[static_cast<std::size_t>(comm.rank())] = baton::cp::calibrate(comm, baton::reference_attention{}, 4, opt);
  });
  for (const baton::cp_costs& c : got) {
    CHECK(std::isfinite(c.wake_up));
    CHECK(c.wake_up >= 0);
    CHECK(c.full_tile_forward > 0);
  }
  CHECK(got[0].wake_up == got[1].wake_up);
  CHECK(got[0].full_tile_forward == got[1].full_tile_forward);
  CHECK(got[0].partial_tile_backward == got[1].partial_tile_backward);
  CHECK(got[0].share == got[1].share);
  CHECK_NOTHROW(baton::cp::choose(baton::cp_choose_mesh{2}, baton::cp_choose_shape{1, 128, 2, 2, 4}, baton::causal_mask{}, got[0]));
  // shared_below 0: never; the wake-up stays 0.
  baton::run_local(2, [&](baton::local_communicator& comm) {
    baton::cp::calibrate_options opt = tiny_calibration(128);
    opt.shared_below = 0;
    got[static_cast<std::size_t>(comm.rank())] = baton::cp::calibrate(comm, baton::reference_attention{}, 4, opt);
  });
  CHECK(got[0].wake_up == 0);
  CHECK(got[1].wake_up == 0);
}

TEST_CASE("cp::calibrate's rank folds: every rank's values by rank, their largest and their mean, the same bits everywhere",
          "[cp][choose][threads]") {
  // The middle entries' sum depends on its order: (1 + 1e16) + 1 is 1e16, (1 + 1) + 1e16 is
  // 1e16 + 2. A mean folded in each rank's own ring order would differ between ranks, and the
  // ranks would choose apart.
  const auto values_of = [](int r) { return std::vector<double>{0.1 * (r + 1), r == 1 ? 1e16 : 1.0, -r - 0.5}; };
  constexpr int ranks = 3;
  std::vector<std::vector<std::vector<double>>> seen(ranks);
  std::vector<std::vector<double>> largest(ranks), mean(ranks);
  baton::run_local(ranks, [&](baton::local_communicator& comm) {
    const auto me = static_cast<std::size_t>(comm.rank());
    const std::vector<double> mine = values_of(comm.rank());
    seen[me] = baton::cp::detail::values_of_every_rank(comm, std::span<const double>(mine));
    largest[me] = mine;
    baton::cp::detail::max_over_ranks(comm, std::span<double>(largest[me]));
    mean[me] = mine;
    baton::cp::detail::mean_over_ranks(comm, std::span<double>(mean[me]));
  });
  for (int r = 0; r < ranks; ++r) {
    const auto at = static_cast<std::size_t>(r);
    REQUIRE(seen[at].size() == ranks);
    for (int from = 0; from < ranks; ++from) CHECK(seen[at][static_cast<std::size_t>(from)] == values_of(from));
    CHECK(largest[at] == std::vector<double>{0.1 * 3, 1e16, -0.5});
    for (std::size_t j = 0; j < 3; ++j) {
      const double expected = ((values_of(0)[j] + values_of(1)[j]) + values_of(2)[j]) / 3;  // rank order
      CHECK(mean[at][j] == expected);
    }
  }
}

TEST_CASE("cp::calibrate: a mask shorter than tokens is priced on the positions it describes", "[cp][choose]") {
  baton::cp::calibrate_options opt = tiny_calibration(256);
  opt.copies = 2;
  std::vector<std::int64_t> ids(128, 0);  // documents of 40 and 88 tokens: partial tiles
  for (std::size_t i = 40; i < ids.size(); ++i) ids[i] = 1;
  const baton::document_mask docs(ids);
  const baton::document_mask too_short(std::vector<std::int64_t>(10, 0));
  baton::run_local(1, [&](baton::local_communicator& comm) {
    baton::cp_costs c;
    CHECK_NOTHROW(c = baton::cp::calibrate(comm, baton::reference_attention{}, 4, opt, docs));
    CHECK(c.partial_tile_forward > 0);
    try {
      baton::cp::calibrate(comm, baton::reference_attention{}, 4, opt, too_short);
      FAIL("a mask of 10 positions was accepted");
    } catch (const baton::cp_error& e) {
      CHECK(std::string(e.what()).find("at least 64 positions") != std::string::npos);
    }
  });
}

TEST_CASE("docs: choosing a CP mode", "[cp][choose][docs][threads]") {
  std::string picked;
  // [doc:cp_choose]
  baton::run_local(2, [&](baton::local_communicator& comm) {
    baton::cp::calibrate_options quick;  // the defaults take ~3 s; this is a tiny one
    quick.tokens = 64;
    quick.window = 0.005;
    quick.link_bytes = 4096;
    const baton::cp_costs costs = baton::cp::calibrate(comm, baton::reference_attention{}, /*head_dim=*/8, quick);
    const baton::cp_choice choice = baton::cp::choose(
        baton::cp_choose_mesh{comm.size(), baton::shard_layout::zigzag},
        baton::cp_choose_shape{/*batch=*/1, /*seq_len=*/256, /*heads=*/4, /*kv_heads=*/2, /*head_dim=*/8},
        baton::causal_mask{}, costs);
    if (comm.rank() == 0) picked = choice.best.name();  // "ring2" or "ulysses2", the same on every rank
  });
  // [/doc:cp_choose]
  CHECK((picked == "ring2" || picked == "ulysses2"));
}

namespace {

// The reference backend, slowed by 20 ms on every call that carries all `heads` query heads: the
// ring's calls do, Ulysses' (heads / U each) do not. So the ring is measured slower, whatever
// the model says.
struct slow_on_all_heads {
  std::int64_t heads;
  baton::reference_attention inner;
  template <class Q, class... A>
  void forward(const Q& q, A&&... rest) const {
    if (q.extent(2) == heads) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    inner.forward(q, std::forward<A>(rest)...);
  }
  template <class Q, class... A>
  void backward(const Q& q, A&&... rest) const {
    if (q.extent(2) == heads) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    inner.backward(q, std::forward<A>(rest)...);
  }
};

}  // namespace

TEST_CASE("cp::refine: the splits predicted close are measured, and the fastest measured is chosen", "[cp][choose][threads]") {
  const baton::cp_choose_mesh mesh{2, baton::shard_layout::zigzag};
  const baton::cp_choose_shape shape{1, 128, 4, 2, 8, 4, true};
  // Costs that make Ulysses' exchange dear: the model predicts the ring.
  baton::cp_costs costs = hand_costs();
  costs.all_to_all_per_byte = 0.004;
  const baton::cp_choice predicted = baton::cp::choose(mesh, shape, baton::causal_mask{}, costs);
  REQUIRE(predicted.best.name() == "ring2");
  const double ratio = find(predicted, "ulysses2").seconds / find(predicted, "ring2").seconds;
  REQUIRE(ratio > 1.0);
  std::vector<baton::cp_choice> got(2);
  baton::cp::refine_options wide;
  wide.within = ratio * 1.01;  // both measured
  wide.warmup = 1;
  wide.rounds = 1;
  baton::run_local(2, [&](baton::local_communicator& comm) {
    got[static_cast<std::size_t>(comm.rank())] =
        baton::cp::refine(comm, slow_on_all_heads{4, {}}, mesh, shape, baton::causal_mask{}, costs, wide);
  });
  for (const baton::cp_choice& c : got) {
    CHECK(c.best.name() == "ulysses2");  // the ring's calls sleep 20 ms each
    CHECK(find(c, "ring2").measured > find(c, "ulysses2").measured);
    CHECK(find(c, "ring2").measured >= 0.08);  // 2 steps forward, 2 backward, 20 ms each
    CHECK(find(c, "ring2").seconds == find(predicted, "ring2").seconds);  // predictions kept
  }
  CHECK(find(got[0], "ring2").measured == find(got[1], "ring2").measured);  // the slowest rank's, on every rank
  CHECK(find(got[0], "ulysses2").measured == find(got[1], "ulysses2").measured);

  // A split predicted beyond `within` of the fastest is not measured; the prediction stands.
  baton::cp::refine_options narrow = wide;
  narrow.within = 1;
  baton::run_local(2, [&](baton::local_communicator& comm) {
    const baton::cp_choice c = baton::cp::refine(comm, slow_on_all_heads{4, {}}, mesh, shape, baton::causal_mask{}, costs, narrow);
    if (comm.rank() == 0) got[0] = c;
  });
  CHECK(got[0].best.name() == "ring2");
  CHECK(find(got[0], "ring2").measured > 0);
  CHECK(find(got[0], "ulysses2").measured == 0);

  // Ranks that share cores (share below min_share): nothing is measured, the prediction stands.
  baton::cp_costs shared = costs;
  shared.share = 0.5;
  baton::run_local(2, [&](baton::local_communicator& comm) {
    const baton::cp_choice c = baton::cp::refine(comm, slow_on_all_heads{4, {}}, mesh, shape, baton::causal_mask{}, shared, wide);
    if (comm.rank() == 0) got[0] = c;
  });
  CHECK(got[0].best.name() == "ring2");
  for (const auto& c : got[0].candidates) CHECK(c.measured == 0);
}

TEST_CASE("cp::refine: a hybrid split is built and measured; bad input refused", "[cp][choose][threads]") {
  const baton::cp_choose_mesh mesh{4, baton::shard_layout::zigzag};
  const baton::cp_choose_shape shape{1, 128, 4, 2, 8, 8, true};  // double tensors
  const baton::cp_choice predicted = baton::cp::choose(mesh, shape, baton::no_mask{}, hand_costs());
  REQUIRE(predicted.candidates.size() == 3);  // ring4, hybrid2x2, ulysses4
  baton::cp::refine_options all;
  all.within = 1e9;
  all.warmup = 0;
  all.rounds = 1;
  baton::cp_choice got;
  baton::run_local(4, [&](baton::local_communicator& comm) {
    const baton::cp_choice c = baton::cp::refine(comm, baton::reference_attention{}, mesh, shape, baton::no_mask{}, hand_costs(), all);
    if (comm.rank() == 0) got = c;
  });
  for (const auto& c : got.candidates) CHECK(c.measured > 0);
  CHECK(got.best.measured == std::min({got.candidates[0].measured, got.candidates[1].measured, got.candidates[2].measured}));

  // Checks on one rank (Catch's assertions are not thread-safe); the checks come before any
  // collective, so every rank of a larger world throws the same way.
  baton::run_local(1, [&](baton::local_communicator& comm) {
    baton::cp::refine_options bad;
    bad.within = 0.5;
    const baton::cp_costs k = hand_costs();
    const baton::cp_choose_mesh one{1};
    CHECK(refused([&] { baton::cp::refine(comm, baton::reference_attention{}, one, shape, baton::no_mask{}, k, bad); }, "within >= 1"));
    bad.within = 1.3;
    bad.min_share = 2;
    CHECK(refused([&] { baton::cp::refine(comm, baton::reference_attention{}, one, shape, baton::no_mask{}, k, bad); }, "min_share"));
    CHECK(refused([&] { baton::cp::refine(comm, baton::reference_attention{}, mesh, shape, baton::no_mask{}, k); },
                  "the communicator has 1 ranks and the mesh 4"));
    baton::cp_choose_shape half = shape;
    half.element_bytes = 2;
    CHECK(refused([&] { baton::cp::refine(comm, baton::reference_attention{}, one, half, baton::no_mask{}, k); }, "element_bytes 2"));
    baton::cp_costs none;  // choose's own refusal comes through
    CHECK(refused([&] { baton::cp::refine(comm, baton::reference_attention{}, one, shape, baton::no_mask{}, none); }, "calibrate"));
  });
}

TEST_CASE("docs: near ties measured", "[cp][choose][docs][threads]") {
  baton::cp::calibrate_options quick;  // a tiny calibration: its figures mean nothing here
  quick.tokens = 64;
  quick.window = 0.005;
  quick.link_bytes = 4096;
  baton::cp_choice refined;
  // [doc:cp_refine]
  baton::run_local(2, [&](baton::local_communicator& comm) {
    const baton::cp_choose_mesh mesh{comm.size(), baton::shard_layout::zigzag};
    const baton::cp_choose_shape shape{/*batch=*/1, /*seq_len=*/128, /*heads=*/4, /*kv_heads=*/2, /*head_dim=*/8};
    const baton::cp_costs costs = baton::cp::calibrate(comm, baton::reference_attention{}, 8, quick);
    const baton::cp_choice choice = baton::cp::refine(comm, baton::reference_attention{}, mesh, shape, baton::causal_mask{}, costs);
    if (comm.rank() == 0) refined = choice;  // candidates[i].measured > 0: that split was run
  });
  // [/doc:cp_refine]
  REQUIRE(refined.candidates.size() == 2);  // ring2, ulysses2
  bool any_measured = false;
  for (const auto& c : refined.candidates) any_measured = any_measured || c.measured > 0;
  // Measured exactly when the calibration saw a core per rank; then best is the fastest measured.
  CHECK(any_measured == (refined.best.measured > 0));
  if (refined.best.measured > 0)
    for (const auto& c : refined.candidates)
      if (c.measured > 0) CHECK(refined.best.measured <= c.measured);
}
