// baton/attention/kokkos.hpp — tiled flash attention through Kokkos on host execution spaces,
// and tensor_view from Kokkos::View.
//
// The kernels are in detail/ (cpu_gemm.hpp, flash_tiles.hpp, flash_packing.hpp,
// flash_forward.hpp, flash_backward.hpp); this header launches them. Every launch is a flat
// Kokkos::RangePolicy parallel_for whose functor does all of an item's work (its reductions
// included) with its own scratch: Kokkos 3.4's Serial backend keeps one global scratch
// buffer for reductions and team policies, so those are not safe when several threads (the
// ranks of an in-process world) launch at once; flat parallel_for is.
#pragma once

#include <baton/config.hpp>

#if !BATON_HAS_KOKKOS()
#error "baton/attention/kokkos.hpp needs Kokkos: link baton::kokkos (find_package(baton COMPONENTS kokkos)); Debian: apt-get install libtrilinos-kokkos-dev"
#endif

#include <Kokkos_Core.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include <baton/attention/backend.hpp>
#include <baton/attention/detail/flash_backward.hpp>
#include <baton/attention/detail/flash_forward.hpp>
#include <baton/attention/detail/flash_packing.hpp>
#include <baton/attention/masks.hpp>
#include <baton/core/tensor_view.hpp>
#include <baton/core/workspace.hpp>

namespace baton {

class kokkos_attention;
namespace detail::attention {
/// Test seam: sets how many runs a kokkos_attention's backward key pass uses (0: one per
/// thread), so that a one-thread build also tests the sum of several runs' dQ partials,
/// which several threads produce.
struct backward_runs_for_tests {
  static void set(kokkos_attention& attention, std::int64_t runs) noexcept;
};
}  // namespace detail::attention

/// A tensor_view of a Kokkos::View's data (any layout: strides come from the view). The
/// view must be host-accessible and stay alive while the tensor_view is used.
///
/// Example:
/// ```cpp
///   Kokkos::View<float****, Kokkos::LayoutRight, Kokkos::HostSpace> q("q", 2, 128, 8, 64);
///   baton::tensor_view<float, 4> qv = baton::make_tensor_view(q);
/// ```
template <class DataType, class... Properties>
[[nodiscard]] auto make_tensor_view(const Kokkos::View<DataType, Properties...>& view) {
  using view_type = Kokkos::View<DataType, Properties...>;
  using element = typename view_type::value_type;  // keeps const
  constexpr std::size_t rank = static_cast<std::size_t>(view_type::rank);
  static_assert(rank >= 1, "baton::make_tensor_view: a rank-0 Kokkos::View has no extents to view");
  static_assert(Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename view_type::memory_space>::accessible,
                "baton::make_tensor_view: the Kokkos::View's memory is not host-accessible; deep_copy it to a "
                "HostSpace mirror (Kokkos::create_mirror_view_and_copy) first");
  tensor_view<element, rank> t;
  t.data = view.data();
  std::size_t strides[8] = {};
  view.stride(strides);
  for (std::size_t d = 0; d < rank; ++d) {
    t.layout.extents[d] = static_cast<std::int64_t>(view.extent(d));
    t.layout.strides[d] = static_cast<std::int64_t>(strides[d]);
  }
  return t;
}

/// Flash attention (FlashAttention-2 tiling, 64 x 64 tiles, register-tiled GEMMs, online
/// softmax) on a Kokkos host execution space; float and double, and bfloat16 storage. Models
/// attention_backend<kokkos_attention, T> for T = float, double and baton::bfloat16:
///  - bfloat16: q, k, v, out, dout and dq, dk, dv are bf16 and the LSE float; every value is
///    widened to float when it is packed (no float copy of a whole tensor), every product,
///    the softmax and every sum run in float, and each output element is rounded to bf16
///    once, when it is written (with params.accumulate: the float sum of the old value and
///    the new contribution, rounded once);
///  - deterministic: each output element is written by one work item, sums run in a fixed
///    order, no atomics; the same inputs give bit-identical outputs (on the same number of
///    threads: the backward sums dQ from one partial per thread);
///  - skips tiles the mask classifies empty and computes full tiles without mask tests;
///  - safe to call from several threads at once, on one object or several (each call leases
///    its own packing buffer and each work item allocates its own tile scratch);
///  - needs the head dim contiguous (stride 1) in q, k, v, out, dout, dq, dk, dv; any other
///    strides, any lengths, any head dim;
///  - memory: O(seq) per call (packed copies of one round's heads: a call runs over a few kv
///    heads at a time, enough work items for every thread), never O(seq_q * seq_k); the
///    packing buffers are kept for the next call (release_workspace() frees them).
class kokkos_attention : public detail::attention::mask_argument_check {
 public:
  using execution_space = Kokkos::DefaultHostExecutionSpace;
  /// Takes bfloat16 storage (backend_stores_bfloat16).
  static constexpr bool stores_bfloat16 = true;

  kokkos_attention() = default;
  explicit kokkos_attention(execution_space space) : space_(std::move(space)) {}

  /// Frees the packing buffers kept for reuse between calls (copies of this object share
  /// them). The next call allocates again.
  void release_workspace() const noexcept { workspace_->release(); }

  // A mask argument that is not an attention_mask: one readable error (mask_argument_check).
  using detail::attention::mask_argument_check::forward;
  using detail::attention::mask_argument_check::backward;

  template <class TQ, class TK, class TV, attention_mask Mask, class TO, class TL>
  void forward(tensor_view<TQ, 4> q, tensor_view<TK, 4> k, tensor_view<TV, 4> v, const Mask& mask,
               tensor_view<TO, 4> out, tensor_view<TL, 3> lse, const attention_params& params = {}) const {
    namespace da = detail::attention;
    da::static_check_forward_types<TQ, TK, TV, TO, TL, da::storage_16::bfloat16>();
    using T = da::compute_t<TQ>;
    const da::checked_call call = da::check_inputs(q, k, v, params);
    da::check_forward_outputs(call, out, lse);
    check_strides(q, "q");
    check_strides(k, "k");
    check_strides(v, "v");
    check_strides(out, "out");
    baton::validate_mask(mask, call.q_pos, call.k_pos);
    if (call.batch * call.heads_q * call.seq_q == 0) return;

    const da::flash_layout<T> layout(call, threads());
    const auto [memory, packed] = lease_packing([&](auto& carver) { return da::carve_forward_packing(layout, carver); });
    for (std::int64_t r = 0; r < layout.rounds(); ++r) {
      const da::head_round round = layout.round(r);
      launch("baton::attention::pack_kv", layout.kv_items(round), [&](std::int64_t item) {
        da::pack_kv_block(layout, round, item, k, v, packed.kt, packed.v, static_cast<T*>(nullptr),
                          static_cast<T*>(nullptr), packed.key_bad, packed.block_bad);
      });
      launch_chunked<T>("baton::attention::forward", layout.q_items(round), layout.dim_padded,
                        [&](std::int64_t item, da::item_scratch<T>& work) {
                          da::forward_tile(layout, round, item, mask, q, packed, out, lse, work);
                        });
    }
  }

  template <class TQ, class TK, class TV, class TO, class TL, class TD, attention_mask Mask, class TG1, class TG2,
            class TG3>
  void backward(tensor_view<TQ, 4> q, tensor_view<TK, 4> k, tensor_view<TV, 4> v, tensor_view<TO, 4> out,
                tensor_view<TL, 3> lse, tensor_view<TD, 4> dout, const Mask& mask, tensor_view<TG1, 4> dq,
                tensor_view<TG2, 4> dk, tensor_view<TG3, 4> dv, const attention_params& params = {}) const {
    namespace da = detail::attention;
    da::static_check_backward_types<TQ, TK, TV, TO, TL, TD, TG1, TG2, TG3, da::storage_16::bfloat16>();
    using T = da::compute_t<TQ>;
    const da::checked_call call = da::check_inputs(q, k, v, params);
    da::check_backward_tensors(call, out, lse, dout, dq, dk, dv);
    check_strides(q, "q");
    check_strides(k, "k");
    check_strides(v, "v");
    check_strides(out, "out");
    check_strides(dout, "dout");
    check_strides(dq, "dq");
    check_strides(dk, "dk");
    check_strides(dv, "dv");
    baton::validate_mask(mask, call.q_pos, call.k_pos);

    const da::flash_layout<T> layout(call, threads());
    // The key pass runs as `runs` runs of items, each adding its keys' share of dQ to its
    // own partial (flash_backward.hpp): one run per thread, so the partials cost
    // threads x one round's dQ. Items are dealt to runs round-robin, which balances a
    // causal mask's uneven key blocks. At least one run: with no keys it leaves dQ zero.
    const std::int64_t wanted_runs = backward_runs_ > 0 ? backward_runs_ : threads();
    const std::int64_t runs = std::max<std::int64_t>(1, std::min(wanted_runs, layout.round_units * layout.k_blocks));
    const auto [memory, packed] =
        lease_packing([&](auto& carver) { return da::carve_backward_packing(layout, runs, carver); });
    const bool accumulate = params.accumulate;
    for (std::int64_t r = 0; r < layout.rounds(); ++r) {
      const da::head_round round = layout.round(r);
      launch("baton::attention::pack_q", layout.q_items(round),
             [&](std::int64_t item) { da::pack_q_block(layout, round, item, q, out, lse, dout, packed); });
      launch("baton::attention::pack_kv", layout.kv_items(round), [&](std::int64_t item) {
        da::pack_kv_block(layout, round, item, k, v, packed.kt, static_cast<T*>(nullptr), packed.vt, packed.k,
                          packed.key_bad, packed.block_bad);
      });
      const std::int64_t items = layout.kv_items(round);
      const std::int64_t round_runs = std::max<std::int64_t>(1, std::min(runs, items));
      const std::int64_t partial_size = layout.round_units * call.group() * layout.seq_q_padded * layout.dim_padded;
      launch("baton::attention::backward_kv", round_runs, [&](std::int64_t run) {
        da::item_scratch<T> work(layout.dim_padded);
        T* const dq_partial = packed.dq_partial + run * partial_size;
        std::fill(dq_partial, dq_partial + partial_size, T(0));
        for (std::int64_t item = run; item < items; item += round_runs)
          da::backward_kv_tile(layout, round, item, mask, packed, dq_partial, dk, dv, accumulate, work);
      });
      launch_chunked<T>("baton::attention::backward_q", layout.q_items(round), layout.dim_padded,
                        [&](std::int64_t item, da::item_scratch<T>& work) {
                          da::backward_q_tile(layout, round, item, mask, packed, round_runs, dq, accumulate, work);
                        });
    }
  }

 private:
  // A round's packed operands, placed by carve(carver) in a buffer leased from the pool (a
  // first carve with no buffer measures them); the lease holds the buffer while it lives.
  template <class Carve>
  [[nodiscard]] auto lease_packing(const Carve& carve) const {
    detail::core::workspace_carver measure;
    (void)carve(measure);
    auto memory = workspace_->acquire(measure.bytes());
    detail::core::workspace_carver carver(memory.data());
    const auto packed = carve(carver);
    return std::pair{std::move(memory), packed};
  }

  template <class F>
  void launch(const char* label, std::int64_t items, const F& body) const {
    if (items <= 0) return;
    Kokkos::parallel_for(label, Kokkos::RangePolicy<execution_space, Kokkos::IndexType<std::int64_t>>(space_, 0, items),
                         body);
    space_.fence();
  }

  [[nodiscard]] std::int64_t threads() const {
    return std::max<std::int64_t>(1, static_cast<std::int64_t>(space_.concurrency()));
  }

  // Work items in a few contiguous runs per thread, each run with one scratch allocation:
  // per-item allocation and zeroing show in the profile of a short causal pass.
  template <class T, class F>
  void launch_chunked(const char* label, std::int64_t items, std::int64_t dim_padded, const F& body) const {
    if (items <= 0) return;
    const std::int64_t chunks = std::min(items, threads() * 4);
    launch(label, chunks, [&](std::int64_t chunk) {
      detail::attention::item_scratch<T> work(dim_padded);
      for (std::int64_t item = chunk * items / chunks; item < (chunk + 1) * items / chunks; ++item) body(item, work);
    });
  }

  template <class T>
  static void check_strides(const tensor_view<T, 4>& t, const char* name) {
    detail::attention::expect_unit_last_stride(t, name, "baton::kokkos_attention");
  }

  execution_space space_{};
  // Packed operands (O(seq) bytes per round of heads) are reused across calls instead of
  // reallocated: a fresh allocation costs page faults comparable to a short causal forward.
  // The pool is thread-safe and hands concurrent calls distinct buffers.
  std::shared_ptr<detail::core::workspace_pool> workspace_ = std::make_shared<detail::core::workspace_pool>();
  std::int64_t backward_runs_ = 0;  // 0: one per thread (backward_runs_for_tests sets others)
  friend struct detail::attention::backward_runs_for_tests;
};

inline void detail::attention::backward_runs_for_tests::set(kokkos_attention& attention, std::int64_t runs) noexcept {
  attention.backward_runs_ = runs;
}

}  // namespace baton
