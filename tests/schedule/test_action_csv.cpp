// The action IR's text form and CSV: parse/print round trips, torch's format quirks, errors.
#include <baton/schedule.hpp>

#include "catch.hpp"

#include <string>

using baton::action;
using baton::action_kind;

TEST_CASE("every action kind prints and parses back", "[schedule][action]") {
  for (const auto& info : baton::detail::schedule::kind_table) {
    // UNSHARD, RESHARD and REDUCE_GRAD act on a whole stage: no microbatch in the text, 0 in the IR.
    const bool stage_level = info.token == "UNSHARD" || info.token == "RESHARD" || info.token == "REDUCE_GRAD";
    CHECK(baton::is_stage_level(info.kind) == stage_level);
    const int microbatches[] = {0, stage_level ? 0 : 123, stage_level ? 0 : 1048575};
    for (const action a : {action{0, info.kind, microbatches[0]}, action{7, info.kind, microbatches[1]},
                           action{1048575, info.kind, microbatches[2]}}) {
      const std::string text = baton::to_string(a);
      REQUIRE(text == std::to_string(a.stage) + std::string(info.token) +
                          (stage_level ? std::string() : std::to_string(a.microbatch)));
      const auto parsed = baton::try_parse_action(text);
      REQUIRE(parsed.has_value());
      CHECK(*parsed == a);
      CHECK(baton::parse_action(" " + text + "\t") == a);
    }
  }
}

TEST_CASE("the text form is torch.distributed.pipelining's", "[schedule][action]") {
  CHECK(baton::parse_action("2F0") == action{2, action_kind::forward, 0});
  CHECK(baton::parse_action("1I3") == action{1, action_kind::backward_input, 3});
  CHECK(baton::parse_action("0SEND_F1") == action{0, action_kind::send_forward, 1});
  CHECK(baton::parse_action("3RECV_B12") == action{3, action_kind::recv_backward, 12});
  CHECK(baton::parse_action("4B5") == action{4, action_kind::backward, 5});
  CHECK(baton::parse_action("4W5") == action{4, action_kind::backward_weight, 5});
  STATIC_REQUIRE(baton::try_parse_action("10SEND_B20") == action{10, action_kind::send_backward, 20});
  STATIC_REQUIRE(baton::to_string(action{10, action_kind::recv_forward, 2}) == "10RECV_F2");
  // torch's runtime actions (its _ComputationType UNSHARD, RESHARD, REDUCE_GRAD): no microbatch.
  CHECK(baton::parse_action("3UNSHARD") == action{3, action_kind::unshard, 0});
  CHECK(baton::parse_action("0RESHARD") == action{0, action_kind::reshard, 0});
  STATIC_REQUIRE(baton::try_parse_action("12REDUCE_GRAD") == action{12, action_kind::reduce_grad, 0});
  STATIC_REQUIRE(baton::to_string(action{2, action_kind::reduce_grad, 0}) == "2REDUCE_GRAD");
}

TEST_CASE("malformed action tokens are rejected with what is expected", "[schedule][action]") {
  for (const char* bad : {"", "F0", "0F", "0X1", "-1F0", "0F-1", "0f0", "0F0x", "0 F0", "0SEND0", "0SEND_X1",
                          "0FF0", "1048576F0", "0F1048576", "99999999999999999999F0", "0F0,1F1", "UNSHARD", "0UNSHARD3",
                          "0REDUCE_GRAD0", "0RESHARDx", "(0F3;3B1)OVERLAP_F_B"}) {
    INFO(bad);
    CHECK_FALSE(baton::try_parse_action(bad).has_value());
    try {
      (void)baton::parse_action(bad);
      FAIL("no exception for " << bad);
    } catch (const baton::schedule_error& e) {
      const std::string what = e.what();
      CHECK(what.find("bad action token") != std::string::npos);
      CHECK(what.find(std::string_view(bad).find("UNSHARD3") != std::string_view::npos ||
                              std::string_view(bad).find("GRAD0") != std::string_view::npos
                          ? "acts on a whole stage and takes no microbatch: write 0"
                          : "e.g. 2F0") != std::string::npos);
    }
  }
}

TEST_CASE("CSV round trip of every policy, compute-only and lowered", "[schedule][csv]") {
  for (const auto& info : baton::builtin_policies) {
    for (int m : {8, 12}) {
      INFO(info.name << " m=" << m);
      const baton::program prog = info.generate(info.shape(4, m));
      const std::string csv = baton::to_csv(prog);
      CHECK(baton::parse_csv(csv, prog.shape) == prog);
      // The inferred shape is the generating one: placement included.
      CHECK(baton::parse_csv(csv) == prog);
      const baton::program lowered = baton::lower(prog);
      CHECK(baton::parse_csv(baton::to_csv(lowered)) == lowered);
    }
  }
}

TEST_CASE("CSV accepts torch's idle cells, blanks, quotes, CRLF and comments", "[schedule][csv]") {
  const std::string torch_style =
      "# a hand-written 1F1B, p = 2, m = 2\r\n"
      "0F0,0F1,,0B0,0B1\r\n"
      "\r\n"
      ",1F0, \"1B0\" ,1F1,1B1,\r\n";
  const baton::program prog = baton::parse_csv(torch_style);
  CHECK(prog.shape == baton::schedule_shape{2, 1, 2, baton::placement::loop});
  REQUIRE(prog.ranks.size() == 2);
  CHECK(baton::to_csv(prog) == "0F0,0F1,0B0,0B1\n1F0,1B0,1F1,1B1\n");
  CHECK(baton::is_valid(prog));
}

TEST_CASE("CSV shape inference recognises V placement", "[schedule][csv]") {
  const std::string zbv_csv = baton::to_csv(baton::zbv::generate(baton::shape_for<baton::zbv>(3, 6)));
  CHECK(baton::parse_csv(zbv_csv).shape == baton::schedule_shape{3, 2, 6, baton::placement::v});
  CHECK(baton::csv_schedule::from_string(zbv_csv).shape().place == baton::placement::v);
}

TEST_CASE("CSV files are written and read back", "[schedule][csv]") {
  const auto prog = baton::lower(baton::one_f_one_b::generate({3, 1, 5}));
  const auto path = std::filesystem::temp_directory_path() / "baton_schedule_test_roundtrip.csv";
  baton::write_csv_file(path, prog);
  CHECK(baton::read_csv_file(path) == prog);
  CHECK(baton::csv_schedule::from_file(path).generate(prog.shape) == prog);
  std::filesystem::remove(path);
  CHECK_THROWS_AS(baton::read_csv_file(path), baton::schedule_error);
}
