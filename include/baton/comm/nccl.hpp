// baton/comm/nccl.hpp — the NCCL backend: ranks are GPUs.
//
// Compiled only (g++ and nvcc): this code has never run on a GPU, and its test
// (baton_comm_nccl) skips without one. Treat it as planned until a GPU run proves it.
//
//     baton::mpi_communicator host;                                    // or a local_communicator
//     auto gpu = baton::nccl_communicator::bootstrap(host, /*device=*/local_rank);
//     gpu.all_reduce(std::span(device_grad, n), baton::reduce_op::sum);  // device memory
//
// Models the same capability concepts as the local world and MPI. Data spans should point to
// device memory (cudaMalloc, cudaMallocManaged) of the communicator's device. Host memory is
// accepted by isend, irecv, shift, all_reduce and broadcast — the pipeline executor sends its
// message headers, agreement tables and loss values from the host — and is staged through a
// pinned host buffer and a device buffer of the communicator (a host irecv's data is copied
// into place when wait() or test() sees the transfer complete; wait_on alone does not).
// all_gather, all_to_all and all_to_all_v take device memory only.
//
// Stream-ordered: collectives are enqueued on the communicator's stream (stream()).
// Point-to-point transfers travel on two more lanes, each its own NCCL communicator (split
// from this one at construction) and stream: one for messages to a higher rank, one for
// messages to a lower rank (a message to oneself uses the main one). An NCCL send blocks its
// stream until the peer receives it, so with one stream a rank sending a large activation up
// the pipeline could not receive the gradient coming down behind it while its peer does the
// same — the executor's lowered programs assume buffered sends; per-direction lanes keep each
// stream's transfers in the same order on both ends of every pair.
// isend, irecv and shift return a request holding a CUDA event recorded after the transfer:
// wait() blocks the host until it passes (with the timeout), wait_on(s) makes another stream
// wait for it without blocking the host. Point-to-point calls are issued inside
// ncclGroupStart/ncclGroupEnd. Collectives enqueue and then wait on the host (they are
// blocking, as the concepts promise), so host code may read managed memory after them.
//
// What NCCL cannot do, and baton therefore cannot check here: tags are not transmitted
// (messages between two ranks match in issue order; the tag only names the transfer in
// errors), a receive buffer of the wrong size is not detected, and ranks disagreeing about
// a collective's arguments are undefined behaviour. Run the same program on the local world
// or MPI to catch those. A transfer that times out cannot be cancelled: call abort().
#pragma once

#include <baton/config.hpp>

#if !BATON_HAS_NCCL()
#error "baton/comm/nccl.hpp needs NCCL and CUDA: link baton::nccl (find_package(baton COMPONENTS nccl)); NCCL ships with the CUDA toolkit under /usr/local/cuda, or install libnccl-dev"
#endif

#include <baton/comm/concepts.hpp>
#include <baton/comm/detail/checks.hpp>
#include <baton/comm/error.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "baton/comm/nccl.hpp needs NCCL 2.18 or newer (for ncclCommSplit); install a newer NCCL"
#endif

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <memory>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// Settings of an nccl_communicator (inherited by communicators split from it).
struct nccl_options {
  /// The longest a host wait (a request's wait(), a collective) may block before it ends
  /// with comm_error. NCCL's own initialisation and split block until every rank joins.
  std::chrono::nanoseconds timeout = std::chrono::seconds(60);
};

namespace detail::comm::nccl {

inline void check_cuda(cudaError_t rc, const std::string& where, const char* call) {
  if (rc != cudaSuccess) {
    throw comm_error(where + ": " + call + " failed: " + cudaGetErrorName(rc) + ": " + cudaGetErrorString(rc));
  }
}

inline void check_nccl(ncclResult_t rc, ncclComm_t comm, const std::string& where, const char* call) {
  if (rc != ncclSuccess) {
    const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
    throw comm_error(where + ": " + call + " failed: " + ncclGetErrorString(rc) +
                     (last != nullptr && *last != '\0' ? std::string(" (") + last + ")" : std::string()));
  }
}

template <class T>
ncclDataType_t datatype_of() {
  if constexpr (std::is_same_v<T, float>) return ncclFloat32;
  else if constexpr (std::is_same_v<T, double>) return ncclFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return ncclInt32;
  else return ncclInt64;
}

inline ncclRedOp_t op_of(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::max: return ncclMax;
    case reduce_op::min: return ncclMin;
  }
  return ncclSum;
}

/// True once `event` has passed; throws on a CUDA error or an asynchronous NCCL error.
inline bool event_done(cudaEvent_t event, ncclComm_t comm, const std::string& where) {
  const cudaError_t rc = cudaEventQuery(event);
  if (rc == cudaSuccess) return true;
  if (rc != cudaErrorNotReady) check_cuda(rc, where, "cudaEventQuery");
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress) {
    check_nccl(async, comm, where, "NCCL (asynchronous error)");
  }
  return false;
}

/// The point-to-point lane a message travels on: to a higher rank (up), to a lower rank
/// (down), or to oneself (the main communicator). The sender classifies a message by its
/// destination and the receiver by its source; both must get the same lane.
enum class p2p_lane { main, up, down };

constexpr p2p_lane lane_of_send(int rank, int dest) noexcept {
  return dest > rank ? p2p_lane::up : dest < rank ? p2p_lane::down : p2p_lane::main;
}
constexpr p2p_lane lane_of_recv(int rank, int source) noexcept {
  return source < rank ? p2p_lane::up : source > rank ? p2p_lane::down : p2p_lane::main;
}

/// Pinned host memory and device memory of one staged host transfer. Owned by the
/// communicator; a request marks it busy while it refers to it, and `done` (recorded after the
/// transfer) must have passed before it is reused.
struct staging_slot {
  std::byte* device = nullptr;
  std::byte* pinned = nullptr;
  std::size_t capacity = 0;
  cudaEvent_t done = nullptr;
  bool busy = false;
};

/// Staging slots are made in advance, at construction: allocating pinned memory while NCCL
/// kernels of this rank wait for a peer may synchronise with them and deadlock.
inline constexpr std::size_t staging_slots_in_advance = 32;
inline constexpr std::size_t staging_slot_bytes = 16 * 1024;

/// Whether `p` is host memory NCCL must not be given directly (pageable, or pinned host
/// memory: the device buffers NCCL documents are cudaMalloc'd or managed).
inline bool host_memory(const void* p) noexcept {
  if (p == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();  // older runtimes report plain host memory as an error
    return true;
  }
  return attributes.type == cudaMemoryTypeUnregistered || attributes.type == cudaMemoryTypeHost;
}

/// Makes `device` current for the calling thread and restores the previous one on exit.
class device_scope {
 public:
  device_scope(int device, const std::string& where) {
    check_cuda(cudaGetDevice(&previous_), where, "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), where, "cudaSetDevice");
  }
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;
  ~device_scope() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace detail::comm::nccl

class nccl_communicator;

/// A pending isend, irecv or shift: a CUDA event recorded on the communicator's stream after
/// the transfer. Move-only. Destroying it does not cancel the transfer (NCCL cannot); the
/// buffers must stay valid until the stream has passed it.
class nccl_request {
 public:
  nccl_request() = default;
  nccl_request(nccl_request&& other) noexcept
      : event_(std::exchange(other.event_, nullptr)),
        staging_(std::exchange(other.staging_, nullptr)),
        host_destination_(std::exchange(other.host_destination_, nullptr)),
        host_bytes_(std::exchange(other.host_bytes_, 0)),
        comm_(other.comm_),
        what_(std::move(other.what_)),
        peer_text_(std::move(other.peer_text_)),
        timeout_(other.timeout_) {}
  nccl_request& operator=(nccl_request&& other) noexcept {
    if (this != &other) {
      destroy();
      event_ = std::exchange(other.event_, nullptr);
      staging_ = std::exchange(other.staging_, nullptr);
      host_destination_ = std::exchange(other.host_destination_, nullptr);
      host_bytes_ = std::exchange(other.host_bytes_, 0);
      comm_ = other.comm_;
      what_ = std::move(other.what_);
      peer_text_ = std::move(other.peer_text_);
      timeout_ = other.timeout_;
    }
    return *this;
  }
  nccl_request(const nccl_request&) = delete;
  nccl_request& operator=(const nccl_request&) = delete;
  ~nccl_request() { destroy(); }

  /// Blocks the host until the transfer is complete on the GPU, or throws comm_error
  /// (timeout, CUDA or NCCL error) naming rank, peer and tag.
  void wait() {
    if (event_ == nullptr) return;
    const auto deadline = detail::comm::deadline_after(timeout_);
    if (!detail::comm::poll_until([&] { return detail::comm::nccl::event_done(event_, comm_, what_); }, deadline)) {
      throw comm_error(what_ + " timed out after " + detail::comm::seconds_text(timeout_) + ": " + peer_text_ +
                       " has not completed the matching transfer (NCCL matches transfers between two ranks in issue "
                       "order; check both ranks issue them alike), or raise nccl_options::timeout; NCCL cannot cancel "
                       "it: call nccl_communicator::abort()");
    }
    finish();
  }

  /// True once the transfer is complete; never blocks.
  bool test() {
    if (event_ == nullptr) return true;
    if (!detail::comm::nccl::event_done(event_, comm_, what_)) return false;
    finish();
    return true;
  }

  /// Makes `stream` wait for the transfer on the GPU, without blocking the host. The
  /// request stays pending (wait() or test() still apply).
  void wait_on(cudaStream_t stream) const {
    if (event_ != nullptr) detail::comm::nccl::check_cuda(cudaStreamWaitEvent(stream, event_, 0), what_, "cudaStreamWaitEvent");
  }

 private:
  friend class nccl_communicator;

  // The transfer is complete: a staged host receive is copied into place.
  void finish() noexcept {
    if (host_destination_ != nullptr && staging_ != nullptr && host_bytes_ != 0) {
      std::memcpy(host_destination_, staging_->pinned, host_bytes_);
    }
    destroy();
  }

  void destroy() noexcept {
    if (event_ != nullptr) cudaEventDestroy(event_);  // released once the event has passed
    event_ = nullptr;
    if (staging_ != nullptr) staging_->busy = false;  // reused only once its `done` event passed
    staging_ = nullptr;
    host_destination_ = nullptr;
    host_bytes_ = 0;
  }

  cudaEvent_t event_ = nullptr;
  detail::comm::nccl::staging_slot* staging_ = nullptr;  // a host transfer's staging buffers
  std::byte* host_destination_ = nullptr;                // a host irecv: copied here when complete
  std::size_t host_bytes_ = 0;
  ncclComm_t comm_ = nullptr;
  std::string what_;       // "rank 1: irecv from peer 0 (tag 3, 64 bytes)"
  std::string peer_text_;  // "peer 0"
  std::chrono::nanoseconds timeout_{};
};

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
  nccl_communicator(ncclComm_t comm, cudaStream_t stream, nccl_options options = {}, bool owns_comm = false)
      : comm_(comm), owns_comm_(owns_comm), options_(options) {
    try {
      set_up(stream);
    } catch (...) {
      release();
      throw;
    }
  }

  nccl_communicator(nccl_communicator&& other) noexcept { take(other); }
  nccl_communicator& operator=(nccl_communicator&& other) noexcept {
    if (this != &other) {
      release();
      take(other);
    }
    return *this;
  }
  nccl_communicator(const nccl_communicator&) = delete;
  nccl_communicator& operator=(const nccl_communicator&) = delete;
  ~nccl_communicator() { release(); }

 private:
  void set_up(cudaStream_t stream) {
    if (comm_ == nullptr) throw comm_error("baton::nccl_communicator: the ncclComm_t is null; create it first (or use bootstrap)");
    detail::comm::nccl::check_nccl(ncclCommUserRank(comm_, &rank_), comm_, "nccl_communicator", "ncclCommUserRank");
    detail::comm::nccl::check_nccl(ncclCommCount(comm_, &size_), comm_, "nccl_communicator", "ncclCommCount");
    detail::comm::nccl::check_nccl(ncclCommCuDevice(comm_, &device_), comm_, "nccl_communicator", "ncclCommCuDevice");
    detail::comm::nccl::device_scope on(device_, rank_text());
    if (stream == nullptr) {
      detail::comm::nccl::check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), rank_text(),
                                    "cudaStreamCreateWithFlags");
      owns_stream_ = true;
    } else {
      stream_ = stream;
    }
    detail::comm::nccl::check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), rank_text(), "cudaEventCreate");
    detail::comm::nccl::check_cuda(cudaMalloc(&scratch_, sizeof(std::int32_t) * (static_cast<std::size_t>(size_) + 1)),
                                  rank_text(), "cudaMalloc");
    // The lanes: every rank splits twice with one color, so each is a copy of this
    // communicator with its own NCCL resources and its own stream.
    for (auto* each : {&up_, &down_}) {
      nccl(ncclCommSplit(comm_, 0, rank_, &each->comm, nullptr), "ncclCommSplit (point-to-point lane)");
      cuda(cudaStreamCreateWithFlags(&each->stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    }
    staging_.reserve(detail::comm::nccl::staging_slots_in_advance);
    for (std::size_t i = 0; i < detail::comm::nccl::staging_slots_in_advance; ++i) {
      add_staging_slot(detail::comm::nccl::staging_slot_bytes);
    }
  }

 public:
  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  int device() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return stream_; }
  ncclComm_t native_handle() const noexcept { return comm_; }
  std::chrono::nanoseconds timeout() const noexcept { return options_.timeout; }
  void set_timeout(std::chrono::nanoseconds timeout) {
    if (timeout < std::chrono::nanoseconds::zero()) throw comm_error(rank_text() + ": set_timeout: the timeout is negative");
    options_.timeout = timeout;
  }

  /// Aborts every pending operation of this communicator (ncclCommAbort), e.g. after a
  /// timeout. The communicator cannot be used afterwards.
  void abort() noexcept {
    for (auto* each : {&up_, &down_}) {
      if (each->comm != nullptr) ncclCommAbort(each->comm);
      each->comm = nullptr;
    }
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // ---- point to point (device buffers; issued inside a group) -----------------------

  [[nodiscard]] nccl_request isend(std::span<const std::byte> data, int dest, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "isend", dest, tag, data.size());
    usable("isend");
    detail::comm::nccl::device_scope on(device_, rank_text());
    const lane on_lane = send_lane(dest);
    detail::comm::nccl::staging_slot* slot = stage_send(data, on_lane.stream);
    group_start();
    nccl(ncclSend(slot != nullptr ? slot->device : data.data(), data.size(), ncclUint8, dest, on_lane.comm,
                  on_lane.stream),
         "ncclSend");
    group_end();
    auto r = record(rank_text() + ": " + detail::comm::p2p_text("isend", dest, tag, data.size()), dest, on_lane);
    hold(r, slot, {}, on_lane.stream);
    return r;
  }

  [[nodiscard]] nccl_request irecv(std::span<std::byte> data, int source, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "irecv", source, tag, data.size());
    usable("irecv");
    detail::comm::nccl::device_scope on(device_, rank_text());
    const lane on_lane = recv_lane(source);
    detail::comm::nccl::staging_slot* slot = stage_recv(data);
    group_start();
    nccl(ncclRecv(slot != nullptr ? slot->device : data.data(), data.size(), ncclUint8, source, on_lane.comm,
                  on_lane.stream),
         "ncclRecv");
    group_end();
    copy_back(slot, data.size(), on_lane.stream);
    auto r = record(rank_text() + ": " + detail::comm::p2p_text("irecv", source, tag, data.size()), source, on_lane);
    hold(r, slot, data, on_lane.stream);
    return r;
  }

  [[nodiscard]] nccl_request shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    const auto peers = detail::comm::ring_peers_of(rank_, size_, k);
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "shift: isend", peers.dest, tag, send.size());
    usable("shift");
    detail::comm::nccl::device_scope on(device_, rank_text());
    // The send and the receive travel on the lanes a plain isend and irecv would use, so a
    // shift matches plain transfers on the peers; one group lets them progress together.
    const lane to_dest = send_lane(peers.dest);
    const lane from_source = recv_lane(peers.source);
    // A host send is staged into its own slot; a host receive gets a second one.
    detail::comm::nccl::staging_slot* send_slot = stage_send(send, to_dest.stream);
    detail::comm::nccl::staging_slot* recv_slot = stage_recv(recv);
    group_start();
    nccl(ncclSend(send_slot != nullptr ? send_slot->device : send.data(), send.size(), ncclUint8, peers.dest,
                  to_dest.comm, to_dest.stream),
         "ncclSend");
    nccl(ncclRecv(recv_slot != nullptr ? recv_slot->device : recv.data(), recv.size(), ncclUint8, peers.source,
                  from_source.comm, from_source.stream),
         "ncclRecv");
    group_end();
    if (send_slot != nullptr) {
      // The request holds one slot; the send's is freed by its own `done` event, which
      // acquire() checks before reusing it.
      cuda(cudaEventRecord(send_slot->done, to_dest.stream), "cudaEventRecord");
      send_slot->busy = false;
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
    copy_back(recv_slot, recv.size(), from_source.stream);
    auto r = record(rank_text() + ": shift by " + std::to_string(k) + " (tag " + std::to_string(tag) + ", to peer " +
                        std::to_string(peers.dest) + ", from peer " + std::to_string(peers.source) + ")",
                    peers.source, from_source);
    hold(r, recv_slot, recv, from_source.stream);
    return r;
  }

  // ---- collectives (enqueued, then waited on the host) -------------------------------

  template <class T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    static_assert(reducible_element<T>,
                  "baton: all_reduce supports float, double, std::int32_t and std::int64_t; convert the data "
                  "to one of them (or all_gather it and reduce it yourself)");
    usable("all_reduce");
    detail::comm::nccl::device_scope on(device_, rank_text());
    const auto bytes = std::as_writable_bytes(inout);
    detail::comm::nccl::staging_slot* slot = stage_send(std::span<const std::byte>(bytes), stream_);
    void* buffer = slot != nullptr ? static_cast<void*>(slot->device) : static_cast<void*>(inout.data());
    nccl(ncclAllReduce(buffer, buffer, inout.size(), detail::comm::nccl::datatype_of<T>(), detail::comm::nccl::op_of(op),
                       comm_, stream_),
         "ncclAllReduce");
    copy_back(slot, bytes.size(), stream_);
    complete("all_reduce");
    finish_blocking(slot, bytes);
  }

  template <class T>
  void all_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_gather moves elements as bytes; T must be trivially copyable");
    usable("all_gather");
    if (recv.size() != send.size() * static_cast<std::size_t>(size_)) {
      throw comm_error(rank_text() + ": all_gather: the receive buffer holds " + std::to_string(recv.size()) +
                       " elements but must hold size() x send = " + std::to_string(send.size() * static_cast<std::size_t>(size_)));
    }
    detail::comm::nccl::device_scope on(device_, rank_text());
    nccl(ncclAllGather(send.data(), recv.data(), send.size_bytes(), ncclUint8, comm_, stream_), "ncclAllGather");
    complete("all_gather");
  }

  template <class T>
  void all_to_all(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_to_all moves elements as bytes; T must be trivially copyable");
    usable("all_to_all");
    const auto n = static_cast<std::size_t>(size_);
    if (send.size() % n != 0 || recv.size() != send.size()) {
      throw comm_error(rank_text() + ": all_to_all: send holds " + std::to_string(send.size()) + " and recv " +
                       std::to_string(recv.size()) + " elements; both must hold the same multiple of size() = " +
                       std::to_string(n));
    }
    const std::size_t block = send.size_bytes() / n;
    const auto* from = reinterpret_cast<const std::byte*>(send.data());
    auto* to = reinterpret_cast<std::byte*>(recv.data());
    detail::comm::nccl::device_scope on(device_, rank_text());
    group_start();
    for (std::size_t peer = 0; peer < n; ++peer) {
      nccl(ncclSend(from + peer * block, block, ncclUint8, static_cast<int>(peer), comm_, stream_), "ncclSend");
      nccl(ncclRecv(to + peer * block, block, ncclUint8, static_cast<int>(peer), comm_, stream_), "ncclRecv");
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
    if (auto bad = detail::comm::counts_problem(me, "send_counts", send_counts, size_, send.size()); !bad.empty()) {
      throw comm_error(bad);
    }
    if (auto bad = detail::comm::counts_problem(me, "recv_counts", recv_counts, size_, recv.size()); !bad.empty()) {
      throw comm_error(bad);
    }
    detail::comm::nccl::device_scope on(device_, rank_text());
    group_start();
    std::size_t send_at = 0, recv_at = 0;
    for (int peer = 0; peer < size_; ++peer) {
      const auto s = static_cast<std::size_t>(send_counts[static_cast<std::size_t>(peer)]);
      const auto r = static_cast<std::size_t>(recv_counts[static_cast<std::size_t>(peer)]);
      if (s != 0) nccl(ncclSend(send.data() + send_at, s * sizeof(T), ncclUint8, peer, comm_, stream_), "ncclSend");
      if (r != 0) nccl(ncclRecv(recv.data() + recv_at, r * sizeof(T), ncclUint8, peer, comm_, stream_), "ncclRecv");
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
    if (auto bad = detail::comm::root_problem([this] { return rank_text(); }, root, size_); !bad.empty()) {
      throw comm_error(bad);
    }
    detail::comm::nccl::device_scope on(device_, rank_text());
    const auto bytes = std::as_writable_bytes(data);
    detail::comm::nccl::staging_slot* slot = stage_send(std::span<const std::byte>(bytes), stream_);
    void* buffer = slot != nullptr ? static_cast<void*>(slot->device) : static_cast<void*>(data.data());
    nccl(ncclBroadcast(buffer, buffer, data.size_bytes(), ncclUint8, root, comm_, stream_), "ncclBroadcast");
    copy_back(slot, bytes.size(), stream_);
    complete("broadcast");
    finish_blocking(slot, bytes);
  }

  void barrier() {
    usable("barrier");
    detail::comm::nccl::device_scope on(device_, rank_text());
    nccl(ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), "ncclAllReduce (barrier)");
    complete("barrier");
  }

  /// Collective. Colors must be >= 0 on every rank; otherwise every rank throws, naming the
  /// ranks and colors at fault (the colors are all-gathered first).
  [[nodiscard]] nccl_communicator split(int color, int key) {
    usable("split");
    detail::comm::nccl::device_scope on(device_, rank_text());
    std::int32_t* slots = static_cast<std::int32_t*>(scratch_) + 1;
    cuda(cudaMemcpyAsync(static_cast<std::int32_t*>(scratch_), &color, sizeof color, cudaMemcpyHostToDevice, stream_),
         "cudaMemcpyAsync");
    nccl(ncclAllGather(scratch_, slots, 1, ncclInt32, comm_, stream_), "ncclAllGather (split colors)");
    std::vector<std::int32_t> colors(static_cast<std::size_t>(size_));
    cuda(cudaMemcpyAsync(colors.data(), slots, colors.size() * sizeof(std::int32_t), cudaMemcpyDeviceToHost, stream_),
         "cudaMemcpyAsync");
    complete("split");
    if (auto bad = detail::comm::colors_problem([this] { return rank_text(); }, size_,
                                                [&](int r) { return colors[static_cast<std::size_t>(r)]; });
        !bad.empty()) {
      throw comm_error(bad);
    }
    ncclComm_t part = nullptr;
    nccl(ncclCommSplit(comm_, color, key, &part, nullptr), "ncclCommSplit");
    return nccl_communicator(part, nullptr, options_, /*owns_comm=*/true);
  }

 private:
  std::string rank_text() const { return "rank " + std::to_string(rank_); }

  void nccl(ncclResult_t rc, const char* call) const { detail::comm::nccl::check_nccl(rc, comm_, rank_text(), call); }
  void cuda(cudaError_t rc, const char* call) const { detail::comm::nccl::check_cuda(rc, rank_text(), call); }
  void group_start() const { nccl(ncclGroupStart(), "ncclGroupStart"); }
  void group_end() const { nccl(ncclGroupEnd(), "ncclGroupEnd"); }

  void usable(const char* what) const {
    if (comm_ == nullptr) {
      throw comm_error(rank_text() + ": " + what + ": this nccl_communicator was aborted or moved from");
    }
    if (!broken_.empty()) {
      throw comm_error(rank_text() + ": " + what + " refused: an earlier operation timed out (" + broken_ +
                       "); call abort() and create a new communicator");
    }
  }

  // ---- staging of host memory (see the file comment) ----------------------------------

  void add_staging_slot(std::size_t capacity) {
    auto slot = std::make_unique<detail::comm::nccl::staging_slot>();
    slot->capacity = capacity;
    staging_.push_back(std::move(slot));  // owned before anything is allocated: release() frees it on a throw
    auto& s = *staging_.back();
    void* device = nullptr;
    void* pinned = nullptr;
    // Stream-ordered (cudaMalloc may synchronise the device, see staging_slots_in_advance);
    // the lanes use it too, so the allocation is waited for here.
    cuda(cudaMallocAsync(&device, capacity, stream_), "cudaMallocAsync (staging)");
    s.device = static_cast<std::byte*>(device);
    cuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (staging)");
    cuda(cudaMallocHost(&pinned, capacity), "cudaMallocHost (staging)");
    s.pinned = static_cast<std::byte*>(pinned);
    cuda(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "cudaEventCreate (staging)");
  }

  // A free slot of at least `bytes`, made when none is (see staging_slots_in_advance).
  detail::comm::nccl::staging_slot* acquire_staging(std::size_t bytes) {
    for (auto& slot : staging_) {
      if (!slot->busy && slot->capacity >= bytes && cudaEventQuery(slot->done) == cudaSuccess) {
        slot->busy = true;
        return slot.get();
      }
    }
    add_staging_slot(std::max(bytes, detail::comm::nccl::staging_slot_bytes));
    staging_.back()->busy = true;
    return staging_.back().get();
  }

  // Host data to send: copied into a slot and on to its device buffer (on the stream, before
  // the transfer). nullptr when `data` is device memory (or empty): NCCL reads it directly.
  detail::comm::nccl::staging_slot* stage_send(std::span<const std::byte> data, cudaStream_t stream) {
    if (data.empty() || !detail::comm::nccl::host_memory(data.data())) return nullptr;
    auto* slot = acquire_staging(data.size());
    std::memcpy(slot->pinned, data.data(), data.size());
    cuda(cudaMemcpyAsync(slot->device, slot->pinned, data.size(), cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync (staging)");
    return slot;
  }

  // A host buffer to receive into: a slot whose device buffer NCCL fills (copy_back then
  // brings it to the pinned buffer). nullptr for device memory.
  detail::comm::nccl::staging_slot* stage_recv(std::span<std::byte> data) {
    if (data.empty() || !detail::comm::nccl::host_memory(data.data())) return nullptr;
    return acquire_staging(data.size());
  }

  void copy_back(detail::comm::nccl::staging_slot* slot, std::size_t bytes, cudaStream_t stream) {
    if (slot == nullptr) return;
    cuda(cudaMemcpyAsync(slot->pinned, slot->device, bytes, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync (staging)");
  }

  // A request refers to its slot until it completes; `destination` is a host receive's buffer.
  void hold(nccl_request& r, detail::comm::nccl::staging_slot* slot, std::span<std::byte> destination,
            cudaStream_t stream) {
    if (slot == nullptr) return;
    cuda(cudaEventRecord(slot->done, stream), "cudaEventRecord");
    r.staging_ = slot;
    r.host_destination_ = destination.empty() ? nullptr : destination.data();
    r.host_bytes_ = destination.size();
  }

  // After a collective's complete(): the staged result back into the host buffer.
  static void finish_blocking(detail::comm::nccl::staging_slot* slot, std::span<std::byte> host) noexcept {
    if (slot == nullptr) return;
    std::memcpy(host.data(), slot->pinned, host.size());
    slot->busy = false;
  }

  // A point-to-point lane: the communicator and stream transfers with one peer travel on.
  struct lane {
    ncclComm_t comm = nullptr;
    cudaStream_t stream = nullptr;
  };

  // A message to a higher rank travels up, to a lower rank down, to oneself on the main
  // communicator (a send and a receive to oneself share one group). The sender classifies
  // it by its destination, the receiver by its source, so both ends pick the same lane.
  lane lane_of(detail::comm::nccl::p2p_lane which) const noexcept {
    switch (which) {
      case detail::comm::nccl::p2p_lane::up: return up_;
      case detail::comm::nccl::p2p_lane::down: return down_;
      case detail::comm::nccl::p2p_lane::main: break;
    }
    return {comm_, stream_};
  }
  lane send_lane(int dest) const noexcept { return lane_of(detail::comm::nccl::lane_of_send(rank_, dest)); }
  lane recv_lane(int source) const noexcept { return lane_of(detail::comm::nccl::lane_of_recv(rank_, source)); }

  nccl_request record(std::string what, int peer, lane on_lane) {
    nccl_request r;
    cuda(cudaEventCreateWithFlags(&r.event_, cudaEventDisableTiming), "cudaEventCreate");
    cuda(cudaEventRecord(r.event_, on_lane.stream), "cudaEventRecord");
    r.comm_ = on_lane.comm;
    r.what_ = std::move(what);
    r.peer_text_ = "peer " + std::to_string(peer);
    r.timeout_ = options_.timeout;
    return r;
  }

  /// Waits on the host for everything enqueued so far, with the timeout.
  void complete(const char* what) {
    cuda(cudaEventRecord(done_, stream_), "cudaEventRecord");
    const std::string where = rank_text() + ": " + what;
    const auto deadline = detail::comm::deadline_after(options_.timeout);
    if (!detail::comm::poll_until([&] { return detail::comm::nccl::event_done(done_, comm_, where); }, deadline)) {
      broken_ = where + " timed out after " + detail::comm::seconds_text(options_.timeout);
      throw comm_error(broken_ + "; some rank did not call " + what +
                       " (every rank must call the same collectives in the same order), or raise nccl_options::timeout; "
                       "call abort() to release the GPU");
    }
  }

  void release() noexcept {
    if (broken_.empty()) {
      // The staging buffers may have been used last on a lane: let those uses finish first.
      for (auto* each : {&up_, &down_}) {
        if (each->stream != nullptr) cudaStreamSynchronize(each->stream);
      }
    }
    for (auto& slot : staging_) {
      if (slot->done != nullptr) cudaEventDestroy(slot->done);
      if (slot->device != nullptr) cudaFreeAsync(slot->device, stream_);
      if (slot->pinned != nullptr) cudaFreeHost(slot->pinned);
    }
    staging_.clear();
    for (auto* each : {&up_, &down_}) {
      if (each->stream != nullptr) cudaStreamDestroy(each->stream);
      if (each->comm != nullptr) {
        if (broken_.empty()) ncclCommDestroy(each->comm);
        else ncclCommAbort(each->comm);
      }
      *each = {};
    }
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (owns_stream_ && stream_ != nullptr) cudaStreamDestroy(stream_);
    if (owns_comm_ && comm_ != nullptr) {
      if (broken_.empty()) ncclCommDestroy(comm_);
      else ncclCommAbort(comm_);
    }
    done_ = nullptr;
    scratch_ = nullptr;
    stream_ = nullptr;
    comm_ = nullptr;
  }

  void take(nccl_communicator& other) noexcept {
    comm_ = std::exchange(other.comm_, nullptr);
    stream_ = std::exchange(other.stream_, nullptr);
    done_ = std::exchange(other.done_, nullptr);
    scratch_ = std::exchange(other.scratch_, nullptr);
    owns_comm_ = other.owns_comm_;
    owns_stream_ = other.owns_stream_;
    rank_ = other.rank_;
    size_ = other.size_;
    device_ = other.device_;
    options_ = other.options_;
    broken_ = std::move(other.broken_);
    staging_ = std::move(other.staging_);
    up_ = std::exchange(other.up_, lane{});
    down_ = std::exchange(other.down_, lane{});
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;  // recorded after each collective, for the host wait
  void* scratch_ = nullptr;     // size()+1 int32 on the device: barrier and split
  bool owns_comm_ = false;
  bool owns_stream_ = false;
  int rank_ = 0;
  int size_ = 0;
  int device_ = 0;
  nccl_options options_;
  std::string broken_;
  // Heap-allocated so that requests may point at them while the communicator moves.
  std::vector<std::unique_ptr<detail::comm::nccl::staging_slot>> staging_;
  lane up_;    // transfers to higher ranks
  lane down_;  // transfers to lower ranks
};

}  // namespace baton
