// baton/schedule/action.hpp — the schedule's action IR and its text form.
//
// An action says "run this kind of work for this stage and this microbatch". The text
// form is torch.distributed.pipelining's, so its users can bring their schedules:
// `{stage}{TOKEN}{microbatch}`, e.g. `2F0`, `1I3`, `0SEND_F1`, and `{stage}{TOKEN}` for the
// kinds that act on a whole stage, e.g. `3UNSHARD`, `0REDUCE_GRAD`.
#pragma once

#include <baton/schedule/detail/text.hpp>

#include <array>
#include <cstddef>
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
// Stage-level, as torch's runtime schedules (`_PipelineScheduleRuntime`) carry them: UNSHARD
// gathers an FSDP-sharded stage's parameters before its compute, RESHARD frees them after,
// REDUCE_GRAD reduces (and scales) a stage's gradients once its last B or W has run. They
// act on a whole stage, so they have no microbatch; baton keeps them in the program where
// they stand, validates their order and writes them back, and computes nothing for them
// (a runtime that shards parameters is what gives them work).
//
// To add a kind: append it here (keep the values stable), give it a row in
// detail::schedule::kind_table below and the range of its group in is_compute /
// is_communication / is_stage_level (static_asserts say when these disagree); parse, print
// and CSV follow from the table.
enum class action_kind : std::uint8_t {
  forward,
  backward,
  backward_input,
  backward_weight,
  send_forward,
  recv_forward,
  send_backward,
  recv_backward,
  unshard,
  reshard,
  reduce_grad,
};

inline constexpr int action_kind_count = 11;

// One unit of a rank's program. Printed and parsed as "{stage}{TOKEN}{microbatch}", or
// "{stage}{TOKEN}" for a stage-level kind, whose microbatch is always 0. Built as
// action{stage, kind, microbatch} (and overlaps_next as a fourth value).
struct action {
  int stage = 0;
  action_kind kind = action_kind::forward;
  // Set on the forward of torch's overlapped pair (DualPipeV's `(0F3;3B1)OVERLAP_F_B` cell):
  // this forward and the next action of the row, a backward (B or I), form one step that
  // starts when the inputs of both are there. A CPU rank runs them one after the other, F
  // then B, exactly as two actions; a GPU backend may overlap them (the point of DualPipeV:
  // one stage's communication hides behind the other's compute).
  bool overlaps_next = false;
  int microbatch = 0;

  constexpr action() noexcept = default;
  // A constructor rather than aggregate order, so that the flag shares the padding after
  // `kind`: validation walks hundreds of thousands of actions, 12 bytes each.
  constexpr action(int stage_index, action_kind what, int microbatch_index = 0, bool overlapped = false) noexcept
      : stage(stage_index), kind(what), overlaps_next(overlapped), microbatch(microbatch_index) {}

  friend constexpr bool operator==(const action&, const action&) = default;
};

static_assert(sizeof(action) == 3 * sizeof(int), "baton: keep action small; it is stored once per step");

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

namespace detail::schedule {

enum class kind_group : std::uint8_t { compute, message, stage_level };

struct kind_info {
  action_kind kind;
  std::string_view token;
  kind_group group;
};

inline constexpr std::array<kind_info, action_kind_count> kind_table{{
    {action_kind::forward, "F", kind_group::compute},
    {action_kind::backward, "B", kind_group::compute},
    {action_kind::backward_input, "I", kind_group::compute},
    {action_kind::backward_weight, "W", kind_group::compute},
    {action_kind::send_forward, "SEND_F", kind_group::message},
    {action_kind::recv_forward, "RECV_F", kind_group::message},
    {action_kind::send_backward, "SEND_B", kind_group::message},
    {action_kind::recv_backward, "RECV_B", kind_group::message},
    {action_kind::unshard, "UNSHARD", kind_group::stage_level},
    {action_kind::reshard, "RESHARD", kind_group::stage_level},
    {action_kind::reduce_grad, "REDUCE_GRAD", kind_group::stage_level},
}};

static_assert([] {
  for (std::size_t i = 0; i < kind_table.size(); ++i)
    if (static_cast<std::size_t>(kind_table[i].kind) != i) return false;
  return true;
}(), "baton: kind_table lists the kinds in the order of action_kind, so that a kind indexes its row");

// The row of a kind: an index, not a search.
constexpr const kind_info& info_of(action_kind kind) noexcept {
  const auto i = static_cast<std::size_t>(kind);
  return kind_table[i < kind_table.size() ? i : 0];
}

// What every message about a malformed token says is expected.
inline constexpr std::string_view token_grammar =
    "expected {stage}{F|B|I|W|SEND_F|RECV_F|SEND_B|RECV_B}{microbatch} or {stage}{UNSHARD|RESHARD|REDUCE_GRAD} "
    "with non-negative indices below 1048576, e.g. 2F0, 1I3, 0SEND_F1 or 3UNSHARD";

// Indices in the text form stay below this, and shapes at or below it, so that a corrupt
// file cannot ask the validator for a schedule of a billion stages; real pipelines are
// orders of magnitude smaller.
inline constexpr int max_index = 1 << 20;
// The most (stage, microbatch) pairs a generated program may hold: 4 Mi, e.g. 1024 ranks x
// 4096 microbatches. Checked before a policy allocates anything.
inline constexpr long long max_stage_microbatches = 1LL << 22;

}  // namespace detail::schedule

[[nodiscard]] constexpr std::string_view token(action_kind kind) noexcept {
  return static_cast<std::size_t>(kind) < detail::schedule::kind_table.size() ? detail::schedule::info_of(kind).token : "?";
}

// The groups are ranges of action_kind (checked against kind_table below): validation asks
// these of every action, several times.

// F, B, I or W.
[[nodiscard]] constexpr bool is_compute(action_kind kind) noexcept { return kind <= action_kind::backward_weight; }

// A message between ranks: SEND_F, RECV_F, SEND_B or RECV_B.
[[nodiscard]] constexpr bool is_communication(action_kind kind) noexcept {
  return kind >= action_kind::send_forward && kind <= action_kind::recv_backward;
}

// UNSHARD, RESHARD or REDUCE_GRAD: acts on a whole stage, has no microbatch.
[[nodiscard]] constexpr bool is_stage_level(action_kind kind) noexcept {
  return kind >= action_kind::unshard && kind <= action_kind::reduce_grad;
}

static_assert([] {
  using detail::schedule::kind_group;
  for (const auto& info : detail::schedule::kind_table) {
    if (is_compute(info.kind) != (info.group == kind_group::compute)) return false;
    if (is_communication(info.kind) != (info.group == kind_group::message)) return false;
    if (is_stage_level(info.kind) != (info.group == kind_group::stage_level)) return false;
  }
  return true;
}(), "baton: is_compute / is_communication / is_stage_level must agree with kind_table's groups");

// B or I: the work that produces the gradient sent to the previous stage.
[[nodiscard]] constexpr bool is_input_backward(action_kind kind) noexcept {
  return kind == action_kind::backward || kind == action_kind::backward_input;
}

// "2F0", "0SEND_F1", "3UNSHARD". (One action: the pair an overlapped forward starts is
// written by the CSV writer.)
[[nodiscard]] constexpr std::string to_string(const action& a) {
  std::string out;
  detail::schedule::append_int(out, a.stage);
  out += token(a.kind);
  if (!is_stage_level(a.kind)) detail::schedule::append_int(out, a.microbatch);
  return out;
}

// Parses one action token; surrounding blanks are ignored. nullopt for anything that is
// not exactly {digits}{TOKEN}{digits} (or {digits}{TOKEN} for a stage-level kind) with the
// numbers below 2^20 = 1048576.
[[nodiscard]] constexpr std::optional<action> try_parse_action(std::string_view text) noexcept {
  text = detail::schedule::trim(text);
  std::size_t pos = 0;
  auto read_number = [&](int& out) -> bool {
    const std::size_t begin = pos;
    long long value = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      value = value * 10 + (text[pos] - '0');
      if (value >= detail::schedule::max_index) return false;
      ++pos;
    }
    out = static_cast<int>(value);
    return pos > begin;
  };
  action result{};
  if (!read_number(result.stage)) return std::nullopt;
  // Longest token first, so that a future token that extends another still parses.
  std::size_t best_length = 0;
  for (const auto& info : detail::schedule::kind_table) {
    const auto rest = text.substr(pos);
    if (info.token.size() > best_length && rest.substr(0, info.token.size()) == info.token) {
      best_length = info.token.size();
      result.kind = info.kind;
    }
  }
  if (best_length == 0) return std::nullopt;
  pos += best_length;
  if (is_stage_level(result.kind)) return pos == text.size() ? std::optional<action>(result) : std::nullopt;
  if (!read_number(result.microbatch)) return std::nullopt;
  if (pos != text.size()) return std::nullopt;
  return result;
}

namespace detail::schedule {

// Why `text` is not an action token, and what to write instead.
inline std::string why_not_a_token(std::string_view text) {
  const std::string_view trimmed = trim(text);
  std::size_t digits = 0;
  while (digits < trimmed.size() && trimmed[digits] >= '0' && trimmed[digits] <= '9') ++digits;
  for (const auto& info : kind_table) {
    if (info.group != kind_group::stage_level || trimmed.substr(digits, info.token.size()) != info.token) continue;
    const std::string_view rest = trimmed.substr(digits + info.token.size());
    if (digits > 0 && !rest.empty() && rest.find_first_not_of("0123456789") == std::string_view::npos) {
      return std::string(info.token) + " acts on a whole stage and takes no microbatch: write " +
             std::string(trimmed.substr(0, digits)) + std::string(info.token);
    }
  }
  return std::string(token_grammar);
}

}  // namespace detail::schedule

// Like try_parse_action, but a malformed token throws schedule_error saying what is expected.
[[nodiscard]] inline action parse_action(std::string_view text) {
  if (auto parsed = try_parse_action(text)) return *parsed;
  throw schedule_error("baton: bad action token " + detail::schedule::quote_for_message(text) + ": " +
                       detail::schedule::why_not_a_token(text));
}

}  // namespace baton
