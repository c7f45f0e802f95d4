// baton/payload/row_major.hpp — payload_traits for any contiguous row-major tensor type.
//
// A tensor type that is "a data pointer and a shape" (row-major, contiguous, host memory)
// needs only four things from its owner; this base supplies the rest (bytes, allocate_like,
// slice, concat, concat_pointers) with the checks and copies baton's own host_tensor uses:
//
//   template <>
//   struct baton::payload_traits<my_tensor> : baton::row_major_payload_traits<my_tensor> {
//     using value_type = float;
//     static std::span<const std::int64_t> shape(const my_tensor& t) { return t.shape; }
//     static const float* data(const my_tensor& t) { return t.values.data(); }
//     static float* data(my_tensor& t) { return t.values.data(); }
//     static my_tensor allocate(std::span<const std::int64_t> shape) { return my_tensor(shape); }
//   };
//
// Optional: `allocate_for_overwrite(shape)`, a tensor whose elements need not be initialised
// (slice and concat overwrite every element), else `allocate` is used. The role defaults to
// activation; pass payload_role::constant for a tensor that is never differentiated.
// docs/payloads.md shows a complete type (compiled in tests/payload/test_docs_example.cpp).
#pragma once

#include <baton/payload/detail/row_major.hpp>
#include <baton/payload/traits.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace baton {

/// Base of payload_traits<Tensor> for a contiguous row-major host tensor; the derived
/// specialisation provides value_type, shape(t), data(t) (const and non-const) and
/// allocate(shape). See the file comment for an example.
template <class Tensor, payload_role Role = payload_role::activation>
struct row_major_payload_traits {
  static_assert(Role != payload_role::opaque,
                "baton::row_major_payload_traits: an opaque value has no rows to slice; specialise "
                "payload_traits with role = payload_role::opaque (and optional split/merge hooks) instead");
  static constexpr payload_role role = Role;

  static std::span<const std::byte> bytes(const Tensor& t) {
    return {reinterpret_cast<const std::byte*>(traits::data(t)), byte_count(t)};
  }
  static std::span<std::byte> mutable_bytes(Tensor& t) {
    return {reinterpret_cast<std::byte*>(traits::data(t)), byte_count(t)};
  }

  static Tensor allocate_like(const Tensor& t) { return traits::allocate(shape_of(t)); }

  static Tensor slice(const Tensor& t, int dim, std::int64_t begin, std::int64_t count) {
    namespace pi = detail::payload;
    const std::span<const std::int64_t> shape = shape_of(t);
    auto [d, sliced] = pi::checked_slice_shape(shape, dim, begin, count, "baton::row_major_payload_traits slice");
    Tensor out = allocate_uninitialised(sliced);
    pi::row_major_slice(reinterpret_cast<const std::byte*>(traits::data(t)), shape, d, begin, count,
                        element_size(), reinterpret_cast<std::byte*>(traits::data(out)));
    return out;
  }

  static Tensor concat(std::span<const Tensor> parts, int dim) {
    return concat_pointers(detail::payload::pointers_to(parts), dim);
  }

  static Tensor concat_pointers(std::span<const Tensor* const> parts, int dim) {
    return detail::payload::concat_through_traits<traits>(
        parts, dim, "baton::row_major_payload_traits concat",
        [](const auto& extents) { return allocate_uninitialised(extents); });
  }

 private:
  // The derived specialisation, complete by the time any of these bodies is instantiated.
  using traits = payload_traits<Tensor>;

  static constexpr std::size_t element_size() { return sizeof(typename traits::value_type); }

  static std::span<const std::int64_t> shape_of(const Tensor& t) {
    static_assert(std::is_lvalue_reference_v<decltype(traits::shape(t))> ||
                      std::is_same_v<std::remove_cvref_t<decltype(traits::shape(t))>, std::span<const std::int64_t>>,
                  "baton::row_major_payload_traits: shape(t) must return the tensor's own extents as a "
                  "std::span<const std::int64_t> or a reference to a contiguous std::int64_t container (a "
                  "temporary would dangle)");
    return std::span<const std::int64_t>(traits::shape(t));
  }
  static std::size_t byte_count(const Tensor& t) {
    const std::int64_t elements =
        detail::payload::checked_element_count(shape_of(t), "baton::row_major_payload_traits", element_size());
    return static_cast<std::size_t>(elements) * element_size();
  }
  static Tensor allocate_uninitialised(std::span<const std::int64_t> shape) {
    if constexpr (requires { traits::allocate_for_overwrite(shape); }) {
      return traits::allocate_for_overwrite(shape);
    } else {
      return traits::allocate(shape);
    }
  }
};

}  // namespace baton
