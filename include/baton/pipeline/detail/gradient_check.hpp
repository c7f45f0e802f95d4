// baton/pipeline/detail/gradient_check.hpp — the checks that keep a wrong gradient or target
// from being passed on: a gradient has the shape and element type of the activation it
// belongs to, and the target has the batch's rows.
//
// A stage whose backward returns a [3, 3] gradient for a [2, 3] input would otherwise hand it
// to the previous stage, whose backward trusts its own output's shape and reads past the end
// of it. Each check runs once per gradient (per field and microbatch), never per element.
#pragma once

#include <baton/core/sizes.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/traits.hpp>
#include <baton/payload/visit.hpp>
#include <baton/pipeline/detail/extents.hpp>

#include <cstddef>
#include <cstdint>
#include <ranges>
#include <string>
#include <string_view>
#include <type_traits>

namespace baton::detail::pipeline {

// "" when every activation tensor of `activation` has a gradient in `grad` of the same shape
// whose storage holds exactly that many elements of its element type; otherwise a sentence
// saying which gradient differs and how. `producer` says who made the gradient ("the stage's
// backward", "the loss") and `side` whose activation it is ("input", "output").
template <class P>
std::string gradient_mismatch(const P& activation, const grad_t<P>& grad, std::string_view producer,
                              std::string_view side) {
  std::string problem;
  for_each_activation(activation, grad, [&](auto info, const auto& a, const auto& g) {
    if (!problem.empty()) return;
    // The words of a message are only built for a gradient that is wrong: this runs for every
    // gradient of every microbatch.
    const auto which = [&] {
      return info.name.empty() ? "the " + std::string(side) + " gradient"
                               : "the gradient of " + std::string(side) + " field \"" + std::string(info.name) + "\"";
    };
    const bool same_shape = with_extents(a, [&](const auto& expected) {
      return with_extents(g, [&](const auto& got) { return std::ranges::equal(expected, got); });
    });
    if (!same_shape) {
      const auto expected = tensor_shape(a);
      problem = std::string(producer) + " returned " + which() + " with shape " + core::shape_text(tensor_shape(g)) +
                " but the " + std::string(side) + " activation has shape " + core::shape_text(expected) +
                ": a gradient must have exactly the shape of the activation it belongs to; return one of shape " +
                core::shape_text(expected);
      return;
    }
    const std::int64_t format = element_format_of(g);
    const std::int64_t element_bytes = element_format_bytes(format);
    const auto differs = [&] {
      return " bytes per element: its element type (dtype) differs from the " + std::string(side) +
             " activation's; return a gradient of the activation's element type";
    };
    if (format != element_format_of(a)) {  // only a run-time element type (torch's dtype) can differ here
      problem = std::string(producer) + " returned " + which() + " of element format " + std::to_string(format) +
                " where the activation's is " + std::to_string(element_format_of(a)) + ", at " +
                std::to_string(element_bytes) + differs();
      return;
    }
    std::int64_t needed = 0;
    if (!with_extents(g, [&](const auto& got) { return core::byte_count(got, element_bytes, needed); })) {
      // A shape whose byte count overflows: checked_element_count throws the message that says so.
      needed = core::checked_element_count<payload_error>(tensor_shape(g), which(), static_cast<std::size_t>(element_bytes)) *
               element_bytes;
    }
    const auto held = tensor_bytes(g).size();
    if (held != static_cast<std::size_t>(needed)) {
      problem = std::string(producer) + " returned " + which() + " of shape " + core::shape_text(tensor_shape(g)) +
                " whose storage holds " + std::to_string(held) + " bytes where " + std::to_string(needed) +
                " are needed at " + std::to_string(element_bytes) + differs();
    }
  });
  return problem;
}

// The rows of a payload: the extent along dim 0 (the dim microbatches are cut along) of its
// first tensor, or -1 when it holds no tensor of rank 1 or more.
template <class P>
std::int64_t leading_rows(const P& p) {
  std::int64_t rows = -1;
  for_each_tensor(p, [&](const auto& t) {
    if (rows >= 0) return;
    const auto shape = tensor_shape(t);
    if (!shape.empty()) rows = shape[0];
  });
  return rows;
}

// "" when the target can be cut like the batch (same rows, or either has no tensor),
// otherwise the reason. Microbatch i of the target is the loss target of microbatch i of the
// batch, so different row counts would pair rows that do not belong together.
inline std::string target_rows_mismatch(std::int64_t batch_rows, std::int64_t target_rows, int microbatches) {
  if (batch_rows < 0 || target_rows < 0 || batch_rows == target_rows) return {};
  return "the target has " + std::to_string(target_rows) + " rows but the batch has " + std::to_string(batch_rows) +
         ": both are cut into " + std::to_string(microbatches) +
         " microbatches along dim 0 and microbatch i of the target is the loss target of microbatch i of the "
         "batch, so they must have the same number of rows; pass the target that belongs to this batch";
}

}  // namespace baton::detail::pipeline
