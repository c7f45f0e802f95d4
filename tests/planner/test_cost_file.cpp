// The cost file: a round trip keeps every number exactly, defaults are what the header says,
// and a malformed file names its line and the problem.
#include <baton/schedule.hpp>

#include "catch.hpp"

#include <cstdio>
#include <filesystem>
#include <string>

TEST_CASE("cost file: a round trip through JSON keeps every value bit for bit", "[planner][cost-file]") {
  baton::cost_file file;
  file.costs.forward = {0.1, 1.0 / 3.0, 2.5e-3, 7};
  file.costs.backward_input = {0.2, 0.3, 0.4, 0.5};
  file.costs.backward_weight = {1e-9};
  file.costs.backward = {0.3, 0.4, 0.5, 0.6};
  file.costs.activation = {1, 2, 3, 4.25};
  file.costs.communication = 1.0 / 7.0;
  file.bytes_per_message = 65536;
  const auto again = baton::cost_file_from_json(baton::to_json(file));
  CHECK(again.costs.forward == file.costs.forward);
  CHECK(again.costs.backward_input == file.costs.backward_input);
  CHECK(again.costs.backward_weight == file.costs.backward_weight);
  CHECK(again.costs.backward == file.costs.backward);
  CHECK(again.costs.activation == file.costs.activation);
  CHECK(again.costs.communication == file.costs.communication);
  CHECK(again.bytes_per_message == file.bytes_per_message);

  const auto path = std::filesystem::temp_directory_path() / "baton_planner_cost_file_test.json";
  baton::save_cost_file(file, path.string());
  CHECK(baton::load_cost_file(path.string()).costs.forward == file.costs.forward);
  std::filesystem::remove(path);
}

TEST_CASE("cost file: backward defaults to I + W, activation to 1, communication to 0", "[planner][cost-file]") {
  const auto file = baton::cost_file_from_json(R"({"format": 1, "forward": [1, 2], "backward_input": [0.5, 1],
                                                   "backward_weight": 0.25})");
  CHECK(file.costs.backward == std::vector<double>{0.75, 1.25});
  CHECK(file.costs.activation == std::vector<double>{1.0});
  CHECK(file.costs.communication == 0.0);
  CHECK(file.bytes_per_message == 0.0);
}

TEST_CASE("cost file: malformed files name the line and the problem", "[planner][cost-file][errors]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(baton::cost_file_from_json("{\"format\": 1,\n \"forwrd\": [1]}", "costs.json"),
                    Contains("costs.json, line 2: unknown key \"forwrd\"") && Contains("known: format, forward"));
  CHECK_THROWS_WITH(baton::cost_file_from_json("{\"forward\": [1]}"), Contains("\"format\": 1 is missing"));
  CHECK_THROWS_WITH(baton::cost_file_from_json("{\"format\": 2}"), Contains("of another version"));
  CHECK_THROWS_WITH(baton::cost_file_from_json("{\"format\": 1, \"forward\": [1, x]}"), Contains("expected a number"));
  CHECK_THROWS_WITH(baton::cost_file_from_json("{\"format\": 1, \"forward\": []}"), Contains("an empty array"));
  CHECK_THROWS_WITH(baton::cost_file_from_json("{\"format\": 1} 3"), Contains("text after the closing '}'"));
  CHECK_THROWS_WITH(baton::load_cost_file("/nonexistent/costs.json"), Contains("cannot read cost file"));
  // A negative cost parses, and cost_model::check refuses it where the model is used.
  const auto negative = baton::cost_file_from_json("{\"format\": 1, \"forward\": -1}");
  CHECK_THROWS_WITH(baton::synthesize({2, 1, 2}, negative.costs, 2), Contains("costs must be finite and >= 0"));
}
