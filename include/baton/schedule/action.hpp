// baton/schedule/action.hpp — the schedule's action IR and its text form.
//
// An action says "run this kind of work for this stage and this microbatch". The text
// form is torch.distributed.pipelining's, so its users can bring their schedules:
// `{stage}{TOKEN}{microbatch}`, e.g. `2F0`, `1I3`, `0SEND_F1`.
#pragma once

#include <baton/schedule/detail/text.hpp>

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace baton {

// The kinds of work a rank's program holds. Compute: F (forward), B (full backward),
// I (input gradient) and W (weight gradient; I and W together are a split backward).
// Communication, added by lower(): SEND_F/RECV_F carry an activation from stage s to
// s + 1, SEND_B/RECV_B carry a gradient from stage s to s - 1.
//
// To add a kind: append it here (keep the values stable) and give it a row in
// detail::sched::kind_table below; parse, print and CSV follow from the table.
enum class action_kind : std::uint8_t {
  forward,
  backward,
  backward_input,
  backward_weight,
  send_forward,
  recv_forward,
  send_backward,
  recv_backward,
};

inline constexpr int action_kind_count = 8;

// One unit of a rank's program. Printed and parsed as "{stage}{TOKEN}{microbatch}".
struct action {
  int stage = 0;
  action_kind kind = action_kind::forward;
  int microbatch = 0;

  friend constexpr bool operator==(const action&, const action&) = default;
};

// Thrown for every schedule problem: an impossible shape, a malformed token or CSV
// file, an invalid program. When the problem is at a place in a program, rank(),
// step() and offending_action() say where (-1 / nullopt when not applicable).
class schedule_error : public std::runtime_error {
 public:
  explicit schedule_error(const std::string& message) : std::runtime_error(message) {}
  schedule_error(const std::string& message, int rank, int step, std::optional<action> act)
      : std::runtime_error(message), rank_(rank), step_(step), action_(act) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int step() const noexcept { return step_; }
  [[nodiscard]] std::optional<action> offending_action() const noexcept { return action_; }

 private:
  int rank_ = -1;
  int step_ = -1;
  std::optional<action> action_;
};

namespace detail::sched {

struct kind_info {
  action_kind kind;
  std::string_view token;
  bool compute;
};

inline constexpr std::array<kind_info, action_kind_count> kind_table{{
    {action_kind::forward, "F", true},
    {action_kind::backward, "B", true},
    {action_kind::backward_input, "I", true},
    {action_kind::backward_weight, "W", true},
    {action_kind::send_forward, "SEND_F", false},
    {action_kind::recv_forward, "RECV_F", false},
    {action_kind::send_backward, "SEND_B", false},
    {action_kind::recv_backward, "RECV_B", false},
}};

// Indices in the text form stay below this, and shapes at or below it, so that a corrupt
// file cannot ask the validator for a schedule of a billion stages; real pipelines are
// orders of magnitude smaller.
inline constexpr int max_index = 1 << 20;
// The most (stage, microbatch) pairs a generated program may hold: 4 Mi, e.g. 1024 ranks x
// 4096 microbatches. Checked before a policy allocates anything.
inline constexpr long long max_stage_microbatches = 1LL << 22;

}  // namespace detail::sched

[[nodiscard]] constexpr std::string_view token(action_kind kind) noexcept {
  for (const auto& info : detail::sched::kind_table)
    if (info.kind == kind) return info.token;
  return "?";
}

[[nodiscard]] constexpr bool is_compute(action_kind kind) noexcept {
  for (const auto& info : detail::sched::kind_table)
    if (info.kind == kind) return info.compute;
  return false;
}

[[nodiscard]] constexpr bool is_communication(action_kind kind) noexcept { return !is_compute(kind); }

// B or I: the work that produces the gradient sent to the previous stage.
[[nodiscard]] constexpr bool is_input_backward(action_kind kind) noexcept {
  return kind == action_kind::backward || kind == action_kind::backward_input;
}

// "2F0", "0SEND_F1".
[[nodiscard]] constexpr std::string to_string(const action& a) {
  std::string out;
  detail::sched::append_int(out, a.stage);
  out += token(a.kind);
  detail::sched::append_int(out, a.microbatch);
  return out;
}

// Parses one action token; surrounding blanks are ignored. nullopt for anything that is
// not exactly {digits}{TOKEN}{digits} with both numbers below 2^20 = 1048576.
[[nodiscard]] constexpr std::optional<action> try_parse_action(std::string_view text) noexcept {
  text = detail::sched::trim(text);
  std::size_t pos = 0;
  auto read_number = [&](int& out) -> bool {
    const std::size_t begin = pos;
    long long value = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      value = value * 10 + (text[pos] - '0');
      if (value >= detail::sched::max_index) return false;
      ++pos;
    }
    out = static_cast<int>(value);
    return pos > begin;
  };
  action result{};
  if (!read_number(result.stage)) return std::nullopt;
  // Longest token first, so that a future token that extends another still parses.
  std::size_t best_length = 0;
  for (const auto& info : detail::sched::kind_table) {
    const auto rest = text.substr(pos);
    if (info.token.size() > best_length && rest.substr(0, info.token.size()) == info.token) {
      best_length = info.token.size();
      result.kind = info.kind;
    }
  }
  if (best_length == 0) return std::nullopt;
  pos += best_length;
  if (!read_number(result.microbatch)) return std::nullopt;
  if (pos != text.size()) return std::nullopt;
  return result;
}

// Like try_parse_action, but a malformed token throws schedule_error saying what is expected.
[[nodiscard]] inline action parse_action(std::string_view text) {
  if (auto parsed = try_parse_action(text)) return *parsed;
  throw schedule_error("baton: bad action token " + detail::sched::quote_for_message(text) +
                       ": expected {stage}{F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B}{microbatch} with "
                       "non-negative indices below 1048576, e.g. 2F0, 1I3 or 0SEND_F1");
}

}  // namespace baton
