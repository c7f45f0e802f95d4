// The parser and validator on random and mutated input: no crash, no sanitizer report, and
// every failure is a schedule_error. 100k inputs, seeded, a few seconds under ASan.
#include <baton/schedule.hpp>

#include "catch.hpp"

#include <random>
#include <string>
#include <vector>

namespace {

std::string random_text(std::mt19937& rng) {
  static constexpr std::string_view alphabet = "0123456789FBIWSENDRCV_,\n\r #\"\t-x";
  std::uniform_int_distribution<std::size_t> length(0, 40);
  std::uniform_int_distribution<std::size_t> pick(0, alphabet.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_int_distribution<int> coin(0, 19);
  std::string s(length(rng), ' ');
  for (char& c : s) c = coin(rng) == 0 ? static_cast<char>(byte(rng)) : alphabet[pick(rng)];
  return s;
}

// Rows of random but well-formed tokens: they parse, and exercise the validator.
std::string random_schedule(std::mt19937& rng) {
  std::uniform_int_distribution<int> rows(1, 4), cells(0, 12), stage(0, 7), microbatch(0, 5);
  std::uniform_int_distribution<int> kind(0, baton::action_kind_count - 1);
  std::string s;
  for (int r = rows(rng); r > 0; --r) {
    for (int c = cells(rng); c > 0; --c) {
      s += baton::to_string(baton::action{stage(rng), static_cast<baton::action_kind>(kind(rng)), microbatch(rng)});
      s += ',';
    }
    s += '\n';
  }
  return s;
}

std::string mutate(std::string s, std::mt19937& rng) {
  std::uniform_int_distribution<int> ops(1, 4);
  const int count = ops(rng);
  for (int i = 0; i < count; ++i) {
    std::uniform_int_distribution<std::size_t> at(0, s.empty() ? 0 : s.size() - 1);
    const std::size_t where = at(rng);
    switch (std::uniform_int_distribution<int>(0, 5)(rng)) {
      case 0:
        if (!s.empty()) s.erase(where, 1);
        break;
      case 1: s.insert(where, 1, "0123456789FBIW,\n_"[std::uniform_int_distribution<int>(0, 16)(rng)]); break;
      case 2:
        if (!s.empty()) s[where] = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
        break;
      case 3:  // duplicate a slice (a cell, part of a line)
        if (!s.empty()) s.insert(where, s.substr(at(rng), 6));
        break;
      case 4:  // swap two characters
        if (!s.empty()) std::swap(s[where], s[at(rng)]);
        break;
      case 5:  // a big number
        s.insert(where, std::to_string(std::uniform_int_distribution<long long>(0, 1LL << 40)(rng)));
        break;
    }
  }
  return s;
}

}  // namespace

TEST_CASE("fuzz: the action parser and the CSV reader never crash", "[schedule][fuzz]") {
  std::mt19937 rng(20240601);
  std::vector<std::string> seeds;
  for (const auto& info : baton::builtin_policies) {
    const auto prog = info.generate(info.shape(2, 4));
    seeds.push_back(baton::to_csv(prog));
    seeds.push_back(baton::to_csv(baton::lower(prog)));
  }
  long long parsed_tokens = 0, parsed_programs = 0, valid_programs = 0, errors = 0;
  constexpr int iterations = 100000;
  for (int i = 0; i < iterations; ++i) {
    std::string text;
    switch (i % 4) {
      case 0: text = random_text(rng); break;
      case 1: text = mutate(baton::to_string(baton::action{i % 11, static_cast<baton::action_kind>(i % 8), i % 7}), rng); break;
      case 2: text = mutate(seeds[static_cast<std::size_t>(i / 4) % seeds.size()], rng); break;
      default: text = random_schedule(rng); break;
    }
    if (const auto a = baton::try_parse_action(text)) {
      ++parsed_tokens;
      REQUIRE(baton::try_parse_action(baton::to_string(*a)) == a);  // what parses, prints and parses back
    }
    try {
      const baton::program prog = baton::parse_csv(text);
      ++parsed_programs;
      if (baton::is_valid(prog)) {
        ++valid_programs;
        const auto sim = baton::simulate(prog);
        REQUIRE(sim.makespan > 0);
        REQUIRE(baton::is_valid(baton::lower(prog)));
      } else {
        baton::validate(prog);
        FAIL("validate accepted what is_valid refused");
      }
    } catch (const baton::schedule_error& e) {
      ++errors;
      // A problem at a place names it; a problem of the whole file (rank() == -1) says so.
      const std::string what = e.what();
      REQUIRE(what.find(e.rank() >= 0 ? "rank " : "invalid schedule: the schedule ") != std::string::npos);
    }
  }
  // The inputs reached every layer: tokens, whole programs, valid schedules and rejections.
  CHECK(parsed_tokens > 1000);
  CHECK(parsed_programs > 10000);
  CHECK(valid_programs > 100);
  CHECK(errors > 10000);
}
