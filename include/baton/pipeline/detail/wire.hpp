// baton/pipeline/detail/wire.hpp — how a payload looks on the wire between pipeline ranks:
// the header message, the id of a message, and the pool key a header is matched against.
//
// Every transfer is one fixed-size header message followed by one message per non-empty
// tensor, in the payload's field order, all on the same tag (messages of one (source, dest,
// tag) arrive in order). The header carries the shapes, so the receiver allocates (or takes
// from its pool) buffers of the right shape whatever the step's sequence length: there is
// nothing to set up again when shapes change between steps. It also carries the step, stage
// and microbatch, so that ranks running different programs fail with a message instead of
// silently mixing data. Sending is detail/sends.hpp, receiving detail/receives.hpp.
#pragma once

#include <baton/payload/traits.hpp>
#include <baton/payload/visit.hpp>
#include <baton/pipeline/detail/extents.hpp>
#include <baton/pipeline/error.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace baton::detail::pipeline {

inline constexpr std::size_t wire_max_tensors = 16;
inline constexpr std::size_t wire_max_rank = 8;
inline constexpr std::int64_t wire_magic = 0x62746e5050;  // "btnPP"

// Payloads up to this many bytes travel inside the header message: one message per transfer
// instead of 1 + tensors, which is what small activations (and the executor's own latency)
// are dominated by. Only payloads whose tensors the host may touch (host_accessible_v): a
// device tensor's bytes cannot be memcpy'd into the header.
inline constexpr std::size_t wire_inline_bytes = 2048;

// The header message. Word layout: magic, call, sending stage, microbatch, direction
// (0 activation, 1 gradient), tensor count, inline flag; then per tensor: rank, element
// format (element_format_of: bytes per element, and the run-time element type of a tensor
// such as torch::Tensor), extents; then the inline data area.
struct wire_header {
  static constexpr std::size_t fixed_words = 7;
  static constexpr std::size_t words_per_tensor = 2 + wire_max_rank;
  static constexpr std::size_t shape_words = fixed_words + wire_max_tensors * words_per_tensor;
  std::array<std::int64_t, shape_words + wire_inline_bytes / sizeof(std::int64_t)> words{};

  [[nodiscard]] std::int64_t tensors() const noexcept { return words[5]; }
  [[nodiscard]] bool data_inline() const noexcept { return words[6] != 0; }
  [[nodiscard]] std::byte* inline_area() noexcept { return reinterpret_cast<std::byte*>(words.data() + shape_words); }
  [[nodiscard]] const std::byte* inline_area() const noexcept {
    return reinterpret_cast<const std::byte*>(words.data() + shape_words);
  }
  [[nodiscard]] const std::int64_t* tensor_words(std::size_t i) const noexcept {
    return words.data() + fixed_words + i * words_per_tensor;
  }
  [[nodiscard]] std::span<const std::byte> bytes() const noexcept { return std::as_bytes(std::span(words)); }
  [[nodiscard]] std::span<std::byte> mutable_bytes() noexcept { return std::as_writable_bytes(std::span(words)); }
};

struct message_id {
  std::int64_t call = 0;
  int stage = 0;  // the sending stage
  int microbatch = 0;
  int direction = 0;  // 0: activation (forward), 1: gradient (backward)
};

inline std::string describe_message(const message_id& id) {
  return std::string(id.direction == 0 ? "activation" : "gradient") + " of stage " + std::to_string(id.stage) +
         ", microbatch " + std::to_string(id.microbatch) + ", call " + std::to_string(id.call);
}

template <class P>
void fill_header(wire_header& h, const P& p, const message_id& id) {
  h.words[0] = wire_magic;
  h.words[1] = id.call;
  h.words[2] = id.stage;
  h.words[3] = id.microbatch;
  h.words[4] = id.direction;
  std::size_t i = 0;
  for_each_tensor(p, [&](const auto& t) {
    with_extents(t, [&](const auto& shape) {
      const auto rank = static_cast<std::size_t>(std::ranges::size(shape));
      if (i >= wire_max_tensors) {
        throw pipeline_error("baton pipeline: a payload with more than " + std::to_string(wire_max_tensors) +
                             " tensors cannot be sent between stages; group tensors into fewer fields");
      }
      if (rank > wire_max_rank) {
        throw pipeline_error("baton pipeline: a tensor of rank " + std::to_string(rank) +
                             " cannot be sent between stages (at most " + std::to_string(wire_max_rank) +
                             " dimensions); reshape it before the stage boundary");
      }
      std::int64_t* w = h.words.data() + wire_header::fixed_words + i * wire_header::words_per_tensor;
      w[0] = static_cast<std::int64_t>(rank);
      w[1] = element_format_of(t);
      std::size_t d = 0;
      for (auto e : shape) w[2 + d++] = static_cast<std::int64_t>(e);
    });
    ++i;
  });
  h.words[5] = static_cast<std::int64_t>(i);
}

// A pool key: per tensor its rank, element bytes and extents, flattened. The words of a
// header's tensor table have that layout, so a header is compared with a key in place.
using pool_key = std::vector<std::int64_t>;

inline bool header_has_key(const wire_header& h, const pool_key& key) noexcept {
  const auto n = static_cast<std::size_t>(h.tensors());
  std::size_t at = 0;
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t* w = h.tensor_words(i);
    const auto words = static_cast<std::size_t>(2 + w[0]);
    if (key.size() - at < words || !std::equal(w, w + words, key.begin() + static_cast<std::ptrdiff_t>(at))) {
      return false;
    }
    at += words;
  }
  return at == key.size();
}

// Overwrites `key` with p's key (reusing its storage).
template <class P>
void fill_payload_key(const P& p, pool_key& key) {
  key.clear();
  for_each_tensor(p, [&](const auto& t) {
    with_extents(t, [&](const auto& shape) {
      key.push_back(static_cast<std::int64_t>(std::ranges::size(shape)));
      key.push_back(element_format_of(t));
      for (auto e : shape) key.push_back(static_cast<std::int64_t>(e));
    });
  });
}

// A payload of type P with the shapes a header announces (zero-filled by the tensor traits).
template <class P>
P make_payload(const wire_header& h) {
  const auto n = static_cast<std::size_t>(h.tensors());
  auto shape_of = [&](std::size_t i) {
    const std::int64_t* w = h.tensor_words(i);
    return std::span<const std::int64_t>(w + 2, static_cast<std::size_t>(w[0]));
  };
  auto format_of = [&](std::size_t i) { return h.tensor_words(i)[1]; };
  if constexpr (is_record_v<P>) {
    P p{};
    std::size_t i = 0;
    for_each_tensor(p, [&](auto& t) {
      using leaf = std::remove_cvref_t<decltype(t)>;
      if (i < n) t = tensor_allocate<leaf>(shape_of(i), format_of(i));
      ++i;
    });
    if (i != n) {
      throw pipeline_error("baton pipeline: received a payload of " + std::to_string(n) + " tensors where the stage's "
                           "type has " + std::to_string(i) + ": the ranks were built with different stage types");
    }
    return p;
  } else {
    if (n != 1) {
      throw pipeline_error("baton pipeline: received a payload of " + std::to_string(n) +
                           " tensors where the stage expects one tensor: the ranks were built with different "
                           "stage types");
    }
    return tensor_allocate<P>(shape_of(0), format_of(0));
  }
}

// Whether the host may touch every tensor of p (host_accessible_v). A payload with a device
// tensor never travels inline: its bytes cannot be memcpy'd into the header on the host.
template <class P>
bool payload_host_accessible(const P& p) {
  bool host = true;
  for_each_tensor(p, [&](const auto& t) { host = host && host_accessible_v<std::remove_cvref_t<decltype(t)>>; });
  return host;
}

// Whether p has exactly the tensor ranks, element sizes and extents header h announces.
template <class P>
bool payload_fits_header(const P& p, const wire_header& h) {
  pool_key key;
  fill_payload_key(p, key);
  return header_has_key(h, key);
}

}  // namespace baton::detail::pipeline
