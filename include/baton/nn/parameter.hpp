// baton/nn/parameter.hpp — what a model's weights are: parameters (value + gradient), a way
// to visit every parameter of a module by name, and initialisation that gives each parameter
// the same values whatever rank builds it.
//
// A module lists its parameters and sub-modules in one member template:
//
// ```cpp
//   template <class Visit> void visit_parameters(Visit&& visit) {
//     visit("weight", weight_);   // a parameter
//     visit("attn", attention_);  // a sub-module: its names become "attn.<name>"
//   }
// ```
//
// and everything that walks weights — optimizers, gradient all-reduce, clipping, checkpoints —
// goes through for_each_parameter / parameters_of, so a pipeline stage that holds layers 4..7
// sees the same names (and, from the same seed, the same values) as a one-rank model.
#pragma once

#include <baton/core/hash.hpp>
#include <baton/nn/error.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/payload/traits.hpp>

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numbers>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton::nn {

/// A trainable tensor: its value and the gradient that backward passes accumulate into.
///
/// Tensor is baton::host_tensor<T> for the pieces of this layer, or any tensor type the
/// payload layer adapts (payload_traits with mutable_bytes): optimizers and gradient
/// reductions see a parameter only as a contiguous span of its value_type.
template <class Tensor>
struct basic_parameter {
  static_assert(tensor_payload<Tensor>,
                "baton::nn::basic_parameter<Tensor>: Tensor must be a tensor the payload layer adapts "
                "(payload_traits<Tensor> with value_type, shape, bytes, mutable_bytes, allocate_like...)");
  using tensor_type = Tensor;
  using value_type = typename payload_traits<Tensor>::value_type;

  Tensor value;
  /// Same shape as value; backward passes add into it. Zero it between steps (zero_grad).
  Tensor grad;
  /// Whether decoupled weight decay applies (AdamW, SGD). Matrices decay; gains and biases
  /// do not (the rule of most LLM recipes).
  bool decay = true;

  basic_parameter() = default;
  basic_parameter(Tensor v, bool weight_decay)
      : value(std::move(v)), grad(payload_traits<Tensor>::allocate_like(value)), decay(weight_decay) {}
};

/// The parameters of baton's own pieces.
template <class T>
using parameter = basic_parameter<host_tensor<T>>;

}  // namespace baton::nn

namespace baton::detail::nn {

// Whether X is Template<...>: a basic_parameter, a no_cp strategy.
template <class X, template <class...> class Template>
struct is_instance_of : std::false_type {};
template <template <class...> class Template, class... Args>
struct is_instance_of<Template<Args...>, Template> : std::true_type {};

// Accepts anything visit_parameters may pass, to test that a type has it.
struct visit_probe {
  template <class X>
  void operator()(std::string_view, X&) const {}
};

template <class Tensor>
std::span<typename payload_traits<Tensor>::value_type> elements(Tensor& t) {
  using V = typename payload_traits<Tensor>::value_type;
  const std::span<std::byte> bytes = payload_traits<Tensor>::mutable_bytes(t);
  return {reinterpret_cast<V*>(bytes.data()), bytes.size() / sizeof(V)};
}

inline std::string join_name(std::string_view prefix, std::string_view name) {
  if (prefix.empty()) return std::string(name);
  if (name.empty()) return std::string(prefix);
  std::string s(prefix);
  s += '.';
  s += name;
  return s;
}

template <class F>
struct named_visitor {
  F* f;
  std::string prefix;

  template <class X>
  void operator()(std::string_view name, X& x) const {
    if constexpr (is_instance_of<std::remove_cvref_t<X>, baton::nn::basic_parameter>::value) {
      (*f)(join_name(prefix, name), x);
    } else {
      static_assert(requires { x.visit_parameters(visit_probe{}); },
                    "baton::nn: visit_parameters passed something that is neither a parameter "
                    "(baton::nn::basic_parameter) nor a module with its own visit_parameters");
      x.visit_parameters(named_visitor<F>{f, join_name(prefix, name)});
    }
  }
};

}  // namespace baton::detail::nn

namespace baton::nn {

/// A type whose parameters can be visited: `m.visit_parameters(visit)` calls
/// `visit(name, parameter)` for each of its parameters and `visit(name, sub_module)` for each
/// sub-module.
template <class M>
concept module_with_parameters = requires(M& m) { m.visit_parameters(detail::nn::visit_probe{}); };

/// True for basic_parameter<Tensor>.
template <class P>
inline constexpr bool is_parameter_v = detail::nn::is_instance_of<std::remove_cvref_t<P>, basic_parameter>::value;

/// Calls `f(const std::string& name, basic_parameter<Tensor>& p)` for every parameter of
/// `module`, in its declaration order, with names joined by dots ("attn.wq.weight").
/// `prefix` is put before every name ("layers.3").
template <module_with_parameters Module, class F>
void for_each_parameter(Module& module, F&& f, std::string_view prefix = {}) {
  module.visit_parameters(detail::nn::named_visitor<std::remove_reference_t<F>>{&f, std::string(prefix)});
}

/// A parameter and its name, as optimizers and reductions take them.
template <class Tensor>
struct named_parameter {
  std::string name;
  basic_parameter<Tensor>* parameter;
};

/// Every parameter of `module` (names prefixed with `prefix`), appended to `list`. A rank that
/// holds several modules (pipeline stages) collects them all into one list.
template <class Tensor, module_with_parameters Module>
void append_parameters(std::vector<named_parameter<Tensor>>& list, Module& module, std::string_view prefix = {}) {
  for_each_parameter(
      module,
      [&](const std::string& name, auto& p) {
        static_assert(std::is_same_v<std::remove_cvref_t<decltype(p)>, basic_parameter<Tensor>>,
                      "baton::nn::append_parameters: the module holds a parameter of another tensor type than "
                      "the list; keep one list per tensor type");
        list.push_back({name, &p});
      },
      prefix);
}

/// The parameters of one module, for a module whose pieces use baton::host_tensor<T>.
template <class T, module_with_parameters Module>
std::vector<named_parameter<host_tensor<T>>> parameters_of(Module& module, std::string_view prefix = {}) {
  std::vector<named_parameter<host_tensor<T>>> list;
  append_parameters(list, module, prefix);
  return list;
}

/// Sets every gradient of the list to zero.
template <class Tensor>
void zero_grad(std::span<const named_parameter<Tensor>> list) {
  for (const auto& p : list)
    for (auto& g : detail::nn::elements(p.parameter->grad)) g = 0;
}
template <class Tensor>
void zero_grad(const std::vector<named_parameter<Tensor>>& list) {
  zero_grad(std::span<const named_parameter<Tensor>>(list));
}

/// The gradients of a list as spans, for baton::clip_grad_norm.
template <class Tensor>
auto gradient_spans(const std::vector<named_parameter<Tensor>>& list) {
  std::vector<std::span<typename payload_traits<Tensor>::value_type>> spans;
  spans.reserve(list.size());
  for (const auto& p : list) spans.push_back(detail::nn::elements(p.parameter->grad));
  return spans;
}

/// Total number of elements of a list's parameters.
template <class Tensor>
std::int64_t parameter_count(const std::vector<named_parameter<Tensor>>& list) {
  std::int64_t n = 0;
  for (const auto& p : list) n += static_cast<std::int64_t>(detail::nn::elements(p.parameter->value).size());
  return n;
}

/// Deterministic initial values that depend only on (seed, the parameter's full name, the
/// element's index) — not on which rank builds the parameter, how many ranks there are or in
/// which order modules are built. A pipeline stage holding "layers.5" draws exactly what a
/// one-rank model's layer 5 draws.
///
/// ```cpp
///   baton::nn::initializer init(42);
///   auto block_init = init / "layers" / 5;          // path "layers.5"
///   auto w = block_init.normal<float>("attn.wq.weight", {512, 512}, 0.04);
/// ```
class initializer {
 public:
  explicit initializer(std::uint64_t seed, std::string path = {}) : seed_(seed), path_(std::move(path)) {}

  std::uint64_t seed() const noexcept { return seed_; }
  /// Dotted path of the module this initializer builds ("layers.5.attn").
  const std::string& path() const noexcept { return path_; }

  /// The initializer of a sub-module.
  friend initializer operator/(const initializer& parent, std::string_view child) {
    return initializer(parent.seed_, detail::nn::join_name(parent.path_, child));
  }
  friend initializer operator/(const initializer& parent, std::int64_t index) {
    return parent / std::string_view(std::to_string(index));
  }

  /// A tensor of the given shape whose element i is a standard normal draw (a function of
  /// seed, path + "." + name and i) times stddev.
  template <class T>
  host_tensor<T> normal(std::string_view name, std::vector<std::int64_t> shape, double stddev) const {
    host_tensor<T> t = host_tensor<T>::for_overwrite(std::move(shape));
    const std::uint64_t key = mix(seed_ ^ hash(detail::nn::join_name(path_, name)));
    for (std::int64_t i = 0; i < t.size(); ++i) {
      // Box-Muller on two uniforms in (0, 1] from a counter-based generator.
      const double u1 = uniform(mix(key + 2 * static_cast<std::uint64_t>(i)));
      const double u2 = uniform(mix(key + 2 * static_cast<std::uint64_t>(i) + 1));
      t[i] = static_cast<T>(stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2));
    }
    return t;
  }

 private:
  static std::uint64_t mix(std::uint64_t z) noexcept { return detail::core::splitmix64(z); }
  static std::uint64_t hash(std::string_view s) noexcept { return detail::core::fnv1a(s); }
  static double uniform(std::uint64_t bits) noexcept {
    return (static_cast<double>(bits >> 11) + 1.0) * (1.0 / 9007199254740992.0);  // (0, 1]
  }

  std::uint64_t seed_;
  std::string path_;
};

}  // namespace baton::nn
