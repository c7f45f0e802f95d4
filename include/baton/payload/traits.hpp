// baton/payload/traits.hpp — what a stage input or output *is*: the payload roles, the
// payload_traits customization point, the tensor concept, and the checked free functions
// that every other layer uses to touch a tensor generically.
//
// Seed 000 (FlexAttention's BlockMask crashing split backward) happened because a pipeline
// treated every stage input alike. Here every leaf value is classified at compile time:
//   activation — a tensor that flows through the pipe and gets a gradient;
//   constant   — a tensor that is split and sent but never differentiated (positions);
//   opaque     — anything else (a block mask): never differentiated, never sent as bytes.
#pragma once

#include <baton/core/meta.hpp>
#include <baton/core/sizes.hpp>

#include <cstddef>
#include <concepts>
#include <cstdint>
#include <exception>
#include <iterator>
#include <limits>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace baton {

/// The role of a leaf payload value. See docs/payloads.md.
enum class payload_role { activation, constant, opaque };

/// Every error the payload layer reports at run time (bad split counts, a dimension out of
/// range, parts that cannot be merged). The message names the field and what to change.
class payload_error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail::payload {
// Instantiated (and so fails) only when someone reads payload_traits<T>::role for a type that
// has no specialisation. Its name shows up in the compiler's "required from" chain next to T.
template <class T>
struct payload_traits_not_specialised_for {
  static_assert(core::dependent_false_v<T>,
                "baton::payload_traits<T> is not specialised for this type: specialise it "
                "(see docs/payloads.md): a tensor type declares `static constexpr payload_role "
                "role = payload_role::activation;` plus value_type, shape, bytes, mutable_bytes, "
                "allocate, allocate_like, slice and concat; any other value declares "
                "`role = payload_role::opaque;` (and may add split/merge hooks)");
  static constexpr payload_role role = payload_role::opaque;
};
}  // namespace detail::payload

/// The customization point. Specialise it for each type that travels in a payload.
///
/// Requirements of a specialisation:
///  1. `static constexpr payload_role role`.
///  2. For role activation or constant (a *tensor*), with `value_type` the element type:
///     - `shape(const T&)`: a random-access range of integral extents (row-major order);
///     - `bytes(const T&) -> std::span<const std::byte>` and
///       `mutable_bytes(T&) -> std::span<std::byte>`: the contiguous storage;
///     - `allocate(std::span<const std::int64_t> shape) -> T` and `allocate_like(const T&) -> T`:
///       new zero-filled tensors (receive and gradient buffers);
///     - `slice(const T&, int dim, std::int64_t begin, std::int64_t count) -> T`: an owning copy
///       of rows [begin, begin+count) along dim;
///     - `concat(std::span<const T>, int dim) -> T`.
///     Optional: `concat_pointers(std::span<const T* const>, int dim) -> T`, the same as concat
///     over tensors that are not adjacent in memory (merge_microbatches gathers a record's
///     field from every part this way; without it the parts are copied into one array first).
///     Optional: `merge(std::span<const T>) -> T`, a reducer used by merge_microbatches instead
///     of concat (for example a scalar loss summed over microbatches).
///     A tensor whose element type is known only at run time (torch::Tensor's dtype) declares,
///     instead of `value_type`, `element_format(const T&) -> std::int64_t` (see
///     element_format_of: bytes per element plus 256 x a code of the traits' choosing) and
///     `allocate(shape, format) -> T`, and may add `scale(T&, double)` (the executor's loss
///     scaling of a gradient). The format travels in the pipeline's wire header, so a
///     receiver allocates the sender's element type.
///  3. For role opaque, optionally `split(const T&, std::int64_t chunk, std::int64_t chunks) -> T`
///     (otherwise every microbatch gets a copy) and `merge(std::span<const T>) -> T`.
///
/// Using the primary template fails with a static_assert that names the type.
template <class T>
struct payload_traits {
  using baton_primary_payload_traits = void;  // marks "not specialised" for the concepts below
  static constexpr payload_role role = detail::payload::payload_traits_not_specialised_for<T>::role;
};

template <class... Fields>
class record;

namespace detail::payload {
template <class T>
struct is_record : std::false_type {};
template <class... Fs>
struct is_record<record<Fs...>> : std::true_type {};
}  // namespace detail::payload

/// True for baton::record<...> (after removing cv and references).
template <class T>
inline constexpr bool is_record_v = detail::payload::is_record<std::remove_cvref_t<T>>::value;

/// T has its own payload_traits specialisation (it is a leaf payload of some role).
template <class T>
concept has_payload_traits =
    !requires { typename payload_traits<std::remove_cvref_t<T>>::baton_primary_payload_traits; } &&
    requires {
      { payload_traits<std::remove_cvref_t<T>>::role } -> std::convertible_to<payload_role>;
    };

/// The role of a leaf payload type (a compile error naming T when T has no traits).
template <class T>
inline constexpr payload_role payload_role_v = payload_traits<std::remove_cvref_t<T>>::role;

/// Traits whose element type is a compile-time `value_type`.
template <class T>
concept static_element_type = requires { typename payload_traits<T>::value_type; };

/// Traits whose element type is a run-time value (torch::Tensor's dtype): `element_format(t)`
/// says what a tensor holds and `allocate(shape, format)` makes one of that format.
template <class T>
concept runtime_element_type = requires(const T& ct, std::span<const std::int64_t> shape, std::int64_t format) {
  { payload_traits<T>::element_format(ct) } -> std::same_as<std::int64_t>;
  { payload_traits<T>::allocate(shape, format) } -> std::same_as<T>;
};

/// The element format of a compile-time element type: its size in bytes (code 0).
template <class V>
inline constexpr std::int64_t static_element_format_v = static_cast<std::int64_t>(sizeof(V));

/// Bytes per element of an element format.
constexpr std::int64_t element_format_bytes(std::int64_t format) noexcept { return format & 0xff; }

/// A tensor: an activation or constant leaf whose traits provide every tensor operation.
template <class T>
concept tensor_payload =
    has_payload_traits<T> && !std::is_reference_v<T> && !std::is_const_v<T> &&
    (payload_traits<T>::role != payload_role::opaque) && (static_element_type<T> || runtime_element_type<T>) &&
    requires(const T& ct, T& t, std::span<const T> parts, std::span<const std::int64_t> shape,
             int dim, std::int64_t index) {
      { payload_traits<T>::shape(ct) } -> std::ranges::random_access_range;
      requires std::integral<std::ranges::range_value_t<decltype(payload_traits<T>::shape(ct))>>;
      { payload_traits<T>::bytes(ct) } -> std::same_as<std::span<const std::byte>>;
      { payload_traits<T>::mutable_bytes(t) } -> std::same_as<std::span<std::byte>>;
      { payload_traits<T>::allocate(shape) } -> std::same_as<T>;
      { payload_traits<T>::allocate_like(ct) } -> std::same_as<T>;
      { payload_traits<T>::slice(ct, dim, index, index) } -> std::same_as<T>;
      { payload_traits<T>::concat(parts, dim) } -> std::same_as<T>;
    };

/// Whether the host may read and write a tensor type's bytes() (memcpy them into a message,
/// scale them in a loop). True unless its traits declare `static constexpr bool
/// host_accessible = false;`, as a device-memory tensor does (baton/payload/cuda.hpp): such a
/// tensor is only ever handed to the communicator as a span and changed through its traits.
template <class T>
inline constexpr bool host_accessible_v = [] {
  if constexpr (requires { payload_traits<std::remove_cvref_t<T>>::host_accessible; }) {
    return static_cast<bool>(payload_traits<std::remove_cvref_t<T>>::host_accessible);
  } else {
    return true;
  }
}();

/// A tensor whose traits can concatenate parts that are not adjacent in memory.
template <class T>
concept pointer_concatenable = tensor_payload<T> && requires(std::span<const T* const> parts, int dim) {
  { payload_traits<T>::concat_pointers(parts, dim) } -> std::same_as<T>;
};

/// A tensor whose role is activation: it has a gradient.
template <class T>
concept activation_tensor = tensor_payload<T> && (payload_traits<T>::role == payload_role::activation);

/// A tensor whose role is constant: split and sent, never differentiated.
template <class T>
concept constant_tensor = tensor_payload<T> && (payload_traits<T>::role == payload_role::constant);

/// A value that is never differentiated and never sent as a tensor (a block mask, a config).
template <class T>
concept opaque_payload = has_payload_traits<T> && !std::is_reference_v<T> && !std::is_const_v<T> &&
                         (payload_traits<T>::role == payload_role::opaque);

/// One leaf of a payload: a tensor or an opaque value.
template <class T>
concept leaf_payload = tensor_payload<T> || opaque_payload<T>;

/// An opaque type that declares how to split itself into microbatches.
template <class T>
concept splittable_opaque = opaque_payload<T> && requires(const T& v, std::int64_t i) {
  { payload_traits<T>::split(v, i, i) } -> std::convertible_to<T>;
};

/// A leaf type that declares its own reducer for merge_microbatches.
template <class T>
concept mergeable_leaf = leaf_payload<T> && requires(std::span<const T> parts) {
  { payload_traits<T>::merge(parts) } -> std::convertible_to<T>;
};

namespace detail::payload {

// The compile-time gate of every function that needs one tensor. The first failing check
// fires, so the user sees one message that says what to do.
template <class T>
constexpr void require_tensor() {
  using U = std::remove_cvref_t<T>;
  if constexpr (is_record_v<U>) {
    static_assert(core::dependent_false_v<U>,
                  "baton: a record was given where one tensor is required; visit its tensors "
                  "with baton::for_each_tensor, or pick one with baton::get<\"name\">(r)");
  } else if constexpr (!has_payload_traits<U>) {
    (void)payload_traits<U>::role;  // fails with the "not specialised" message naming U
  } else if constexpr (payload_traits<U>::role == payload_role::opaque) {
    static_assert(core::dependent_false_v<U>,
                  "baton: an opaque value was given where a tensor is required: opaque values "
                  "cannot cross a stage boundary; pass them as a side input (the stage's `side` "
                  "type), or give the type a tensor role in its payload_traits");
  } else if constexpr (!tensor_payload<U>) {
    static_assert(core::dependent_false_v<U>,
                  "baton: payload_traits<T> declares a tensor role (activation or constant) but "
                  "lacks tensor operations: it needs value_type (or element_format), shape, bytes, mutable_bytes, "
                  "allocate, allocate_like, slice and concat with the signatures listed in "
                  "baton/payload/traits.hpp (check with static_assert(baton::tensor_payload<T>))");
  }
}

// A pointer to each element of `values`, in order.
template <class T>
std::vector<const T*> pointers_to(std::span<const T> values) {
  std::vector<const T*> out;
  out.reserve(values.size());
  for (const T& v : values) out.push_back(&v);
  return out;
}

// A copy of each value `pointers` points to, in order.
template <class T>
std::vector<T> copies_of(std::span<const T* const> pointers) {
  std::vector<T> out;
  out.reserve(pointers.size());
  for (const T* p : pointers) out.push_back(*p);
  return out;
}

// Concatenates tensors given by pointer: through the traits' concat_pointers when they have
// one, otherwise by copying the parts into one array for concat.
template <class T>
T concat_pointers(std::span<const T* const> parts, int dim) {
  if constexpr (pointer_concatenable<T>) {
    return payload_traits<T>::concat_pointers(parts, dim);
  } else {
    const auto copies = copies_of<T>(parts);
    return payload_traits<T>::concat(std::span<const T>(copies), dim);
  }
}

// Resolves a possibly negative dimension (-1 = last) against a rank; throws naming `what`.
inline int normalise_dim(int dim, std::size_t rank, std::string_view what) {
  const auto r = static_cast<std::int64_t>(rank);
  const std::int64_t d = dim < 0 ? dim + r : dim;
  if (d < 0 || d >= r) {
    throw payload_error(std::string(what) + ": dim " + std::to_string(dim) +
                        " is out of range for a tensor of rank " + std::to_string(rank) +
                        (rank == 0 ? " (a rank-0 tensor has no dimension to split or concatenate)"
                                   : "; use a dim in [" + std::to_string(-r) + ", " +
                                         std::to_string(r) + ")"));
  }
  return static_cast<int>(d);
}

// "[begin, end)" for an error message; "[begin, begin + count)" spelled out when the end
// does not fit in std::int64_t (the range is being rejected, so it may be anything).
inline std::string row_range_text(std::int64_t begin, std::int64_t count) {
  const bool end_fits = count >= 0 ? begin <= std::numeric_limits<std::int64_t>::max() - count
                                   : begin >= std::numeric_limits<std::int64_t>::min() - count;
  std::string text = "[";  // appended piece by piece: GCC 12's -Wrestrict misfires on "[" + to_string()
  text += std::to_string(begin);
  text += ", ";
  if (end_fits) {
    text += std::to_string(begin + count);
  } else {
    text += std::to_string(begin);
    text += " + ";
    text += std::to_string(count);
  }
  text += ')';
  return text;
}

}  // namespace detail::payload

// ---- Checked access to one tensor through its traits --------------------------------------
// Each gate is a static_assert with a readable message (an opaque value, a record or a type
// without traits is rejected here rather than deep inside an instantiation).

/// The extents of a tensor, outermost first.
template <class T>
std::vector<std::int64_t> tensor_shape(const T& t) {
  detail::payload::require_tensor<T>();
  std::vector<std::int64_t> out;
  if constexpr (tensor_payload<T>) {
    const auto& s = payload_traits<T>::shape(t);
    out.reserve(static_cast<std::size_t>(std::ranges::size(s)));
    for (auto e : s) out.push_back(static_cast<std::int64_t>(e));
  }
  return out;
}

/// The tensor's contiguous storage, for sending.
template <class T>
std::span<const std::byte> tensor_bytes(const T& t) {
  detail::payload::require_tensor<T>();
  if constexpr (tensor_payload<T>) {
    return payload_traits<T>::bytes(t);
  } else {
    return {};
  }
}

/// The tensor's contiguous storage, for receiving into.
template <class T>
std::span<std::byte> tensor_mutable_bytes(T& t) {
  detail::payload::require_tensor<T>();
  if constexpr (tensor_payload<T>) {
    return payload_traits<T>::mutable_bytes(t);
  } else {
    return {};
  }
}

/// A new zero-filled tensor of t's shape and element type.
template <class T>
T tensor_allocate_like(const T& t) {
  detail::payload::require_tensor<T>();
  if constexpr (tensor_payload<T>) {
    return payload_traits<T>::allocate_like(t);
  } else {
    std::terminate();  // unreachable: require_tensor already failed to compile
  }
}

/// What a tensor's elements are: bytes per element (element_format_bytes) plus 256 x a code the
/// traits choose (0 for a compile-time value_type, whose format is its size). Two tensors of
/// one type hold the same element type exactly when their formats are equal.
template <class T>
std::int64_t element_format_of(const T& t) {
  detail::payload::require_tensor<T>();
  if constexpr (runtime_element_type<T>) {
    return payload_traits<T>::element_format(t);
  } else if constexpr (static_element_type<T>) {
    return static_element_format_v<typename payload_traits<T>::value_type>;
  } else {
    return 0;
  }
}

/// A new zero-filled tensor of `shape` holding elements of `format` (as element_format_of
/// gave it for a tensor of type T).
template <class T>
T tensor_allocate(std::span<const std::int64_t> shape, std::int64_t format) {
  detail::payload::require_tensor<T>();
  if constexpr (runtime_element_type<T>) {
    return payload_traits<T>::allocate(shape, format);
  } else if constexpr (tensor_payload<T>) {
    (void)format;
    return payload_traits<T>::allocate(shape);
  } else {
    std::terminate();  // unreachable: require_tensor already failed to compile
  }
}

/// An owning copy of rows [begin, begin + count) of t along dim (negative dim counts from the end).
template <class T>
T tensor_slice(const T& t, int dim, std::int64_t begin, std::int64_t count) {
  namespace pi = detail::payload;
  pi::require_tensor<T>();
  if constexpr (!tensor_payload<T>) {
    std::terminate();  // unreachable: require_tensor already failed to compile
  } else {
    const auto shape = tensor_shape(t);
    const int d = pi::normalise_dim(dim, shape.size(), "baton::tensor_slice");
    const auto extent = shape[static_cast<std::size_t>(d)];
    if (begin < 0 || count < 0 || begin > extent || count > extent - begin) {
      throw payload_error("baton::tensor_slice: rows " + pi::row_range_text(begin, count) + " along dim " +
                          std::to_string(d) +
                          " are outside a tensor of shape " + detail::core::shape_text(shape));
    }
    return payload_traits<T>::slice(t, d, begin, count);
  }
}

}  // namespace baton
