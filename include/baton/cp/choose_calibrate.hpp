// baton/cp/choose_calibrate.hpp — measures the rates baton::cp::choose needs on the world at
// hand, briefly (about eight windows of calibrate_options::window) and collectively: every
// rank of the CP world calls it at once, so the kernel and the copies are timed while the
// other ranks run theirs — on thread ranks that share cores this is the rate each rank
// actually gets (4 ranks on 2 cores: about half a core each), which is what the model needs.
// Every rank returns the same costs: the slowest rank's figure of each (ring steps and
// exchanges wait for the slowest), but where ranks share cores the mean of the kernel terms.
#pragma once

#include <baton/attention/backend.hpp>
#include <baton/attention/masks.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/core/tags.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/cp/choose.hpp>
#include <baton/cp/detail/bshd.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/memory.hpp>
#include <baton/cp/sharding.hpp>
#include <baton/cp/ulysses.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace baton::cp {

namespace detail {
// A calibration's `share` from which each rank counts as having a core (or a device) of its own.
inline constexpr double own_cores_share = 0.9;
}  // namespace detail

struct calibrate_options {
  std::int64_t heads = 2;       // heads of the timed kernel calls
  std::int64_t tokens = 1024;   // the timed call is tokens x tokens (a multiple of 64), of `heads` query heads
  int repeats = 3;              // each transfer figure is the median of this many
  // Each kernel and copy figure runs back to back for this long (s). With thread ranks that
  // outnumber the cores, 0.08 s windows priced the 4-rank splits at up to 1.5x their time and
  // 0.32 s ones at 0.84-1.24 (docs/context-parallel.md): a longer window averages the sharing.
  double window = 0.32;
  std::int64_t link_bytes = 4 << 20;  // one shift / all-to-all of this many bytes per rank
  double overlap = 0.0;         // the local world copies on the rank threads: nothing hides
  int copies = 4;               // sets of tensors the kernel calls take in turn (>= 1), so that each reads cold inputs
  // Below this share the ranks count as sharing cores: the kernel terms are the mean over the
  // ranks and the wake-up is measured (0: never; above 1: always).
  double shared_below = detail::own_cores_share;
};

namespace detail {

// Every message of the calibration is issued by every rank in the same order and waited for
// before the next, so one tag of the CP range serves them all (as the CP agreement's).
inline constexpr int calibrate_tag = tags::cp::tag<0>;

// One rank's inputs, outputs and gradients of an attention call, [batch, local, heads,
// head_dim], the inputs of unit scale (what they are does not change the kernels' time):
// calibrate's timed calls take views of their first rows and heads, refine's splits run on
// them whole.
template <class T>
struct attention_tensors {
  std::int64_t b, n, h, hkv, d;
  std::vector<T> q, k, v, dout, out, dq, dk, dv;
  std::vector<lse_t<T>> lse;
  attention_tensors(const cp_choose_shape& s, std::int64_t local)
      : b(s.batch), n(local), h(s.heads), hkv(s.kv_heads), d(s.head_dim) {
    const auto qs = static_cast<std::size_t>(b * n * h * d), ks = static_cast<std::size_t>(b * n * hkv * d);
    for (auto* x : {&q, &dout, &out, &dq}) x->resize(qs);
    for (auto* x : {&k, &v, &dk, &dv}) x->resize(ks);
    lse.resize(static_cast<std::size_t>(b * h * n));
    for (std::size_t i = 0; i < qs; ++i) {
      q[i] = static_cast<T>(static_cast<double>((i * 7919) % 97) / 97.0 - 0.5);
      dout[i] = static_cast<T>(static_cast<double>((i * 13) % 79) / 79.0 - 0.5);
    }
    for (std::size_t i = 0; i < ks; ++i) {
      k[i] = static_cast<T>(static_cast<double>((i * 104729) % 89) / 89.0 - 0.5);
      v[i] = static_cast<T>(static_cast<double>((i * 31) % 83) / 83.0 - 0.5);
    }
  }
  template <class Attention, class Mask>
  void run(Attention& attn, const Mask& mask, bool backward) {
    const auto in = [&](const std::vector<T>& x, std::int64_t heads) { return make_tensor_view(x.data(), {b, n, heads, d}); };
    const auto io = [&](std::vector<T>& x, std::int64_t heads) { return make_tensor_view(x.data(), {b, n, heads, d}); };
    attn.forward(in(q, h), in(k, hkv), in(v, hkv), mask, io(out, h), make_tensor_view(lse.data(), {b, h, n}));
    if (backward)
      attn.backward(in(q, h), in(k, hkv), in(v, hkv), in(out, h), make_tensor_view(std::as_const(lse).data(), {b, h, n}),
                    in(dout, h), mask, io(dq, h), io(dk, hkv), io(dv, hkv));
  }
};

// A backend that computes nothing: a layer run on it costs only its exchanges.
struct exchange_only_backend {
  template <class... A>
  void forward(A&&... /*call*/) const noexcept {}
  template <class... A>
  void backward(A&&... /*call*/) const noexcept {}
};

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

// Every rank's values, indexed by rank, on every rank: R-1 shifts around the ring (a shift
// sends to rank+1, so after i of them a rank holds rank - i's values).
template <class Comm>
std::vector<std::vector<double>> values_of_every_rank(Comm& comm, std::span<const double> values) {
  const int P = comm.size(), me = comm.rank();
  std::vector<std::vector<double>> all(static_cast<std::size_t>(P));
  all[static_cast<std::size_t>(me)].assign(values.begin(), values.end());
  for (int i = 1; i < P; ++i) {
    const std::vector<double>& held = all[static_cast<std::size_t>((me - i + 1 + P) % P)];
    std::vector<double>& next = all[static_cast<std::size_t>((me - i + P) % P)];
    next.resize(values.size());
    comm.shift(std::as_bytes(std::span<const double>(held)), std::as_writable_bytes(std::span<double>(next)), 1, calibrate_tag)
        .wait();
  }
  return all;
}

// Every rank ends with the largest of each entry over the ranks.
template <class Comm>
void max_over_ranks(Comm& comm, std::span<double> values) {
  for (const std::vector<double>& theirs : values_of_every_rank(comm, values))
    for (std::size_t j = 0; j < values.size(); ++j) values[j] = std::max(values[j], theirs[j]);
}

// Every rank ends with the mean of each entry over the ranks, summed in rank order on every
// rank so that all of them hold the same bits (and choose the same split).
template <class Comm>
void mean_over_ranks(Comm& comm, std::span<double> values) {
  const std::vector<std::vector<double>> all = values_of_every_rank(comm, values);
  for (std::size_t j = 0; j < values.size(); ++j) {
    double sum = 0;
    for (const std::vector<double>& theirs : all) sum += theirs[j];
    values[j] = sum / static_cast<double>(all.size());
  }
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
      opt.copies < 1 || !(opt.window >= 0 && opt.window <= 10) || !(opt.overlap >= 0 && opt.overlap <= 1) ||
      !(opt.shared_below >= 0 && opt.shared_below <= 2))
    throw cp_error("baton::cp::calibrate: head_dim, heads >= 1, tokens a multiple of 64, repeats >= 1, link_bytes >= 64, "
                   "copies >= 1, window in [0, 10] s, overlap in [0, 1] and shared_below in [0, 2] are required (got head_dim " + std::to_string(head_dim) +
                   ", tokens " + std::to_string(opt.tokens) + ", copies " + std::to_string(opt.copies) + ")");
  const std::int64_t n = opt.tokens, h = opt.heads, d = head_dim;
  // The mask's partial tiles are priced on its first `cut` positions: `tokens`, or the most a
  // shorter mask describes (a multiple of 64).
  std::int64_t cut = n;
  while (cut > 64 && !baton::detail::cp::check_mask(mask, cut).empty()) cut -= 64;
  if (const std::string bad = baton::detail::cp::check_mask(mask, cut); !bad.empty())
    throw cp_error("baton::cp::calibrate: " + bad + " (the mask must describe at least 64 positions)");
  const positions all(0, cut);
  const baton::detail::cp::tile_count mask_tiles = baton::detail::cp::count_call_tiles(mask, all, all, cut, cut);
  const bool own_partials = mask_tiles.partial > 0;
  // `copies` sets of tensors, one call on each in turn: a layer's call reads inputs that an
  // exchange or another layer left outside L2, not the ones it has just written, and a
  // calibration that reran one call on its own cache-warm tensors priced masked calls at
  // 0.82-0.96 of their time (docs/context-parallel.md, "Choosing a CP mode").
  const auto copies = static_cast<std::size_t>(opt.copies);
  std::vector<detail::attention_tensors<float>> sets;
  for (std::size_t i = 0; i < copies; ++i) sets.emplace_back(cp_choose_shape{1, n, h, h, d}, n);
  std::size_t next = 0;
  // One call on the next set: rows x rows of `heads` query heads and `kv_heads` kv heads.
  const auto kernel = [&](std::int64_t rows, std::int64_t heads, std::int64_t kv_heads, const auto& km, bool bwd) {
    detail::attention_tensors<float>& t = sets[next];
    next = (next + 1) % copies;
    // [1, rows, hh, d] over x, stored head-major as every mode computes on the host (the
    // gathered tensors of Ulysses and hybrid, the ring's staged copies): read-only through a
    // const x, writable otherwise.
    const auto view = [&](auto& x, std::int64_t hh) { return baton::detail::cp::bshd_head_major(x.data(), 1, rows, hh, d); };
    const auto in = [&](const std::vector<float>& x, std::int64_t hh) { return view(x, hh); };
    if (!bwd) {
      backend.forward(in(t.q, heads), in(t.k, kv_heads), in(t.v, kv_heads), km, view(t.out, heads),
                      make_tensor_view(t.lse.data(), {1, heads, rows}));
      return;
    }
    backend.backward(in(t.q, heads), in(t.k, kv_heads), in(t.v, kv_heads), in(t.out, heads),
                     make_tensor_view(std::as_const(t.lse).data(), {1, heads, rows}), in(t.dout, heads), km, view(t.dq, heads),
                     view(t.dk, kv_heads), view(t.dv, kv_heads));
  };
  const auto warm = [&](std::int64_t rows, std::int64_t kv_heads, const auto& km) {  // out and lse of every set
    for (std::size_t i = 0; i < copies; ++i) kernel(rows, h, kv_heads, km, false);
  };
  // Documents of 64 tokens, aligned to the tiles: n/64 full tiles on the diagonal, the rest empty.
  std::vector<std::int64_t> ids(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) ids[static_cast<std::size_t>(i)] = i / 64;
  const document_mask blocks(std::move(ids));
  const double tiles = static_cast<double>((n / 64) * (n / 64)), diag = static_cast<double>(n / 64);
  // The partial call's tiles: causal's unless the mask has its own.
  const baton::detail::cp::tile_count fit =
      own_partials ? mask_tiles : baton::detail::cp::count_call_tiles(causal_mask{}, positions(0, n), positions(0, n), n, n);
  // full f/b, partial f/b, per_call, link, a2a, copy, latency, share, row panel f/b, column panel f/b,
  // Ulysses exchange f/b, wake-up
  std::array<double, 17> m{};
  for (int bwd = 0; bwd < 2; ++bwd) {
    const auto b = static_cast<std::size_t>(bwd);
    warm(n, h, no_mask{});  // warm-up (and out/lse for the backward)
    const double call = detail::timed_window(comm, opt.window / 4, [&] { kernel(64, 1, 1, no_mask{}, bwd != 0); });
    const double full = detail::timed_window(comm, opt.window, [&] { kernel(n, h, h, no_mask{}, bwd != 0); });
    warm(n, h, blocks);
    const double sparse = detail::timed_window(comm, opt.window / 2, [&] { kernel(n, h, h, blocks, bwd != 0); });
    // The same call with one kv head for all h query heads (GQA): h - 1 kv heads' key blocks fewer.
    double shared = sparse;
    if (h > 1) {
      warm(n, 1, blocks);
      shared = detail::timed_window(comm, opt.window / 2, [&] { kernel(n, h, 1, blocks, bwd != 0); });
    }
    double partial = 0;
    const auto partial_run = [&](std::int64_t rows, const auto& pm) {
      warm(rows, h, pm);
      partial = detail::timed_window(comm, opt.window, [&] { kernel(rows, h, h, pm, bwd != 0); });
    };
    if (own_partials)
      partial_run(cut, mask);
    else
      partial_run(n, causal_mask{});
    if (bwd == 0) {  // the same kernel on rank 0 alone, the others waiting: the share of a core
      const double alone = comm.rank() == 0 ? detail::timed_window(comm, opt.window, [&] { kernel(n, h, h, no_mask{}, false); }) : 0;
      if (comm.rank() != 0) detail::sync(comm);  // rank 0's window began with this sync
      std::array<double, 1> share{comm.rank() == 0 ? std::clamp(alone / full, 0.05, 1.0) : 0.0};
      detail::max_over_ranks(comm, std::span<double>(share));  // every rank needs it below
      m[9] = share[0];
    }
    const double hh = static_cast<double>(h);
    // full = panels + tiles full tiles, sparse = panels + diag full tiles (the same n/64 row
    // and column panels): their difference prices a tile, the rest of sparse a head's row and
    // column panel together, and sparse - shared splits off the column panel. With one tile
    // (tokens 64) there is no difference to take; the panels are then counted in the tile.
    const double per_full = tiles > diag ? std::max(full - sparse, 1e-12) / (hh * (tiles - diag))
                                         : std::max(full - call, 1e-12) / (hh * tiles);
    const double per_panel = tiles > diag ? std::max((sparse - call) / hh - diag * per_full, 0.0) / diag : 0.0;
    const double per_column =
        tiles > diag && h > 1 ? std::clamp((sparse - shared) / ((hh - 1) * diag), 0.0, per_panel) : 0.0;
    // A partial tile costs the area it computes at the full tiles' rate plus a fixed part, what
    // is left: at least a tenth of a full tile (it tests the mask), so that noise cannot push
    // it lower.
    const double per_partial =
        std::max(((partial - call) / hh - fit.full * per_full - fit.panels * per_panel - fit.partial_area * per_full) /
                     fit.partial,
                 0.1 * per_full);
    m[b] = per_full;
    m[2 + b] = per_partial;
    m[10 + b] = per_panel - per_column;
    m[12 + b] = per_column;
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
      if constexpr (cp_memory_space_t<Backend>::location == cp_memory_location::host) {
        // Ulysses' layer itself on a backend that computes nothing: its packs, all-to-alls and
        // unpacks as they run, over one head per rank and link_bytes per tensor and rank.
        const std::int64_t local = std::max<std::int64_t>(64, opt.link_bytes / (P * d * 4));
        const auto elems = static_cast<std::size_t>(local * P * d);
        std::vector<float> q(elems, 0.5f), k(elems, 0.25f), v(elems, 0.125f), dout(elems, 1.0f), out(elems), dq(elems), dk(elems),
            dv(elems), lse(static_cast<std::size_t>(P * local));
        ulysses_attention<Comm, detail::exchange_only_backend> ulysses(comm, {}, sequence_sharding(shard_layout::contiguous, local * P, P));
        const auto io = [&](std::vector<float>& x) { return make_tensor_view(x.data(), {1, local, P, d}); };
        const auto in = [&](const std::vector<float>& x) { return make_tensor_view(x.data(), {1, local, P, d}); };
        const auto fwd = [&] { ulysses.forward(in(q), in(k), in(v), no_mask{}, io(out), make_tensor_view(lse.data(), {1, P, local})); };
        const auto bwd = [&] {
          ulysses.backward(in(q), in(k), in(v), in(out), make_tensor_view(std::as_const(lse).data(), {1, P, local}), in(dout),
                           no_mask{}, io(dq), io(dk), io(dv));
        };
        fwd();  // sizes the exchange buffers
        bwd();
        // Per byte as the model counts a pass (q and kv tensors alike here).
        const double tensor = static_cast<double>(elems * sizeof(float));
        m[14] = detail::timed(comm, opt.repeats, fwd) / baton::detail::cp::ulysses_pass_bytes(tensor, tensor, 0);
        m[15] = detail::timed(comm, opt.repeats, bwd) / baton::detail::cp::ulysses_pass_bytes(tensor, tensor, 1);
      }
    }
  }
  m[7] = detail::timed_window(comm, opt.window / 4, [&] { std::memcpy(recv.data(), send.data(), bytes); }) /
         static_cast<double>(bytes);
  const bool shared_cores = P > 1 && m[9] < opt.shared_below;
  if (shared_cores) {
    // The wake-up: small calls (a quarter of `tokens`) running free, then as many with an
    // all-to-all of a few bytes after each (a ring shift where the communicator has none): each
    // rank waits for the others, then for a core the others hold. The extra per call, less a
    // shift's latency (priced apart), is the wait. Not a shift: that waits for one neighbour
    // only, read 0-83 us where the all-to-all reads 31-134, and left the splits of the 4-rank
    // document shape predicted at 0.83-0.85 of their time (docs/context-parallel.md).
    const std::int64_t rows = std::max<std::int64_t>(64, n / 4 / 64 * 64);
    warm(rows, h, no_mask{});
    int calls = 0;
    const double free_running = detail::timed_window(comm, opt.window / 2, [&] {
      kernel(rows, h, h, no_mask{}, false);
      ++calls;
    });
    std::array<double, 1> agreed{static_cast<double>(calls)};
    detail::max_over_ranks(comm, std::span<double>(agreed));  // every rank runs as many: they shift together
    std::vector<float> token(static_cast<std::size_t>(16 * P)), tokens(token.size());
    detail::sync(comm);
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < static_cast<int>(agreed[0]); ++i) {
      kernel(rows, h, h, no_mask{}, false);
      if constexpr (all_to_all_communicator<Comm>)
        comm.all_to_all(std::span<const float>(token), std::span<float>(tokens));
      else
        detail::sync(comm);
    }
    const double lockstep = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / agreed[0];
    m[16] = std::max(lockstep - free_running - m[8], 0.0);
  }
  // Every rank takes the slowest rank's figures (a ring step and an exchange wait for the
  // slowest side), except the kernel terms and the wake-up of ranks that share cores: timed on
  // every rank at once, a rank's window is then only as fast as its luck with the scheduler,
  // which evens out over a run (docs/context-parallel.md, "Ranks that share cores").
  const std::array<double, 17> own = m;
  detail::max_over_ranks(comm, std::span<double>(m));
  if (shared_cores) {
    const std::array<std::size_t, 10> mean_terms{0, 1, 2, 3, 4, 10, 11, 12, 13, 16};
    std::array<double, 10> means{};
    for (std::size_t i = 0; i < mean_terms.size(); ++i) means[i] = own[mean_terms[i]];
    detail::mean_over_ranks(comm, std::span<double>(means));
    for (std::size_t i = 0; i < mean_terms.size(); ++i) m[mean_terms[i]] = means[i];
  }
  cp_costs c;
  c.full_tile_forward = m[0];
  c.full_tile_backward = m[1];
  c.partial_tile_forward = m[2];
  c.partial_tile_backward = m[3];
  c.partial_area_forward = m[0];
  c.partial_area_backward = m[1];
  c.per_call = m[4];
  c.link_per_byte = m[5];
  c.all_to_all_per_byte = m[6] > 0 ? m[6] : m[5];
  c.copy_per_byte = m[7];
  c.latency = m[8];
  c.overlap = opt.overlap;
  c.share = m[9];
  c.row_panel_forward = m[10];
  c.row_panel_backward = m[11];
  c.column_panel_forward = m[12];
  c.column_panel_backward = m[13];
  c.ulysses_forward_per_byte = m[14];
  c.ulysses_backward_per_byte = m[15];
  c.wake_up = m[16];
  return c;
}

}  // namespace baton::cp
