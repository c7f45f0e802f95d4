// baton/cp/choose.hpp — which context-parallel split is fastest for a shape and a mask on this
// machine: a cost model of ring, Ulysses and hybrid (ring of Ulysses groups) attention, fed
// with rates measured here (baton/cp/choose_calibrate.hpp), and the split it predicts fastest.
//
// The model (docs/context-parallel.md, "Choosing a CP mode") counts what the code does:
// compute is the tiles each rank's backend calls touch (the ring's own planner and trimming,
// the flash backend's 64 x 64 tiles, full and partial priced apart), per batch entry and
// local head, plus a fixed cost per call; communication is the bytes each transfer moves
// times a measured rate plus a latency per operation. Ring steps run in lock step (a shift
// needs both neighbours), so a step costs its slowest rank's compute plus the part of its
// transfer that does not overlap it (`overlap` of the smaller of the two is hidden).
#pragma once

#include <baton/attention/masks.hpp>
#include <baton/cp/detail/choose_model.hpp>
#include <baton/cp/error.hpp>
#include <baton/cp/sharding.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace baton {

/// The context-parallel ranks and the splits to consider: every (ring R, Ulysses U) with
/// R x U = ranks whose U divides the query heads and either divides or is divided by the kv
/// heads (the even Ulysses splits; uneven ones work but move more and are not proposed).
struct cp_choose_mesh {
  int ranks = 1;
  shard_layout layout = shard_layout::zigzag;  // how the ring (or Ulysses) shards the sequence
};

/// The attention problem one layer solves: [batch, seq_len, heads, head_dim] queries,
/// kv_heads keys and values; element_bytes of the stored tensors (4 for float).
struct cp_choose_shape {
  std::int64_t batch = 1, seq_len = 0, heads = 0, kv_heads = 0, head_dim = 0;
  std::int64_t element_bytes = 4;
  bool backward = true;  // predict forward + backward (a training step) or the forward only
};

/// Measured rates (seconds). Tiles are 64 x 64 (query x key) of one head and batch entry.
struct cp_costs {
  double full_tile_forward = 0, full_tile_backward = 0;        // a tile every pair of which is allowed
  double partial_tile_forward = 0, partial_tile_backward = 0;  // a tile the mask cuts: its fixed part
  // ... plus, per full tile's worth of the area the kernel computes in it (its row groups' key
  // spans), this: a partial tile that computes 0.4 of a tile costs partial_tile + 0.4 x this.
  double partial_area_forward = 0, partial_area_backward = 0;
  double row_panel_forward = 0, row_panel_backward = 0;        // 64 rows of a call and query head, set up and walked
  double column_panel_forward = 0, column_panel_backward = 0;  // 64 keys of a call and kv head, packed and written
  double per_call = 0;              // fixed cost of one backend call (packing, setup)
  double link_per_byte = 0;         // a ring shift, per byte one rank sends
  double all_to_all_per_byte = 0;   // an all-to-all, per byte one rank sends to the others
  double copy_per_byte = 0;         // a local pass over memory (packing, merging), per byte
  double latency = 0;               // fixed cost of one communication operation
  // Ulysses' exchanges as the layer runs them (packs, all-to-alls, unpacks, its agreement),
  // per byte of the tensors the model counts them by, timed on the calibration's world of P
  // ranks (calibrate runs the layer on a backend that computes nothing); 0: priced from
  // all_to_all_per_byte, copy_per_byte and latency instead. A split whose Ulysses degree U is
  // not P (hybrid) pays ((U-1)/U) / ((P-1)/P) of it: the share of its bytes that leaves the rank.
  double ulysses_forward_per_byte = 0, ulysses_backward_per_byte = 0;
  double overlap = 0;               // fraction of min(compute, transfer) a ring step hides, in [0, 1]
  // The tile costs are those of every rank computing at once. `share` = that time / the time of
  // one rank computing alone, in (0, 1]: 1 when each rank has a core of its own, about
  // cores / ranks when thread ranks oversubscribe the cores. A ring step of per-rank work w_r
  // then takes max(mean w, share x max w): while a rank waits, the others get its core.
  double share = 1;
  // Where ranks share cores: what a rank that waited for a message loses before it runs again
  // (the others hold the cores), per wait — a ring step, an all-to-all, an agreement. 0 where
  // each rank has a core of its own (calibrate measures it only below a share of 0.9).
  double wake_up = 0;
};

/// One candidate's prediction for one call of the layer (forward, or forward + backward).
struct cp_mode_prediction {
  int ring_degree = 1, ulysses_degree = 1;
  double compute = 0;       // the slowest rank's backend work, summed over steps
  double communication = 0; // transfers and their copies, before overlap
  double exposed = 0;       // the part of communication the time includes
  double seconds = 0;       // compute + exposed: the predicted time
  double measured = 0;      // cp::refine's measured time of the split (0: not measured)
  std::string name() const {
    if (ulysses_degree == 1) return "ring" + std::to_string(ring_degree);
    if (ring_degree == 1) return "ulysses" + std::to_string(ulysses_degree);
    return "hybrid" + std::to_string(ring_degree) + "x" + std::to_string(ulysses_degree);
  }
};

struct cp_choice {
  cp_mode_prediction best;
  std::vector<cp_mode_prediction> candidates;  // every legal split, ring degree descending
};

namespace detail::cp {

inline void check_choose_inputs(const cp_choose_mesh& mesh, const cp_choose_shape& s, const cp_costs& c) {
  const auto fail = [](const std::string& what) { throw cp_error("baton::cp::choose: " + what); };
  if (mesh.ranks < 1) fail("ranks " + std::to_string(mesh.ranks) + " must be >= 1; pass the context-parallel world size");
  if (s.batch < 1 || s.seq_len < 1 || s.heads < 1 || s.kv_heads < 1 || s.head_dim < 1 || s.element_bytes < 1)
    fail("batch, seq_len, heads, kv_heads, head_dim and element_bytes must all be >= 1 (got " +
         std::to_string(s.batch) + ", " + std::to_string(s.seq_len) + ", " + std::to_string(s.heads) + ", " +
         std::to_string(s.kv_heads) + ", " + std::to_string(s.head_dim) + ", " + std::to_string(s.element_bytes) + ")");
  if (s.heads % s.kv_heads != 0)
    fail("kv_heads (" + std::to_string(s.kv_heads) + ") must divide heads (" + std::to_string(s.heads) + ")");
  const double rates[] = {c.full_tile_forward, c.full_tile_backward, c.partial_tile_forward, c.partial_tile_backward,
                          c.partial_area_forward, c.partial_area_backward,
                          c.row_panel_forward, c.row_panel_backward, c.column_panel_forward, c.column_panel_backward,
                          c.per_call, c.link_per_byte, c.all_to_all_per_byte, c.copy_per_byte, c.latency, c.overlap, c.share,
                          c.ulysses_forward_per_byte, c.ulysses_backward_per_byte, c.wake_up};
  for (double r : rates)
    if (!std::isfinite(r) || r < 0) fail("every cost must be finite and >= 0; calibrate with baton::cp::calibrate");
  if (c.overlap > 1) fail("overlap " + std::to_string(c.overlap) + " must be in [0, 1]");
  if (c.share <= 0 || c.share > 1) fail("share " + std::to_string(c.share) + " must be in (0, 1]");
  if (c.full_tile_forward <= 0 || (s.backward && c.full_tile_backward <= 0))
    fail("the full-tile costs must be > 0 (an uncalibrated cp_costs{}); calibrate with baton::cp::calibrate");
}

// Bytes of one kv head split's worth of a [b, n, heads, d] tensor.
inline double tensor_bytes(const cp_choose_shape& s, std::int64_t tokens, std::int64_t heads, std::int64_t elem) {
  return static_cast<double>(s.batch * tokens * heads * s.head_dim * elem);
}

// Bytes of one Ulysses pass per rank, as the model counts them, from the bytes of one q-shaped
// and one kv-shaped tensor: forward gathers q, k, v and scatters out; backward gathers q, k, v,
// out, dout and scatters dq, dk, dv (calibrate divides its measured exchange by the same).
inline double ulysses_pass_bytes(double q, double kv, int pass) noexcept {
  return pass == 0 ? 2 * q + 2 * kv : 4 * q + 4 * kv;
}

// The model's time for backend work of `t`'s tiles, panels and calls (pass 0: forward, 1:
// backward) over bh = batch entries x local query heads and bkv = batch entries x local kv heads.
inline double work_seconds(const cp_costs& c, const tile_count& t, double bh, double bkv, int pass) {
  const double calls = static_cast<double>(t.calls) * c.per_call;
  return pass == 0 ? bh * (t.full * c.full_tile_forward + t.partial * c.partial_tile_forward +
                           t.partial_area * c.partial_area_forward + t.panels * c.row_panel_forward) +
                         bkv * t.columns * c.column_panel_forward + calls
                   : bh * (t.full * c.full_tile_backward + t.partial * c.partial_tile_backward +
                           t.partial_area * c.partial_area_backward + t.panels * c.row_panel_backward) +
                         bkv * t.columns * c.column_panel_backward + calls;
}

template <class Mask>
cp_mode_prediction predict_split(const cp_choose_shape& s, const cp_costs& c, const Mask& mask, shard_layout layout,
                                 int ring, int uly) {
  cp_mode_prediction p;
  p.ring_degree = ring;
  p.ulysses_degree = uly;
  const head_splits hs = split_heads(s.heads, s.kv_heads, uly);
  const std::int64_t hq = hs.q.max_count(), hkv = hs.kv.max_count();
  const double bh = static_cast<double>(s.batch * hq), bkv = static_cast<double>(s.batch * hkv);
  const int passes = s.backward ? 2 : 1;
  const auto work = [&](const tile_count& t, int pass) { return work_seconds(c, t, bh, bkv, pass); };
  const double acc = 4;  // the ring's dK/dV accumulators and merges are fp32
  if (ring == 1) {
    // Ulysses: one backend call over the whole sequence (positions = every rank's, in rank order).
    const std::vector<std::int64_t> all = ulysses_call_positions(layout, s.seq_len, uly);
    const positions pos{std::span<const std::int64_t>(all)};
    const tile_count t = count_call_tiles(mask, pos, pos, s.seq_len, s.seq_len);
    for (int pass = 0; pass < passes; ++pass) p.compute += work(t, pass);
  } else {
    const sequence_sharding sh(layout, s.seq_len, ring);
    std::vector<std::vector<shard_piece>> groups;
    for (int g = 0; g < ring; ++g) groups.push_back(sh.pieces(g));
    const std::vector<int> steps = needed_steps(mask, groups);
    const double block = tensor_bytes(s, sh.max_local_len(), hkv, s.element_bytes);  // one of K, V
    const double grads = tensor_bytes(s, sh.max_local_len(), hkv, acc);
    const double merge = tensor_bytes(s, sh.max_local_len(), hq, acc) * 2;  // read + write the accumulator
    // The owner's own dK/dV stays home when its block comes first: the travelling sum starts a step later.
    const std::size_t first_grad_step = own_grad_stays_home(steps) ? 1 : 0;
    // Each (step, rank)'s tiles, counted once for both passes.
    std::vector<std::vector<tile_count>> step_tiles(steps.size());
    for (std::size_t i = 0; i < steps.size(); ++i)
      for (int r = 0; r < ring; ++r) step_tiles[i].push_back(ring_step_tiles(mask, groups, r, steps[i]));
    for (int pass = 0; pass < passes; ++pass) {
      for (std::size_t i = 0; i < steps.size(); ++i) {
        double most = 0, sum = 0;
        for (int r = 0; r < ring; ++r) {
          const double w = work(step_tiles[i][static_cast<std::size_t>(r)], pass);
          most = std::max(most, w);
          sum += w;
        }
        const double slowest = std::max(sum / ring, c.share * most);
        double moved = 0;
        if (i + 1 < steps.size()) moved += 2 * block;  // the next K and V
        if (pass == 1 && i > first_grad_step) moved += 2 * grads;  // dK, dV one step behind
        const double transfer = moved * c.link_per_byte + (moved > 0 ? 2 * c.latency : 0);
        const double wait = moved > 0 ? c.wake_up : 0;  // no transfer hides it
        const double merging = (pass == 0 && i > 0) ? merge * c.copy_per_byte : 0;
        p.compute += slowest;
        p.communication += transfer + merging + wait;
        p.exposed += transfer - c.overlap * std::min(transfer, slowest) + merging + wait;
      }
      if (pass == 1 && !steps.empty() && steps.back() != 0) {  // dK/dV return to their owners
        const double back = 2 * grads * c.link_per_byte + 2 * c.latency + c.wake_up;
        p.communication += back;
        p.exposed += back;
      }
    }
    p.communication += (2 * c.latency + c.wake_up) * passes;  // the agreement around the ring
    p.exposed += (2 * c.latency + c.wake_up) * passes;
    if (uly == 1) {
      // ring_attention on the host computes on head-major copies (ring_core.hpp): q, k, v in
      // and out back in the forward; q, out, dout, k, v in and dq, dk, dv back in the backward;
      // each copy a read and a write. (Hybrid's ring computes on the gathered tensors; with one
      // head the two layouts are one.)
      const double q_bytes = hq > 1 ? tensor_bytes(s, sh.max_local_len(), hq, s.element_bytes) : 0;
      const double kv_bytes = hkv > 1 ? block : 0;
      for (int pass = 0; pass < passes; ++pass) {
        const double copied = pass == 0 ? 2 * q_bytes + 2 * kv_bytes : 4 * q_bytes + 4 * kv_bytes;
        p.communication += 2 * copied * c.copy_per_byte;
        p.exposed += 2 * copied * c.copy_per_byte;
      }
    }
  }
  if (uly > 1) {
    // The exchange: each tensor is packed once and sent (U-1)/U off-rank; forward gathers q, k,
    // v and scatters out (+ lse), backward gathers q, k, v, out, dout (+ lse) and scatters dq, dk, dv.
    const std::int64_t local = (s.seq_len + ring * uly - 1) / (ring * uly);
    const double q = tensor_bytes(s, local, hq * uly, s.element_bytes);
    const double kv = tensor_bytes(s, local, hkv * uly, s.element_bytes);
    const int ops_fwd = 4, ops_bwd = 8;
    const double frac = static_cast<double>(uly - 1) / uly;
    const double world = static_cast<double>(ring) * uly, world_frac = (world - 1) / world;
    for (int pass = 0; pass < passes; ++pass) {
      const double bytes = ulysses_pass_bytes(q, kv, pass);
      const double measured = pass == 0 ? c.ulysses_forward_per_byte : c.ulysses_backward_per_byte;
      // Measured, the exchange took 2-2.5x what its all-to-alls and memcpy-rate copies add up
      // to (docs/context-parallel.md, "Choosing a CP mode"): the packs gather rows of a head
      // from [b, s, H, d], not one run of memory.
      // Each all-to-all is a wait (forward q, k, v, out, lse; backward q, k, v, out, dout, lse,
      // dq, dk, dv), and so is the agreement.
      const double waits = (pass == 0 ? 5 : 9) + 1;
      const double t = (measured > 0 ? bytes * measured * frac / world_frac
                                     : bytes * frac * c.all_to_all_per_byte + 2 * bytes * c.copy_per_byte +
                                           static_cast<double>((pass == 0 ? ops_fwd : ops_bwd) * s.batch) * c.latency) +
                       waits * c.wake_up;
      p.communication += t;
      p.exposed += t;
    }
  }
  p.seconds = p.compute + p.exposed;
  return p;
}

}  // namespace detail::cp

namespace cp {

/// The splits of `mesh.ranks` this shape allows: (ring, Ulysses) pairs, ring degree descending.
inline std::vector<std::pair<int, int>> legal_splits(const cp_choose_mesh& mesh, const cp_choose_shape& s) {
  std::vector<std::pair<int, int>> out;
  for (int u = 1; u <= mesh.ranks; ++u) {
    if (mesh.ranks % u != 0 || s.heads % u != 0) continue;
    if (s.kv_heads % u != 0 && u % s.kv_heads != 0) continue;
    out.emplace_back(mesh.ranks / u, u);
  }
  return out;
}

/// Predicts every legal split's time for one call of the layer (forward + backward when
/// shape.backward) and returns them with the fastest. Throws cp_error on a bad input, naming it.
template <class Mask>
  requires attention_mask<Mask>
cp_choice choose(const cp_choose_mesh& mesh, const cp_choose_shape& shape, const Mask& mask, const cp_costs& costs) {
  baton::detail::cp::check_choose_inputs(mesh, shape, costs);
  {
    const std::string bad = baton::detail::cp::check_mask(mask, shape.seq_len);
    if (!bad.empty()) throw cp_error("baton::cp::choose: " + bad);
  }
  cp_choice out;
  for (const auto& [ring, uly] : legal_splits(mesh, shape))
    out.candidates.push_back(baton::detail::cp::predict_split(shape, costs, mask, mesh.layout, ring, uly));
  out.best = *std::min_element(out.candidates.begin(), out.candidates.end(),
                               [](const auto& a, const auto& b) { return a.seconds < b.seconds; });
  return out;
}

}  // namespace cp
}  // namespace baton
