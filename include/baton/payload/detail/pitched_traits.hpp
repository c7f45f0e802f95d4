// baton/payload/detail/pitched_traits.hpp — the payload_traits of a row-major tensor whose
// storage the host cannot touch (device memory): everything a tensor needs, written against
// a tensor type and a copier, so that the CPU tests run the very code the device tensor uses
// (with host memory and run_on_host as the copier).
//
// Tensor needs: value_type; shape() -> const std::vector<std::int64_t>&; data() (const and
// not); bytes_size(); an explicit Tensor(std::vector<std::int64_t>) that zero-fills;
// static for_overwrite(std::vector<std::int64_t>); to_host() -> std::vector<value_type> and
// copy_from_host(std::span<const value_type>).
// Copier needs: static void run(std::span<const pitched_copy>, std::span<const std::byte* const>
// sources, std::byte* dst, const std::string& what) — every copy done when it returns.
#pragma once

#include <baton/payload/detail/pitched_copies.hpp>
#include <baton/payload/detail/row_major.hpp>
#include <baton/payload/traits.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <vector>

namespace baton::detail::payload {

template <class Tensor, class Copier>
struct pitched_payload_traits {
  using tensor = Tensor;
  using value_type = typename Tensor::value_type;
  static constexpr payload_role role = payload_role::activation;
  // The executor neither memcpy's these bytes into a message nor scales them in a host loop.
  static constexpr bool host_accessible = false;

  static const std::vector<std::int64_t>& shape(const tensor& t) noexcept { return t.shape(); }
  static std::span<const std::byte> bytes(const tensor& t) noexcept {
    return {reinterpret_cast<const std::byte*>(t.data()), t.bytes_size()};
  }
  static std::span<std::byte> mutable_bytes(tensor& t) noexcept {
    return {reinterpret_cast<std::byte*>(t.data()), t.bytes_size()};
  }
  static tensor allocate(std::span<const std::int64_t> shape) {
    return tensor(std::vector<std::int64_t>(shape.begin(), shape.end()));
  }
  static tensor allocate_like(const tensor& t) { return tensor(t.shape()); }

  static tensor slice(const tensor& t, int dim, std::int64_t begin, std::int64_t count) {
    const auto [d, out_shape] = checked_slice_shape(t.shape(), dim, begin, count, "baton device tensor slice");
    tensor out = tensor::for_overwrite(out_shape);
    const pitched_copy copy = slice_copy(t.shape(), d, begin, count, sizeof(value_type));
    const std::byte* source = bytes(t).data();
    Copier::run(std::span(&copy, 1), std::span(&source, 1), mutable_bytes(out).data(), "baton device tensor slice");
    return out;
  }

  static tensor concat(std::span<const tensor> parts, int dim) { return concat_pointers(pointers_to(parts), dim); }

  static tensor concat_pointers(std::span<const tensor* const> parts, int dim) {
    const concat_sources in = sources_of<pitched_payload_traits>(parts);
    const auto [d, out_shape] = concat_shape(in.shapes, dim, "baton device tensor concat");
    tensor out = tensor::for_overwrite(out_shape);
    const auto copies = concat_copies(in.shapes, d, out_shape, sizeof(value_type));
    Copier::run(copies, in.data, mutable_bytes(out).data(), "baton device tensor concat");
    return out;
  }

  /// The executor's loss scaling of a loss gradient (once per microbatch). A host round trip:
  /// the gradient of a loss is small, and it keeps kernels out of headers g++ compiles.
  static void scale(tensor& t, double factor)
    requires std::is_floating_point_v<value_type>
  {
    std::vector<value_type> values = t.to_host();
    const auto f = static_cast<value_type>(factor);
    for (auto& v : values) v *= f;
    t.copy_from_host(values);
  }
};

}  // namespace baton::detail::payload
