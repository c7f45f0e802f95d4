// baton/core/agreement.hpp — the one cross-rank agreement protocol: before a collective step
// (a pipeline call, a context-parallel attention call, an MPI collective) every rank
// describes what it is about to do in a fixed-size descriptor of 64-bit words, the
// descriptors are exchanged (comm/agree.hpp), and every rank compares the same table. So
// either every rank goes on, or every rank throws an error that names the first
// disagreement — the field, both values, both ranks and what to do — instead of ranks
// waiting forever for messages that never come, or computing with mismatched inputs.
//
// A rank whose own input is wrong does not throw alone (its peers would wait for it): it
// marks its descriptor failed with the problem's text, and every rank throws that text.
//
// The descriptor is plain words so that it travels over any transport as bytes; its first
// word is a magic number and its second the protocol's (the first tag of its tag range), so a
// message of another protocol that arrives on the same tag is named as such, not compared.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

namespace baton {

/// One field of a protocol's descriptor: how messages name it, how they write a value, and
/// what a user does when ranks differ in it.
struct agreement_field {
  std::string_view name;  // "the softmax scale"
  std::string_view fix;   // "every rank must pass the same cp_params::softmax_scale"
  /// Writes a value for the message; null: as a decimal integer. A field whose values are
  /// hashes (a schedule, a mask) sets show_values to false: its values mean nothing to a user.
  std::string (*value_text)(std::int64_t) = nullptr;
  bool show_values = true;
};

/// What one rank sends: the words every protocol has, then the protocol's Fields values,
/// then MessageBytes of text for a rank that rejected its own input (0: a failure carries
/// only its code, and the protocol words its text).
template <std::size_t Fields, std::size_t MessageBytes = 0>
struct agreement_descriptor {
  struct no_text {};

  static constexpr std::int64_t magic_value = 0x626174'6f6e4147;  // "batonAG"
  static constexpr std::size_t fields = Fields;

  std::int64_t magic = magic_value;
  std::int64_t protocol = 0;   // which protocol: its tag range's first tag
  std::int64_t operation = 0;  // what the rank is about to do (a collective's kind, forward or backward, ...)
  std::int64_t rank = 0;       // the sender's rank in the group that agrees
  std::int64_t failure = 0;    // 0, or the code of the problem this rank found in its own input
  std::array<std::int64_t, Fields> values{};
  // The text; a struct without members (and so, with no_unique_address, no bytes) when 0.
  [[no_unique_address]] std::conditional_t<(MessageBytes > 0), std::array<char, MessageBytes>, no_text> message{};

  /// Marks this rank's input wrong, with the text every rank will throw (cut to fit).
  void fail(std::int64_t code, std::string_view text = {}) noexcept {
    failure = code == 0 ? 1 : code;
    if constexpr (MessageBytes > 0) {
      message.fill('\0');
      std::memcpy(message.data(), text.data(), std::min(text.size(), MessageBytes - 1));
    }
  }
  [[nodiscard]] std::string failure_text() const {
    if constexpr (MessageBytes > 0) {
      return std::string(message.data(), ::strnlen(message.data(), MessageBytes));
    } else {
      return {};
    }
  }
  /// The same step with the same arguments (failures may differ: each rank finds its own).
  [[nodiscard]] bool same_call(const agreement_descriptor& other) const noexcept {
    return protocol == other.protocol && operation == other.operation && values == other.values;
  }
};

/// The first difference among a table of descriptors, in the order a reader needs it.
struct agreement_verdict {
  enum class kind {
    agreed,     // every descriptor agrees with the reference rank's
    foreign,    // `rank` sent something that is not this protocol's descriptor
    failed,     // `rank` (the lowest that failed) rejected its own input
    operation,  // `rank` is about to do another operation than `reference`
    field,      // `rank` and `reference` differ in values[field]
  };
  kind what = kind::agreed;
  int rank = -1;          // the rank the verdict is about
  int reference = -1;     // the rank it was compared with
  std::size_t field = 0;  // for kind::field
  std::int64_t value = 0, reference_value = 0;

  [[nodiscard]] explicit operator bool() const noexcept { return what != kind::agreed; }
};

/// Compares every descriptor of `all` (one per rank, any order: each carries its rank) with
/// the one of rank `reference`: a foreign message first, then the lowest failed rank, then
/// the first rank (by rank) whose operation or fields differ, fields in order. Only the
/// fields whose bit is set in `compared` count (a field that may differ between ranks, such
/// as a shard's length, travels for the messages only).
template <std::size_t F, std::size_t M>
[[nodiscard]] agreement_verdict compare_descriptors(std::span<const agreement_descriptor<F, M>> all, std::int64_t protocol,
                                                    int reference, std::uint64_t compared = ~std::uint64_t{0}) {
  static_assert(F <= 64, "baton agreement: at most 64 fields (one bit each in `compared`)");
  using verdict = agreement_verdict;
  for (const auto& d : all) {
    if (d.magic != d.magic_value || d.protocol != protocol) return {verdict::kind::foreign, static_cast<int>(d.rank), reference};
  }
  const agreement_descriptor<F, M>* ref = nullptr;
  const agreement_descriptor<F, M>* lowest_failed = nullptr;
  for (const auto& d : all) {
    if (d.rank == reference) ref = &d;
    if (d.failure != 0 && (lowest_failed == nullptr || d.rank < lowest_failed->rank)) lowest_failed = &d;
  }
  if (lowest_failed != nullptr) return {verdict::kind::failed, static_cast<int>(lowest_failed->rank), reference};
  if (ref == nullptr) return {verdict::kind::foreign, reference, reference};
  const agreement_descriptor<F, M>* first = nullptr;
  verdict found;
  for (const auto& d : all) {
    if (first != nullptr && d.rank > first->rank) continue;
    if (d.operation != ref->operation) {
      first = &d;
      found = {verdict::kind::operation, static_cast<int>(d.rank), reference, 0, d.operation, ref->operation};
      continue;
    }
    for (std::size_t f = 0; f < F; ++f) {
      if ((compared >> f & 1u) != 0 && d.values[f] != ref->values[f]) {
        first = &d;
        found = {verdict::kind::field, static_cast<int>(d.rank), reference, f, d.values[f], ref->values[f]};
        break;
      }
    }
  }
  return found;
}

/// The sentence for a field verdict: "ranks 0 and 2 disagree on the head dim (64 on rank 0,
/// 128 on rank 2); every rank must pass ...".
inline std::string agreement_field_text(const agreement_field& field, const agreement_verdict& v) {
  const auto text = [&](std::int64_t x) { return field.value_text ? field.value_text(x) : std::to_string(x); };
  const int low = std::min(v.rank, v.reference), high = std::max(v.rank, v.reference);
  std::string s = "ranks " + std::to_string(low) + " and " + std::to_string(high) + " disagree on " + std::string(field.name);
  if (field.show_values) {
    const std::int64_t low_value = low == v.reference ? v.reference_value : v.value;
    const std::int64_t high_value = low == v.reference ? v.value : v.reference_value;
    s += " (" + text(low_value) + " on rank " + std::to_string(low) + ", " + text(high_value) + " on rank " +
         std::to_string(high) + ")";
  }
  return s + "; " + std::string(field.fix);
}

}  // namespace baton
