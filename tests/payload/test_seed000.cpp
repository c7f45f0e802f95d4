// Seed 000: FlexAttention's BlockMask, forwarded to every pipeline stage beside the hidden
// states and positions, crashed split-backward schedules, which asked every stage input for
// requires_grad. Here the same stage input is a record whose roles are known at compile time:
// the block mask is opaque, so it is split by its own trait, never visited as a tensor, and
// absent from the gradient type, so no backward can name it.
#include "catch.hpp"
#include "payload_test_types.hpp"
#include "payload_test_util.hpp"

#include <baton/payload.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

using namespace baton;
using baton_test::block_mask_like;
using baton_test::iota_tensor;
using baton_test::same_values;

using flex_input = record<field<"hidden", host_tensor<float>>,                    // activation [batch, dim]
                          field<"positions", constant<host_tensor<std::int64_t>>>,  // constant [batch, seq]
                          field<"block_mask", block_mask_like>>;                    // opaque, per batch row

TEST_CASE("seed 000: the gradient of a payload holding a block mask has only the activation",
          "[payload][seed000]") {
  STATIC_REQUIRE(std::is_same_v<grad_t<flex_input>, record<field<"hidden", host_tensor<float>>>>);
  STATIC_REQUIRE_FALSE(has_field_v<grad_t<flex_input>, "block_mask">);
  STATIC_REQUIRE_FALSE(has_field_v<grad_t<flex_input>, "positions">);
  // The mask may not travel through the pipe; it is a side input.
  STATIC_REQUIRE_FALSE(sendable_payload<flex_input>);
  STATIC_REQUIRE(sendable_payload<record<field<"hidden", host_tensor<float>>, field<"positions", constant<host_tensor<std::int64_t>>>>>);
}

TEST_CASE("seed 000: microbatching splits the block mask by its trait", "[payload][seed000]") {
  const std::int64_t batch = 5;
  flex_input x{iota_tensor<float>({batch, 4}), constant{iota_tensor<std::int64_t>({batch, 3})},
               block_mask_like{{10, 11, 12, 13, 14}, 64}};

  const auto parts = split_microbatches(x, 2);
  REQUIRE(parts.size() == 2);
  // The tensors are cut 3 + 2 rows; the mask hook received (chunk, chunks) and cut the same rows.
  CHECK(get<"block_mask">(parts[0]).kv_blocks_per_row == std::vector<std::int64_t>{10, 11, 12});
  CHECK(get<"block_mask">(parts[1]).kv_blocks_per_row == std::vector<std::int64_t>{13, 14});
  CHECK(get<"block_mask">(parts[0]).split_chunk == 0);
  CHECK(get<"block_mask">(parts[1]).split_chunk == 1);
  CHECK(get<"block_mask">(parts[1]).block_size == 64);
  CHECK(get<"hidden">(parts[1]).shape() == std::vector<std::int64_t>{2, 4});
  CHECK(get<"positions">(parts[1])->at(0, 0) == 9);  // row 3 of the batch

  // Backward visits only activations: the mask and the positions are never touched.
  for (const auto& mb : parts) {
    std::vector<std::string> differentiated;
    for_each_activation(mb, [&](auto info, const auto&) { differentiated.emplace_back(info.name); });
    CHECK(differentiated == std::vector<std::string>{"hidden"});
    std::vector<std::string> tensors;
    for_each_tensor(mb, [&](auto info, const auto&) { tensors.emplace_back(info.name); });
    CHECK(tensors == std::vector<std::string>{"hidden", "positions"});
    const auto g = grad_like(mb);
    CHECK(get<"hidden">(g).shape() == get<"hidden">(mb).shape());
  }

  const auto merged = merge_microbatches(parts);
  CHECK(same_values(get<"hidden">(merged), get<"hidden">(x)));
  CHECK(same_values(get<"positions">(merged).value, get<"positions">(x).value));
  CHECK(get<"block_mask">(merged).kv_blocks_per_row == get<"block_mask">(x).kv_blocks_per_row);
}
