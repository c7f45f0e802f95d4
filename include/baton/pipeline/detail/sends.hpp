// baton/pipeline/detail/sends.hpp — the sends of one executor in flight: a payload posted as
// its header and tensors (or inline in the header), the spare send objects reused per type,
// and the queue of a call's sends that releases each payload once its requests complete.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/payload/traits.hpp>
#include <baton/payload/visit.hpp>
#include <baton/pipeline/detail/wire.hpp>

#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton::detail::pipeline {

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

// The sends of one call that have not completed, oldest first.
template <class Request>
class send_queue {
 public:
  [[nodiscard]] bool empty() const noexcept { return pending_.empty(); }

  void push(std::unique_ptr<outgoing<Request>> send) { pending_.push_back(std::move(send)); }

  // Completed sends release their payload early; the rest are waited at the end of the call.
  // Sends complete roughly in the order they were posted, so only the oldest are tested:
  // each test() takes the communicator's lock, and testing every pending send after every
  // action would cost more than the executor itself.
  // Completed send objects go back to their spares, for the next send of their type.
  // Throws what the communicator throws, before retiring anything.
  void poll() {
    std::size_t done = 0;
    while (done < pending_.size() && pending_[done]->test()) ++done;
    for (std::size_t i = 0; i < done; ++i) pending_[i]->retire(std::move(pending_[i]));
    if (done > 0) pending_.erase(pending_.begin(), pending_.begin() + static_cast<std::ptrdiff_t>(done));
  }

  // Waits for every send; throws what the communicator throws, before retiring anything.
  void finish() {
    for (auto& send : pending_) send->wait();
    for (auto& send : pending_) send->retire(std::move(send));
    pending_.clear();
  }

 private:
  std::vector<std::unique_ptr<outgoing<Request>>> pending_;
};

}  // namespace baton::detail::pipeline
