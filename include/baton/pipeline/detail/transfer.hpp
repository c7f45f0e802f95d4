// baton/pipeline/detail/transfer.hpp — how a payload crosses ranks: the wire header, the pooled
// receive buffers, and the in-flight sends and receives of one executor.
//
// Every transfer is one fixed-size header message followed by one message per non-empty
// tensor, in the payload's field order, all on the same tag (messages of one (source, dest,
// tag) arrive in order). The header carries the shapes, so the receiver allocates (or takes
// from its pool) buffers of the right shape whatever the step's sequence length: there is
// nothing to set up again when shapes change between steps. It also carries the step, stage
// and microbatch, so that ranks running different programs fail with a message instead of
// silently mixing data.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/core/sizes.hpp>
#include <baton/payload/record.hpp>
#include <baton/payload/traits.hpp>
#include <baton/payload/visit.hpp>
#include <baton/pipeline/detail/extents.hpp>
#include <baton/pipeline/error.hpp>
#include <baton/pipeline/options.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
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

// Multiplies every tensor of p by `factor` (the loss scaling applied to a loss gradient).
template <class P>
void scale_payload(P& p, double factor) {
  for_each_tensor(p, [&](auto& t) {
    using leaf = std::remove_cvref_t<decltype(t)>;
    if constexpr (requires { payload_traits<leaf>::scale(t, factor); }) {
      payload_traits<leaf>::scale(t, factor);
    } else if constexpr (static_element_type<leaf>) {
      static_assert(host_accessible_v<leaf>,
                    "baton pipeline: a loss gradient in memory the host cannot touch (a device tensor) needs "
                    "`static void scale(T&, double)` in its payload_traits (the loss scaling)");
      using value = typename payload_traits<leaf>::value_type;
      static_assert(std::is_floating_point_v<value>,
                    "baton pipeline: the loss gradient must hold floating-point tensors");
      auto bytes = tensor_mutable_bytes(t);
      auto* v = reinterpret_cast<value*>(bytes.data());
      const std::size_t count = bytes.size() / sizeof(value);
      const auto f = static_cast<value>(factor);
      for (std::size_t i = 0; i < count; ++i) v[i] *= f;
    } else {
      static_assert(static_element_type<leaf>,
                    "baton pipeline: a loss gradient whose element type is known only at run time needs "
                    "`static void scale(T&, double)` in its payload_traits (the loss scaling)");
    }
  });
}

// Receive buffers of one payload type, reused across microbatches and steps. A buffer is only
// storage: the stage is handed the payload for one microbatch, and everything attached to that
// microbatch (its hooks) lives elsewhere and dies with it — so reusing the storage cannot
// carry anything from one microbatch to the next (seed 002).
template <class P>
class buffer_pool {
 public:
  // A buffer of the shapes header h announces. `built` says whether it was made now (from the
  // header) rather than reused: a reused buffer was stored under a key equal to the header's,
  // a new one may not fit P (other element types or tensor ranks).
  P acquire(const wire_header& h, bool& built) {
    for (std::size_t i = 0; i < idle_.size(); ++i) {
      if (header_has_key(h, idle_[i].key)) {
        P p = std::move(idle_[i].payload);
        retire(i);
        ++stats_.reuses;
        built = false;
        return p;
      }
    }
    ++stats_.allocations;
    built = true;
    return make_payload<P>(h);
  }

  void release(P&& p) {
    // Bounded so that a long run of changing shapes (variable sequence lengths) cannot grow the
    // pool without limit: the oldest idle buffers go first.
    if (idle_.size() >= max_idle_) {
      spare_keys_.push_back(std::move(idle_.front().key));
      idle_.erase(idle_.begin());
    }
    // Keys are reused too: computing one into fresh storage cost an allocation per receive.
    pool_key key;
    if (!spare_keys_.empty()) {
      key = std::move(spare_keys_.back());
      spare_keys_.pop_back();
    }
    fill_payload_key(p, key);
    idle_.push_back({std::move(key), std::move(p)});
  }

  [[nodiscard]] buffer_pool_stats stats() const noexcept {
    auto s = stats_;
    s.idle = idle_.size();
    return s;
  }

 private:
  struct entry {
    pool_key key;
    P payload;
  };

  void retire(std::size_t i) {
    spare_keys_.push_back(std::move(idle_[i].key));
    if (i + 1 != idle_.size()) std::swap(idle_[i], idle_.back());
    idle_.pop_back();
  }

  std::vector<entry> idle_;
  std::vector<pool_key> spare_keys_;
  buffer_pool_stats stats_;
  std::size_t max_idle_ = 64;
};

// A send in flight: it owns the payload and header until every request has completed.
template <class Request>
class outgoing {
 public:
  virtual ~outgoing() = default;
  // True when every request completed; throws what the communicator throws.
  virtual bool test() = 0;
  virtual void wait() = 0;
  // Called once every request completed: frees the payload and returns this object (`self`)
  // to the spares it came from, for the next send of its type.
  virtual void retire(std::unique_ptr<outgoing>&& self) noexcept = 0;
};

template <class Request, class P>
class outgoing_payload;

// Send objects of one payload type that completed, kept for reuse: each holds a header of a
// few KiB, and allocating one per send was a large share of the executor's time per action.
template <class Request, class P>
using send_spares = std::vector<std::unique_ptr<outgoing_payload<Request, P>>>;

template <class Request, class P>
class outgoing_payload final : public outgoing<Request> {
 public:
  bool test() override {
    while (done_ < requests.size()) {
      if (!requests[done_].test()) return false;
      ++done_;
    }
    return true;
  }
  void wait() override {
    while (done_ < requests.size()) {
      requests[done_].wait();
      ++done_;
    }
  }
  void retire(std::unique_ptr<outgoing<Request>>&& self) noexcept override {
    requests.clear();  // the requests first: they may still refer to the buffers below
    payload.reset();
    done_ = 0;
    auto* spares = spares_;
    spares_ = nullptr;
    // Kept only if the spares can take it without allocating; otherwise freed.
    if (spares && spares->size() < spares->capacity()) {
      spares->emplace_back(static_cast<outgoing_payload*>(self.release()));
    } else {
      self.reset();
    }
  }

  // The spares retire() returns this object to.
  void bind(send_spares<Request, P>& spares) noexcept { spares_ = &spares; }

  std::optional<P> payload;
  wire_header header;
  std::vector<Request> requests;

 private:
  std::size_t done_ = 0;
  send_spares<Request, P>* spares_ = nullptr;  // where retire() returns this object
};

// How many completed send objects of one type are kept for reuse.
inline constexpr std::size_t spare_sends = 16;

template <point_to_point_communicator Comm, class P>
std::unique_ptr<outgoing<comm_request_t<Comm>>> post_send(
    Comm& comm, P&& payload, int dest, int tag, const message_id& id,
    send_spares<comm_request_t<Comm>, std::remove_cvref_t<P>>& spares) {
  using request = comm_request_t<Comm>;
  using payload_type = std::remove_cvref_t<P>;
  std::unique_ptr<outgoing_payload<request, payload_type>> out;
  if (!spares.empty()) {
    out = std::move(spares.back());
    spares.pop_back();
  } else {
    out = std::make_unique<outgoing_payload<request, payload_type>>();
    if (spares.capacity() < spare_sends) spares.reserve(spare_sends);
  }
  out->bind(spares);
  out->payload.emplace(std::move(payload));
  fill_header(out->header, *out->payload, id);
  std::size_t total = 0;
  for_each_tensor(*out->payload, [&](const auto& t) { total += tensor_bytes(t).size(); });
  const bool small = total <= wire_inline_bytes && payload_host_accessible(*out->payload);
  out->header.words[6] = small ? 1 : 0;
  if (small) {
    std::byte* at = out->header.inline_area();
    for_each_tensor(*out->payload, [&](const auto& t) {
      const auto bytes = tensor_bytes(t);
      if (!bytes.empty()) std::memcpy(at, bytes.data(), bytes.size());
      at += bytes.size();
    });
  }
  out->requests.reserve(1 + (small ? 0 : static_cast<std::size_t>(out->header.tensors())));
  out->requests.push_back(comm.isend(out->header.bytes(), dest, tag));
  if (!small) {
    for_each_tensor(*out->payload, [&](const auto& t) {
      const auto bytes = tensor_bytes(t);
      if (!bytes.empty()) out->requests.push_back(comm.isend(bytes, dest, tag));
    });
  }
  return out;
}

// A receive in flight, kept in the microbatch state it fills (no allocation per receive). The
// header is received first; the data receives are posted once the header says which shapes to
// expect (at the latest when the stage needs the payload).
template <class Request, class P>
class incoming {
 public:
  incoming() = default;
  incoming(int source_rank, int message_tag, message_id expected_id)
      : source(source_rank), tag(message_tag), expected(expected_id) {}

  // Whether a receive was posted and its payload not yet taken.
  [[nodiscard]] bool active() const noexcept { return active_; }
  void set_active(bool active) noexcept { active_ = active; }

  int source = -1;
  int tag = 0;
  message_id expected;
  std::optional<P> buffer;
  wire_header header;
  std::optional<Request> header_request;
  std::vector<Request> data_requests;
  bool header_done = false;

 private:
  bool active_ = false;
};

template <point_to_point_communicator Comm, class P>
void post_recv(Comm& comm, incoming<comm_request_t<Comm>, P>& in, int source, int tag, const message_id& expected) {
  in.source = source;
  in.tag = tag;
  in.expected = expected;
  in.buffer.reset();
  in.data_requests.clear();
  in.header_done = false;
  in.header_request.emplace(comm.irecv(in.header.mutable_bytes(), source, tag));
  in.set_active(true);
}

template <class Request, class P>
void check_header(const incoming<Request, P>& in) {
  const auto& w = in.header.words;
  const auto& e = in.expected;
  if (w[0] != wire_magic) {
    throw pipeline_error("baton pipeline: a message from rank " + std::to_string(in.source) + " on tag " +
                         std::to_string(in.tag) + " is not a pipeline header: another component uses the "
                         "pipeline's tags on this communicator; give the executor its own communicator or set "
                         "pipeline_options::tag_offset");
  }
  if (w[1] != e.call || w[2] != e.stage || w[3] != e.microbatch || w[4] != e.direction) {
    const message_id got{w[1], static_cast<int>(w[2]), static_cast<int>(w[3]), static_cast<int>(w[4])};
    throw pipeline_error("baton pipeline: expected the " + describe_message(e) + " from rank " +
                         std::to_string(in.source) + " but received the " + describe_message(got) +
                         ": the ranks run different programs; build every rank's executor from the same "
                         "schedule");
  }
  if (w[5] < 0 || static_cast<std::size_t>(w[5]) > wire_max_tensors) {
    throw pipeline_error("baton pipeline: corrupt header from rank " + std::to_string(in.source));
  }
  // The shapes decide what is allocated and how many bytes are copied or received, so each is
  // checked (rank, element size, an element count or byte count that overflows) before any
  // buffer is made from it, and inline data must fit the header's data area.
  const auto corrupt = [&] {
    return "baton pipeline: corrupt header for the " + describe_message(e) + " from rank " +
           std::to_string(in.source) + ": ";
  };
  std::int64_t total_bytes = 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(in.header.tensors()); ++i) {
    const std::int64_t* t = in.header.tensor_words(i);
    const std::int64_t element_bytes = element_format_bytes(t[1]);
    if (t[0] < 0 || static_cast<std::size_t>(t[0]) > wire_max_rank || t[1] <= 0 || element_bytes == 0) {
      throw pipeline_error(corrupt() + "tensor " + std::to_string(i) + " has rank " + std::to_string(t[0]) +
                           " and element format " + std::to_string(t[1]) + "; the ranks do not run the same program");
    }
    const std::span<const std::int64_t> shape(t + 2, static_cast<std::size_t>(t[0]));
    std::int64_t bytes = 0;
    if (!core::byte_count(shape, element_bytes, bytes)) {
      throw pipeline_error(corrupt() +
                           core::count_problem(shape, "tensor " + std::to_string(i), static_cast<std::size_t>(element_bytes)));
    }
    if (bytes > std::numeric_limits<std::int64_t>::max() - total_bytes) {
      throw pipeline_error(corrupt() + "the byte count of its " + std::to_string(in.header.tensors()) +
                           " tensors overflows");
    }
    total_bytes += bytes;
  }
  if (in.header.data_inline() && total_bytes > static_cast<std::int64_t>(wire_inline_bytes)) {
    throw pipeline_error(corrupt() + "it carries its data inline but announces " + std::to_string(total_bytes) +
                         " bytes, more than the " + std::to_string(wire_inline_bytes) + " bytes a header holds");
  }
}

// Whether p has exactly the tensor ranks, element sizes and extents header h announces.
template <class P>
bool payload_fits_header(const P& p, const wire_header& h) {
  pool_key key;
  fill_payload_key(p, key);
  return header_has_key(h, key);
}

// Takes the header if it has arrived and posts the data receives. Returns whether the header
// is done. `wait` blocks for it.
template <point_to_point_communicator Comm, class Request, class P>
bool advance_recv(Comm& comm, incoming<Request, P>& in, buffer_pool<P>& pool, bool wait) {
  if (in.header_done) return true;
  if (wait) {
    in.header_request->wait();
  } else if (!in.header_request->test()) {
    return false;
  }
  in.header_done = true;
  in.header_request.reset();
  check_header(in);
  bool built = false;
  in.buffer.emplace(pool.acquire(in.header, built));
  if (built && !payload_fits_header(*in.buffer, in.header)) {
    throw pipeline_error("baton pipeline: the " + describe_message(in.expected) + " from rank " +
                         std::to_string(in.source) + " does not fit this rank's stage input type (different "
                         "element types or tensor ranks): the ranks were built with different stage types");
  }
  if (in.header.data_inline()) {
    if (!payload_host_accessible(*in.buffer)) {
      throw pipeline_error("baton pipeline: the " + describe_message(in.expected) + " from rank " +
                           std::to_string(in.source) + " carries its data inline, but this rank's stage input "
                           "holds device tensors: the ranks were built with different stage types");
    }
    const std::byte* at = in.header.inline_area();
    for_each_tensor(*in.buffer, [&](auto& t) {
      auto bytes = tensor_mutable_bytes(t);
      if (!bytes.empty()) std::memcpy(bytes.data(), at, bytes.size());
      at += bytes.size();
    });
    return true;
  }
  in.data_requests.reserve(static_cast<std::size_t>(in.header.tensors()));
  for_each_tensor(*in.buffer, [&](auto& t) {
    auto bytes = tensor_mutable_bytes(t);
    if (!bytes.empty()) in.data_requests.push_back(comm.irecv(bytes, in.source, in.tag));
  });
  return true;
}

// Waits for the payload of a posted receive and hands it over; the receive is then inactive.
template <point_to_point_communicator Comm, class Request, class P>
P complete_recv(Comm& comm, incoming<Request, P>& in, buffer_pool<P>& pool) {
  advance_recv(comm, in, pool, true);
  wait_all(in.data_requests);
  in.data_requests.clear();
  P p = std::move(*in.buffer);
  in.buffer.reset();
  in.set_active(false);
  return p;
}

}  // namespace baton::detail::pipeline
