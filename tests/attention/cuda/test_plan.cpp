// The CUDA backend's host planning: tile classification equal to the mask's own (the CPU
// kernels ask the same questions), bitmasks equal to allowed(), lists of non-empty tiles,
// launch configurations within the devices' limits.
#include <baton/attention/cuda/plan.hpp>

#include "catch.hpp"

#include <baton/attention/masks.hpp>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace cu = baton::detail::attention::cuda;
using baton::block_kind;

namespace {
// Checks plan against the mask for every tile and pair, and the lists against the kinds.
template <class Mask>
void check_plan(const Mask& mask, const baton::positions& qp, const baton::positions& kp, std::int32_t tq,
                std::int32_t tk) {
  const std::int64_t sq = qp.size(), sk = kp.size();
  const cu::tile_plan plan = cu::make_tile_plan(mask, qp, kp, sq, sk, tq, tk);
  const cu::tile_plan_view v = plan.view();
  REQUIRE(v.q_tiles == (sq + tq - 1) / tq);
  REQUIRE(v.k_tiles == (sk + tk - 1) / tk);
  std::int64_t nonempty = 0, partial = 0;
  for (std::int32_t i = 0; i < v.q_tiles; ++i) {
    const std::int64_t q0 = std::int64_t{i} * tq, qc = std::min<std::int64_t>(tq, sq - q0);
    const baton::position_block qb(qp, q0, qc);
    std::vector<std::int32_t> row_list;
    for (std::int32_t j = 0; j < v.k_tiles; ++j) {
      const std::int64_t k0 = std::int64_t{j} * tk, kc = std::min<std::int64_t>(tk, sk - k0);
      const baton::position_block kb(kp, k0, kc);
      const block_kind kind = v.kind_at(i, j);
      CHECK(kind == mask.classify(qb, kb));  // the CPU kernels' classification, tile for tile
      if (kind != block_kind::empty) {
        row_list.push_back(j);
        ++nonempty;
      }
      if (kind == block_kind::partial) {
        CHECK(v.partial_slot[i * v.k_tiles + j] == partial);
        ++partial;
      } else {
        CHECK(v.partial_slot[i * v.k_tiles + j] == -1);
      }
      // Every pair (in range or not) against allowed(): the kernel's view of the tile.
      bool all_bits_right = true;
      for (std::int32_t r = 0; r < tq; ++r)
        for (std::int32_t c = 0; c < tk; ++c) {
          const bool in_range = r < qc && c < kc;
          const bool want = in_range && mask.allowed(qp[q0 + r], kp[k0 + c]);
          all_bits_right = all_bits_right && v.allowed(i, j, r, c) == want;
          if (kind == block_kind::partial) {
            const bool bit = (v.bit_row(i, j, r)[c / 64] >> (c % 64)) & 1u;
            all_bits_right = all_bits_right && bit == want;  // 0 past the sequence ends too
          }
        }
      CHECK(all_bits_right);
    }
    const std::vector<std::int32_t> listed(v.q_list + v.q_list_begin[i], v.q_list + v.q_list_begin[i + 1]);
    CHECK(listed == row_list);
  }
  for (std::int32_t j = 0; j < v.k_tiles; ++j) {
    std::vector<std::int32_t> col_list;
    for (std::int32_t i = 0; i < v.q_tiles; ++i)
      if (v.kind_at(i, j) != block_kind::empty) col_list.push_back(i);
    const std::vector<std::int32_t> listed(v.k_list + v.k_list_begin[j], v.k_list + v.k_list_begin[j + 1]);
    CHECK(listed == col_list);
  }
  CHECK(plan.nonempty_tiles() == nonempty);
  CHECK(plan.partial_tiles() == partial);
  CHECK(v.partial_tiles == partial);
  // The view rebased on a copy of the blob reads the same (as a device copy does).
  std::vector<std::uint64_t> copy(plan.blob(), plan.blob() + plan.size_bytes() / 8);
  const cu::tile_plan_view w = plan.view(copy.data());
  for (std::int32_t i = 0; i < v.q_tiles; ++i)
    for (std::int32_t j = 0; j < v.k_tiles; ++j) CHECK(w.kind_at(i, j) == v.kind_at(i, j));
}

template <class Mask>
void check_shapes(const Mask& mask, std::int64_t total) {
  for (const auto& [sq, sk] : {std::pair<std::int64_t, std::int64_t>{1, 1}, {37, 37}, {64, 64}, {70, 70}, {129, 70},
                               {20, 70}})
    for (const auto& [tq, tk] : {std::pair<std::int32_t, std::int32_t>{64, 64}, {128, 64}, {64, 16}, {16, 128}}) {
      if (sq > total || sk > total) continue;
      // Keys at the start, queries at the end (a decode-like call), as a CP rank sees them.
      check_plan(mask, baton::positions(total - sq, sq), baton::positions(0, sk), tq, tk);
    }
}
}  // namespace

TEST_CASE("tile plan: classification and bits equal the mask's on every built-in mask", "[cuda][plan]") {
  const std::int64_t n = 140;
  std::vector<std::int64_t> docs(static_cast<std::size_t>(n));
  for (std::int64_t p = 0; p < n; ++p) docs[static_cast<std::size_t>(p)] = p < 30 ? 0 : p < 31 ? 1 : p < 100 ? 2 : 3;
  SECTION("no_mask") { check_shapes(baton::no_mask{}, n); }
  SECTION("causal") { check_shapes(baton::causal_mask{}, n); }
  SECTION("sliding window") { check_shapes(baton::sliding_window_mask{17, 5}, n); }
  SECTION("prefix-LM") { check_shapes(baton::prefix_lm_mask{45}, n); }
  SECTION("documents") { check_shapes(baton::document_mask(docs), n); }
  SECTION("documents x causal") { check_shapes(baton::intersect(baton::document_mask(docs), baton::causal_mask{}), n); }
  SECTION("padding") { check_shapes(baton::padding_mask(baton::causal_mask{}, 101), n); }
  SECTION("custom block mask") {
    check_shapes(baton::block_mask([](std::int64_t q, std::int64_t k) { return k <= q && (k < 4 || q - k < 40); }, n, n, 32),
                 n);
  }
}

TEST_CASE("tile plan: zigzag and strided CP shards (position lists)", "[cuda][plan]") {
  // Zigzag over 2 ranks of 4 chunks of 24: rank 0 holds chunks 0 and 3.
  std::vector<std::int64_t> zig;
  for (std::int64_t p = 0; p < 24; ++p) zig.push_back(p);
  for (std::int64_t p = 72; p < 96; ++p) zig.push_back(p);
  std::vector<std::int64_t> striped;
  for (std::int64_t p = 1; p < 96; p += 2) striped.push_back(p);
  const baton::positions zq = baton::positions::list(zig), sq = baton::positions::list(striped);
  check_plan(baton::causal_mask{}, zq, zq, 16, 16);
  check_plan(baton::causal_mask{}, zq, sq, 32, 16);
  check_plan(baton::sliding_window_mask{10, 0}, sq, zq, 16, 64);
  std::vector<std::int64_t> docs(96);
  for (std::int64_t p = 0; p < 96; ++p) docs[static_cast<std::size_t>(p)] = p / 40;
  check_plan(baton::intersect(baton::document_mask(docs), baton::causal_mask{}), zq, zq, 16, 16);
}

TEST_CASE("tile plan: empty sequences and bad tile sizes", "[cuda][plan]") {
  const cu::tile_plan plan = cu::make_tile_plan(baton::causal_mask{}, baton::positions(0, 0), baton::positions(0, 5), 0, 5, 64, 64);
  CHECK(plan.view().q_tiles == 0);
  CHECK(plan.view().k_list_begin[1] == 0);
  CHECK(plan.nonempty_tiles() == 0);
  CHECK_THROWS_AS(cu::make_tile_plan(baton::no_mask{}, baton::positions(0, 3), baton::positions(0, 3), 3, 3, 0, 64),
                  baton::attention_error);
}

TEST_CASE("tile plan: a grid past 2^31 - 1 tiles is refused with the limit and the fix", "[cuda][plan]") {
  // 2^22 queries x 2^22 keys in 64 x 64 tiles: 2^32 tiles (positions are ranges: nothing is
  // allocated before the refusal).
  const std::int64_t s = std::int64_t{1} << 22;
  try {
    (void)cu::make_tile_plan(baton::causal_mask{}, baton::positions(0, s), baton::positions(0, s), s, s, 64, 64);
    FAIL("a plan of 2^32 tiles was built");
  } catch (const baton::attention_error& e) {
    CHECK(std::string(e.what()).find("65536 x 65536 tiles exceed the plan's limit of 2^31 - 1 tiles") != std::string::npos);
    CHECK(std::string(e.what()).find("split the call along the sequence") != std::string::npos);
  }
}

TEST_CASE("tile plan: its bytes depend on the call only, not on the memory it reuses", "[cuda][plan]") {
  // A causal plan of ~400 KB comes from the thread's block cache; a block of its size class
  // filled with garbage in between must not change a byte (padding included).
  const baton::positions all(0, 8192);
  const auto bytes_of = [](const cu::tile_plan& p) {
    return std::vector<std::uint64_t>(p.blob(), p.blob() + p.size_bytes() / 8);
  };
  std::vector<std::uint64_t> first;
  std::size_t size = 0;
  {
    const cu::tile_plan a = cu::make_tile_plan(baton::causal_mask{}, all, all, 8192, 8192, 128, 32);
    first = bytes_of(a);
    size = a.size_bytes();
  }
  using cache = baton::detail::core::block_cache;
  void* dirty = cache::allocate(size);
  std::memset(dirty, 0xAB, size);
  cache::deallocate(dirty, size);
  const cu::tile_plan b = cu::make_tile_plan(baton::causal_mask{}, all, all, 8192, 8192, 128, 32);
  CHECK(static_cast<const void*>(b.blob()) == dirty);  // the garbage block was reused
  CHECK(bytes_of(b) == first);
}

TEST_CASE("forward launch configuration: tiles, shared memory within sm_80 and sm_90 limits, grid", "[cuda][plan]") {
  for (const int bytes : {2, 4})
    for (const int dim : cu::supported_head_dims) {
      const cu::forward_config c = cu::forward_config_for(bytes, dim);
      INFO("element bytes " << bytes << ", dim " << dim);
      CHECK(c.threads == 32 * c.warps);
      CHECK(c.tile_q == c.warps * c.m_tiles * 16);
      CHECK(c.tile_k % 16 == 0);
      CHECK(c.tile_k <= 64);  // the kernel reads one bit word per row of a partial tile
      CHECK(c.stages == 2);
      CHECK(c.shared_bytes() <= cu::max_shared_bytes_sm80);  // fits both architectures
      CHECK(c.shared_bytes() <= cu::max_shared_bytes_sm90);
      // The regions do not overlap and fit: Q, then K/V per stage, then the row flags.
      CHECK(c.k_offset(0) == c.row_bytes() * static_cast<std::size_t>(c.tile_q));
      CHECK(c.v_offset(1) + c.row_bytes() * static_cast<std::size_t>(c.tile_k) == c.row_flags_offset());
      CHECK(c.row_flags_offset() + 4 * static_cast<std::size_t>(c.tile_q) == c.key_flags_offset());
      CHECK(c.key_flags_offset() + 4 * static_cast<std::size_t>(c.tile_k) == c.row_sums_offset());
      CHECK(c.row_sums_offset() + c.row_sums_bytes() <= c.shared_bytes());
      // The running row sums live in shared memory only at 16-bit D 128 (128 x 64 tiles, where
      // registers run out), one word per lane of each row's 4.
      CHECK(c.row_sums_shared() == (bytes == 2 && dim == 128));
      CHECK(c.row_sums_bytes() == (c.row_sums_shared() ? 16 * static_cast<std::size_t>(c.tile_q) : 0));
      CHECK(c.row_bytes() % 128 == 0);  // whole 128-byte rows: the XOR swizzle stays in a row
      const cu::launch_shape s = cu::forward_launch(c, 1000, 12, 3);
      // column_splits blocks per query tile (float at head dim 256: 2), each whole n8 tiles of O.
      CHECK(c.column_splits == (bytes == 4 && dim == 256 ? 2 : 1));
      CHECK(c.dim % (16 * c.column_splits) == 0);
      CHECK(s.grid[0] % static_cast<std::uint32_t>(c.column_splits) == 0);
      const std::int64_t q_blocks = s.grid[0] / static_cast<std::uint32_t>(c.column_splits);
      CHECK(q_blocks * c.tile_q >= 1000);        // every query row
      CHECK((q_blocks - 1) * c.tile_q < 1000);  // and no idle tile
      CHECK(s.grid[1] == 12);
      CHECK(s.grid[2] == 3);
      CHECK(s.block[0] == static_cast<std::uint32_t>(c.threads));
      CHECK(s.shared_bytes == c.shared_bytes());
    }
  CHECK_THROWS_AS(cu::forward_launch(cu::forward_config_for(2, 64), 10, 70000, 1), baton::attention_error);
  const cu::launch_shape flags = cu::key_flag_launch(300, 4, 2);
  CHECK(flags.grid[0] * flags.block[0] >= 300);
  CHECK(flags.grid[1] == 4);
  CHECK(flags.grid[2] == 2);
  const cu::tile_plan plan = cu::make_tile_plan(baton::causal_mask{}, baton::positions(0, 100), baton::positions(0, 100), 100, 100, 64, 64);
  const std::size_t ws = cu::forward_workspace_bytes(plan, 2, 4, 100);
  CHECK(ws >= plan.size_bytes() + 800);
  CHECK(ws % 256 == 0);
}
