// baton/payload/grad.hpp — grad_t<P>: the gradient of a payload holds its activation fields
// and nothing else. A backward pass works on grad_t, so it cannot even name a constant or an
// opaque value (seed 000: split backward asked a BlockMask for requires_grad and crashed).
#pragma once

#include <baton/payload/constant.hpp>
#include <baton/payload/record.hpp>
#include <baton/payload/traits.hpp>

#include <tuple>
#include <type_traits>

namespace baton {

namespace detail::payload {

template <class P>
struct grad_of {
  static constexpr bool check() {
    if constexpr (!has_payload_traits<P>) {
      (void)payload_traits<P>::role;  // the "not specialised" message, naming P
    } else if constexpr (payload_traits<P>::role == payload_role::constant) {
      static_assert(core::dependent_false_v<P>,
                    "baton::grad_t<P>: P is a constant tensor, which is never differentiated and "
                    "has no gradient; only activation fields have gradients (grad_t of a record "
                    "keeps just its activation fields)");
    } else if constexpr (payload_traits<P>::role == payload_role::opaque) {
      static_assert(core::dependent_false_v<P>,
                    "baton::grad_t<P>: P is an opaque value, which is never differentiated and has "
                    "no gradient; only activation fields have gradients (grad_t of a record keeps "
                    "just its activation fields)");
    }
    return true;
  }
  static_assert(check());
  using type = P;
};

template <class... Fs>
struct grad_of<record<Fs...>> {
  template <class F>
  using keep = std::conditional_t<activation_tensor<typename F::type>, std::tuple<F>, std::tuple<>>;

  template <class Tuple>
  struct to_record;
  template <class... Kept>
  struct to_record<std::tuple<Kept...>> {
    using type = record<Kept...>;
  };

  using type = typename to_record<decltype(std::tuple_cat(std::declval<keep<Fs>>()...))>::type;
};

}  // namespace detail::payload

/// The gradient type of payload P: P itself for an activation tensor; for a record, the record
/// of its activation fields (same names, same order). grad_t of a constant or opaque value is
/// a compile error that says it has no gradient.
template <class P>
using grad_t = typename detail::payload::grad_of<std::remove_cvref_t<P>>::type;

/// Whether grad_t<P> exists: P is an activation tensor or a record (possibly with no
/// activation fields, whose grad_t is record<>).
template <class P>
inline constexpr bool has_gradient_v = activation_tensor<std::remove_cvref_t<P>> || is_record_v<P>;

/// Zero-filled gradient buffers shaped like p's activations (a gradient accumulator, or the
/// receive buffer of a backward message).
template <class P>
grad_t<P> grad_like(const P& p) {
  if constexpr (is_record_v<P>) {
    using G = grad_t<P>;
    return []<class... Gs>(const P& src, std::type_identity<record<Gs...>>) {
      return G(payload_traits<typename Gs::type>::allocate_like(
          get<Gs::key>(src))...);
    }(p, std::type_identity<G>{});
  } else {
    using G = grad_t<P>;
    return payload_traits<G>::allocate_like(p);
  }
}

}  // namespace baton
