// Helpers shared by the payload tests: deterministic tensors and a naive, index-by-index
// oracle for slicing (independent of the row-major block copies under test).
#pragma once

#include <baton/payload.hpp>

#include <cstdint>
#include <vector>

namespace baton_test {

// Element i of a tensor gets a value that is distinct per element and exact in float.
template <class T>
baton::host_tensor<T> iota_tensor(std::vector<std::int64_t> shape, std::int64_t offset = 0) {
  baton::host_tensor<T> t(std::move(shape));
  for (std::int64_t i = 0; i < t.size(); ++i) t[i] = static_cast<T>(i + offset);
  return t;
}

// Multi-index of flat index `flat` in a row-major shape.
inline std::vector<std::int64_t> unravel(std::int64_t flat, const std::vector<std::int64_t>& shape) {
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = flat % shape[d];
    flat /= shape[d];
  }
  return idx;
}

inline std::int64_t ravel(const std::vector<std::int64_t>& idx, const std::vector<std::int64_t>& shape) {
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + idx[d];
  return flat;
}

// The expected slice, element by element: out[idx] = t[idx with idx[dim] += begin].
template <class T>
baton::host_tensor<T> naive_slice(const baton::host_tensor<T>& t, int dim, std::int64_t begin, std::int64_t count) {
  auto shape = t.shape();
  shape[static_cast<std::size_t>(dim)] = count;
  baton::host_tensor<T> out(shape);
  for (std::int64_t i = 0; i < out.size(); ++i) {
    auto idx = unravel(i, shape);
    idx[static_cast<std::size_t>(dim)] += begin;
    out[i] = t[ravel(idx, t.shape())];
  }
  return out;
}

template <class T>
bool same_values(const baton::host_tensor<T>& a, const baton::host_tensor<T>& b) {
  if (a.shape() != b.shape()) return false;
  for (std::int64_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return false;  // exact: every value is copied, never computed
  }
  return true;
}

}  // namespace baton_test
