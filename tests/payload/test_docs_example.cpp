// The examples of docs/payloads.md and of the comment of baton/payload/constant.hpp, compiled
// and run. Each block between "// [doc:NAME]" and "// [/doc:NAME]" is shown verbatim in a
// document (ctest -L docs checks it).
#include "catch.hpp"

#include <baton/payload.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

// The declarations the page sketches, compiled in a namespace of their own and checked
// against the library's.
namespace sketch {
// [doc:payload_role]
enum class payload_role { activation, constant, opaque };
template <class T> struct payload_traits;  // specialise it for each leaf type
// [/doc:payload_role]

using baton::row_range;

template <class P>
struct microbatch_functions {
  // [doc:microbatch_signatures]
  std::vector<P> split_microbatches(const P& p, std::int64_t chunks, int dim = 0);
  P merge_microbatches(std::span<const P> parts, int dim = 0);   // also const std::vector<P>&
  std::vector<std::int64_t> microbatch_sizes(std::int64_t extent, std::int64_t chunks);
  std::vector<row_range> microbatch_bounds(std::int64_t extent, std::int64_t chunks);  // {begin, count}
  // [/doc:microbatch_signatures]
};
}  // namespace sketch

static_assert(static_cast<int>(sketch::payload_role::activation) == static_cast<int>(baton::payload_role::activation));
static_assert(static_cast<int>(sketch::payload_role::constant) == static_cast<int>(baton::payload_role::constant));
static_assert(static_cast<int>(sketch::payload_role::opaque) == static_cast<int>(baton::payload_role::opaque));

namespace {
using sketched_tensor = baton::host_tensor<float>;
using sketched = sketch::microbatch_functions<sketched_tensor>;
template <class... A>
using split_of_sketch = decltype(std::declval<sketched&>().split_microbatches(std::declval<A>()...));
template <class... A>
using split_of_baton = decltype(baton::split_microbatches(std::declval<A>()...));
template <class... A>
using merge_of_sketch = decltype(std::declval<sketched&>().merge_microbatches(std::declval<A>()...));
template <class... A>
using merge_of_baton = decltype(baton::merge_microbatches(std::declval<A>()...));
// The same results for the same arguments, with and without the defaulted dim.
static_assert(std::is_same_v<split_of_sketch<const sketched_tensor&, std::int64_t>,
                             split_of_baton<const sketched_tensor&, std::int64_t>>);
static_assert(std::is_same_v<split_of_sketch<const sketched_tensor&, std::int64_t, int>,
                             split_of_baton<const sketched_tensor&, std::int64_t, int>>);
static_assert(std::is_same_v<merge_of_sketch<std::span<const sketched_tensor>>,
                             merge_of_baton<std::span<const sketched_tensor>>>);
static_assert(std::is_same_v<merge_of_sketch<std::span<const sketched_tensor>, int>,
                             merge_of_baton<std::span<const sketched_tensor>, int>>);
static_assert(std::is_same_v<merge_of_baton<const std::vector<sketched_tensor>&>, sketched_tensor>);
static_assert(std::is_same_v<decltype(std::declval<sketched&>().microbatch_sizes(std::int64_t{}, std::int64_t{})),
                             decltype(baton::microbatch_sizes(std::int64_t{}, std::int64_t{}))>);
static_assert(std::is_same_v<decltype(std::declval<sketched&>().microbatch_bounds(std::int64_t{}, std::int64_t{})),
                             decltype(baton::microbatch_bounds(std::int64_t{}, std::int64_t{}))>);
}  // namespace

// [doc:matrix]
// A user's own tensor type: a dense row-major matrix of floats.
namespace mylib {
struct matrix {
  std::int64_t rows = 0, cols = 0;
  std::vector<float> data;  // rows * cols, row-major
};
}  // namespace mylib

template <>
struct baton::payload_traits<mylib::matrix> {
  static constexpr payload_role role = payload_role::activation;  // it carries gradients
  using value_type = float;
  using matrix = mylib::matrix;

  static std::vector<std::int64_t> shape(const matrix& m) { return {m.rows, m.cols}; }
  static std::span<const std::byte> bytes(const matrix& m) { return std::as_bytes(std::span(m.data)); }
  static std::span<std::byte> mutable_bytes(matrix& m) { return std::as_writable_bytes(std::span(m.data)); }

  static matrix allocate(std::span<const std::int64_t> s) {
    return {s[0], s[1], std::vector<float>(static_cast<std::size_t>(s[0] * s[1]))};  // zero-filled
  }
  static matrix allocate_like(const matrix& m) { return allocate(shape(m)); }

  // An owning copy of rows or columns [begin, begin + count). baton checks dim and the range
  // before calling (split_microbatches, tensor_slice), so this only copies.
  static matrix slice(const matrix& m, int dim, std::int64_t begin, std::int64_t count) {
    matrix out = dim == 0 ? allocate(std::vector<std::int64_t>{count, m.cols})
                          : allocate(std::vector<std::int64_t>{m.rows, count});
    for (std::int64_t r = 0; r < out.rows; ++r)
      for (std::int64_t c = 0; c < out.cols; ++c)
        out.data[static_cast<std::size_t>(r * out.cols + c)] =
            dim == 0 ? m.data[static_cast<std::size_t>((r + begin) * m.cols + c)]
                     : m.data[static_cast<std::size_t>(r * m.cols + c + begin)];
    return out;
  }

  // baton checks that the parts agree on the other extent before calling.
  static matrix concat(std::span<const matrix> parts, int dim) {
    matrix out = parts[0];
    for (std::size_t p = 1; p < parts.size(); ++p) {
      const matrix& next = parts[p];
      if (dim == 0) {
        out.data.insert(out.data.end(), next.data.begin(), next.data.end());
        out.rows += next.rows;
      } else {
        matrix wide = allocate(std::vector<std::int64_t>{out.rows, out.cols + next.cols});
        for (std::int64_t r = 0; r < out.rows; ++r)
          for (std::int64_t c = 0; c < wide.cols; ++c)
            wide.data[static_cast<std::size_t>(r * wide.cols + c)] =
                c < out.cols ? out.data[static_cast<std::size_t>(r * out.cols + c)]
                             : next.data[static_cast<std::size_t>(r * next.cols + c - out.cols)];
        out = std::move(wide);
      }
    }
    return out;
  }
};

static_assert(baton::tensor_payload<mylib::matrix>);  // check the adapter where you write it
// [/doc:matrix]

// [doc:opaque]
// A value that is not a tensor: opaque. It splits along the batch with its own hook, so each
// microbatch gets the rows it covers; without a split hook it would be copied to each one.
namespace mylib {
struct doc_mask {
  std::vector<int> allowed_per_row;
};
}  // namespace mylib

template <>
struct baton::payload_traits<mylib::doc_mask> {
  static constexpr payload_role role = payload_role::opaque;
  static mylib::doc_mask split(const mylib::doc_mask& m, std::int64_t chunk, std::int64_t chunks) {
    const auto rows = baton::microbatch_bounds(static_cast<std::int64_t>(m.allowed_per_row.size()), chunks);
    const auto first = m.allowed_per_row.begin() + rows[static_cast<std::size_t>(chunk)].begin;
    return {{first, first + rows[static_cast<std::size_t>(chunk)].count}};
  }
  static mylib::doc_mask merge(std::span<const mylib::doc_mask> parts) {
    mylib::doc_mask out;
    for (const auto& p : parts) out.allowed_per_row.insert(out.allowed_per_row.end(), p.allowed_per_row.begin(), p.allowed_per_row.end());
    return out;
  }
};
// [/doc:opaque]

TEST_CASE("docs/payloads.md: records, roles, grad_t and microbatches", "[payload][docs]") {
  // [doc:record]
  using baton::constant;
  using baton::field;
  using baton::get;
  using baton::host_tensor;
  using baton::record;

  using block_input = record<field<"hidden", mylib::matrix>,                  // activation
                             field<"positions", constant<host_tensor<std::int64_t>>>,  // no gradient
                             field<"mask", mylib::doc_mask>>;                 // opaque

  block_input x{mylib::matrix{4, 2, {0, 1, 2, 3, 4, 5, 6, 7}},
                constant{host_tensor<std::int64_t>({4}, {0, 1, 2, 3})},
                mylib::doc_mask{{1, 2, 3, 4}}};

  // The gradient of a block_input holds "hidden" only.
  static_assert(std::is_same_v<baton::grad_t<block_input>, record<field<"hidden", mylib::matrix>>>);

  // Four rows into three microbatches: 2 + 1 + 1 rows, the mask cut the same way.
  std::vector<block_input> mbs = baton::split_microbatches(x, 3);
  // get<"hidden">(mbs[0]).rows == 2, get<"mask">(mbs[2]).allowed_per_row == {4}

  // Visit what a backward pass touches: the activations only.
  std::vector<std::string_view> differentiated;
  baton::for_each_activation(mbs[0], [&](auto info, const auto& /*tensor*/) {
    differentiated.push_back(info.name);  // info.role == baton::payload_role::activation
  });
  // differentiated == {"hidden"}: backward never sees the positions or the mask

  block_input again = baton::merge_microbatches(mbs);
  // [/doc:record]

  CHECK(get<"hidden">(mbs[0]).rows == 2);
  CHECK(get<"hidden">(mbs[2]).data == std::vector<float>{6, 7});
  CHECK(get<"mask">(mbs[2]).allowed_per_row == std::vector<int>{4});
  CHECK(get<"positions">(mbs[1])->values()[0] == 2);
  CHECK(get<"hidden">(again).data == get<"hidden">(x).data);
  CHECK(get<"mask">(again).allowed_per_row == std::vector<int>{1, 2, 3, 4});
  CHECK(differentiated == std::vector<std::string_view>{"hidden"});

  const auto by_column = baton::split_microbatches(get<"hidden">(x), 2, 1);
  CHECK(by_column[1].data == std::vector<float>{1, 3, 5, 7});
  CHECK(baton::merge_microbatches(by_column, 1).data == get<"hidden">(x).data);

  // [doc:host_tensor]
  host_tensor<float> a({2, 3});                              // zero-filled
  host_tensor<float> b({2, 2}, {1, 2, 3, 4});                // values in row-major order
  auto c = host_tensor<double>::filled({4}, 1.0);            // every element 1.0
  auto d = host_tensor<float>::for_overwrite({1024, 64});    // uninitialised: a buffer to fill
  a(1, 2) = 5;                                               // unchecked multi-index
  a.at(1, 2) += b[3];                                        // checked (throws), flat index
  // a.shape() == {2, 3}, a.rank() == 2, a.size() == 6, a.extent(-1) == 3, a.values()[5] == 9
  // [/doc:host_tensor]
  CHECK(a.values()[5] == 9.f);
  CHECK(a.extent(-1) == 3);
  CHECK(c[3] == 1.0);
  CHECK(d.size() == 1024 * 64);

  // [doc:boundary]
  // What crosses a stage boundary must be sendable: tensors only. The mask is a side input.
  using block_boundary = record<field<"hidden", mylib::matrix>, field<"positions", constant<host_tensor<std::int64_t>>>>;
  static_assert(baton::sendable_payload<block_boundary>);
  static_assert(!baton::sendable_payload<block_input>);
  static_assert(baton::require_sendable<block_boundary>());
  // baton::require_sendable<block_input>() would not compile: "opaque values cannot cross a
  // stage boundary; pass them as a side input".
  // [/doc:boundary]
}

TEST_CASE("docs/payloads.md: visiting tensors", "[payload][docs]") {
  using block_input = baton::record<baton::field<"hidden", mylib::matrix>,
                                    baton::field<"positions", baton::constant<baton::host_tensor<std::int64_t>>>,
                                    baton::field<"mask", mylib::doc_mask>>;
  block_input x{mylib::matrix{2, 2, {0, 1, 2, 3}}, baton::constant{baton::host_tensor<std::int64_t>({2}, {0, 1})},
                mylib::doc_mask{{1, 2}}};
  block_input y = x;
  baton::grad_t<block_input> dx = baton::grad_like(x);
  std::vector<std::string> visited;
  const auto visit_all = [](auto& p, auto& a, auto& b, auto& g, auto f) {
    // [doc:visiting]
    for_each_tensor(p, f);        // activations and constants, in field order; opaque fields skipped
    for_each_activation(p, f);    // exactly the tensors grad_t<P> holds
    for_each_tensor(a, b, f);     // two payloads together, fields paired by name
    for_each_activation(a, g, f); // a's activations with the same-named fields of g (e.g. grad_t)
    // [/doc:visiting]
  };
  // The visitor takes the field's info first, then one tensor (or two for the paired forms).
  visit_all(x, x, y, dx, [&](auto info, const auto&...) { visited.emplace_back(info.name); });
  CHECK(visited == std::vector<std::string>{"hidden", "positions", "hidden", "hidden", "positions", "hidden"});
}

TEST_CASE("baton/payload/constant.hpp: a constant field", "[payload][docs]") {
  using H = baton::host_tensor<float>;
  using P = baton::host_tensor<std::int64_t>;
  const H h({2, 3});
  const P p({2}, {7, 8});
  // [doc:constant_field]
  baton::record<baton::field<"hidden", H>, baton::field<"positions", baton::constant<P>>> r{h, baton::constant{p}};
  // [/doc:constant_field]
  static_assert(std::is_same_v<baton::grad_t<decltype(r)>, baton::record<baton::field<"hidden", H>>>);
  CHECK(baton::get<"positions">(r)->values()[1] == 8);
  // Split like the tensor beside it: the second microbatch holds the second position.
  const auto parts = baton::split_microbatches(r, 2);
  REQUIRE(baton::get<"positions">(parts[1])->size() == 1);
  CHECK(baton::get<"positions">(parts[1])->values()[0] == 8);
}
