// baton/payload/visit.hpp — visiting the tensors of a payload.
//
//   for_each_tensor(p, f)      every tensor: activations and constants, in field order
//   for_each_activation(p, f)  only the activations (the fields grad_t<P> keeps)
//
// f is called as f(info, tensor) when it accepts two arguments, otherwise as f(tensor).
// `info` is an empty object whose static members say which field this is:
//   decltype(info)::name  (std::string_view; "" for a payload that is a single tensor)
//   decltype(info)::role  (payload_role::activation or payload_role::constant)
//   decltype(info)::index (position of the field in the record; 0 for a single tensor)
// They are constant expressions, so `if constexpr (info.role == payload_role::constant)` works.
// The tensor is passed unwrapped: a constant<T> field is visited as its T.
//
// The two-payload forms for_each_tensor(a, b, f) / for_each_activation(a, b, f) walk a and b
// together, pairing fields by name: b may be a payload of the same type (a receive buffer) or,
// for for_each_activation, grad_t of a's type (a gradient).
#pragma once

#include <baton/payload/constant.hpp>
#include <baton/payload/record.hpp>
#include <baton/payload/traits.hpp>

#include <concepts>
#include <cstddef>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace baton {

/// What a visitor learns about the tensor it is given (all static, all constant expressions).
template <fixed_string Name, payload_role Role, std::size_t Index>
struct tensor_info {
  static constexpr std::string_view name = Name.view();
  static constexpr payload_role role = Role;
  static constexpr std::size_t index = Index;
};

namespace detail::payload {

template <class T>
decltype(auto) unwrap(T& t) noexcept {
  if constexpr (is_constant_wrapper<std::remove_const_t<T>>::value) {
    return (t.value);
  } else {
    return (t);
  }
}

template <class Info, class F, class... Ts>
void invoke_visitor(F& f, Ts&... tensors) {
  if constexpr (std::invocable<F&, Info, Ts&...>) {
    f(Info{}, tensors...);
  } else {
    static_assert(std::invocable<F&, Ts&...>,
                  "baton::for_each_tensor / for_each_activation: the visitor must be callable as "
                  "f(info, tensor) or f(tensor) (with one tensor argument per payload visited)");
    f(tensors...);
  }
}

template <class P>
constexpr void require_visitable() {
  using U = std::remove_cvref_t<P>;
  if constexpr (!is_record_v<U> && !has_payload_traits<U>) {
    (void)payload_traits<U>::role;  // the "not specialised" message, naming U
  }
}

template <bool ActivationsOnly, class T>
constexpr bool visited_v = [] {
  if constexpr (!tensor_payload<T>) {
    return false;
  } else {
    return !ActivationsOnly || payload_traits<T>::role == payload_role::activation;
  }
}();

// Visits the leaves of `a` (and the same-named leaves of `others`).
template <bool ActivationsOnly, class F, class A, class... Others>
void visit(F& f, A& a, Others&... others) {
  using U = std::remove_const_t<A>;
  require_visitable<U>();
  if constexpr (is_record_v<U>) {
    [&]<class... Fs, std::size_t... I>(std::type_identity<record<Fs...>>, std::index_sequence<I...>) {
      auto one = [&]<class Fd, std::size_t Index>() {
        using T = typename Fd::type;
        if constexpr (visited_v<ActivationsOnly, T>) {
          using info = tensor_info<Fd::key, payload_traits<T>::role, Index>;
          invoke_visitor<info>(f, unwrap(std::get<Index>(a.values())), unwrap(get<Fd::key>(others))...);
        }
      };
      (one.template operator()<Fs, I>(), ...);
    }(std::type_identity<U>{}, std::make_index_sequence<U::size>{});
  } else if constexpr (visited_v<ActivationsOnly, U>) {
    using info = tensor_info<"", payload_traits<U>::role, 0>;
    invoke_visitor<info>(f, unwrap(a), unwrap(others)...);
  }
}

}  // namespace detail::payload

/// Calls f on every tensor of p (activations and constants, in field order); opaque fields are
/// skipped. p may be a record or a single leaf.
template <class P, class F>
void for_each_tensor(P& p, F&& f) {
  detail::payload::visit<false>(f, p);
}

/// Calls f on every activation tensor of p: exactly the tensors grad_t<P> holds.
template <class P, class F>
void for_each_activation(P& p, F&& f) {
  detail::payload::visit<true>(f, p);
}

/// Walks two payloads together, pairing tensors by field name: f(info, ta, tb) or f(ta, tb).
/// b needs a field of the same name for every tensor field of a.
template <class A, class B, class F>
void for_each_tensor(A& a, B& b, F&& f) {
  detail::payload::visit<false>(f, a, b);
}

/// Walks the activations of a together with the same-named fields of b (b is typically a
/// grad_t of a's type, or a buffer of a's type): f(info, ta, tb) or f(ta, tb).
template <class A, class B, class F>
void for_each_activation(A& a, B& b, F&& f) {
  detail::payload::visit<true>(f, a, b);
}

}  // namespace baton
