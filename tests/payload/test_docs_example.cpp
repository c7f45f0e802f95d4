// The examples of docs/payloads.md, compiled and run. Keep the two in step: each block between
// "// [doc:NAME]" and "// [/doc:NAME]" appears in the document verbatim.
#include "catch.hpp"

#include <baton/payload.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

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
    const auto sizes = baton::microbatch_sizes(static_cast<std::int64_t>(m.allowed_per_row.size()), chunks);
    std::int64_t begin = 0;
    for (std::int64_t c = 0; c < chunk; ++c) begin += sizes[static_cast<std::size_t>(c)];
    const auto first = m.allowed_per_row.begin() + begin;
    return {{first, first + sizes[static_cast<std::size_t>(chunk)]}};
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
