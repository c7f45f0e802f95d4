// baton/payload/microbatch.hpp — cutting a batch into microbatches and putting it back.
//
// split_microbatches(p, chunks, dim): every tensor of p is cut along dim into `chunks` parts
// of sizes like torch.tensor_split (the first extent % chunks parts get one extra row); an
// opaque value is split by its traits' split(value, chunk, chunks) hook when it has one (a
// block mask cut along batch), otherwise every microbatch gets a copy.
//
// merge_microbatches(parts, dim): the inverse; tensors are concatenated along dim unless their
// traits declare a merge(parts) reducer (a scalar loss: the sum); opaque values are merged by
// their merge hook, or, when they were replicated, taken from the first part.
#pragma once

#include <baton/payload/constant.hpp>
#include <baton/payload/detail/row_major.hpp>
#include <baton/payload/record.hpp>
#include <baton/payload/traits.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// Rows per microbatch when `extent` rows are cut into `chunks` parts, torch.tensor_split
/// style: sizes differ by at most one and the larger ones come first. Throws
/// baton::payload_error when chunks <= 0 or chunks > extent (a microbatch would be empty).
inline std::vector<std::int64_t> microbatch_sizes(std::int64_t extent, std::int64_t chunks) {
  if (chunks <= 0) {
    throw payload_error("baton::microbatch_sizes: the number of microbatches must be positive, got " +
                        std::to_string(chunks));
  }
  if (chunks > extent) {
    throw payload_error("baton::microbatch_sizes: cannot cut " + std::to_string(extent) + " rows into " +
                        std::to_string(chunks) + " non-empty microbatches; use at most " +
                        std::to_string(extent) + " microbatches or a larger batch");
  }
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(chunks), extent / chunks);
  for (std::int64_t c = 0; c < extent % chunks; ++c) ++sizes[static_cast<std::size_t>(c)];
  return sizes;
}

/// One microbatch's rows of a batch: [begin, begin + count).
struct row_range {
  std::int64_t begin = 0;
  std::int64_t count = 0;
  friend bool operator==(const row_range&, const row_range&) = default;
};

/// Where each microbatch's rows lie when `extent` rows are cut into `chunks` parts: the
/// microbatch_sizes, laid end to end from row 0 (split_microbatches cuts exactly these rows).
/// For a tensor that is not a payload — a side input indexed by batch row, a per-sample
/// weight — cut by hand alongside the batch. Throws as microbatch_sizes does.
inline std::vector<row_range> microbatch_bounds(std::int64_t extent, std::int64_t chunks) {
  std::vector<row_range> bounds;
  std::int64_t begin = 0;
  for (const std::int64_t count : microbatch_sizes(extent, chunks)) {
    bounds.push_back({begin, count});
    begin += count;
  }
  return bounds;
}

namespace detail::payload {

inline std::string describe(std::string_view function, std::string_view field) {
  std::string s(function);
  if (!field.empty()) {
    s += ": field \"";
    s += field;
    s += '"';
  }
  return s;
}

template <class P>
constexpr void require_payload() {
  using U = std::remove_cvref_t<P>;
  if constexpr (!is_record_v<U> && !has_payload_traits<U>) {
    (void)payload_traits<U>::role;  // the "not specialised" message, naming U
  } else if constexpr (!is_record_v<U> && !opaque_payload<U>) {
    require_tensor<U>();
  }
}

template <class T>
std::vector<T> split_leaf(const T& value, std::int64_t chunks, int dim, std::string_view field) {
  std::vector<T> out;
  out.reserve(static_cast<std::size_t>(chunks));
  if constexpr (tensor_payload<T>) {
    const auto shape = tensor_shape(value);
    const auto what = describe("baton::split_microbatches", field);
    const int d = normalise_dim(dim, shape.size(), what);
    const auto extent = shape[static_cast<std::size_t>(d)];
    if (chunks > extent) {
      throw payload_error(what + ": cannot split a tensor of shape " + core::shape_text(shape) + " along dim " +
                          std::to_string(d) + " into " + std::to_string(chunks) +
                          " microbatches (each needs at least one row); use at most " + std::to_string(extent) +
                          " microbatches");
    }
    for (const row_range rows : microbatch_bounds(extent, chunks)) {
      out.push_back(payload_traits<T>::slice(value, d, rows.begin, rows.count));
    }
  } else if constexpr (splittable_opaque<T>) {
    for (std::int64_t c = 0; c < chunks; ++c) out.push_back(payload_traits<T>::split(value, c, chunks));
  } else {
    static_assert(std::is_copy_constructible_v<T>,
                  "baton::split_microbatches: an opaque value without a split hook is copied to "
                  "every microbatch, but this type is not copyable; declare "
                  "`static T split(const T&, std::int64_t chunk, std::int64_t chunks)` in its "
                  "payload_traits");
    for (std::int64_t c = 0; c < chunks; ++c) out.push_back(value);
  }
  return out;
}

template <class T>
T merge_leaf(std::span<const T* const> parts, int dim, std::string_view field) {
  if constexpr (mergeable_leaf<T>) {
    const auto copies = copies_of<T>(parts);
    return payload_traits<T>::merge(std::span<const T>(copies));
  } else if constexpr (tensor_payload<T>) {
    std::vector<std::vector<std::int64_t>> shapes;
    shapes.reserve(parts.size());
    for (const T* p : parts) shapes.push_back(tensor_shape(*p));
    const auto what = describe("baton::merge_microbatches", field);
    // concat_shape throws naming the part whose shape disagrees.
    return concat_pointers<T>(parts, concat_shape(shapes, dim, what).dim);
  } else if constexpr (splittable_opaque<T>) {
    static_assert(core::dependent_false_v<T>,
                  "baton::merge_microbatches: this opaque type is split by its payload_traits but "
                  "declares no merge; add `static T merge(std::span<const T> parts)` to its "
                  "payload_traits");
    return *parts[0];
  } else {
    return *parts[0];  // replicated by split: every part holds the same value
  }
}

inline void check_split_arguments(std::int64_t chunks) {
  if (chunks <= 0) {
    throw payload_error("baton::split_microbatches: the number of microbatches must be positive, got " +
                        std::to_string(chunks));
  }
}

}  // namespace detail::payload

/// Cuts payload p into `chunks` microbatches along dim (negative dim counts from the end).
/// Throws baton::payload_error, naming the field, when chunks <= 0, dim is out of range for a
/// tensor, or a tensor has fewer than `chunks` rows along dim.
template <class P>
std::vector<P> split_microbatches(const P& p, std::int64_t chunks, int dim = 0) {
  namespace pi = detail::payload;
  pi::require_payload<P>();
  pi::check_split_arguments(chunks);
  if constexpr (is_record_v<P>) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      // Split every field first (a bad field throws before anything is assembled), then
      // assemble microbatch c from the c-th piece of each field, moving the pieces.
      std::tuple<std::vector<std::tuple_element_t<I, typename P::tuple_type>>...> pieces{
          pi::split_leaf(std::get<I>(p.values()), chunks, dim, P::names[I])...};
      std::vector<P> out;
      out.reserve(static_cast<std::size_t>(chunks));
      for (std::size_t c = 0; c < static_cast<std::size_t>(chunks); ++c) {
        out.push_back(P(std::move(std::get<I>(pieces)[c])...));
      }
      return out;
    }(std::make_index_sequence<P::size>{});
  } else {
    return pi::split_leaf(p, chunks, dim, "");
  }
}

/// Puts microbatches back together: the inverse of split_microbatches with the same dim.
/// Throws baton::payload_error when parts is empty or the parts' shapes disagree on any
/// extent other than dim.
template <class P>
P merge_microbatches(std::span<const P> parts, int dim = 0) {
  namespace pi = detail::payload;
  pi::require_payload<P>();
  if (parts.empty()) {
    throw payload_error("baton::merge_microbatches: no parts to merge");
  }
  if constexpr (is_record_v<P>) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      auto merge_field = [&]<std::size_t J>(std::integral_constant<std::size_t, J>) {
        using T = std::tuple_element_t<J, typename P::tuple_type>;
        std::vector<const T*> field_parts;
        field_parts.reserve(parts.size());
        for (const P& part : parts) field_parts.push_back(&std::get<J>(part.values()));
        return pi::merge_leaf<T>(field_parts, dim, P::names[J]);
      };
      (void)merge_field;  // unused for a record without fields
      return P(merge_field(std::integral_constant<std::size_t, I>{})...);
    }(std::make_index_sequence<P::size>{});
  } else if constexpr (mergeable_leaf<P>) {
    return payload_traits<P>::merge(parts);
  } else {
    return pi::merge_leaf<P>(pi::pointers_to(parts), dim, "");
  }
}

template <class P>
P merge_microbatches(const std::vector<P>& parts, int dim = 0) {
  return merge_microbatches(std::span<const P>(parts), dim);
}

}  // namespace baton
