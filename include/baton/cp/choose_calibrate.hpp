// baton/cp/choose_calibrate.hpp — measures the rates baton::cp::choose needs on the world at
// hand, briefly (some twelve windows of calibrate_options::window) and collectively: every
// rank of the CP world calls it at once, so the kernel and the copies are timed while the
// other ranks run theirs — on thread ranks that share cores this is the rate each rank
// actually gets (4 ranks on 2 cores: about half a core each), which is what the model needs.
// Every rank returns the same costs (the slowest rank's figure of each, since ring steps and
// exchanges wait for the slowest).
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/core/tags.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/cp/choose.hpp>
#include <baton/cp/error.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace baton::cp {

struct calibrate_options {
  std::int64_t heads = 2;       // heads of the timed kernel calls
  std::int64_t tokens = 512;    // the timed call is tokens x tokens (a multiple of 64)
  int repeats = 3;              // each transfer figure is the median of this many
  double window = 0.08;         // each kernel and copy figure runs back to back for this long (s)
  std::int64_t link_bytes = 4 << 20;  // one shift / all-to-all of this many bytes per rank
  double overlap = 0.0;         // the local world copies on the rank threads: nothing hides
};

namespace detail {

// Every message of the calibration is issued by every rank in the same order and waited for
// before the next, so one tag of the CP range serves them all (as the CP agreement's).
inline constexpr int calibrate_tag = tags::cp::tag<0>;

inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

template <class Comm>
void sync(Comm& comm) {  // a token around the ring: every rank has reached this point
  std::array<std::byte, 8> a{}, b{};
  if (comm.size() > 1) comm.shift(std::span<const std::byte>(a), std::span<std::byte>(b), 1, detail::calibrate_tag).wait();
}

template <class Comm, class F>
double timed(Comm& comm, int repeats, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) {
    sync(comm);
    const auto t0 = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return median_of(std::move(t));
}

// Runs f back to back for at least `window` seconds on every rank at once and returns the
// time per call. A single short call would read a faster machine than the layers see: on a
// loaded machine a thread that has just woken runs at once for a few milliseconds before it
// shares the core with everything else that wants it (docs/context-parallel.md has the
// figures).
template <class Comm, class F>
double timed_window(Comm& comm, double window, F&& f) {
  sync(comm);
  const auto t0 = std::chrono::steady_clock::now();
  int calls = 0;
  double elapsed = 0;
  do {
    f();
    ++calls;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < window);
  return elapsed / calls;
}

}  // namespace detail

/// Measures cp_costs on this world: call on every rank of the CP world at once, with the
/// backend the layers will use, the model's head dim and the mask (its partial tiles are
/// priced on its first `opt.tokens` positions, so a mask that tests more per element costs
/// more; causal when it has none there). Throws cp_error on a bad option.
template <ring_communicator Comm, class Backend, class Mask = causal_mask>
  requires attention_mask<Mask>
cp_costs calibrate(Comm& comm, Backend backend, std::int64_t head_dim, const calibrate_options& opt = {},
                   const Mask& mask = {}) {
  if (head_dim < 1 || opt.heads < 1 || opt.tokens < 64 || opt.tokens % 64 != 0 || opt.repeats < 1 || opt.link_bytes < 64 ||
      !(opt.window >= 0 && opt.window <= 10) ||
      !(opt.overlap >= 0 && opt.overlap <= 1))
    throw cp_error("baton::cp::calibrate: head_dim, heads >= 1, tokens a multiple of 64, repeats >= 1, link_bytes >= 64 "
                   "window in [0, 10] s and overlap in [0, 1] are required (got head_dim " + std::to_string(head_dim) + ", tokens " +
                   std::to_string(opt.tokens) + ")");
  const std::int64_t n = opt.tokens, h = opt.heads, d = head_dim;
  if (const std::string bad = baton::detail::cp::check_mask(mask, n); !bad.empty())
    throw cp_error("baton::cp::calibrate: " + bad + " (calibrate_options::tokens " + std::to_string(n) +
                   " must not exceed the sequence the mask describes)");
  const positions all(0, n);
  const baton::detail::cp::tile_count mask_tiles = baton::detail::cp::count_call_tiles(mask, all, all, n, n);
  const bool own_partials = mask_tiles.partial > 0;
  const auto count = static_cast<std::size_t>(n * h * d);
  std::vector<float> q(count), k(count), v(count), dout(count), out(count), dq(count), dk(count), dv(count);
  std::vector<float> lse(static_cast<std::size_t>(h * n));
  for (std::size_t i = 0; i < count; ++i) {  // deterministic values of unit scale
    q[i] = static_cast<float>((i * 7919) % 97) / 97.0f - 0.5f;
    k[i] = static_cast<float>((i * 104729) % 89) / 89.0f - 0.5f;
    v[i] = static_cast<float>((i * 31) % 83) / 83.0f - 0.5f;
    dout[i] = static_cast<float>((i * 13) % 79) / 79.0f - 0.5f;
  }
  const auto kernel = [&](std::int64_t rows, std::int64_t heads, const auto& km, bool bwd) {
    const auto cv = [&](const std::vector<float>& t) { return make_tensor_view(t.data(), {1, rows, heads, d}); };
    const auto mv = [&](std::vector<float>& t) { return make_tensor_view(t.data(), {1, rows, heads, d}); };
    if (!bwd) {
      backend.forward(cv(q), cv(k), cv(v), km, mv(out), make_tensor_view(lse.data(), {1, heads, rows}));
      return;
    }
    backend.backward(cv(q), cv(k), cv(v), cv(out), make_tensor_view(static_cast<const float*>(lse.data()), {1, heads, rows}),
                     cv(dout), km, mv(dq), mv(dk), mv(dv));
  };
  // Documents of 64 tokens, aligned to the tiles: n/64 full tiles on the diagonal, the rest empty.
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = i / 64;
  const document_mask blocks(std::move(ids));
  const double tiles = static_cast<double>((n / 64) * (n / 64)), diag = static_cast<double>(n / 64);
  baton::detail::cp::tile_count fit{(tiles - diag) / 2, diag, diag, 1};  // causal
  if (own_partials) fit = mask_tiles;
  std::array<double, 12> m{};  // full f/b, partial f/b, per_call, link, a2a, copy, latency, share, row panel f/b
  for (int bwd = 0; bwd < 2; ++bwd) {
    const auto b = static_cast<std::size_t>(bwd);
    kernel(n, h, no_mask{}, false);  // warm-up (and out/lse for the backward)
    const double call = detail::timed_window(comm, opt.window / 4, [&] { kernel(64, 1, no_mask{}, bwd != 0); });
    const double full = detail::timed_window(comm, opt.window, [&] { kernel(n, h, no_mask{}, bwd != 0); });
    kernel(n, h, blocks, false);
    const double sparse = detail::timed_window(comm, opt.window / 2, [&] { kernel(n, h, blocks, bwd != 0); });
    double cut = 0;
    const auto partial_run = [&](const auto& pm) {
      kernel(n, h, pm, false);
      cut = detail::timed_window(comm, opt.window, [&] { kernel(n, h, pm, bwd != 0); });
    };
    if (own_partials)
      partial_run(mask);
    else
      partial_run(causal_mask{});
    if (bwd == 0) {  // the same kernel on rank 0 alone, the others waiting: the share of a core
      const double alone = comm.rank() == 0 ? detail::timed_window(comm, opt.window, [&] { kernel(n, h, no_mask{}, false); }) : 0;
      if (comm.rank() != 0) detail::sync(comm);  // rank 0's window began with this sync
      m[9] = comm.rank() == 0 ? std::clamp(alone / full, 0.05, 1.0) : 0.0;
    }
    const double hh = static_cast<double>(h);
    // full = panels + tiles full tiles, sparse = panels + diag full tiles (the same n/64 row
    // panels): their difference prices a tile, the rest of sparse a panel. With one tile
    // (tokens 64) there is no difference to take; the panel is then counted in the tile.
    const double per_full = tiles > diag ? std::max(full - sparse, 1e-12) / (hh * (tiles - diag))
                                         : std::max(full - call, 1e-12) / (hh * tiles);
    const double per_panel = tiles > diag ? std::max((sparse - call) / hh - diag * per_full, 0.0) / diag : 0.0;
    // A partial tile costs at least half a full one (it tests the mask); noise cannot push it lower.
    const double per_partial =
        std::max((cut - call) / hh - fit.full * per_full - fit.panels * per_panel, 0.5 * per_full * fit.partial) / fit.partial;
    m[b] = per_full;
    m[2 + b] = per_partial;
    m[10 + b] = per_panel;
    m[4] = std::max(m[4], std::max(call - per_full, 0.0));
  }
  const auto bytes = static_cast<std::size_t>(opt.link_bytes);
  std::vector<std::byte> send(bytes, std::byte{1}), recv(bytes);
  const int P = comm.size();
  if (P > 1) {
    m[5] = detail::timed(comm, opt.repeats, [&] {
             comm.shift(std::span<const std::byte>(send), std::span<std::byte>(recv), 1, detail::calibrate_tag).wait();
           }) / static_cast<double>(bytes);
    std::array<std::byte, 64> s{}, r{};
    m[8] = detail::timed(comm, opt.repeats, [&] {
             for (int i = 0; i < 10; ++i) comm.shift(std::span<const std::byte>(s), std::span<std::byte>(r), 1, detail::calibrate_tag).wait();
           }) / 10;
    if constexpr (all_to_all_communicator<Comm>) {
      std::vector<float> a(bytes / sizeof(float) / static_cast<std::size_t>(P) * static_cast<std::size_t>(P)), b(a.size());
      m[6] = detail::timed(comm, opt.repeats, [&] { comm.all_to_all(std::span<const float>(a), std::span<float>(b)); }) /
             (static_cast<double>(a.size() * sizeof(float)) * (P - 1) / P);
    }
  }
  m[7] = detail::timed_window(comm, opt.window / 4, [&] { std::memcpy(recv.data(), send.data(), bytes); }) /
         static_cast<double>(bytes);
  // Every rank takes the largest of each figure: R-1 shifts of the array around the ring.
  std::array<double, 12> mine = m, got{};
  for (int i = 1; i < P; ++i) {
    comm.shift(std::as_bytes(std::span<const double>(mine)), std::as_writable_bytes(std::span<double>(got)), 1, detail::calibrate_tag).wait();
    for (std::size_t j = 0; j < m.size(); ++j) m[j] = std::max(m[j], got[j]);
    mine = got;
  }
  cp_costs c;
  c.full_tile_forward = m[0];
  c.full_tile_backward = m[1];
  c.partial_tile_forward = m[2];
  c.partial_tile_backward = m[3];
  c.per_call = m[4];
  c.link_per_byte = m[5];
  c.all_to_all_per_byte = m[6] > 0 ? m[6] : m[5];
  c.copy_per_byte = m[7];
  c.latency = m[8];
  c.overlap = opt.overlap;
  c.share = m[9];
  c.row_panel_forward = m[10];
  c.row_panel_backward = m[11];
  return c;
}

}  // namespace baton::cp
