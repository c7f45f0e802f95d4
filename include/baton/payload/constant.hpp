// baton/payload/constant.hpp — constant<T>: a tensor that is split and sent but never
// differentiated (token positions, segment ids, an index tensor).
#pragma once

#include <baton/payload/traits.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace baton {

template <class T>
struct constant;

namespace detail::payload {
template <class T>
struct is_constant_wrapper : std::false_type {};
template <class T>
struct is_constant_wrapper<constant<T>> : std::true_type {};

template <class T>
constexpr bool check_constant_argument() {
  if constexpr (is_record_v<T>) {
    static_assert(core::dependent_false_v<T>,
                  "baton::constant<T>: T is a record; mark the individual tensor fields as constant "
                  "instead (field<\"positions\", constant<Tensor>>)");
  } else if constexpr (is_constant_wrapper<T>::value) {
    static_assert(core::dependent_false_v<T>, "baton::constant<constant<T>>: T is already constant");
  } else if constexpr (!has_payload_traits<T>) {
    (void)payload_traits<T>::role;  // the "not specialised" message, naming T
  } else if constexpr (payload_traits<T>::role == payload_role::opaque) {
    static_assert(core::dependent_false_v<T>,
                  "baton::constant<T>: T is opaque; constant<T> marks a tensor that is split and "
                  "sent without a gradient. Opaque values cannot cross a stage boundary; pass them "
                  "as a side input");
  } else {
    require_tensor<T>();
  }
  return true;
}

// The value_type of T's traits, when it has one (a run-time element type has none).
template <class T>
struct value_type_of {};
template <class T>
  requires requires { typename payload_traits<T>::value_type; }
struct value_type_of<T> {
  using value_type = typename payload_traits<T>::value_type;
};

}  // namespace detail::payload

/// A tensor that is split into microbatches and sent between stages but has no gradient:
/// grad_t drops it from records, and asking for grad_t<constant<T>> is a compile error.
///
/// Example, with `h` a tensor of type H and `p` one of type P:
/// ```cpp
///   baton::record<baton::field<"hidden", H>, baton::field<"positions", baton::constant<P>>> r{h, baton::constant{p}};
/// ```
template <class T>
struct constant {
  static_assert(detail::payload::check_constant_argument<T>());

  using tensor_type = T;
  T value;

  constant() = default;
  explicit constant(T v) noexcept(std::is_nothrow_move_constructible_v<T>) : value(std::move(v)) {}

  T& get() & noexcept { return value; }
  const T& get() const& noexcept { return value; }
  T&& get() && noexcept { return std::move(value); }
  T& operator*() noexcept { return value; }
  const T& operator*() const noexcept { return value; }
  T* operator->() noexcept { return &value; }
  const T* operator->() const noexcept { return &value; }
};

template <class T>
constant(T) -> constant<T>;

/// constant<T> is a tensor with role constant; every operation forwards to T's traits.
template <class T>
struct payload_traits<constant<T>> : detail::payload::value_type_of<T> {
  static constexpr payload_role role = payload_role::constant;
  using inner = payload_traits<T>;

  // T's run-time element format, when T has one instead of a value_type (the base gives
  // value_type otherwise).
  static std::int64_t element_format(const constant<T>& c)
    requires runtime_element_type<T>
  {
    return inner::element_format(c.value);
  }
  static constant<T> allocate(std::span<const std::int64_t> shape, std::int64_t format)
    requires runtime_element_type<T>
  {
    return constant<T>(inner::allocate(shape, format));
  }

  static decltype(auto) shape(const constant<T>& c) { return inner::shape(c.value); }
  static std::span<const std::byte> bytes(const constant<T>& c) { return inner::bytes(c.value); }
  static std::span<std::byte> mutable_bytes(constant<T>& c) { return inner::mutable_bytes(c.value); }
  static constant<T> allocate(std::span<const std::int64_t> shape) { return constant<T>(inner::allocate(shape)); }
  static constant<T> allocate_like(const constant<T>& c) { return constant<T>(inner::allocate_like(c.value)); }
  static constant<T> slice(const constant<T>& c, int dim, std::int64_t begin, std::int64_t count) {
    return constant<T>(inner::slice(c.value, dim, begin, count));
  }
  static constant<T> concat(std::span<const constant<T>> parts, int dim) {
    std::vector<const T*> inner_parts;
    inner_parts.reserve(parts.size());
    for (const auto& p : parts) inner_parts.push_back(&p.value);
    return constant<T>(detail::payload::concat_pointers<T>(inner_parts, dim));
  }
  static constant<T> concat_pointers(std::span<const constant<T>* const> parts, int dim) {
    std::vector<const T*> inner_parts;
    inner_parts.reserve(parts.size());
    for (const auto* p : parts) inner_parts.push_back(&p->value);
    return constant<T>(detail::payload::concat_pointers<T>(inner_parts, dim));
  }
};

}  // namespace baton
