// baton/payload/record.hpp — structured payloads: records of named fields, the C++ answer to
// "dict inputs and outputs between stages" (seed 004), and the payload / sendable concepts.
//
//   using block_input = record<field<"hidden", host_tensor<float>>,
//                              field<"positions", constant<host_tensor<std::int64_t>>>>;
//   block_input x{hidden, constant{positions}};
//   get<"hidden">(x) ...
#pragma once

#include <baton/core/meta.hpp>
#include <baton/payload/constant.hpp>
#include <baton/payload/traits.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace baton {

/// One named field of a record: `field<"hidden", Tensor>`. Holds the value when used to
/// build a record by name (`record{field<"hidden", T>{t}, ...}`).
template <fixed_string Name, class T>
struct field {
  static constexpr auto key = Name;  // the name as a template argument: get<F::key>(r)
  static constexpr std::string_view name = Name.view();
  using type = T;
  T value;
};

/// Makes a field from a value: `make_field<"hidden">(t)`.
template <fixed_string Name, class T>
constexpr field<Name, std::remove_cvref_t<T>> make_field(T&& value) {
  return {std::forward<T>(value)};
}

namespace detail::payload {

template <class F>
struct is_field : std::false_type {};
template <fixed_string Name, class T>
struct is_field<field<Name, T>> : std::true_type {};

template <class F>
constexpr bool check_record_field() {
  if constexpr (!is_field<F>::value) {
    static_assert(core::dependent_false_v<F>,
                  "baton::record<...> takes field<\"name\", T> arguments, e.g. "
                  "record<field<\"hidden\", Tensor>, field<\"positions\", constant<Tensor>>>");
  } else {
    using T = typename F::type;
    if constexpr (is_record_v<T>) {
      static_assert(core::dependent_false_v<T>,
                    "baton::record: a field holds a record; nested records are not supported, "
                    "flatten the names instead (field<\"attn_q\", ...>, field<\"attn_k\", ...>)");
    } else if constexpr (std::is_reference_v<T> || std::is_const_v<T>) {
      static_assert(core::dependent_false_v<T>, "baton::record: field types must be non-const values, not references");
    } else if constexpr (!has_payload_traits<T>) {
      (void)payload_traits<T>::role;  // the "not specialised" message, naming T
    } else if constexpr (payload_traits<T>::role != payload_role::opaque) {
      require_tensor<T>();
    }
  }
  return true;
}

template <class... Fs>
constexpr bool names_unique() {
  constexpr std::array<std::string_view, sizeof...(Fs)> names{Fs::name...};
  for (std::size_t i = 0; i < names.size(); ++i) {
    for (std::size_t j = i + 1; j < names.size(); ++j) {
      if (names[i] == names[j]) return false;
    }
  }
  return true;
}

}  // namespace detail::payload

/// A structured payload: named fields, each a leaf payload (an activation tensor, a
/// constant<Tensor> or an opaque value). Fields keep their declaration order, which is the
/// order every visitor and the wire format use.
///
/// Construct from the values in order (`record<...> r{h, constant{p}}`) or from fields, which
/// deduces the type (`record r{make_field<"hidden">(h), make_field<"mask">(m)}`).
template <class... Fields>
class record {
  static_assert((detail::payload::check_record_field<Fields>() && ...));
  static_assert(detail::payload::names_unique<Fields...>(),
                "baton::record: two fields have the same name; field names must be unique");

 public:
  using tuple_type = std::tuple<typename Fields::type...>;
  static constexpr std::size_t size = sizeof...(Fields);
  static constexpr std::array<std::string_view, sizeof...(Fields)> names{Fields::name...};

  /// Index of the field called `name`, or `size` when there is none.
  static constexpr std::size_t index_of(std::string_view name) noexcept {
    for (std::size_t i = 0; i < size; ++i) {
      if (names[i] == name) return i;
    }
    return size;
  }

  record() = default;
  constexpr explicit(sizeof...(Fields) == 1) record(typename Fields::type... values) : values_(std::move(values)...) {}
  constexpr record(Fields... fields) : values_(std::move(fields.value)...) {}

  /// The field values in declaration order.
  tuple_type& values() & noexcept { return values_; }
  const tuple_type& values() const& noexcept { return values_; }
  tuple_type&& values() && noexcept { return std::move(values_); }

 private:
  tuple_type values_;
};

/// The record without fields (for example grad_t of a record that holds no activation).
template <>
class record<> {
 public:
  using tuple_type = std::tuple<>;
  static constexpr std::size_t size = 0;
  static constexpr std::array<std::string_view, 0> names{};
  static constexpr std::size_t index_of(std::string_view) noexcept { return 0; }

  tuple_type& values() & noexcept { return values_; }
  const tuple_type& values() const& noexcept { return values_; }
  tuple_type&& values() && noexcept { return std::move(values_); }

 private:
  tuple_type values_;
};

template <fixed_string... Names, class... Ts>
record(field<Names, Ts>...) -> record<field<Names, Ts>...>;

/// Number of fields of a record type.
template <class R>
  requires is_record_v<R>
inline constexpr std::size_t record_size_v = std::remove_cvref_t<R>::size;

/// Whether record type R has a field called Name.
template <class R, fixed_string Name>
  requires is_record_v<R>
inline constexpr bool has_field_v = std::remove_cvref_t<R>::index_of(Name.view()) < std::remove_cvref_t<R>::size;

namespace detail::payload {
// What get<"name"> of a missing field returns after its static_assert, so that the one
// readable error is not followed by a cascade of others.
struct no_such_field {};
inline no_such_field no_such_field_value{};

template <class R, fixed_string Name>
constexpr std::size_t checked_field_index() {
  using rec = std::remove_cvref_t<R>;
  constexpr std::size_t i = rec::index_of(Name.view());
  static_assert(i < rec::size,
                "baton::get<\"name\">(record): the record has no field with this name; the "
                "field names are those in its type, record<field<\"name\", T>, ...>");
  return i < rec::size ? i : 0;
}
}  // namespace detail::payload

/// The type of the field called Name of record type R.
template <class R, fixed_string Name>
  requires is_record_v<R>
using field_type_t = std::tuple_element_t<detail::payload::checked_field_index<R, Name>(),
                                          typename std::remove_cvref_t<R>::tuple_type>;

/// The field called Name: `get<"hidden">(r)`. A name the record lacks is a compile error.
template <fixed_string Name, class R>
  requires is_record_v<R>
constexpr decltype(auto) get(R&& r) noexcept {
  constexpr std::size_t i = std::remove_cvref_t<R>::index_of(Name.view());
  if constexpr (i < std::remove_cvref_t<R>::size) {
    return std::get<i>(std::forward<R>(r).values());
  } else {
    (void)detail::payload::checked_field_index<R, Name>();  // the readable error
    return (detail::payload::no_such_field_value);
  }
}

/// Anything that can be a stage input or output: a leaf payload or a record of leaves.
template <class P>
concept payload = leaf_payload<P> || is_record_v<P>;

namespace detail::payload {
template <class R>
struct record_all_tensors;
template <class... Fs>
struct record_all_tensors<record<Fs...>> : std::bool_constant<(tensor_payload<typename Fs::type> && ...)> {};
}  // namespace detail::payload

/// A payload that may cross a stage boundary: a tensor, or a record whose fields are all
/// tensors (activation or constant). Opaque values must travel as side inputs instead.
template <class P>
concept sendable_payload =
    tensor_payload<P> ||
    (is_record_v<P> && !std::is_reference_v<P> && detail::payload::record_all_tensors<std::remove_cv_t<P>>::value);

namespace detail::payload {
// Instantiated for the offending field, so the diagnostic shows field<"name", T>.
template <class Field, class T>
struct opaque_field_at_stage_boundary {
  static_assert(core::dependent_false_v<T>,
                "baton: this payload holds an opaque field: opaque values cannot cross a stage "
                "boundary; pass them as a side input (the stage's `side` type) instead of a field "
                "of its input or output");
  static constexpr bool value = false;
};

template <class F>
constexpr void require_sendable_field() {
  using T = typename F::type;
  if constexpr (opaque_payload<T>) {
    (void)opaque_field_at_stage_boundary<F, T>::value;
  }
}
}  // namespace detail::payload

/// Compile-time gate for a type that crosses a stage boundary (the pipeline calls it on every
/// stage's input and output). An opaque value, or a record holding one, fails with
/// "opaque values cannot cross a stage boundary; pass them as a side input".
template <class P>
constexpr bool require_sendable() {
  using U = std::remove_cvref_t<P>;
  if constexpr (is_record_v<U>) {
    []<class... Fs>(std::type_identity<record<Fs...>>) {
      (detail::payload::require_sendable_field<Fs>(), ...);
    }(std::type_identity<U>{});
  } else if constexpr (opaque_payload<U>) {
    static_assert(detail::core::dependent_false_v<U>,
                  "baton: an opaque value is used as a stage input or output: opaque values cannot "
                  "cross a stage boundary; pass them as a side input (the stage's `side` type)");
  } else {
    detail::payload::require_tensor<U>();
  }
  return true;
}

}  // namespace baton
