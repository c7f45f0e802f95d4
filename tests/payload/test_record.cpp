// Roles, concepts, records of named fields, grad_t and the visitors.
#include "catch.hpp"
#include "payload_test_types.hpp"
#include "payload_test_util.hpp"

#include <baton/payload.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

using namespace baton;
using baton_test::block_mask_like;
using baton_test::iota_tensor;
using baton_test::run_config;
using baton_test::scalar_loss;
using baton_test::tensor_without_operations;

using hidden_t = host_tensor<float>;
using index_t = host_tensor<std::int64_t>;
using stage_input =
    record<field<"hidden", hidden_t>, field<"positions", constant<index_t>>, field<"residual", host_tensor<double>>>;
using with_mask = record<field<"hidden", hidden_t>, field<"mask", block_mask_like>>;

struct not_a_payload {};

TEST_CASE("roles and concepts classify types at compile time", "[payload][concepts]") {
  STATIC_REQUIRE(payload_role_v<hidden_t> == payload_role::activation);
  STATIC_REQUIRE(payload_role_v<constant<hidden_t>> == payload_role::constant);
  STATIC_REQUIRE(payload_role_v<block_mask_like> == payload_role::opaque);

  STATIC_REQUIRE(tensor_payload<hidden_t>);
  STATIC_REQUIRE(tensor_payload<index_t>);
  STATIC_REQUIRE(tensor_payload<constant<index_t>>);
  STATIC_REQUIRE(tensor_payload<scalar_loss>);
  STATIC_REQUIRE(activation_tensor<hidden_t>);
  STATIC_REQUIRE_FALSE(activation_tensor<constant<hidden_t>>);
  STATIC_REQUIRE(constant_tensor<constant<hidden_t>>);

  // Deliberately broken or foreign types are rejected, not hard errors.
  STATIC_REQUIRE_FALSE(has_payload_traits<not_a_payload>);
  STATIC_REQUIRE_FALSE(tensor_payload<not_a_payload>);
  STATIC_REQUIRE_FALSE(payload<not_a_payload>);
  STATIC_REQUIRE_FALSE(payload<int>);
  STATIC_REQUIRE(has_payload_traits<tensor_without_operations>);
  STATIC_REQUIRE_FALSE(tensor_payload<tensor_without_operations>);
  STATIC_REQUIRE_FALSE(tensor_payload<block_mask_like>);
  STATIC_REQUIRE(opaque_payload<block_mask_like>);
  STATIC_REQUIRE(splittable_opaque<block_mask_like>);
  STATIC_REQUIRE_FALSE(splittable_opaque<run_config>);
  STATIC_REQUIRE(mergeable_leaf<scalar_loss>);
  STATIC_REQUIRE_FALSE(mergeable_leaf<hidden_t>);
  STATIC_REQUIRE(pointer_concatenable<hidden_t>);
  STATIC_REQUIRE(pointer_concatenable<constant<hidden_t>>);
  STATIC_REQUIRE_FALSE(tensor_payload<const hidden_t>);

  STATIC_REQUIRE(payload<hidden_t>);
  STATIC_REQUIRE(payload<block_mask_like>);
  STATIC_REQUIRE(payload<stage_input>);
  STATIC_REQUIRE(payload<with_mask>);
}

TEST_CASE("sendable_payload: opaque values never cross a stage boundary", "[payload][concepts]") {
  STATIC_REQUIRE(sendable_payload<hidden_t>);
  STATIC_REQUIRE(sendable_payload<constant<index_t>>);
  STATIC_REQUIRE(sendable_payload<stage_input>);
  STATIC_REQUIRE(sendable_payload<record<>>);
  STATIC_REQUIRE_FALSE(sendable_payload<block_mask_like>);
  STATIC_REQUIRE_FALSE(sendable_payload<with_mask>);
  STATIC_REQUIRE_FALSE(sendable_payload<record<field<"config", run_config>>>);
  STATIC_REQUIRE(require_sendable<stage_input>());
  STATIC_REQUIRE(require_sendable<hidden_t>());
}

TEST_CASE("tensor helpers go through the traits", "[payload][concepts]") {
  auto t = iota_tensor<float>({4, 2});
  CHECK(tensor_shape(t) == std::vector<std::int64_t>{4, 2});
  CHECK(tensor_bytes(t).size() == 8 * sizeof(float));
  CHECK(tensor_mutable_bytes(t).data() == reinterpret_cast<std::byte*>(t.data()));
  CHECK(tensor_allocate_like(t).shape() == t.shape());
  auto s = tensor_slice(t, -2, 1, 2);
  CHECK(s.shape() == std::vector<std::int64_t>{2, 2});
  CHECK(s(0, 0) == 2.f);
  CHECK_THROWS_WITH(tensor_slice(t, 0, 3, 2), Catch::Contains("rows [3, 5) along dim 0"));
  CHECK_THROWS_WITH(tensor_slice(t, 2, 0, 1), Catch::Contains("dim 2 is out of range for a tensor of rank 2"));
  constant<hidden_t> c{iota_tensor<float>({3})};
  CHECK(tensor_shape(c) == std::vector<std::int64_t>{3});
  CHECK(tensor_slice(c, 0, 1, 1)->values()[0] == 1.f);
}

TEST_CASE("record: named fields, construction and get", "[payload][record]") {
  STATIC_REQUIRE(stage_input::size == 3);
  STATIC_REQUIRE(stage_input::names[1] == "positions");
  STATIC_REQUIRE(stage_input::index_of("residual") == 2);
  STATIC_REQUIRE(has_field_v<stage_input, "hidden">);
  STATIC_REQUIRE_FALSE(has_field_v<stage_input, "mask">);
  STATIC_REQUIRE(std::is_same_v<field_type_t<stage_input, "positions">, constant<index_t>>);
  STATIC_REQUIRE(record_size_v<const stage_input&> == 3);

  SECTION("from values in declaration order") {
    stage_input x{iota_tensor<float>({2, 3}), constant{iota_tensor<std::int64_t>({2})}, host_tensor<double>({2})};
    CHECK(get<"hidden">(x)(1, 2) == 5.f);
    CHECK(get<"positions">(x)->values()[1] == 1);
    get<"residual">(x)[0] = 2.5;
    const stage_input& cx = x;
    CHECK(get<"residual">(cx)[0] == 2.5);
    STATIC_REQUIRE(std::is_same_v<decltype(get<"hidden">(cx)), const hidden_t&>);
    STATIC_REQUIRE(std::is_same_v<decltype(get<"hidden">(std::move(x))), hidden_t&&>);
  }
  SECTION("from fields, deducing the record type") {
    record r{make_field<"hidden">(iota_tensor<float>({2})), make_field<"mask">(block_mask_like{{1, 2}, 64})};
    STATIC_REQUIRE(std::is_same_v<decltype(r), with_mask>);
    CHECK(get<"mask">(r).block_size == 64);
    CHECK(get<"hidden">(r)[1] == 1.f);
  }
  SECTION("fixed_string") {
    constexpr fixed_string name = "hidden";
    STATIC_REQUIRE(name.view() == "hidden");
    STATIC_REQUIRE(name == fixed_string("hidden"));
    STATIC_REQUIRE_FALSE(name == fixed_string("hid"));
  }
}

TEST_CASE("grad_t keeps only activation fields", "[payload][grad]") {
  STATIC_REQUIRE(std::is_same_v<grad_t<hidden_t>, hidden_t>);
  STATIC_REQUIRE(std::is_same_v<grad_t<const hidden_t&>, hidden_t>);
  STATIC_REQUIRE(std::is_same_v<grad_t<stage_input>,
                                record<field<"hidden", hidden_t>, field<"residual", host_tensor<double>>>>);
  STATIC_REQUIRE(std::is_same_v<grad_t<with_mask>, record<field<"hidden", hidden_t>>>);
  STATIC_REQUIRE(std::is_same_v<grad_t<record<field<"positions", constant<index_t>>>>, record<>>);
  STATIC_REQUIRE(has_gradient_v<hidden_t>);
  STATIC_REQUIRE(has_gradient_v<stage_input>);
  STATIC_REQUIRE_FALSE(has_gradient_v<constant<hidden_t>>);
  STATIC_REQUIRE_FALSE(has_gradient_v<block_mask_like>);

  stage_input x{iota_tensor<float>({2, 3}), constant{iota_tensor<std::int64_t>({2})}, host_tensor<double>({4})};
  get<"residual">(x).fill(3.0);
  auto g = grad_like(x);
  STATIC_REQUIRE(std::is_same_v<decltype(g), grad_t<stage_input>>);
  CHECK(get<"hidden">(g).shape() == std::vector<std::int64_t>{2, 3});
  CHECK(get<"residual">(g).shape() == std::vector<std::int64_t>{4});
  for (auto v : get<"residual">(g).values()) CHECK(v == 0.0);
  CHECK(grad_like(get<"hidden">(x)).size() == 6);
}

TEST_CASE("for_each_tensor and for_each_activation", "[payload][visit]") {
  stage_input x{iota_tensor<float>({2, 3}), constant{iota_tensor<std::int64_t>({2})}, host_tensor<double>({4})};

  SECTION("names, roles and indices in field order") {
    std::vector<std::string> seen;
    for_each_tensor(x, [&](auto info, auto& t) {
      seen.push_back(std::string(info.name) + (info.role == payload_role::constant ? ":c" : ":a") +
                     std::to_string(info.index) + ":" + std::to_string(t.size()));
    });
    CHECK(seen == std::vector<std::string>{"hidden:a0:6", "positions:c1:2", "residual:a2:4"});
    seen.clear();
    for_each_activation(x, [&](auto info, const auto& t) {
      STATIC_REQUIRE(decltype(info)::role == payload_role::activation);
      seen.push_back(std::string(info.name) + ":" + std::to_string(t.size()));
    });
    CHECK(seen == std::vector<std::string>{"hidden:6", "residual:4"});
  }
  SECTION("one-argument visitors, mutation, const payloads") {
    std::int64_t total = 0;
    for_each_tensor(x, [&](auto& t) { total += t.size(); });
    CHECK(total == 12);
    for_each_activation(x, [](auto& t) { t.fill(1); });
    CHECK(get<"hidden">(x)(1, 1) == 1.f);
    CHECK(get<"positions">(x)->values()[1] == 1);  // constant untouched (iota 0, 1)
    const stage_input& cx = x;
    int count = 0;
    for_each_tensor(cx, [&](const auto&) { ++count; });
    CHECK(count == 3);
  }
  SECTION("opaque fields are never visited") {
    with_mask m{iota_tensor<float>({2}), block_mask_like{{1, 1}}};
    int count = 0;
    for_each_tensor(m, [&](auto info, auto&) {
      CHECK(info.name == "hidden");
      ++count;
    });
    CHECK(count == 1);
    block_mask_like lone{};
    for_each_tensor(lone, [&](auto&) { ++count; });
    CHECK(count == 1);
  }
  SECTION("a single tensor is visited once with an empty name") {
    auto t = iota_tensor<float>({3});
    for_each_tensor(t, [](auto info, auto& u) {
      CHECK(info.name.empty());
      CHECK(u.size() == 3);
    });
    constant<hidden_t> c{iota_tensor<float>({5})};
    int activations = 0;
    for_each_activation(c, [&](auto&) { ++activations; });
    CHECK(activations == 0);
    for_each_tensor(c, [](auto info, hidden_t& u) {  // unwrapped to the tensor
      CHECK(info.role == payload_role::constant);
      CHECK(u.size() == 5);
    });
  }
  SECTION("two payloads walked together, paired by name") {
    auto g = grad_like(x);
    for_each_activation(x, g, [](auto info, const auto& value, auto& grad) {
      CHECK(value.shape() == grad.shape());
      grad.fill(static_cast<typename std::remove_cvref_t<decltype(grad)>::value_type>(info.index + 1));
    });
    CHECK(get<"hidden">(g)[0] == 1.f);
    CHECK(get<"residual">(g)[3] == 3.0);
    auto buffer = x;
    for_each_tensor(buffer, [](auto& t) { t.fill(0); });
    for_each_tensor(x, buffer, [](const auto& from, auto& to) {
      std::copy(from.values().begin(), from.values().end(), to.values().begin());
    });
    CHECK(get<"positions">(buffer)->values()[1] == 1);
    CHECK(get<"hidden">(buffer)(1, 2) == get<"hidden">(x)(1, 2));
  }
}
