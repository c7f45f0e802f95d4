// baton/cp/detail/view4.hpp — the strided 4-D view the CP layer's data movement works on.
#pragma once

#include <array>
#include <cstdint>

namespace baton::detail::cp {

// A strided 4-D view [batch, seq, heads, inner]. The LSE [batch, heads, seq] is viewed as
// [batch, seq, heads, 1] with swapped strides, so one set of transforms serves both.
template <class T>
struct view4 {
  T* data = nullptr;
  std::array<std::int64_t, 4> ext{};
  std::array<std::int64_t, 4> str{};

  T& operator()(std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t x) const noexcept {
    return data[b * str[0] + s * str[1] + h * str[2] + x * str[3]];
  }
  std::int64_t size() const noexcept { return ext[0] * ext[1] * ext[2] * ext[3]; }
  view4<const T> as_const() const noexcept { return {data, ext, str}; }
  // The single batch entry `b`, as a view of batch extent 1.
  view4 batch_slice(std::int64_t b) const noexcept {
    view4 v = *this;
    v.data = data + b * str[0];
    v.ext[0] = 1;
    return v;
  }
  // The heads [begin, begin + count).
  view4 head_slice(std::int64_t begin, std::int64_t count) const noexcept {
    view4 v = *this;
    v.data = data + begin * str[2];
    v.ext[2] = count;
    return v;
  }
  // The rows [begin, begin + count) of the sequence axis.
  view4 seq_slice(std::int64_t begin, std::int64_t count) const noexcept {
    view4 v = *this;
    v.data = data + begin * str[1];
    v.ext[1] = count;
    return v;
  }
};

template <class T>
view4<T> bshd(T* p, std::int64_t b, std::int64_t s, std::int64_t h, std::int64_t d) noexcept {
  return {p, {b, s, h, d}, {s * h * d, h * d, d, 1}};
}

// A contiguous LSE [b, h, s] seen as [b, s, h, 1].
template <class T>
view4<T> lse_as_bshd(T* p, std::int64_t b, std::int64_t h, std::int64_t s) noexcept {
  return {p, {b, s, h, 1}, {h * s, 1, s, 1}};
}

}  // namespace baton::detail::cp
