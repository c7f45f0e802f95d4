// baton/comm/nccl.hpp — the NCCL backend: ranks are GPUs.
//
// Compiled only (g++ and nvcc): this code has never run on a GPU, and its test
// (baton_comm_nccl) skips without one. Treat it as planned until a GPU run proves it.
//
//     baton::mpi_communicator host;                                    // or a local_communicator
//     auto gpu = baton::nccl_communicator::bootstrap(host, /*device=*/local_rank);
//     gpu.all_reduce(std::span(device_grad, n), baton::reduce_op::sum);  // device memory
//
// Models the same capability concepts as the local world and MPI. Every span must point to
// device memory (cudaMalloc, cudaMallocManaged) of the communicator's device.
//
// Stream-ordered: every operation is enqueued on the communicator's stream (stream()).
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

#include <chrono>
#include <cstddef>
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
        comm_(other.comm_),
        what_(std::move(other.what_)),
        peer_text_(std::move(other.peer_text_)),
        timeout_(other.timeout_) {}
  nccl_request& operator=(nccl_request&& other) noexcept {
    if (this != &other) {
      destroy();
      event_ = std::exchange(other.event_, nullptr);
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
    destroy();
  }

  /// True once the transfer is complete; never blocks.
  bool test() {
    if (event_ == nullptr) return true;
    if (!detail::comm::nccl::event_done(event_, comm_, what_)) return false;
    destroy();
    return true;
  }

  /// Makes `stream` wait for the transfer on the GPU, without blocking the host. The
  /// request stays pending (wait() or test() still apply).
  void wait_on(cudaStream_t stream) const {
    if (event_ != nullptr) detail::comm::nccl::check_cuda(cudaStreamWaitEvent(stream, event_, 0), what_, "cudaStreamWaitEvent");
  }

 private:
  friend class nccl_communicator;

  void destroy() noexcept {
    if (event_ != nullptr) cudaEventDestroy(event_);  // released once the event has passed
    event_ = nullptr;
  }

  cudaEvent_t event_ = nullptr;
  ncclComm_t comm_ = nullptr;
  std::string what_;       // "rank 1: irecv from peer 0 (tag 3, 64 bytes)"
  std::string peer_text_;  // "peer 0"
  std::chrono::nanoseconds timeout_{};
};

/// One rank's handle on an NCCL communicator: a ncclComm_t, its device and a stream.
/// Move-only; owns the communicator, the stream and a little scratch device memory.
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
  nccl_communicator(ncclComm_t comm, cudaStream_t stream, nccl_options options = {}, bool owns_comm = false)
      : comm_(comm), owns_comm_(owns_comm), options_(options) {
    if (comm == nullptr) throw comm_error("baton::nccl_communicator: the ncclComm_t is null; create it first (or use bootstrap)");
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
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  // ---- point to point (device buffers; issued inside a group) -----------------------

  [[nodiscard]] nccl_request isend(std::span<const std::byte> data, int dest, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "isend", dest, tag, data.size());
    usable("isend");
    detail::comm::nccl::device_scope on(device_, rank_text());
    group_start();
    nccl(ncclSend(data.data(), data.size(), ncclUint8, dest, comm_, stream_), "ncclSend");
    group_end();
    return record(rank_text() + ": " + detail::comm::p2p_text("isend", dest, tag, data.size()), dest);
  }

  [[nodiscard]] nccl_request irecv(std::span<std::byte> data, int source, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "irecv", source, tag, data.size());
    usable("irecv");
    detail::comm::nccl::device_scope on(device_, rank_text());
    group_start();
    nccl(ncclRecv(data.data(), data.size(), ncclUint8, source, comm_, stream_), "ncclRecv");
    group_end();
    return record(rank_text() + ": " + detail::comm::p2p_text("irecv", source, tag, data.size()), source);
  }

  [[nodiscard]] nccl_request shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    const auto peers = detail::comm::ring_peers_of(rank_, size_, k);
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "shift: isend", peers.dest, tag, send.size());
    usable("shift");
    detail::comm::nccl::device_scope on(device_, rank_text());
    group_start();
    nccl(ncclSend(send.data(), send.size(), ncclUint8, peers.dest, comm_, stream_), "ncclSend");
    nccl(ncclRecv(recv.data(), recv.size(), ncclUint8, peers.source, comm_, stream_), "ncclRecv");
    group_end();
    return record(rank_text() + ": shift by " + std::to_string(k) + " (tag " + std::to_string(tag) + ", to peer " +
                      std::to_string(peers.dest) + ", from peer " + std::to_string(peers.source) + ")",
                  peers.source);
  }

  // ---- collectives (enqueued, then waited on the host) -------------------------------

  template <class T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    static_assert(reducible_element<T>,
                  "baton: all_reduce supports float, double, std::int32_t and std::int64_t; convert the data "
                  "to one of them (or all_gather it and reduce it yourself)");
    usable("all_reduce");
    detail::comm::nccl::device_scope on(device_, rank_text());
    nccl(ncclAllReduce(inout.data(), inout.data(), inout.size(), detail::comm::nccl::datatype_of<T>(),
                       detail::comm::nccl::op_of(op), comm_, stream_),
         "ncclAllReduce");
    complete("all_reduce");
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
    nccl(ncclBroadcast(data.data(), data.data(), data.size_bytes(), ncclUint8, root, comm_, stream_), "ncclBroadcast");
    complete("broadcast");
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

  nccl_request record(std::string what, int peer) {
    nccl_request r;
    cuda(cudaEventCreateWithFlags(&r.event_, cudaEventDisableTiming), "cudaEventCreate");
    cuda(cudaEventRecord(r.event_, stream_), "cudaEventRecord");
    r.comm_ = comm_;
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
};

}  // namespace baton
