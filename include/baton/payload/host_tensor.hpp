// baton/payload/host_tensor.hpp — a small owning, row-major host tensor and its payload_traits.
//
// It is the tensor of baton's tests, examples and reference layers; real models bring their
// own tensor type (Kokkos::View through baton/payload/kokkos.hpp, or any type given
// payload_traits, see docs/payloads.md).
#pragma once

#include <baton/core/block_cache.hpp>
#include <baton/payload/detail/row_major.hpp>
#include <baton/payload/row_major.hpp>
#include <baton/payload/traits.hpp>

#include <algorithm>
#include <concepts>
#include <initializer_list>
#include <memory>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// An owning, contiguous, row-major tensor of float, double, std::int32_t or std::int64_t.
///
/// The shape is fixed at construction; a shape of {} is a scalar (one element), and the
/// default-constructed tensor has shape {0} (no elements). There is deliberately no
/// operator==: compare values() explicitly, with the tolerance your test justifies.
///
/// The elements are 64-byte aligned. A tensor of 64 KiB or more keeps its memory, once
/// destroyed, in a cache of the destroying thread for the next tensor of its size class, so
/// a training step after the first does not fault in fresh pages (baton/core/block_cache.hpp;
/// host_tensor_cache_release() and host_tensor_cache_limit() control it). The bytes a thread's
/// tensors hold are counted: host_tensor_memory().
template <class T>
class host_tensor {
  static_assert(detail::payload::own_tensor_element_v<T>,
                "baton::host_tensor<T> holds float, double, std::int32_t, std::int64_t or baton::bfloat16; for "
                "other element types use your own tensor type with payload_traits");

 public:
  using value_type = T;

  host_tensor() : shape_{0} {}

  /// A zero-filled tensor of the given shape (throws baton::payload_error on a negative extent,
  /// or when the shape's element count or size in bytes overflows).
  explicit host_tensor(std::vector<std::int64_t> shape) : host_tensor(std::move(shape), for_overwrite_tag{}) {
    std::fill_n(values_.get(), size_, T{});
  }

  /// A tensor holding `values` in row-major order; their number must match the shape.
  host_tensor(std::vector<std::int64_t> shape, std::span<const T> values)
      : host_tensor(std::move(shape), for_overwrite_tag{}) {
    if (static_cast<std::int64_t>(values.size()) != size_) {
      throw payload_error("baton::host_tensor: shape " + detail::core::shape_text(shape_) +
                          " holds " + std::to_string(size_) + " elements but " +
                          std::to_string(values.size()) + " values were given");
    }
    std::copy(values.begin(), values.end(), values_.get());
  }
  host_tensor(std::vector<std::int64_t> shape, std::initializer_list<T> values)
      : host_tensor(std::move(shape), std::span<const T>(values.begin(), values.size())) {}

  /// A tensor of the given shape with every element equal to `value`.
  static host_tensor filled(std::vector<std::int64_t> shape, T value) {
    host_tensor t(std::move(shape), for_overwrite_tag{});
    std::fill_n(t.values_.get(), t.size_, value);
    return t;
  }

  /// A tensor whose elements are indeterminate until written (a buffer about to be overwritten
  /// by a copy or a receive): saves the zero-fill of the other constructors.
  static host_tensor for_overwrite(std::vector<std::int64_t> shape) {
    return host_tensor(std::move(shape), for_overwrite_tag{});
  }

  host_tensor(const host_tensor& other) : host_tensor(other.shape_, for_overwrite_tag{}) {
    std::copy_n(other.values_.get(), size_, values_.get());
  }
  host_tensor(host_tensor&& other) noexcept
      : shape_(std::exchange(other.shape_, std::vector<std::int64_t>{0})),
        size_(std::exchange(other.size_, 0)),
        values_(std::move(other.values_)) {}
  host_tensor& operator=(const host_tensor& other) {
    if (this != &other) *this = host_tensor(other);
    return *this;
  }
  host_tensor& operator=(host_tensor&& other) noexcept {
    shape_ = std::exchange(other.shape_, std::vector<std::int64_t>{0});
    size_ = std::exchange(other.size_, 0);
    values_ = std::move(other.values_);
    return *this;
  }
  ~host_tensor() = default;

  const std::vector<std::int64_t>& shape() const noexcept { return shape_; }
  int rank() const noexcept { return static_cast<int>(shape_.size()); }
  /// Extent along dim d (negative d counts from the end); throws when d is out of range.
  std::int64_t extent(int d) const {
    return shape_[static_cast<std::size_t>(
        detail::payload::normalise_dim(d, shape_.size(), "baton::host_tensor::extent"))];
  }
  /// Number of elements.
  std::int64_t size() const noexcept { return size_; }

  T* data() noexcept { return values_.get(); }
  const T* data() const noexcept { return values_.get(); }
  std::span<T> values() noexcept { return {values_.get(), static_cast<std::size_t>(size_)}; }
  std::span<const T> values() const noexcept { return {values_.get(), static_cast<std::size_t>(size_)}; }

  /// Element by flat (row-major) index, unchecked.
  T& operator[](std::int64_t flat) noexcept { return values_.get()[static_cast<std::size_t>(flat)]; }
  const T& operator[](std::int64_t flat) const noexcept { return values_.get()[static_cast<std::size_t>(flat)]; }

  /// Element by multi-index, unchecked (one index per dimension). Use at() for checked access.
  template <std::integral... I>
  T& operator()(I... index) noexcept {
    return values_.get()[static_cast<std::size_t>(offset_unchecked(index...))];
  }
  template <std::integral... I>
  const T& operator()(I... index) const noexcept {
    return values_.get()[static_cast<std::size_t>(offset_unchecked(index...))];
  }

  /// Element by multi-index; throws baton::payload_error on a wrong index count or range.
  template <std::integral... I>
  T& at(I... index) {
    return values_.get()[static_cast<std::size_t>(offset_checked(index...))];
  }
  template <std::integral... I>
  const T& at(I... index) const {
    return values_.get()[static_cast<std::size_t>(offset_checked(index...))];
  }

  void fill(T value) { std::fill_n(values_.get(), size_, value); }

 private:
  struct for_overwrite_tag {};
  host_tensor(std::vector<std::int64_t> shape, for_overwrite_tag)
      : shape_(std::move(shape)),
        size_(detail::payload::checked_element_count(shape_, "baton::host_tensor", sizeof(T))),
        values_(static_cast<std::size_t>(size_)) {}

  template <class... I>
  std::int64_t offset_unchecked(I... index) const noexcept {
    std::int64_t offset = 0;
    std::size_t d = 0;
    ((offset = offset * shape_[d++] + static_cast<std::int64_t>(index)), ...);
    return offset;
  }

  template <class... I>
  std::int64_t offset_checked(I... index) const {
    if (sizeof...(I) != shape_.size()) {
      throw payload_error("baton::host_tensor::at: " + std::to_string(sizeof...(I)) +
                          " indices for a tensor of rank " + std::to_string(shape_.size()));
    }
    const std::int64_t idx[] = {static_cast<std::int64_t>(index)..., 0};
    for (std::size_t d = 0; d < shape_.size(); ++d) {
      if (idx[d] < 0 || idx[d] >= shape_[d]) {
        throw payload_error("baton::host_tensor::at: index " + std::to_string(idx[d]) + " along dim " +
                            std::to_string(d) + " is outside a tensor of shape " +
                            detail::core::shape_text(shape_));
      }
    }
    return offset_unchecked(index...);
  }

  std::vector<std::int64_t> shape_;
  std::int64_t size_ = 0;
  detail::core::cached_array<T> values_;
};

/// Frees the tensor memory the calling thread keeps for reuse (baton/core/block_cache.hpp).
inline void host_tensor_cache_release() noexcept { detail::core::block_cache::release(); }
/// The most bytes of freed tensor memory each thread keeps for reuse (default 1 GiB; 0: none).
inline void host_tensor_cache_limit(std::size_t bytes) noexcept { detail::core::block_cache::set_limit(bytes); }

/// The bytes of host_tensor elements (and baton's other host arrays) the calling thread has
/// allocated and not freed yet, wherever they are freed; and the most since the thread began
/// or host_tensor_memory_reset_peak(). Where ranks are threads, a rank's own memory.
struct host_memory_use {
  std::int64_t live = 0;
  std::int64_t peak = 0;
};
inline host_memory_use host_tensor_memory() {
  const auto meter = detail::core::memory_meter::of_this_thread();
  return meter ? host_memory_use{meter->live(), meter->peak()} : host_memory_use{};
}
/// Starts the calling thread's peak again from what it holds now.
inline void host_tensor_memory_reset_peak() {
  if (const auto meter = detail::core::memory_meter::of_this_thread()) meter->reset_peak();
}

/// host_tensor is an activation tensor; row_major_payload_traits supplies bytes, slice and
/// concat from the four members below.
template <class T>
struct payload_traits<host_tensor<T>> : row_major_payload_traits<host_tensor<T>> {
  using value_type = T;
  using tensor = host_tensor<T>;

  static const std::vector<std::int64_t>& shape(const tensor& t) noexcept { return t.shape(); }
  static const T* data(const tensor& t) noexcept { return t.data(); }
  static T* data(tensor& t) noexcept { return t.data(); }

  static tensor allocate(std::span<const std::int64_t> shape) {
    return tensor(std::vector<std::int64_t>(shape.begin(), shape.end()));
  }
  static tensor allocate_for_overwrite(std::span<const std::int64_t> shape) {
    return tensor::for_overwrite(std::vector<std::int64_t>(shape.begin(), shape.end()));
  }
};

}  // namespace baton
