// baton/comm/nccl/communicator.hpp — nccl_communicator: one rank's handle on an NCCL
// communicator, with its stream and two point-to-point lanes (see <baton/comm/nccl.hpp> for
// what the backend does and what NCCL cannot check).
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/elements.hpp>
#include <baton/comm/detail/nccl_staging.hpp>
#include <baton/comm/detail/nccl_support.hpp>
#include <baton/comm/detail/unique_state.hpp>
#include <baton/comm/error.hpp>
#include <baton/comm/nccl/options.hpp>
#include <baton/comm/nccl/request.hpp>
#include <baton/core/cuda_check.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// One rank's handle on an NCCL communicator: a ncclComm_t, its device and a stream, plus the
/// two point-to-point lanes (communicators split from it, with their streams). Move-only;
/// owns them, the stream and a little scratch and staging memory.
class nccl_communicator {
 public:
  using request_type = nccl_request;

  /// Creates an NCCL communicator over the ranks of `host` (any communicator with
  /// broadcast: a local_communicator or an mpi_communicator), one rank per GPU: rank 0 makes
  /// the unique id and broadcasts it. Collective over `host`. `device` is this rank's GPU;
  /// with no stream given the communicator creates (and owns) a non-blocking stream.
  template <class Host>
  [[nodiscard]] static nccl_communicator bootstrap(Host& host, int device, cudaStream_t stream = nullptr,
                                                   nccl_options options = {}) {
    static_assert(broadcast_communicator<Host>,
                  "baton::nccl_communicator::bootstrap(host, device): host must model baton::broadcast_communicator "
                  "(a local_communicator or an mpi_communicator), which carries NCCL's unique id to every rank");
    const std::string where = "rank " + std::to_string(host.rank()) + ": nccl_communicator::bootstrap";
    struct id_message {
      ncclResult_t status;
      ncclUniqueId id;
    } message{};
    if (host.rank() == 0) message.status = ncclGetUniqueId(&message.id);
    host.broadcast(std::as_writable_bytes(std::span(&message, 1)), 0);  // ranks > 0 learn rank 0's failure too
    detail::comm::nccl::check_nccl(message.status, nullptr, where, "ncclGetUniqueId (on rank 0)");
    detail::comm::nccl::device_scope on(device, where);
    ncclComm_t comm = nullptr;
    detail::comm::nccl::check_nccl(ncclCommInitRank(&comm, host.size(), message.id, host.rank()), nullptr, where,
                                  "ncclCommInitRank");
    return nccl_communicator(comm, stream, options, /*owns_comm=*/true);
  }

  /// Wraps an existing NCCL communicator. With owns_comm it is destroyed with this object.
  /// Collective over the communicator's ranks: it splits the two point-to-point lanes off it.
  nccl_communicator(ncclComm_t comm, cudaStream_t stream, nccl_options options = {}, bool owns_comm = false) {
    s_->comm = comm;
    s_->owns_comm = owns_comm;
    s_->options = options;
    set_up(stream);  // on a throw, s_ is released like a constructed one's
  }

 private:
  void set_up(cudaStream_t stream) {
    if (s_->comm == nullptr) throw comm_error("baton::nccl_communicator: the ncclComm_t is null; create it first (or use bootstrap)");
    detail::comm::nccl::check_nccl(ncclCommUserRank(s_->comm, &s_->rank), s_->comm, "nccl_communicator", "ncclCommUserRank");
    detail::comm::nccl::check_nccl(ncclCommCount(s_->comm, &s_->size), s_->comm, "nccl_communicator", "ncclCommCount");
    detail::comm::nccl::check_nccl(ncclCommCuDevice(s_->comm, &s_->device), s_->comm, "nccl_communicator", "ncclCommCuDevice");
    detail::comm::nccl::device_scope on(s_->device, rank_text());
    if (stream == nullptr) {
      cuda(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
      s_->owns_stream = true;
    } else {
      s_->stream = stream;
    }
    cuda(cudaEventCreateWithFlags(&s_->done, cudaEventDisableTiming), "cudaEventCreate");
    cuda(cudaEventCreateWithFlags(&s_->ready, cudaEventDisableTiming), "cudaEventCreate");
    cuda(cudaMalloc(&s_->scratch, sizeof(std::int32_t) * (static_cast<std::size_t>(s_->size) + 1)), "cudaMalloc");
    // The lanes: every rank splits twice with one color, so each is a copy of this
    // communicator with its own NCCL resources and its own stream.
    for (auto* each : {&s_->up, &s_->down}) {
      nccl(ncclCommSplit(s_->comm, 0, s_->rank, &each->comm, nullptr), "ncclCommSplit (point-to-point lane)");
      cuda(cudaStreamCreateWithFlags(&each->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    }
    // Every staging slot is made here, before anything is posted (see staging_pool.hpp).
    s_->staging.make_in_advance(
        detail::comm::nccl::cuda_staging_runtime{s_->stream, rank_text()},
        {.slots = s_->options.staging_slots, .slot_bytes = s_->options.staging_slot_bytes, .grow = s_->options.staging_growth},
        detail::comm::nccl::staging_lanes, rank_text());
  }

 public:
  int rank() const noexcept { return s_->rank; }
  int size() const noexcept { return s_->size; }
  int device() const noexcept { return s_->device; }
  cudaStream_t stream() const noexcept { return s_->stream; }
  ncclComm_t native_handle() const noexcept { return s_->comm; }
  std::chrono::nanoseconds timeout() const noexcept { return s_->options.timeout; }
  void set_timeout(std::chrono::nanoseconds timeout) {
    if (timeout < std::chrono::nanoseconds::zero()) throw comm_error(rank_text() + ": set_timeout: the timeout is negative");
    s_->options.timeout = timeout;
  }

  /// Aborts every pending operation of this communicator (ncclCommAbort), e.g. after a
  /// timeout. The communicator cannot be used afterwards.
  void abort() noexcept {
    for (auto* each : {&s_->up, &s_->down}) {
      if (each->comm != nullptr) ncclCommAbort(each->comm);
      each->comm = nullptr;
    }
    if (s_->comm != nullptr) ncclCommAbort(s_->comm);
    s_->comm = nullptr;
  }

  /// Transfers posted from now on start on the GPU only after the work queued on `producer`
  /// so far: an event recorded there, which this communicator's streams (the main one and
  /// both point-to-point lanes) wait for. The host does not wait. What
  /// cuda_device_memory::order_before calls before a ring transfer, in place of a host
  /// stream synchronisation.
  void enqueue_after(cudaStream_t producer) {
    usable("enqueue_after");
    detail::comm::nccl::device_scope on(s_->device, rank_text());
    cuda(cudaEventRecord(s_->ready, producer), "cudaEventRecord (enqueue_after)");
    for (cudaStream_t each : {s_->stream, s_->up.stream, s_->down.stream})
      cuda(cudaStreamWaitEvent(each, s_->ready, 0), "cudaStreamWaitEvent (enqueue_after)");
  }

  // ---- point to point (device buffers; issued inside a group) -----------------------

  [[nodiscard]] nccl_request isend(std::span<const std::byte> data, int dest, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, s_->size, "isend", dest, tag, data.size());
    not_to_self("isend", dest);
    usable("isend");
    detail::comm::nccl::device_scope on(s_->device, rank_text());
    const lane on_lane = send_lane(dest);
    const std::string what = detail::comm::p2p_text("isend", dest, tag, data.size());
    staging_lease slot = stage_send(data, on_lane.stream, what);
    group_start();
    nccl(ncclSend(slot ? slot.device() : data.data(), data.size(), ncclUint8, dest, on_lane.comm, on_lane.stream),
         "ncclSend");
    group_end();
    posted(on_lane);
    auto r = record(rank_text() + ": " + what, dest, on_lane);
    hold(r, std::move(slot), {}, on_lane.stream);
    return r;
  }

  [[nodiscard]] nccl_request irecv(std::span<std::byte> data, int source, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, s_->size, "irecv", source, tag, data.size());
    not_to_self("irecv", source);
    usable("irecv");
    detail::comm::nccl::device_scope on(s_->device, rank_text());
    const lane on_lane = recv_lane(source);
    const std::string what = detail::comm::p2p_text("irecv", source, tag, data.size());
    staging_lease slot = stage_recv(data, on_lane.stream, what);
    group_start();
    nccl(ncclRecv(slot ? slot.device() : data.data(), data.size(), ncclUint8, source, on_lane.comm, on_lane.stream),
         "ncclRecv");
    group_end();
    posted(on_lane);
    if (slot) s_->staging.copy_back(slot, data.size(), on_lane.stream);
    auto r = record(rank_text() + ": " + what, source, on_lane);
    hold(r, std::move(slot), data, on_lane.stream);
    return r;
  }

  [[nodiscard]] nccl_request shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    const auto peers = detail::comm::ring_peers_of(s_->rank, s_->size, k);
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, s_->size, "shift: isend", peers.dest, tag, send.size());
    usable("shift");
    detail::comm::nccl::device_scope on(s_->device, rank_text());
    // The send and the receive travel on the lanes a plain isend and irecv would use, so a
    // shift matches plain transfers on the peers; one group lets them progress together.
    const lane to_dest = send_lane(peers.dest);
    const lane from_source = recv_lane(peers.source);
    // A host send is staged into its own slot; a host receive gets a second one.
    const std::string what = "shift by " + std::to_string(k) + " (tag " + std::to_string(tag) + ", to peer " +
                             std::to_string(peers.dest) + ", from peer " + std::to_string(peers.source) + ")";
    staging_lease send_slot = stage_send(send, to_dest.stream, what + ", its send");
    staging_lease recv_slot = stage_recv(recv, from_source.stream, what + ", its receive");
    group_start();
    nccl(ncclSend(send_slot ? send_slot.device() : send.data(), send.size(), ncclUint8, peers.dest, to_dest.comm,
                  to_dest.stream),
         "ncclSend");
    nccl(ncclRecv(recv_slot ? recv_slot.device() : recv.data(), recv.size(), ncclUint8, peers.source,
                  from_source.comm, from_source.stream),
         "ncclRecv");
    group_end();
    posted(to_dest);
    posted(from_source);
    if (send_slot) {
      // The request holds one slot; the send's returns to the pool now, marked after the
      // send, and is handed out again only once the GPU got past that mark.
      send_slot.mark(to_dest.stream);
      send_slot.reset();
    }
    if (to_dest.stream != from_source.stream) {
      // The request's event goes on the receive lane: make it also wait for the send.
      cudaEvent_t sent = nullptr;
      cuda(cudaEventCreateWithFlags(&sent, cudaEventDisableTiming), "cudaEventCreate");
      const cudaError_t recorded = cudaEventRecord(sent, to_dest.stream);
      const cudaError_t waited = recorded == cudaSuccess ? cudaStreamWaitEvent(from_source.stream, sent, 0) : recorded;
      cudaEventDestroy(sent);  // released once it has passed
      cuda(waited, "cudaStreamWaitEvent");
    }
    if (recv_slot) s_->staging.copy_back(recv_slot, recv.size(), from_source.stream);
    auto r = record(rank_text() + ": " + what, peers.source, from_source);
    hold(r, std::move(recv_slot), recv, from_source.stream);
    return r;
  }

  // ---- collectives (enqueued, then waited on the host) -------------------------------

  template <class T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    constexpr auto kind = detail::comm::element_kind_of<T>();
    usable("all_reduce");
    in_place(std::as_writable_bytes(inout), "all_reduce", [&](void* buffer) {
      nccl(ncclAllReduce(buffer, buffer, inout.size(), detail::comm::nccl::datatype_of(kind), detail::comm::nccl::op_of(op),
                         s_->comm, s_->stream),
           "ncclAllReduce");
    });
  }

  template <class T>
  void all_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_gather moves elements as bytes; T must be trivially copyable");
    usable("all_gather");
    if (recv.size() != send.size() * static_cast<std::size_t>(s_->size)) {
      throw comm_error(rank_text() + ": all_gather: the receive buffer holds " + std::to_string(recv.size()) +
                       " elements but must hold size() x send = " + std::to_string(send.size() * static_cast<std::size_t>(s_->size)));
    }
    detail::comm::nccl::device_scope on(s_->device, rank_text());
    nccl(ncclAllGather(send.data(), recv.data(), send.size_bytes(), ncclUint8, s_->comm, s_->stream), "ncclAllGather");
    complete("all_gather");
  }

  template <class T>
  void all_to_all(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_to_all moves elements as bytes; T must be trivially copyable");
    usable("all_to_all");
    const auto n = static_cast<std::size_t>(s_->size);
    if (send.size() % n != 0 || recv.size() != send.size()) {
      throw comm_error(rank_text() + ": all_to_all: send holds " + std::to_string(send.size()) + " and recv " +
                       std::to_string(recv.size()) + " elements; both must hold the same multiple of size() = " +
                       std::to_string(n));
    }
    const std::size_t block = send.size_bytes() / n;
    const auto* from = reinterpret_cast<const std::byte*>(send.data());
    auto* to = reinterpret_cast<std::byte*>(recv.data());
    detail::comm::nccl::device_scope on(s_->device, rank_text());
    group_start();
    for (std::size_t peer = 0; peer < n; ++peer) {
      nccl(ncclSend(from + peer * block, block, ncclUint8, static_cast<int>(peer), s_->comm, s_->stream), "ncclSend");
      nccl(ncclRecv(to + peer * block, block, ncclUint8, static_cast<int>(peer), s_->comm, s_->stream), "ncclRecv");
    }
    group_end();
    complete("all_to_all");
  }

  template <class T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> send, std::span<const std::int64_t> send_counts,
                    std::span<T> recv, std::span<const std::int64_t> recv_counts) {
    static_assert(communicable_element<T>, "baton: all_to_all_v moves elements as bytes; T must be trivially copyable");
    usable("all_to_all_v");
    const auto me = [this] { return rank_text(); };
    if (auto bad = detail::comm::counts_problem(me, "send_counts", send_counts, s_->size, send.size()); !bad.empty()) {
      throw comm_error(bad);
    }
    if (auto bad = detail::comm::counts_problem(me, "recv_counts", recv_counts, s_->size, recv.size()); !bad.empty()) {
      throw comm_error(bad);
    }
    detail::comm::nccl::device_scope on(s_->device, rank_text());
    group_start();
    std::size_t send_at = 0, recv_at = 0;
    for (int peer = 0; peer < s_->size; ++peer) {
      const auto s = static_cast<std::size_t>(send_counts[static_cast<std::size_t>(peer)]);
      const auto r = static_cast<std::size_t>(recv_counts[static_cast<std::size_t>(peer)]);
      if (s != 0) nccl(ncclSend(send.data() + send_at, s * sizeof(T), ncclUint8, peer, s_->comm, s_->stream), "ncclSend");
      if (r != 0) nccl(ncclRecv(recv.data() + recv_at, r * sizeof(T), ncclUint8, peer, s_->comm, s_->stream), "ncclRecv");
      send_at += s;
      recv_at += r;
    }
    group_end();
    complete("all_to_all_v");
  }

  template <class T>
  void broadcast(std::span<T> data, int root) {
    static_assert(communicable_element<T>, "baton: broadcast moves elements as bytes; T must be trivially copyable");
    usable("broadcast");
    if (auto bad = detail::comm::root_problem([this] { return rank_text(); }, root, s_->size); !bad.empty()) {
      throw comm_error(bad);
    }
    in_place(std::as_writable_bytes(data), "broadcast", [&](void* buffer) {
      nccl(ncclBroadcast(buffer, buffer, data.size_bytes(), ncclUint8, root, s_->comm, s_->stream), "ncclBroadcast");
    });
  }

  void barrier() {
    usable("barrier");
    detail::comm::nccl::device_scope on(s_->device, rank_text());
    nccl(ncclAllReduce(s_->scratch, s_->scratch, 1, ncclInt32, ncclSum, s_->comm, s_->stream), "ncclAllReduce (barrier)");
    complete("barrier");
  }

  /// Collective. Colors must be >= 0 on every rank; otherwise every rank throws, naming the
  /// ranks and colors at fault (the colors are all-gathered first).
  [[nodiscard]] nccl_communicator split(int color, int key) {
    usable("split");
    detail::comm::nccl::device_scope on(s_->device, rank_text());
    std::int32_t* slots = static_cast<std::int32_t*>(s_->scratch) + 1;
    cuda(cudaMemcpyAsync(static_cast<std::int32_t*>(s_->scratch), &color, sizeof color, cudaMemcpyHostToDevice, s_->stream),
         "cudaMemcpyAsync");
    nccl(ncclAllGather(s_->scratch, slots, 1, ncclInt32, s_->comm, s_->stream), "ncclAllGather (split colors)");
    std::vector<std::int32_t> colors(static_cast<std::size_t>(s_->size));
    cuda(cudaMemcpyAsync(colors.data(), slots, colors.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, s_->stream),
         "cudaMemcpyAsync");
    complete("split");
    if (auto bad = detail::comm::colors_problem([this] { return rank_text(); }, s_->size,
                                                [&](int r) { return colors[static_cast<std::size_t>(r)]; });
        !bad.empty()) {
      throw comm_error(bad);
    }
    ncclComm_t part = nullptr;
    nccl(ncclCommSplit(s_->comm, color, key, &part, nullptr), "ncclCommSplit");
    return nccl_communicator(part, nullptr, s_->options, /*owns_comm=*/true);
  }

 private:
  std::string rank_text() const { return "rank " + std::to_string(s_->rank); }

  void nccl(ncclResult_t rc, const char* call) const { detail::comm::nccl::check_nccl(rc, s_->comm, rank_text(), call); }
  void cuda(cudaError_t rc, const char* call) const { detail::core::check_cuda<comm_error>(rc, rank_text(), call); }
  void group_start() const { nccl(ncclGroupStart(), "ncclGroupStart"); }
  void group_end() const { nccl(ncclGroupEnd(), "ncclGroupEnd"); }

  void usable(const char* what) const {
    if (s_->comm == nullptr) {
      throw comm_error(rank_text() + ": " + what + ": this nccl_communicator was aborted or moved from");
    }
    if (!s_->broken.empty()) {
      throw comm_error(rank_text() + ": " + what + " refused: an earlier operation timed out (" + s_->broken +
                       "); call abort() and create a new communicator");
    }
  }

  /// A collective in place on `data` on the main stream, enqueued by `enqueue(buffer)` and
  /// waited for on the host; host memory travels through a staging slot.
  template <class Enqueue>
  void in_place(std::span<std::byte> data, const char* what, Enqueue&& enqueue) {
    detail::comm::nccl::device_scope on(s_->device, rank_text());
    staging_lease slot = stage_send(std::span<const std::byte>(data), s_->stream, what);
    enqueue(slot ? static_cast<void*>(slot.device()) : static_cast<void*>(data.data()));
    posted({s_->comm, s_->stream});
    if (slot) {
      s_->staging.copy_back(slot, data.size(), s_->stream);
      slot.mark(s_->stream);
    }
    complete(what);  // on a timeout the slot stays marked behind the stuck collective: never reused
    if (slot) std::memcpy(data.data(), slot.pinned(), data.size());
  }

  using staging_lease = detail::comm::nccl::staging_lease;

  // Host memory travels through a staging slot (an empty lease for device memory or no data).
  staging_lease stage_send(std::span<const std::byte> data, cudaStream_t on, const std::string& what) {
    if (data.empty() || !detail::comm::nccl::host_memory(data.data())) return {};
    return s_->staging.stage_send(data, on, what);
  }
  staging_lease stage_recv(std::span<std::byte> data, cudaStream_t on, const std::string& what) {
    if (data.empty() || !detail::comm::nccl::host_memory(data.data())) return {};
    return s_->staging.acquire(data.size(), on, what);
  }

  // A transfer was enqueued on `on_lane`: the staging pool is not quiescent until it passes.
  void posted(detail::comm::nccl::lane on_lane) {
    const auto which = on_lane.stream == s_->up.stream     ? detail::comm::nccl::p2p_lane::up
                       : on_lane.stream == s_->down.stream ? detail::comm::nccl::p2p_lane::down
                                                           : detail::comm::nccl::p2p_lane::main;
    s_->staging.posted(static_cast<std::size_t>(which), on_lane.stream);
  }

  void not_to_self(const char* what, int peer) const {
    if (auto bad = detail::comm::nccl::self_transfer_problem(rank_text(), what, s_->rank, peer); !bad.empty()) {
      throw comm_error(bad);
    }
  }

  // The request owns its slot until it ends; `destination` is a host receive's buffer. The
  // slot is marked after its last use first, so however the request ends (or if marking
  // throws and the lease ends here) the pool reuses it only once the GPU got past it.
  void hold(nccl_request& r, staging_lease slot, std::span<std::byte> destination, cudaStream_t stream) {
    if (!slot) return;
    slot.mark(stream);
    r.s_->staging = std::move(slot);
    r.s_->host_destination = destination.empty() ? nullptr : destination.data();
    r.s_->host_bytes = destination.size();
  }

  using lane = detail::comm::nccl::lane;

  // A message to a higher rank travels up, to a lower rank down, to oneself on the main
  // communicator (a send and a receive to oneself share one group). The sender classifies
  // it by its destination, the receiver by its source, so both ends pick the same lane.
  lane lane_of(detail::comm::nccl::p2p_lane which) const noexcept {
    switch (which) {
      case detail::comm::nccl::p2p_lane::up: return s_->up;
      case detail::comm::nccl::p2p_lane::down: return s_->down;
      case detail::comm::nccl::p2p_lane::main: break;
    }
    return {s_->comm, s_->stream};
  }
  lane send_lane(int dest) const noexcept { return lane_of(detail::comm::nccl::lane_of_send(s_->rank, dest)); }
  lane recv_lane(int source) const noexcept { return lane_of(detail::comm::nccl::lane_of_recv(s_->rank, source)); }

  nccl_request record(std::string what, int peer, lane on_lane) {
    nccl_request r;
    cuda(cudaEventCreateWithFlags(&r.s_->event, cudaEventDisableTiming), "cudaEventCreate");
    cuda(cudaEventRecord(r.s_->event, on_lane.stream), "cudaEventRecord");
    r.s_->comm = on_lane.comm;
    r.s_->what = std::move(what);
    r.s_->peer_text = "peer " + std::to_string(peer);
    r.s_->timeout = s_->options.timeout;
    return r;
  }

  /// Waits on the host for everything enqueued so far, with the timeout.
  void complete(const char* what) {
    cuda(cudaEventRecord(s_->done, s_->stream), "cudaEventRecord");
    const std::string where = rank_text() + ": " + what;
    const auto deadline = detail::comm::deadline_after(s_->options.timeout);
    if (!detail::comm::poll_until([&] { return detail::comm::nccl::event_done(s_->done, s_->comm, where); }, deadline)) {
      s_->broken = where + " timed out after " + detail::comm::seconds_text(s_->options.timeout);
      throw comm_error(s_->broken + "; some rank did not call " + what +
                       " (every rank must call the same collectives in the same order), or raise nccl_options::timeout; "
                       "call abort() to release the GPU");
    }
  }

  // Everything a communicator holds.
  struct state {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;   // recorded after each collective, for the host wait
    cudaEvent_t ready = nullptr;  // enqueue_after's: recorded on the producer, waited for by the streams
    void* scratch = nullptr;     // size()+1 int32 on the device: barrier and split
    bool owns_comm = false;
    bool owns_stream = false;
    int rank = 0;
    int size = 0;
    int device = 0;
    nccl_options options;
    std::string broken;
    detail::comm::nccl::staging_pool staging;
    lane up;    // transfers to higher ranks
    lane down;  // transfers to lower ranks

    /// Frees what the communicator owns (nothing, in a moved-from one).
    void release() noexcept {
      if (broken.empty()) {
        // The staging buffers may have been used last on any lane, the main stream included
        // (a host shift onto oneself): let those uses finish before the pinned memory goes.
        for (cudaStream_t each : {up.stream, down.stream, stream}) {
          if (each != nullptr) cudaStreamSynchronize(each);
        }
        staging.release();
      } else {
        // A timed-out collective may still use a staging slot on a stream that only aborting
        // unblocks (never, for a communicator this object does not own): the buffers stay
        // allocated rather than freed under a running transfer.
        staging.abandon();
      }
      for (auto* each : {&up, &down}) {
        if (each->stream != nullptr) cudaStreamDestroy(each->stream);
        if (each->comm != nullptr) {
          if (broken.empty()) ncclCommDestroy(each->comm);
          else ncclCommAbort(each->comm);
        }
        *each = {};
      }
      if (done != nullptr) cudaEventDestroy(done);
      if (ready != nullptr) cudaEventDestroy(ready);
      if (scratch != nullptr) cudaFree(scratch);
      if (owns_stream && stream != nullptr) cudaStreamDestroy(stream);
      if (owns_comm && comm != nullptr) {
        if (broken.empty()) ncclCommDestroy(comm);
        else ncclCommAbort(comm);
      }
      done = nullptr;
      ready = nullptr;
      scratch = nullptr;
      stream = nullptr;
      comm = nullptr;
    }
  };

  // Every member, moved as a whole and released once.
  detail::comm::unique_state<state, &state::release> s_;
};

}  // namespace baton
