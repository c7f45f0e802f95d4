// baton/comm/mpi.hpp — the MPI backend: ranks are MPI processes.
//
//     MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
//     {
//       baton::mpi_communicator world;              // a private duplicate of MPI_COMM_WORLD
//       world.all_reduce(std::span(grad), baton::reduce_op::sum);
//     }                                             // freed before MPI_Finalize
//     MPI_Finalize();
//
// Models every capability concept with non-blocking MPI calls (MPI_Isend/Irecv and the
// MPI-3 non-blocking collectives) polled against a deadline, so a dead or diverged peer
// ends in comm_error after mpi_options::timeout instead of a hang. The communicator is a
// duplicate with MPI_ERRORS_RETURN, so MPI errors come back as comm_error too.
// Floating-point all_reduce is a reduce-scatter (an all-to-all, then the owner of each chunk
// combines the pieces in rank order, as the local world does) followed by an all-gather: every
// rank holds bitwise the same result, and the same bits as a run on threads.
#pragma once

#include <baton/config.hpp>

#if !BATON_HAS_MPI()
#error "baton/comm/mpi.hpp needs MPI: link baton::mpi (find_package(baton COMPONENTS mpi)); Debian: apt-get install libopenmpi-dev openmpi-bin"
#endif

#include <baton/comm/concepts.hpp>
#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/reduce.hpp>
#include <baton/comm/error.hpp>

#include <mpi.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// Settings of an mpi_communicator (inherited by communicators split from it).
struct mpi_options {
  /// The longest any wait (a request's wait(), a collective) may block before it ends with
  /// comm_error. After a collective times out the communicator refuses further collectives.
  std::chrono::nanoseconds timeout = std::chrono::seconds(60);
  /// Before each collective, one small all-reduce checks that every rank called the same
  /// collective with the same sizes, root and op, so a mismatch is the same comm_error on
  /// every rank instead of undefined behaviour. all_to_all_v also checks its counts against
  /// the senders'. Costs a latency per collective; turn off once a program is known good.
  bool check_collectives = true;
};

namespace detail::comm_mpi {

inline std::string error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(length));
}

inline int error_class(int code) {
  int cls = code;
  MPI_Error_class(code, &cls);
  return cls;
}

inline bool finalized() {
  int done = 0;
  MPI_Finalized(&done);
  return done != 0;
}

template <class T>
MPI_Datatype datatype_of() {
  if constexpr (std::is_same_v<T, float>) return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>) return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int32_t>) return MPI_INT32_T;
  else return MPI_INT64_T;
}

inline MPI_Op op_of(reduce_op op) {
  switch (op) {
    case reduce_op::sum: return MPI_SUM;
    case reduce_op::max: return MPI_MAX;
    case reduce_op::min: return MPI_MIN;
  }
  return MPI_SUM;
}

using coll_kind = comm::collective_kind;

/// Problems a rank finds in its own arguments, reported to all ranks by the agreement step.
enum class problem : std::int64_t {
  none = 0,
  gather_recv_size,
  to_all_not_divisible,
  to_all_recv_size,
  counts_invalid,
  counts_disagree,
};

inline const char* text_of(problem p) {
  switch (p) {
    case problem::none: return "";
    case problem::gather_recv_size: return "the receive buffer does not hold size() x the send elements";
    case problem::to_all_not_divisible: return "the send buffer is not a multiple of size() elements";
    case problem::to_all_recv_size: return "the receive and send buffers differ in size";
    case problem::counts_invalid:
      return "send_counts or recv_counts do not have one non-negative count per rank adding up to the buffer";
    case problem::counts_disagree:
      return "recv_counts disagree with what the other ranks send (recv_counts[i] on rank j must equal "
             "send_counts[j] on rank i)";
  }
  return "invalid arguments";
}

}  // namespace detail::comm_mpi

class mpi_communicator;

/// A pending isend, irecv or shift on MPI. Move-only. Destroying it before it completes
/// cancels a pending receive; a pending send is detached (MPI may still read its buffer).
class mpi_request {
 public:
  mpi_request() = default;
  mpi_request(mpi_request&& other) noexcept { take(other); }
  mpi_request& operator=(mpi_request&& other) noexcept {
    if (this != &other) {
      abandon();
      take(other);
    }
    return *this;
  }
  mpi_request(const mpi_request&) = delete;
  mpi_request& operator=(const mpi_request&) = delete;
  ~mpi_request() { abandon(); }

  /// Blocks until complete, or throws comm_error (timeout, MPI error, size mismatch) naming
  /// rank, peer and tag. Completes (or throws) once; later calls return at once.
  void wait() {
    if (active() == 0) return;
    const auto deadline = detail::comm::deadline_after(timeout_);
    if (detail::comm::poll_until([&] { return progress(); }, deadline)) return;
    for (const part& p : parts_) {
      if (p.request == MPI_REQUEST_NULL) continue;
      const std::string what = rank_text_ + ": " + describe(p) + " timed out after " +
                               detail::comm::seconds_text(timeout_) + ": peer " + std::to_string(p.peer) +
                               " posted no matching " + (p.is_recv ? "isend" : "irecv") + " with tag " +
                               std::to_string(p.tag) +
                               "; check that both ranks agree on peer, tag and order, or raise mpi_options::timeout";
      abandon();
      throw comm_error(what);
    }
  }

  /// True once complete; never blocks. Throws like wait() on an MPI error or size mismatch.
  bool test() { return active() == 0 || progress(); }

 private:
  friend class mpi_communicator;

  struct part {
    MPI_Request request = MPI_REQUEST_NULL;
    bool is_recv = false;
    int peer = 0;
    int tag = 0;
    std::size_t bytes = 0;
  };

  int active() const noexcept {
    int n = 0;
    for (const part& p : parts_) n += p.request != MPI_REQUEST_NULL;
    return n;
  }

  std::string describe(const part& p) const { return detail::comm::p2p_text(p.is_recv ? "irecv" : "isend", p.peer, p.tag, p.bytes); }

  /// Tests every active part once; true when all are complete.
  bool progress() {
    for (part& p : parts_) {
      if (p.request == MPI_REQUEST_NULL) continue;
      int flag = 0;
      MPI_Status status{};
      const int rc = MPI_Test(&p.request, &flag, &status);
      if (rc != MPI_SUCCESS) {
        std::string what = rank_text_ + ": " + describe(p) + ": ";
        if (detail::comm_mpi::error_class(rc) == MPI_ERR_TRUNCATE) {
          what += "the message is larger than the receive buffer of " + std::to_string(p.bytes) +
                  " bytes; a message must exactly fill its receive buffer (check the shapes both ranks use)";
        } else {
          what += "MPI error: " + detail::comm_mpi::error_text(rc);
        }
        p.request = MPI_REQUEST_NULL;  // MPI has completed (and freed) it on error
        abandon();
        throw comm_error(what);
      }
      if (flag == 0) return false;
      if (p.is_recv) {
        int received = 0;
        MPI_Get_count(&status, MPI_BYTE, &received);
        if (static_cast<std::size_t>(received) != p.bytes) {
          const std::string what = rank_text_ + ": " + describe(p) + ": the message has " + std::to_string(received) +
                                   " bytes but the receive buffer holds " + std::to_string(p.bytes) +
                                   "; a message must exactly fill its receive buffer (check the shapes both ranks use)";
          abandon();
          throw comm_error(what);
        }
      }
    }
    return true;
  }

  /// Cancels pending receives (and waits for the cancellation, which MPI completes at once);
  /// detaches pending sends, which MPI cannot reliably cancel.
  void abandon() noexcept {
    if (active() == 0 || detail::comm_mpi::finalized()) {
      for (part& p : parts_) p.request = MPI_REQUEST_NULL;
      return;
    }
    for (part& p : parts_) {
      if (p.request == MPI_REQUEST_NULL) continue;
      if (p.is_recv) {
        MPI_Cancel(&p.request);
        MPI_Wait(&p.request, MPI_STATUS_IGNORE);
      } else {
        MPI_Request_free(&p.request);
      }
      p.request = MPI_REQUEST_NULL;
    }
  }

  void take(mpi_request& other) noexcept {
    parts_ = other.parts_;
    for (part& p : other.parts_) p.request = MPI_REQUEST_NULL;
    rank_text_ = std::move(other.rank_text_);
    timeout_ = other.timeout_;
  }

  std::array<part, 2> parts_{};
  std::string rank_text_;
  std::chrono::nanoseconds timeout_{};
};

/// One rank's handle on an MPI communicator. Move-only; owns (and frees) its MPI_Comm, so
/// destroy it before MPI_Finalize. After a collective timed out, the communicator refuses
/// further collectives and is not freed (MPI may still progress the abandoned collective);
/// such a program should report the error and end.
class mpi_communicator {
 public:
  using request_type = mpi_request;

  /// Wraps a duplicate of `comm` (collective over `comm`), so baton's traffic never matches
  /// the caller's messages and errors return as comm_error. MPI must be initialised.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD, mpi_options options = {}) : options_(options) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized == 0 || detail::comm_mpi::finalized()) {
      throw comm_error("baton::mpi_communicator: MPI is not initialised (or already finalised); call MPI_Init or "
                       "MPI_Init_thread first and destroy every communicator before MPI_Finalize");
    }
    check_options();
    MPI_Comm dup = MPI_COMM_NULL;
    check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
    adopt(dup);
  }

  mpi_communicator(mpi_communicator&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
        rank_(other.rank_),
        size_(other.size_),
        world_rank_(other.world_rank_),
        tag_ub_(other.tag_ub_),
        options_(other.options_),
        broken_(std::move(other.broken_)) {}
  mpi_communicator& operator=(mpi_communicator&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      rank_ = other.rank_;
      size_ = other.size_;
      world_rank_ = other.world_rank_;
      tag_ub_ = other.tag_ub_;
      options_ = other.options_;
      broken_ = std::move(other.broken_);
    }
    return *this;
  }
  mpi_communicator(const mpi_communicator&) = delete;
  mpi_communicator& operator=(const mpi_communicator&) = delete;
  ~mpi_communicator() { release(); }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  /// The MPI communicator baton uses (its own duplicate): for calls baton does not wrap.
  MPI_Comm native_handle() const noexcept { return comm_; }
  /// The largest tag MPI allows on this communicator (at least 32767).
  int max_tag() const noexcept { return tag_ub_; }

  std::chrono::nanoseconds timeout() const noexcept { return options_.timeout; }
  void set_timeout(std::chrono::nanoseconds timeout) {
    options_.timeout = timeout;
    check_options();
  }
  const mpi_options& options() const noexcept { return options_; }

  // ---- point to point ---------------------------------------------------------------

  [[nodiscard]] mpi_request isend(std::span<const std::byte> data, int dest, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "isend", dest, tag, data.size(), tag_ub_);
    mpi_request r = make_request();
    start_send(r.parts_[0], data, dest, tag);
    return r;
  }

  [[nodiscard]] mpi_request irecv(std::span<std::byte> data, int source, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "irecv", source, tag, data.size(), tag_ub_);
    mpi_request r = make_request();
    start_recv(r.parts_[0], data, source, tag);
    return r;
  }

  [[nodiscard]] mpi_request shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    const auto peers = detail::comm::ring_peers_of(rank_, size_, k);
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "shift: isend", peers.dest, tag, send.size(),
                                     tag_ub_);
    mpi_request r = make_request();
    start_recv(r.parts_[1], recv, peers.source, tag);
    start_send(r.parts_[0], send, peers.dest, tag);
    return r;
  }

  // ---- collectives ------------------------------------------------------------------

  template <class T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    static_assert(reducible_element<T>,
                  "baton: all_reduce supports float, double, std::int32_t and std::int64_t; convert the data "
                  "to one of them (or all_gather it and reduce it yourself)");
    using kind = detail::comm_mpi::coll_kind;
    const std::int64_t type_and_op = static_cast<std::int64_t>(sizeof(T)) * 16 +
                                     (std::is_floating_point_v<T> ? 8 : 0) + static_cast<std::int64_t>(op);
    agree(kind::all_reduce, static_cast<std::int64_t>(inout.size()), "element count", type_and_op,
          "element type or reduce_op");
    const int count = int_count(inout.size(), "all_reduce");
    const MPI_Datatype type = detail::comm_mpi::datatype_of<T>();
    MPI_Request request = MPI_REQUEST_NULL;
    if constexpr (std::is_floating_point_v<T>) {
      // Rank r owns chunk r: every rank sends it its piece (all-to-all), r combines the n
      // pieces in rank order — the order and the code of the local world, so the bits are the
      // same over threads and over MPI — and every rank copies every chunk (all-gather). The
      // traffic is a reduce-scatter's plus an all-gather's, MPI_Allreduce's own.
      const auto n = static_cast<std::size_t>(size_);
      auto layout = std::make_unique<int[]>(4 * n);  // send counts, displacements; receive counts, displacements
      int* counts = layout.get();
      int* displs = layout.get() + n;
      int* piece_counts = layout.get() + 2 * n;
      int* piece_displs = layout.get() + 3 * n;
      for (std::size_t r = 0; r < n; ++r) {
        displs[r] = static_cast<int>(static_cast<std::size_t>(count) * r / n);
        counts[r] = static_cast<int>(static_cast<std::size_t>(count) * (r + 1) / n) - displs[r];
      }
      const auto me = static_cast<std::size_t>(rank_);
      const auto mine = static_cast<std::size_t>(counts[me]);
      for (std::size_t r = 0; r < n; ++r) {
        piece_counts[r] = counts[me];
        piece_displs[r] = static_cast<int>(r * mine);
      }
      auto pieces = std::make_unique<T[]>(n * mine);  // rank r's piece of my chunk at r * mine
      check(MPI_Ialltoallv(inout.data(), counts, displs, type, pieces.get(), piece_counts, piece_displs, type, comm_,
                           &request),
            "MPI_Ialltoallv");
      finish(request, "all_reduce", layout, pieces);
      if (mine > 0) {  // an empty chunk (fewer elements than ranks) has nothing to combine
        T* chunk = inout.data() + displs[me];
        std::memcpy(chunk, pieces.get(), mine * sizeof(T));
        for (std::size_t r = 1; r < n; ++r) detail::comm::combine(chunk, pieces.get() + r * mine, mine, op);
      }
      check(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, inout.data(), counts, displs, type, comm_, &request),
            "MPI_Iallgatherv");
      finish(request, "all_reduce", layout);
    } else {
      check(MPI_Iallreduce(MPI_IN_PLACE, inout.data(), count, type, detail::comm_mpi::op_of(op), comm_, &request),
            "MPI_Iallreduce");
      finish(request, "all_reduce");
    }
  }

  template <class T>
  void all_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_gather moves elements as bytes; T must be trivially copyable");
    using problem = detail::comm_mpi::problem;
    agree(detail::comm_mpi::coll_kind::all_gather, static_cast<std::int64_t>(send.size_bytes()), "send size in bytes", 0, "",
          recv.size_bytes() == send.size_bytes() * static_cast<std::size_t>(size_) ? problem::none : problem::gather_recv_size);
    MPI_Request request = MPI_REQUEST_NULL;
    const int bytes = int_count(send.size_bytes(), "all_gather");
    check(MPI_Iallgather(send.data(), bytes, MPI_BYTE, recv.data(), bytes, MPI_BYTE, comm_, &request), "MPI_Iallgather");
    finish(request, "all_gather");
  }

  template <class T>
  void all_to_all(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_to_all moves elements as bytes; T must be trivially copyable");
    using problem = detail::comm_mpi::problem;
    const auto n = static_cast<std::size_t>(size_);
    problem p = problem::none;
    if (send.size() % n != 0) p = problem::to_all_not_divisible;
    else if (recv.size() != send.size()) p = problem::to_all_recv_size;
    agree(detail::comm_mpi::coll_kind::all_to_all, static_cast<std::int64_t>(send.size_bytes()), "send size in bytes", 0, "", p);
    MPI_Request request = MPI_REQUEST_NULL;
    const int block = int_count(send.size_bytes() / n, "all_to_all");
    check(MPI_Ialltoall(send.data(), block, MPI_BYTE, recv.data(), block, MPI_BYTE, comm_, &request), "MPI_Ialltoall");
    finish(request, "all_to_all");
  }

  template <class T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> send, std::span<const std::int64_t> send_counts,
                    std::span<T> recv, std::span<const std::int64_t> recv_counts) {
    static_assert(communicable_element<T>, "baton: all_to_all_v moves elements as bytes; T must be trivially copyable");
    using problem = detail::comm_mpi::problem;
    using kind = detail::comm_mpi::coll_kind;
    const auto n = static_cast<std::size_t>(size_);
    const auto me = [this] { return rank_text(); };
    problem p = problem::none;
    if (!detail::comm::counts_problem(me, "send_counts", send_counts, size_, send.size()).empty() ||
        !detail::comm::counts_problem(me, "recv_counts", recv_counts, size_, recv.size()).empty()) {
      p = problem::counts_invalid;
    }
    agree(kind::all_to_all_v, static_cast<std::int64_t>(sizeof(T)), "element size in bytes", 0, "", p);
    if (options_.check_collectives) {
      // What each rank sends me must be what I expect: exchange the counts first.
      auto sent_to_me = std::make_unique<std::int64_t[]>(n);
      MPI_Request request = MPI_REQUEST_NULL;
      check(MPI_Ialltoall(send_counts.data(), 1, MPI_INT64_T, sent_to_me.get(), 1, MPI_INT64_T, comm_, &request),
            "MPI_Ialltoall");
      finish(request, "all_to_all_v", sent_to_me);
      const bool same = std::equal(sent_to_me.get(), sent_to_me.get() + n, recv_counts.begin());
      agree(kind::all_to_all_v, 0, "", 0, "", same ? problem::none : problem::counts_disagree);
    }
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    std::size_t send_at = 0, recv_at = 0;
    for (std::size_t i = 0; i < n; ++i) {
      sc[i] = int_count(static_cast<std::size_t>(send_counts[i]) * sizeof(T), "all_to_all_v");
      rc[i] = int_count(static_cast<std::size_t>(recv_counts[i]) * sizeof(T), "all_to_all_v");
      sd[i] = int_count(send_at, "all_to_all_v");
      rd[i] = int_count(recv_at, "all_to_all_v");
      send_at += static_cast<std::size_t>(sc[i]);
      recv_at += static_cast<std::size_t>(rc[i]);
    }
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ialltoallv(send.data(), sc.data(), sd.data(), MPI_BYTE, recv.data(), rc.data(), rd.data(), MPI_BYTE, comm_,
                         &request),
          "MPI_Ialltoallv");
    finish(request, "all_to_all_v");
  }

  template <class T>
  void broadcast(std::span<T> data, int root) {
    static_assert(communicable_element<T>, "baton: broadcast moves elements as bytes; T must be trivially copyable");
    agree(detail::comm_mpi::coll_kind::broadcast, root, "root", static_cast<std::int64_t>(data.size_bytes()),
          "size in bytes");
    // Every rank passed this root (agreed above): all throw alike.
    if (auto bad = detail::comm::root_problem([this] { return rank_text(); }, root, size_); !bad.empty()) {
      throw comm_error(bad);
    }
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibcast(data.data(), int_count(data.size_bytes(), "broadcast"), MPI_BYTE, root, comm_, &request), "MPI_Ibcast");
    finish(request, "broadcast");
  }

  void barrier() {
    if (options_.check_collectives) {
      agree(detail::comm_mpi::coll_kind::barrier, 0, "", 0, "");  // the agreement is itself a barrier
      return;
    }
    refuse_if_broken("barrier");
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
    finish(request, "barrier");
  }

  /// Collective. Colors must be >= 0 on every rank; otherwise every rank throws, naming
  /// the ranks and colors at fault.
  [[nodiscard]] mpi_communicator split(int color, int key) {
    agree(detail::comm_mpi::coll_kind::split, 0, "", 0, "");
    auto scratch = std::make_unique<int[]>(static_cast<std::size_t>(size_) + 1);
    scratch[static_cast<std::size_t>(size_)] = color;
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallgather(&scratch[static_cast<std::size_t>(size_)], 1, MPI_INT, scratch.get(), 1, MPI_INT, comm_, &request),
          "MPI_Iallgather");
    finish(request, "split", scratch);
    const std::span<const int> colors(scratch.get(), static_cast<std::size_t>(size_));
    if (auto bad = detail::comm::colors_problem([this] { return rank_text(); }, size_,
                                                [&](int r) { return colors[static_cast<std::size_t>(r)]; });
        !bad.empty()) {
      throw comm_error(bad);
    }
    MPI_Comm part = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &part), "MPI_Comm_split");  // every rank is here: no wait
    return mpi_communicator(adopt_tag{}, part, options_);
  }

 private:
  struct adopt_tag {};
  mpi_communicator(adopt_tag, MPI_Comm comm, mpi_options options) : options_(options) { adopt(comm); }

  void adopt(MPI_Comm comm) {
    comm_ = comm;
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank_);
    void* value = nullptr;
    int found = 0;
    MPI_Comm_get_attr(comm_, MPI_TAG_UB, &value, &found);
    tag_ub_ = found != 0 ? *static_cast<int*>(value) : 32767;
  }

  /// Frees the communicator, unless a collective on it timed out: MPI still progresses that
  /// collective and would touch a freed communicator, so a broken one is leaked on purpose.
  void release() noexcept {
    if (comm_ != MPI_COMM_NULL && broken_.empty() && !detail::comm_mpi::finalized()) MPI_Comm_free(&comm_);
    comm_ = MPI_COMM_NULL;
  }

  void check_options() const {
    if (options_.timeout < std::chrono::nanoseconds::zero()) {
      throw comm_error("baton::mpi_communicator: the timeout is negative; pass a duration >= 0");
    }
  }

  std::string rank_text() const {
    return "rank " + std::to_string(rank_) + (world_rank_ == rank_ ? "" : " (world rank " + std::to_string(world_rank_) + ")");
  }

  void check(int rc, const char* call) const {
    if (rc != MPI_SUCCESS) throw comm_error(rank_text() + ": " + call + " failed: " + detail::comm_mpi::error_text(rc));
  }

  int int_count(std::size_t n, const char* what) const {
    if (n > static_cast<std::size_t>(INT_MAX)) {
      throw comm_error(rank_text() + ": " + what + ": " + std::to_string(n) +
                       " exceeds the int counts MPI takes; split the transfer into pieces below 2 GiB");
    }
    return static_cast<int>(n);
  }

  mpi_request make_request() const {
    mpi_request r;
    r.rank_text_ = rank_text();
    r.timeout_ = options_.timeout;
    return r;
  }

  void start_send(mpi_request::part& p, std::span<const std::byte> data, int dest, int tag) {
    p.is_recv = false;
    p.peer = dest;
    p.tag = tag;
    p.bytes = data.size();
    check(MPI_Isend(data.data(), int_count(data.size(), "isend"), MPI_BYTE, dest, tag, comm_, &p.request), "MPI_Isend");
  }

  void start_recv(mpi_request::part& p, std::span<std::byte> data, int source, int tag) {
    p.is_recv = true;
    p.peer = source;
    p.tag = tag;
    p.bytes = data.size();
    check(MPI_Irecv(data.data(), int_count(data.size(), "irecv"), MPI_BYTE, source, tag, comm_, &p.request), "MPI_Irecv");
  }

  void refuse_if_broken(const char* what) const {
    if (!broken_.empty()) {
      throw comm_error(rank_text() + ": " + what + " refused: an earlier collective of this communicator timed out (" +
                       broken_ + "); this communicator cannot be used for collectives any more");
    }
  }

  /// Waits for a collective request with the timeout. A collective cannot be cancelled, so
  /// after a timeout the communicator refuses further collectives, and the internal scratch
  /// buffers given as `scratch` are leaked on purpose: MPI may still write into them.
  template <class... Scratch>
  void finish(MPI_Request& request, const char* what, Scratch&... scratch) {
    const auto deadline = detail::comm::deadline_after(options_.timeout);
    int rc = MPI_SUCCESS;
    const bool done = detail::comm::poll_until(
        [&] {
          int flag = 0;
          rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
          return rc != MPI_SUCCESS || flag != 0;
        },
        deadline);
    if (rc != MPI_SUCCESS) throw comm_error(rank_text() + ": " + what + ": MPI error: " + detail::comm_mpi::error_text(rc));
    if (!done) {
      (static_cast<void>(scratch.release()), ...);
      broken_ = rank_text() + ": " + what + " timed out after " + detail::comm::seconds_text(options_.timeout);
      throw comm_error(broken_ + "; some rank did not call " + what +
                       " (every rank must call the same collectives in the same order), or raise mpi_options::timeout");
    }
  }

  /// With check_collectives: one all-reduce (MAX over v and -v) tells every rank whether all
  /// called `kind` with the same `a` and `b`, and which rank (if any) found `p` in its own
  /// arguments; every rank then throws the same error or none does.
  void agree(detail::comm_mpi::coll_kind kind, std::int64_t a, const char* a_name, std::int64_t b, const char* b_name,
             detail::comm_mpi::problem p = detail::comm_mpi::problem::none) {
    const char* what = detail::comm::collective_name(kind);
    refuse_if_broken(what);
    if (!options_.check_collectives) {
      if (p != detail::comm_mpi::problem::none) {
        throw comm_error(rank_text() + ": " + what + ": " + detail::comm_mpi::text_of(p));
      }
      return;
    }
    const auto k = static_cast<std::int64_t>(kind);
    const std::int64_t flag = p == detail::comm_mpi::problem::none ? 0 : (static_cast<std::int64_t>(rank_) + 1) * 64 + static_cast<std::int64_t>(p);
    auto scratch = std::make_unique<std::array<std::int64_t, 7>>(std::array<std::int64_t, 7>{k, -k, a, -a, b, -b, flag});
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Iallreduce(MPI_IN_PLACE, scratch->data(), 7, MPI_INT64_T, MPI_MAX, comm_, &request), "MPI_Iallreduce");
    finish(request, what, scratch);
    const auto& v = *scratch;
    if (v[0] != -v[1]) {
      throw comm_error(rank_text() + ": collective mismatch: some ranks called " + detail::comm::collective_name(static_cast<detail::comm::collective_kind>(v[0])) +
                       " while others called " + detail::comm::collective_name(static_cast<detail::comm::collective_kind>(-v[1])) +
                       "; every rank of a communicator must call the same collectives in the same order");
    }
    if (v[2] != -v[3]) {
      throw comm_error(rank_text() + ": " + what + " called with different " + a_name + " on different ranks (from " +
                       std::to_string(-v[3]) + " to " + std::to_string(v[2]) + "); every rank must pass the same " + a_name);
    }
    if (v[4] != -v[5]) {
      throw comm_error(rank_text() + ": " + what + " called with different " + b_name +
                       " on different ranks; every rank must pass the same " + b_name);
    }
    if (v[6] != 0) {
      throw comm_error(rank_text() + ": " + what + ": on rank " + std::to_string(v[6] / 64 - 1) + ", " +
                       detail::comm_mpi::text_of(static_cast<detail::comm_mpi::problem>(v[6] % 64)));
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  int world_rank_ = 0;
  int tag_ub_ = 32767;
  mpi_options options_;
  std::string broken_;
};

}  // namespace baton
