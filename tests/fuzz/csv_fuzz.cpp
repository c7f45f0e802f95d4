// libFuzzer target: the CSV schedule reader, the validator and the writer.
//
// For any bytes: parse_csv either throws schedule_error or returns a program; validate()
// throws exactly when is_valid() is false; a valid program written with to_csv reads back as
// the same program, and so does its lowered (compute + comms) form, which is valid too. Any
// other exception, a crash, a sanitizer report or a failed round trip is a finding.
//
// Built with clang (-fsanitize=fuzzer,address,undefined) when one is present; see
// CMakeLists.txt. Run by hand: csv_fuzz -max_total_time=600 new_corpus/ tests/fuzz/corpus/
#include <baton/schedule.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

namespace {

[[noreturn]] void finding(const char* what, std::string_view input) {
  std::fprintf(stderr, "csv_fuzz: %s\ninput:\n%.*s\n", what, static_cast<int>(input.size()), input.data());
  std::abort();
}

void round_trip(const baton::program& prog, std::string_view input) {
  const std::string text = baton::to_csv(prog);
  const baton::program again = baton::parse_csv(text, prog.shape);
  if (again.ranks != prog.ranks) finding("to_csv then parse_csv changed the program", input);
  if (!baton::is_valid(again)) finding("a valid program read back invalid", input);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  try {
    const baton::program prog = baton::parse_csv(input);
    if (baton::is_valid(prog)) {
      round_trip(prog, input);
      const baton::program lowered = baton::lower(prog);
      if (!baton::is_valid(lowered)) finding("lower() made a valid program invalid", input);
      round_trip(lowered, input);
    } else {
      try {
        baton::validate(prog);
      } catch (const baton::schedule_error&) {
        return 0;
      }
      finding("validate() accepted a program is_valid() refused", input);
    }
  } catch (const baton::schedule_error&) {  // refused, with a message: fine
  } catch (const std::exception& e) {
    finding(e.what(), input);
  }
  return 0;
}
