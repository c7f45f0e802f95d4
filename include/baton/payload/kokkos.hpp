// baton/payload/kokkos.hpp — payload_traits for Kokkos::View: host views of rank 1 to 4 with
// runtime extents, LayoutRight, HostSpace, managed memory, arithmetic elements.
//
//   Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> hidden("hidden", b, d);
//   auto parts = baton::split_microbatches(hidden, 4);   // 4 new views, rows cut like tensor_split
//
// A View is an activation tensor; wrap it in baton::constant<> for a constant one. Slices and
// concatenations are new allocations (a microbatch never aliases the batch it came from).
// Uses only View APIs common to Kokkos 3.4 and 4.x: traits::rank, traits::rank_dynamic,
// array_layout, memory_space, memory_traits, extent(), size(), data(), span_is_contiguous(),
// and the (view_alloc(...), extents...) constructor.
#pragma once

#include <baton/config.hpp>

#if !BATON_HAS_KOKKOS()
#error "baton/payload/kokkos.hpp needs Kokkos: link baton::kokkos (find_package(baton COMPONENTS kokkos)); Debian: apt-get install libtrilinos-kokkos-dev"
#else

#include <baton/payload/detail/row_major.hpp>
#include <baton/payload/traits.hpp>

#include <Kokkos_Core.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

namespace detail::payload {

template <class V>
constexpr bool kokkos_view_adaptable() {
  using traits = typename V::traits;
  constexpr auto rank = static_cast<int>(traits::rank);
  using value_type = typename traits::value_type;
  return rank >= 1 && rank <= 4 && static_cast<int>(traits::rank_dynamic) == rank &&
         std::is_same_v<typename traits::array_layout, Kokkos::LayoutRight> &&
         std::is_same_v<typename traits::memory_space, Kokkos::HostSpace> &&
         !static_cast<bool>(traits::memory_traits::is_unmanaged) && std::is_arithmetic_v<value_type> &&
         !std::is_const_v<value_type>;
}

template <class V>
struct kokkos_view_not_supported_by_baton {
  static_assert(core::dependent_false_v<V>,
                "baton's Kokkos::View payload adapter takes views of rank 1 to 4 with runtime "
                "extents (double**, not double*[3]), Kokkos::LayoutRight, Kokkos::HostSpace, "
                "managed memory and non-const arithmetic elements; deep_copy into such a view, "
                "or specialise baton::payload_traits for your view type");
  static constexpr payload_role role = payload_role::opaque;
};

}  // namespace detail::payload

/// A host Kokkos::View of rank 1-4 (LayoutRight, HostSpace, managed) is an activation tensor.
template <class DataType, class... Properties>
  requires(detail::payload::kokkos_view_adaptable<Kokkos::View<DataType, Properties...>>())
struct payload_traits<Kokkos::View<DataType, Properties...>> {
  using view = Kokkos::View<DataType, Properties...>;
  using value_type = typename view::traits::value_type;
  static constexpr payload_role role = payload_role::activation;
  static constexpr int rank = static_cast<int>(view::traits::rank);

  static std::vector<std::int64_t> shape(const view& v) {
    std::vector<std::int64_t> s(static_cast<std::size_t>(rank));
    for (int d = 0; d < rank; ++d) s[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(v.extent(static_cast<unsigned>(d)));
    return s;
  }

  static std::span<const std::byte> bytes(const view& v) {
    require_contiguous(v);
    return {reinterpret_cast<const std::byte*>(v.data()), v.size() * sizeof(value_type)};
  }
  static std::span<std::byte> mutable_bytes(view& v) {
    require_contiguous(v);
    return {reinterpret_cast<std::byte*>(v.data()), v.size() * sizeof(value_type)};
  }

  /// A zero-filled view of the given shape (the shape's length must equal the view's rank).
  static view allocate(std::span<const std::int64_t> shape) { return make(shape, true); }
  static view allocate_like(const view& v) { return make(shape(v), true); }

  static view slice(const view& v, int dim, std::int64_t begin, std::int64_t count) {
    namespace pi = detail::payload;
    require_contiguous(v);
    const auto s = shape(v);
    const auto [d, out_shape] = pi::checked_slice_shape(s, dim, begin, count, "baton Kokkos::View slice");
    view out = make(out_shape, false);
    pi::row_major_slice(reinterpret_cast<const std::byte*>(v.data()), s, d, begin, count, sizeof(value_type),
                        reinterpret_cast<std::byte*>(out.data()));
    return out;
  }

  static view concat(std::span<const view> parts, int dim) {
    return concat_pointers(detail::payload::pointers_to(parts), dim);
  }

  static view concat_pointers(std::span<const view* const> parts, int dim) {
    return detail::payload::concat_through_traits<payload_traits>(
        parts, dim, "baton Kokkos::View concat", [](const auto& extents) { return make(extents, false); });
  }

 private:
  static void require_contiguous(const view& v) {
    if (!v.span_is_contiguous()) {
      throw payload_error("baton Kokkos::View payload: view \"" + v.label() +
                          "\" is not contiguous (padded); baton needs contiguous storage to send and "
                          "slice it");
    }
  }

  static view make(std::span<const std::int64_t> shape, bool zero_fill) {
    namespace pi = detail::payload;
    if (static_cast<int>(shape.size()) != rank) {
      throw payload_error("baton Kokkos::View allocate: shape " + detail::core::shape_text(shape) + " has " +
                          std::to_string(shape.size()) + " extents but the view type has rank " +
                          std::to_string(rank));
    }
    (void)pi::checked_element_count(shape, "baton Kokkos::View allocate", sizeof(value_type));
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      if (zero_fill) {
        return view(Kokkos::view_alloc(std::string("baton::payload")), static_cast<std::size_t>(shape[I])...);
      }
      return view(Kokkos::view_alloc(Kokkos::WithoutInitializing, std::string("baton::payload")),
                  static_cast<std::size_t>(shape[I])...);
    }(std::make_index_sequence<static_cast<std::size_t>(rank)>{});
  }
};

/// Any other Kokkos::View: a compile error that says which views the adapter takes.
template <class DataType, class... Properties>
  requires(!detail::payload::kokkos_view_adaptable<Kokkos::View<DataType, Properties...>>())
struct payload_traits<Kokkos::View<DataType, Properties...>> {
  using baton_primary_payload_traits = void;  // not a payload: the concepts say no
  static constexpr payload_role role =
      detail::payload::kokkos_view_not_supported_by_baton<Kokkos::View<DataType, Properties...>>::role;
};

}  // namespace baton

#endif  // BATON_HAS_KOKKOS()
