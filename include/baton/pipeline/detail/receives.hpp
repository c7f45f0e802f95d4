// baton/pipeline/detail/receives.hpp — the receives of one executor in flight: the header
// first, checked before anything is allocated from it, then the data into a pooled buffer
// (or copied out of the header), handed over when the stage needs the payload.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/core/sizes.hpp>
#include <baton/payload/traits.hpp>
#include <baton/payload/visit.hpp>
#include <baton/pipeline/detail/buffer_pool.hpp>
#include <baton/pipeline/detail/wire.hpp>
#include <baton/pipeline/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace baton::detail::pipeline {

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
