// baton/comm/mpi.hpp — the MPI backend: ranks are MPI processes.
//
//     baton::mpi_session mpi(argc, argv);           // MPI_Init_thread; MPI_Finalize at scope end
//     baton::mpi_communicator world;                // a private duplicate of MPI_COMM_WORLD
//     world.all_reduce(std::span(grad), baton::reduce_op::sum);
//                                                   // world is freed first: made after mpi
//
// Models every capability concept with non-blocking MPI calls (MPI_Isend/Irecv and the
// MPI-3 non-blocking collectives) polled against a deadline, so a dead or diverged peer
// ends in comm_error after mpi_options::timeout instead of a hang. The communicator is a
// duplicate with MPI_ERRORS_RETURN, so MPI errors come back as comm_error too.
// Run each rank's work through run_mpi(comm, fn) and a rank that throws tells every other
// rank at once (an out-of-band notice every wait polls): they fail within milliseconds with
// "aborted because rank N failed: <what>", as in the local world. A wait that times out asks
// the other ranks what they wait for and names the rank that made no progress.
// Before each collective every rank checks that all ranks called the same collective with
// the same sizes, type, op and root (see detail/mpi_agreement.hpp): an exchange of 32-byte
// headers, so a mismatch is the same comm_error on every rank instead of a hang or undefined
// behaviour. all_reduce folds every rank's contribution in rank order, as the local world
// does: every rank holds bitwise the same result, and the same bits as a run on threads. A
// small all_reduce sends its data with its header (one exchange in all); a large one is a
// reduce-scatter in segments (each folded while the next arrives) and an all-gather, the
// traffic of MPI_Allreduce's ring.
#pragma once

#include <baton/config.hpp>

#if !BATON_HAS_MPI()
#error "baton/comm/mpi.hpp needs MPI: link baton::mpi (find_package(baton COMPONENTS mpi)); Debian: apt-get install libopenmpi-dev openmpi-bin"
#endif

#include <baton/comm/concepts.hpp>
#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/mpi_agreement.hpp>
#include <baton/comm/detail/mpi_notice.hpp>
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
#include <exception>
#include <functional>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// Settings of an mpi_communicator (inherited by communicators split from it).
struct mpi_options {
  /// The longest any wait (a request's wait(), a collective) may block before it ends with
  /// comm_error. After a collective times out the communicator refuses further collectives.
  std::chrono::nanoseconds timeout = std::chrono::seconds(60);
  /// Before each collective, the ranks check that every rank called the same collective
  /// with the same sizes, element type, root and op, so a mismatch is the same comm_error on
  /// every rank instead of undefined behaviour. all_to_all_v also checks its counts against
  /// the senders'. A small all_reduce carries the check in its own messages (free); other
  /// collectives pay one small exchange (a latency); turn off once a program is known good.
  bool check_collectives = true;
  /// Up to this many ranks the check is an exchange of 32-byte headers between every pair of
  /// ranks (one round trip, and none of its own for a small all_reduce); above it, one
  /// MPI all-reduce of the fingerprints (log n steps) before each collective.
  int exchange_agreement_max_ranks = 16;
};

namespace detail::comm::mpi {

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

}  // namespace detail::comm::mpi

class mpi_communicator;

namespace detail::comm::mpi {
/// A wait tests its own requests on every poll and the notice board (failures, returned
/// peers, queries) on every 16th: a notice still arrives within microseconds of a busy wait
/// (milliseconds of a long one), and a fast transfer does not pay for a second MPI_Test.
inline constexpr unsigned notice_polls = 16;
}  // namespace detail::comm::mpi

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
  /// Ends early with comm_error when a rank announced a failure (run_mpi) or the peer's
  /// run_mpi function returned without the matching call.
  void wait() {
    if (active() == 0) return;
    const auto deadline = detail::comm::deadline_after(timeout_);
    const detail::comm::mpi::waiter me = waiting_for();
    std::string stop;
    unsigned polls = 0;
    const bool done = detail::comm::poll_until(
        [&] {
          if (progress()) return true;
          if (++polls % detail::comm::mpi::notice_polls != 0) return false;
          stop = interruption(me);
          return !stop.empty();
        },
        deadline);
    if (done && stop.empty()) return;
    if (!stop.empty()) {
      abandon();
      throw comm_error(stop);
    }
    const part& p = pending();
    std::string cause = board_ ? board_->diagnose(me, timeout_, board_label_) : std::string();
    if (board_ && !board_->failure().empty()) {
      const std::string what = rank_text_ + ": " + describe(p) + " aborted " + board_->failure();
      abandon();
      throw comm_error(what);
    }
    if (cause.empty()) {
      cause = std::string("peer ") + std::to_string(p.peer) + " posted no matching " + (p.is_recv ? "isend" : "irecv") +
              " with tag " + std::to_string(p.tag) + "; check that both ranks agree on peer, tag and order";
    }
    const std::string what = rank_text_ + ": " + describe(p) + " timed out after " + detail::comm::seconds_text(timeout_) +
                             ": " + cause + ", or raise mpi_options::timeout";
    abandon();
    throw comm_error(what);
  }

  /// True once complete; never blocks. Throws like wait() on an MPI error or size mismatch,
  /// or when a rank announced a failure.
  bool test() {
    if (active() == 0 || progress()) return true;
    if (board_) {
      board_->poll(nullptr);
      if (!board_->failure().empty()) {
        const std::string what = rank_text_ + ": " + describe(pending()) + " aborted " + board_->failure();
        abandon();
        throw comm_error(what);
      }
    }
    return false;
  }

 private:
  friend class mpi_communicator;

  struct part {
    MPI_Request request = MPI_REQUEST_NULL;
    bool is_recv = false;
    int peer = 0;
    int tag = 0;
    std::size_t bytes = 0;
    int board_peer = -1;  // the peer's rank on the notice board
  };

  /// The first part still pending (the receive of a shift before its send).
  const part& pending() const {
    for (const part& p : parts_) {
      if (p.request != MPI_REQUEST_NULL && p.is_recv) return p;
    }
    for (const part& p : parts_) {
      if (p.request != MPI_REQUEST_NULL) return p;
    }
    return parts_[0];
  }

  detail::comm::mpi::waiter waiting_for() {
    return {pending().board_peer, [this] { return describe(pending()); }};
  }

  /// Why this wait must end now — a failure announced by some rank, or a peer whose run_mpi
  /// function returned while the transfer is still pending — or "" to go on waiting.
  std::string interruption(const detail::comm::mpi::waiter& me) {
    if (!board_) return {};
    board_->poll(&me);
    const part& p = pending();
    if (!board_->failure().empty()) return rank_text_ + ": " + describe(p) + " aborted " + board_->failure();
    if (!board_->returned(p.board_peer)) return {};
    // What the peer sent before returning may still be on its way: give it a moment.
    const auto now = std::chrono::steady_clock::now();
    if (returned_seen_ == std::chrono::steady_clock::time_point{}) returned_seen_ = now;
    if (now - returned_seen_ < std::chrono::milliseconds(250)) return {};
    return rank_text_ + ": " + describe(p) + " cannot complete: peer " + std::to_string(p.peer) +
           " returned from its run_mpi function without " +
           (p.is_recv ? "sending a matching message" : "receiving this message") +
           "; make both ranks agree on peer, tag and count";
  }

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
        if (detail::comm::mpi::error_class(rc) == MPI_ERR_TRUNCATE) {
          what += "the message is larger than the receive buffer of " + std::to_string(p.bytes) +
                  " bytes; a message must exactly fill its receive buffer (check the shapes both ranks use)";
        } else {
          what += "MPI error: " + detail::comm::mpi::error_text(rc);
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
    if (active() == 0 || detail::comm::mpi::finalized()) {
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
    board_ = std::move(other.board_);
    board_label_ = std::move(other.board_label_);
    returned_seen_ = other.returned_seen_;
  }

  std::array<part, 2> parts_{};
  std::string rank_text_;
  std::chrono::nanoseconds timeout_{};
  std::shared_ptr<detail::comm::mpi::notice_board> board_;
  std::string board_label_;  // "rank" or "world rank": how diagnoses name board ranks
  std::chrono::steady_clock::time_point returned_seen_{};
};

/// MPI's lifetime as an object: MPI_Init_thread when made, MPI_Finalize when destroyed (unless
/// the program finalised MPI itself). Make one per process before any communicator, in a
/// scope that encloses them all, so that every communicator is freed before MPI_Finalize:
///
///     baton::mpi_session mpi(argc, argv);   // MPI_THREAD_FUNNELED unless asked for more
///     baton::mpi_communicator world;
///
/// Throws comm_error when MPI is already initialised (or finalised), or when the MPI library
/// cannot give the thread level asked for (it is finalised again first).
class mpi_session {
 public:
  mpi_session(int& argc, char**& argv, int required_thread_level = MPI_THREAD_FUNNELED) {
    start(&argc, &argv, required_thread_level);
  }
  explicit mpi_session(int required_thread_level = MPI_THREAD_FUNNELED) {
    start(nullptr, nullptr, required_thread_level);
  }
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
  ~mpi_session() {
    if (!detail::comm::mpi::finalized()) MPI_Finalize();
  }

  /// The thread level MPI provides (at least the one asked for).
  [[nodiscard]] int thread_level() const noexcept { return provided_; }

 private:
  void start(int* argc, char*** argv, int required) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized != 0 || detail::comm::mpi::finalized()) {
      throw comm_error(std::string("baton::mpi_session: MPI is already ") +
                       (initialized != 0 && !detail::comm::mpi::finalized() ? "initialised" : "finalised") +
                       "; make exactly one mpi_session per process, before any other MPI call");
    }
    MPI_Init_thread(argc, argv, required, &provided_);
    if (provided_ < required) {
      const int got = provided_;
      MPI_Finalize();
      throw comm_error("baton::mpi_session: the MPI library provides thread level " + std::to_string(got) +
                       " but " + std::to_string(required) +
                       " was asked for (MPI_THREAD_SINGLE 0, FUNNELED 1, SERIALIZED 2, MULTIPLE 3); ask for "
                       "less, or use an MPI built with thread support");
    }
  }

  int provided_ = 0;
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
    if (initialized == 0 || detail::comm::mpi::finalized()) {
      throw comm_error("baton::mpi_communicator: MPI is not initialised (or already finalised); call MPI_Init or "
                       "MPI_Init_thread first and destroy every communicator before MPI_Finalize");
    }
    check_options();
    MPI_Comm dup = MPI_COMM_NULL;
    check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
    adopt(dup);
    board_ = std::make_shared<detail::comm::mpi::notice_board>(comm_);
  }

  mpi_communicator(mpi_communicator&& other) noexcept
      : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
        coll_(std::exchange(other.coll_, MPI_COMM_NULL)),
        rank_(other.rank_),
        size_(other.size_),
        world_rank_(other.world_rank_),
        tag_ub_(other.tag_ub_),
        options_(other.options_),
        broken_(std::move(other.broken_)),
        board_(std::move(other.board_)),
        board_ranks_(std::move(other.board_ranks_)),
        scratch_(std::move(other.scratch_)),
        requests_(std::move(other.requests_)),
        completed_at_(std::move(other.completed_at_)),
        statuses_(std::move(other.statuses_)) {}
  mpi_communicator& operator=(mpi_communicator&& other) noexcept {
    if (this != &other) {
      release();
      comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
      coll_ = std::exchange(other.coll_, MPI_COMM_NULL);
      rank_ = other.rank_;
      size_ = other.size_;
      world_rank_ = other.world_rank_;
      tag_ub_ = other.tag_ub_;
      options_ = other.options_;
      broken_ = std::move(other.broken_);
      board_ = std::move(other.board_);
      board_ranks_ = std::move(other.board_ranks_);
      scratch_ = std::move(other.scratch_);
      requests_ = std::move(other.requests_);
      completed_at_ = std::move(other.completed_at_);
      statuses_ = std::move(other.statuses_);
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

  /// Tells every rank of this communicator's family — the communicator it was constructed
  /// from and every communicator split from that — that this rank failed with `what`: their
  /// pending and later operations end within milliseconds with comm_error "... aborted because
  /// rank N failed: <what>". run_mpi calls it when its function throws; call it yourself where
  /// a rank's failure is caught outside run_mpi. Does nothing when a failure was already
  /// announced to this rank (its own error is then a consequence). Never throws.
  void announce_failure(std::string_view what) noexcept {
    try {
      if (board_) board_->announce_failure(what);
    } catch (...) {  // announcing is best effort: the caller is already handling an error
    }
  }

  // ---- point to point ---------------------------------------------------------------

  [[nodiscard]] mpi_request isend(std::span<const std::byte> data, int dest, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "isend", dest, tag, data.size(), tag_ub_);
    refuse_if_aborted([&] { return detail::comm::p2p_text("isend", dest, tag, data.size()); });
    mpi_request r = make_request();
    start_send(r.parts_[0], data, dest, tag);
    return r;
  }

  [[nodiscard]] mpi_request irecv(std::span<std::byte> data, int source, int tag) {
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "irecv", source, tag, data.size(), tag_ub_);
    refuse_if_aborted([&] { return detail::comm::p2p_text("irecv", source, tag, data.size()); });
    mpi_request r = make_request();
    start_recv(r.parts_[0], data, source, tag);
    return r;
  }

  [[nodiscard]] mpi_request shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    const auto peers = detail::comm::ring_peers_of(rank_, size_, k);
    detail::comm::check_peer_and_tag([this] { return rank_text(); }, size_, "shift: isend", peers.dest, tag, send.size(),
                                     tag_ub_);
    refuse_if_aborted([&] { return detail::comm::p2p_text("shift: isend", peers.dest, tag, send.size()); });
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
    namespace cm = detail::comm::mpi;
    const std::int64_t type_and_op = static_cast<std::int64_t>(sizeof(T)) * 16 +
                                     (std::is_floating_point_v<T> ? 8 : 0) + static_cast<std::int64_t>(op);
    const cm::header mine{static_cast<std::int64_t>(cm::coll_kind::all_reduce), static_cast<std::int64_t>(inout.size()),
                          type_and_op, 0};
    const auto n = static_cast<std::size_t>(size_);
    if (size_ > 1 && exchange_agreement() && (n - 1) * inout.size_bytes() <= small_all_reduce_bytes) {
      // Small: the data travels with the agreement header to every other rank, and every rank
      // folds all contributions itself — one exchange in all.
      refuse_if_aborted([] { return std::string("all_reduce"); });
      refuse_if_broken("all_reduce");
      const std::byte* base = exchange(mine, std::as_bytes(inout), "all_reduce");
      if (base == nullptr) disagreed(mine, "element count", "element type or reduce_op");
      const std::size_t slot = cm::header_bytes + inout.size_bytes();
      const auto piece = [&](int r) {
        return reinterpret_cast<const T*>(base + slot * static_cast<std::size_t>(r) + cm::header_bytes);
      };
      cm::fold_in_rank_order(inout.data(), inout.size(), size_, piece, op);
      return;
    }
    agree(cm::coll_kind::all_reduce, mine.a, "element count", mine.b, "element type or reduce_op");
    static_cast<void>(int_count(inout.size(), "all_reduce"));
    if (size_ > 1) all_reduce_in_chunks(inout, op);
  }

  template <class T>
  void all_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_gather moves elements as bytes; T must be trivially copyable");
    using problem = detail::comm::mpi::problem;
    agree(detail::comm::mpi::coll_kind::all_gather, static_cast<std::int64_t>(send.size_bytes()), "send size in bytes", 0, "",
          recv.size_bytes() == send.size_bytes() * static_cast<std::size_t>(size_) ? problem::none : problem::gather_recv_size);
    MPI_Request request = MPI_REQUEST_NULL;
    const int bytes = int_count(send.size_bytes(), "all_gather");
    check(MPI_Iallgather(send.data(), bytes, MPI_BYTE, recv.data(), bytes, MPI_BYTE, comm_, &request), "MPI_Iallgather");
    finish(request, "all_gather");
  }

  template <class T>
  void all_to_all(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_to_all moves elements as bytes; T must be trivially copyable");
    using problem = detail::comm::mpi::problem;
    const auto n = static_cast<std::size_t>(size_);
    problem p = problem::none;
    if (send.size() % n != 0) p = problem::to_all_not_divisible;
    else if (recv.size() != send.size()) p = problem::to_all_recv_size;
    agree(detail::comm::mpi::coll_kind::all_to_all, static_cast<std::int64_t>(send.size_bytes()), "send size in bytes", 0, "", p);
    MPI_Request request = MPI_REQUEST_NULL;
    const int block = int_count(send.size_bytes() / n, "all_to_all");
    check(MPI_Ialltoall(send.data(), block, MPI_BYTE, recv.data(), block, MPI_BYTE, comm_, &request), "MPI_Ialltoall");
    finish(request, "all_to_all");
  }

  template <class T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> send, std::span<const std::int64_t> send_counts,
                    std::span<T> recv, std::span<const std::int64_t> recv_counts) {
    static_assert(communicable_element<T>, "baton: all_to_all_v moves elements as bytes; T must be trivially copyable");
    using problem = detail::comm::mpi::problem;
    using kind = detail::comm::mpi::coll_kind;
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
    agree(detail::comm::mpi::coll_kind::broadcast, root, "root", static_cast<std::int64_t>(data.size_bytes()),
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
      agree(detail::comm::mpi::coll_kind::barrier, 0, "", 0, "");  // the agreement is itself a barrier
      return;
    }
    refuse_if_aborted([] { return std::string("barrier"); });
    refuse_if_broken("barrier");
    MPI_Request request = MPI_REQUEST_NULL;
    check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier");
    finish(request, "barrier");
  }

  /// Collective. Colors must be >= 0 on every rank; otherwise every rank throws, naming
  /// the ranks and colors at fault.
  [[nodiscard]] mpi_communicator split(int color, int key) {
    agree(detail::comm::mpi::coll_kind::split, 0, "", 0, "");
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
    mpi_communicator child(adopt_tag{}, part, options_);
    // The part shares this family's notice board; its ranks are translated to the board's.
    child.board_ = board_;
    MPI_Group mine = MPI_GROUP_NULL, board = MPI_GROUP_NULL;
    MPI_Comm_group(child.comm_, &mine);
    MPI_Comm_group(board_->channel(), &board);
    std::vector<int> ranks(static_cast<std::size_t>(child.size_));
    std::iota(ranks.begin(), ranks.end(), 0);
    auto translated = std::make_shared<std::vector<int>>(ranks.size());
    MPI_Group_translate_ranks(mine, child.size_, ranks.data(), board, translated->data());
    MPI_Group_free(&mine);
    MPI_Group_free(&board);
    child.board_ranks_ = std::move(translated);
    return child;
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
    // baton's own messages (agreement headers, all_reduce data) never match the caller's.
    check(MPI_Comm_dup(comm_, &coll_), "MPI_Comm_dup");
    check(MPI_Comm_set_errhandler(coll_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  }

  /// Frees the communicator, unless a collective on it timed out: MPI still progresses that
  /// collective and would touch a freed communicator, so a broken one is leaked on purpose.
  void release() noexcept {
    if (broken_.empty() && !detail::comm::mpi::finalized()) {
      if (coll_ != MPI_COMM_NULL) MPI_Comm_free(&coll_);
      if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
    }
    comm_ = MPI_COMM_NULL;
    coll_ = MPI_COMM_NULL;
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
    if (rc != MPI_SUCCESS) throw comm_error(rank_text() + ": " + call + " failed: " + detail::comm::mpi::error_text(rc));
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
    r.board_ = board_;
    r.board_label_ = board_label();
    return r;
  }

  /// This communicator's rank `r` on the notice board.
  int board_rank(int r) const {
    return board_ranks_ ? (*board_ranks_)[static_cast<std::size_t>(r)] : r;
  }
  /// How diagnoses name board ranks: "rank" on the communicator itself, "world rank" on a split.
  std::string board_label() const { return board_ranks_ ? "world rank" : "rank"; }

  /// Refuses a new operation once a failure was announced: "rank 1: isend to peer 2 (...)
  /// aborted because rank 3 failed: ...".
  template <class What>
  void refuse_if_aborted(const What& what) {
    if (!board_) return;
    // Every 16th new operation reads the notices (every wait reads them too): one between is
    // refused by its wait instead, microseconds later, and a fast one pays no extra MPI_Test.
    if (++started_ % detail::comm::mpi::notice_polls == 0) board_->poll(nullptr);
    if (!board_->failure().empty()) throw comm_error(rank_text() + ": " + what() + " aborted " + board_->failure());
  }

  void start_send(mpi_request::part& p, std::span<const std::byte> data, int dest, int tag) {
    p.is_recv = false;
    p.peer = dest;
    p.tag = tag;
    p.bytes = data.size();
    p.board_peer = board_rank(dest);
    check(MPI_Isend(data.data(), int_count(data.size(), "isend"), MPI_BYTE, dest, tag, comm_, &p.request), "MPI_Isend");
  }

  void start_recv(mpi_request::part& p, std::span<std::byte> data, int source, int tag) {
    p.is_recv = true;
    p.peer = source;
    p.tag = tag;
    p.bytes = data.size();
    p.board_peer = board_rank(source);
    check(MPI_Irecv(data.data(), int_count(data.size(), "irecv"), MPI_BYTE, source, tag, comm_, &p.request), "MPI_Irecv");
  }

  void refuse_if_broken(const char* what) const {
    if (!broken_.empty()) {
      throw comm_error(rank_text() + ": " + what + " refused: an earlier collective of this communicator timed out (" +
                       broken_ + "); this communicator cannot be used for collectives any more");
    }
  }

  /// Polls `done()` with the timeout until it returns true. A collective cannot be
  /// cancelled, so after a timeout the communicator refuses further collectives, and
  /// `abandon()` leaks what MPI may still write into (and frees what it may still use).
  /// A collective also ends early when a rank announced a failure, or when a member's
  /// run_mpi function returned without calling it; the communicator is then broken likewise.
  /// An exception from `done()` (an MPI error) breaks it too.
  template <class Done, class Abandon>
  void await(Done&& done, const char* what, Abandon&& abandon) {
    const auto deadline = detail::comm::deadline_after(options_.timeout);
    const detail::comm::mpi::waiter me{-1, [what] { return std::string(what) + " (a collective)"; }};
    std::string stop;
    std::chrono::steady_clock::time_point returned_seen{};
    bool completed = false;
    unsigned polls = 0;
    try {
      completed = detail::comm::poll_until(
          [&] {
            if (done()) return true;
            if (++polls % detail::comm::mpi::notice_polls != 0) return false;
            stop = interruption(me, what, returned_seen);
            return !stop.empty();
          },
          deadline);
    } catch (const std::exception& e) {
      broken_ = e.what();
      abandon();
      throw;
    }
    if (completed && stop.empty()) return;
    abandon();
    if (!stop.empty()) {
      broken_ = stop;
      throw comm_error(stop);
    }
    broken_ = rank_text() + ": " + what + " timed out after " + detail::comm::seconds_text(options_.timeout);
    std::string cause = board_->diagnose(me, options_.timeout, board_label());
    if (!board_->failure().empty()) {
      broken_ = rank_text() + ": " + what + " aborted " + board_->failure();
      throw comm_error(broken_);
    }
    if (cause.empty()) cause = "some rank did not call " + std::string(what) + " (every rank must call the same collectives in the same order)";
    throw comm_error(broken_ + "; " + cause + ", or raise mpi_options::timeout");
  }

  /// Waits for an MPI collective request (see await); the internal buffers given as
  /// `scratch` are leaked on a timeout.
  template <class... Scratch>
  void finish(MPI_Request& request, const char* what, Scratch&... scratch) {
    int rc = MPI_SUCCESS;
    await(
        [&] {
          int flag = 0;
          rc = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
          return rc != MPI_SUCCESS || flag != 0;
        },
        what, [&] { (static_cast<void>(scratch.release()), ...); });
    if (rc != MPI_SUCCESS) throw comm_error(rank_text() + ": " + what + ": MPI error: " + detail::comm::mpi::error_text(rc));
  }

  /// Waits until every request of `requests` (a range of requests_) is complete, calling
  /// `completed(index, rc, status)` for each as it completes (rc: MPI_SUCCESS or the error
  /// it completed with). See await: on a timeout the scratch buffer is leaked and every
  /// pending request of requests_ is freed.
  template <class Completed>
  void await_requests(std::span<MPI_Request> requests, const char* what, Completed&& completed) {
    // One MPI_Testsome per poll: one pass of MPI's progress engine, however many requests
    // (with mpi_yield_when_idle, every idle pass also gives the core away).
    completed_at_.resize(requests.size());
    statuses_.resize(requests.size());
    await(
        [&] {
          int count = 0;
          const int rc = MPI_Testsome(static_cast<int>(requests.size()), requests.data(), &count, completed_at_.data(),
                                      statuses_.data());
          if (count == MPI_UNDEFINED) return true;  // none was active
          if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) {
            throw comm_error(rank_text() + ": " + what + ": MPI error: " + detail::comm::mpi::error_text(rc));
          }
          for (int k = 0; k < count; ++k) {
            const MPI_Status& status = statuses_[static_cast<std::size_t>(k)];
            const auto at = static_cast<std::size_t>(completed_at_[static_cast<std::size_t>(k)]);
            const int error = rc == MPI_ERR_IN_STATUS ? status.MPI_ERROR : MPI_SUCCESS;
            // Open MPI leaves a request that completed with an error allocated: free it.
            if (error != MPI_SUCCESS && requests[at] != MPI_REQUEST_NULL) MPI_Request_free(&requests[at]);
            completed(at, error, status);
          }
          return std::all_of(requests.begin(), requests.end(), [](MPI_Request r) { return r == MPI_REQUEST_NULL; });
        },
        what,
        [&] {
          scratch_.leak();
          for (MPI_Request& r : requests_) {
            if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
          }
        });
  }

  /// Why a collective must end now, or "" to go on waiting (see mpi_request::interruption).
  std::string interruption(const detail::comm::mpi::waiter& me, const char* what,
                           std::chrono::steady_clock::time_point& returned_seen) {
    board_->poll(&me);
    if (!board_->failure().empty()) return rank_text() + ": " + what + " aborted " + board_->failure();
    std::string gone;
    for (int r = 0; r < size_; ++r) {
      if (board_->returned(board_rank(r))) gone += (gone.empty() ? "" : ", ") + std::to_string(r);
    }
    if (gone.empty()) return {};
    const auto now = std::chrono::steady_clock::now();
    if (returned_seen == std::chrono::steady_clock::time_point{}) returned_seen = now;
    if (now - returned_seen < std::chrono::milliseconds(250)) return {};
    return rank_text() + ": " + what + " cannot complete: rank(s) " + gone +
           " returned from their run_mpi function without calling " + what +
           "; every rank of a communicator must call the same collectives in the same order";
  }

  // ---- the agreement (see detail/mpi_agreement.hpp) ---------------------------------

  /// An all_reduce of at most this many bytes times (ranks - 1) sends its data with the
  /// agreement header to every rank, instead of a reduce-scatter and an all-gather.
  static constexpr std::size_t small_all_reduce_bytes = std::size_t{64} << 10;
  /// A large all_reduce moves each rank's pieces in segments of this size, folding one
  /// while the next arrives (2 segments per rank of scratch).
  static constexpr std::size_t all_reduce_segment_bytes = std::size_t{256} << 10;

  /// Whether the agreement is an exchange of headers (see mpi_options).
  bool exchange_agreement() const noexcept { return size_ <= options_.exchange_agreement_max_ranks; }

  static detail::comm::mpi::header header_of(detail::comm::mpi::coll_kind kind, std::int64_t a, std::int64_t b,
                                            std::int64_t flag) {
    return {static_cast<std::int64_t>(kind), a, b, flag};
  }

  /// Sends `mine` followed by `payload` to every other rank, and receives every other rank's
  /// message of the same size. Returns where they are — rank r's at r x (32 + payload bytes),
  /// this rank's own copy in its own slot — when every message had this size and a header of
  /// the same call; otherwise null, and then on every rank (see detail/mpi_agreement.hpp).
  const std::byte* exchange(const detail::comm::mpi::header& mine, std::span<const std::byte> payload, const char* what) {
    namespace cm = detail::comm::mpi;
    const auto n = static_cast<std::size_t>(size_);
    const std::size_t slot = cm::header_bytes + payload.size();
    const int slot_count = int_count(slot, what);
    std::byte* base = scratch_.get(slot * n);
    std::byte* own = base + slot * static_cast<std::size_t>(rank_);
    std::memcpy(own, &mine, cm::header_bytes);
    if (!payload.empty()) std::memcpy(own + cm::header_bytes, payload.data(), payload.size());
    requests_.assign(2 * (n - 1), MPI_REQUEST_NULL);
    std::size_t i = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      check(MPI_Irecv(base + slot * static_cast<std::size_t>(r), slot_count, MPI_BYTE, r, cm::tag_header, coll_,
                      &requests_[i++]),
            "MPI_Irecv");
    }
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      check(MPI_Isend(own, slot_count, MPI_BYTE, r, cm::tag_header, coll_, &requests_[i++]), "MPI_Isend");
    }
    bool same = true;
    await_requests(std::span(requests_), what, [&](std::size_t index, int rc, const MPI_Status& status) {
      const bool receive = index < n - 1;
      if (rc != MPI_SUCCESS) {
        if (receive && cm::error_class(rc) == MPI_ERR_TRUNCATE) {  // a longer message: another call
          same = false;
          return;
        }
        throw comm_error(rank_text() + ": " + what + ": MPI error: " + cm::error_text(rc));
      }
      if (!receive) return;
      const int from = static_cast<int>(index) < rank_ ? static_cast<int>(index) : static_cast<int>(index) + 1;
      int received = 0;
      MPI_Get_count(&status, MPI_BYTE, &received);
      cm::header theirs;
      std::memcpy(&theirs, base + slot * static_cast<std::size_t>(from), cm::header_bytes);
      if (received != slot_count || !theirs.same_call(mine)) same = false;
    });
    return same ? base : nullptr;
  }

  /// The exchange found ranks in different calls: tells every rank which difference, with
  /// the same text everywhere.
  [[noreturn]] void disagreed(const detail::comm::mpi::header& mine, const char* a_name, const char* b_name) {
    agree_by_reduction(mine, a_name, b_name);
    throw comm_error(rank_text() + ": " + detail::comm::collective_name(static_cast<detail::comm::mpi::coll_kind>(mine.kind)) +
                     ": the ranks' agreement messages differ in size; every rank must call the same collectives "
                     "with the same arguments");
  }

  /// With check_collectives: tells every rank whether all called `kind` with the same `a`
  /// and `b`, and which rank (if any) found `p` in its own arguments; every rank then throws
  /// the same error or none does.
  void agree(detail::comm::mpi::coll_kind kind, std::int64_t a, const char* a_name, std::int64_t b, const char* b_name,
             detail::comm::mpi::problem p = detail::comm::mpi::problem::none) {
    namespace cm = detail::comm::mpi;
    const char* what = detail::comm::collective_name(kind);
    refuse_if_aborted([what] { return std::string(what); });
    refuse_if_broken(what);
    const std::int64_t flag =
        p == cm::problem::none ? 0 : (static_cast<std::int64_t>(rank_) + 1) * 64 + static_cast<std::int64_t>(p);
    if (!options_.check_collectives || size_ == 1) {
      if (p != cm::problem::none) throw comm_error(rank_text() + ": " + what + ": " + cm::text_of(p));
      return;
    }
    const cm::header mine = header_of(kind, a, b, flag);
    if (!exchange_agreement()) {
      agree_by_reduction(mine, a_name, b_name);
      return;
    }
    const std::byte* base = exchange(mine, {}, what);
    if (base == nullptr) disagreed(mine, a_name, b_name);
    // Every rank called the same collective: the same problem flags reach every rank.
    std::int64_t worst = 0;
    for (int r = 0; r < size_; ++r) {
      cm::header h;
      std::memcpy(&h, base + cm::header_bytes * static_cast<std::size_t>(r), cm::header_bytes);
      worst = std::max(worst, h.flag);
    }
    throw_if_flagged(what, worst);
  }

  void throw_if_flagged(const char* what, std::int64_t flag) const {
    if (flag != 0) {
      throw comm_error(rank_text() + ": " + what + ": on rank " + std::to_string(flag / 64 - 1) + ", " +
                       detail::comm::mpi::text_of(static_cast<detail::comm::mpi::problem>(flag % 64)));
    }
  }

  /// One all-reduce (MAX over v and -v) of every rank's header: every rank learns the same
  /// range of each field, and throws the same error (or none does). The agreement of large
  /// communicators, and what an exchange that found a mismatch falls back on for the text.
  void agree_by_reduction(const detail::comm::mpi::header& mine, const char* a_name, const char* b_name) {
    namespace cm = detail::comm::mpi;
    const auto kind = static_cast<cm::coll_kind>(mine.kind);
    const char* what = detail::comm::collective_name(kind);
    auto scratch = std::make_unique<std::array<std::int64_t, 7>>(
        std::array<std::int64_t, 7>{mine.kind, -mine.kind, mine.a, -mine.a, mine.b, -mine.b, mine.flag});
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
    throw_if_flagged(what, v[6]);
  }

  // ---- a large all_reduce ------------------------------------------------------------

  /// Reduce-scatter then all-gather, over baton's own messages. Rank r owns chunk r: every
  /// rank sends r its piece of it in segments, and r folds each segment's pieces in rank order
  /// (while the next arrives) into `inout`; then every rank sends its reduced chunk to every
  /// other. The traffic of MPI_Allreduce's ring: 2 (n - 1) / n of the buffer per rank.
  template <class T>
  void all_reduce_in_chunks(std::span<T> inout, reduce_op op) {
    namespace cm = detail::comm::mpi;
    const int n = size_;
    const auto un = static_cast<std::size_t>(n);
    const std::size_t count = inout.size();
    const MPI_Datatype type = cm::datatype_of<T>();
    const std::size_t seg = std::max<std::size_t>(1, all_reduce_segment_bytes / sizeof(T));
    const auto begin = [&](int r) { return cm::chunk_begin(count, n, r); };
    const auto length = [&](int r) { return begin(r + 1) - begin(r); };
    const auto segments = [&](int r) { return (length(r) + seg - 1) / seg; };
    const auto piece_count = [&](int r, std::size_t k) { return static_cast<int>(std::min(seg, length(r) - k * seg)); };
    T* const chunk = inout.data() + begin(rank_);
    const std::size_t my_segments = segments(rank_);
    // Two windows of receive slots, one slot per rank (this rank's stays unused).
    T* const window = reinterpret_cast<T*>(scratch_.get(2 * un * seg * sizeof(T)));
    const auto slot = [&](std::size_t k, int r) { return window + ((k % 2) * un + static_cast<std::size_t>(r)) * seg; };
    std::size_t sends = 0;
    for (int r = 0; r < n; ++r) sends += r == rank_ ? 0 : segments(r);
    requests_.assign(2 * un + sends, MPI_REQUEST_NULL);  // receives of window 0, of window 1, then the sends
    const auto receive = [&](std::size_t k) {
      if (k >= my_segments) return;
      for (int r = 0; r < n; ++r) {
        if (r == rank_) continue;
        check(MPI_Irecv(slot(k, r), piece_count(rank_, k), type, r, cm::tag_reduce, coll_,
                        &requests_[(k % 2) * un + static_cast<std::size_t>(r)]),
              "MPI_Irecv");
      }
    };
    receive(0);
    receive(1);
    std::size_t at = 2 * un;
    for (std::size_t k = 0;; ++k) {  // the sends, segment by segment, round robin over the ranks
      bool any = false;
      for (int r = 0; r < n; ++r) {
        if (r == rank_ || k >= segments(r)) continue;
        any = true;
        check(MPI_Isend(inout.data() + begin(r) + k * seg, piece_count(r, k), type, r, cm::tag_reduce, coll_,
                        &requests_[at++]),
              "MPI_Isend");
      }
      if (!any) break;
    }
    const auto fail_on_error = [&](std::size_t, int rc, const MPI_Status&) {
      if (rc != MPI_SUCCESS) throw comm_error(rank_text() + ": all_reduce: MPI error: " + cm::error_text(rc));
    };
    for (std::size_t k = 0; k < my_segments; ++k) {
      await_requests(std::span(requests_).subspan((k % 2) * un, un), "all_reduce", fail_on_error);
      T* const out = chunk + k * seg;
      const auto len = static_cast<std::size_t>(piece_count(rank_, k));
      // The fold may write over this rank's own piece while reading it only as piece 0 or 1;
      // a later rank's own piece goes to its (otherwise unused) slot first.
      if (rank_ >= 2) std::memcpy(slot(k, rank_), out, len * sizeof(T));
      const auto piece = [&](int r) { return r == rank_ && rank_ < 2 ? out : slot(k, r); };
      cm::fold_in_rank_order(out, len, n, piece, op);
      receive(k + 2);
    }
    await_requests(std::span(requests_).subspan(2 * un), "all_reduce", fail_on_error);
    // All-gather: the sends above have completed, so the chunks may now be overwritten.
    requests_.assign(2 * (un - 1), MPI_REQUEST_NULL);
    std::size_t i = 0;
    for (int r = 0; r < n; ++r) {
      if (r == rank_) continue;
      check(MPI_Irecv(inout.data() + begin(r), static_cast<int>(length(r)), type, r, cm::tag_gather, coll_, &requests_[i++]),
            "MPI_Irecv");
    }
    for (int r = 0; r < n; ++r) {
      if (r == rank_) continue;
      check(MPI_Isend(chunk, static_cast<int>(length(rank_)), type, r, cm::tag_gather, coll_, &requests_[i++]), "MPI_Isend");
    }
    await_requests(std::span(requests_), "all_reduce", fail_on_error);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm coll_ = MPI_COMM_NULL;  // a duplicate for baton's own point-to-point collective traffic
  int rank_ = 0;
  int size_ = 0;
  int world_rank_ = 0;
  int tag_ub_ = 32767;
  mpi_options options_;
  std::string broken_;
  std::shared_ptr<detail::comm::mpi::notice_board> board_;  // shared by the family (see announce_failure)
  std::shared_ptr<const std::vector<int>> board_ranks_;    // rank -> board rank; null: the same
  detail::comm::mpi::scratch_buffer scratch_;               // headers and all_reduce pieces, kept between calls
  std::vector<MPI_Request> requests_;                      // of the point-to-point collective in progress
  std::vector<int> completed_at_;                          // MPI_Testsome's indices and statuses
  unsigned started_ = 0;                                   // operations started (see refuse_if_aborted)
  std::vector<MPI_Status> statuses_;

  template <class F>
  friend auto run_mpi(mpi_communicator& comm, F&& fn);

  /// run_mpi: this rank's function returned; waits (with the timeout) until every rank's has.
  void join_run() {
    board_->announce_return();
    const detail::comm::mpi::waiter me{-1, [] { return std::string("run_mpi (its function returned)"); }};
    const bool done = detail::comm::poll_until(
        [&] {
          board_->poll(&me);
          return board_->all_returned() || !board_->failure().empty();
        },
        detail::comm::deadline_after(options_.timeout));
    if (!board_->failure().empty()) throw comm_error(rank_text() + ": run_mpi aborted " + board_->failure());
    if (done) return;
    std::string cause = board_->diagnose(me, options_.timeout, board_label());
    if (!board_->failure().empty()) throw comm_error(rank_text() + ": run_mpi aborted " + board_->failure());
    if (cause.empty()) cause = "some rank's function did not return";
    throw comm_error(rank_text() + ": run_mpi: the other ranks' functions did not return within " +
                     detail::comm::seconds_text(options_.timeout) + ": " + cause + ", or raise mpi_options::timeout");
  }
};

/// Runs this rank's part of a job: call it on every rank of `comm`, as run_local calls fn
/// on every thread. Returns fn's result once every rank's fn has returned.
///
/// When fn throws, every other rank learns at once (announce_failure): its pending and later
/// operations on `comm` and on the communicators split from it end within milliseconds with
/// comm_error "aborted because rank N failed: <what>", and its run_mpi throws too. This rank's
/// run_mpi rethrows its own error. When fn returns while another rank still waits for a
/// message or collective from it, that wait ends (after a moment for messages in flight) with
/// "returned from its run_mpi function without ...". A wait that times out names the rank
/// that made no progress. After a failure the family of communicators is unusable: report the
/// error and end the job (see docs/communicators.md for MPI_Finalize and MPI_Abort).
template <class F>
auto run_mpi(mpi_communicator& comm, F&& fn) {
  static_assert(std::is_invocable_v<F&, mpi_communicator&>,
                "baton::run_mpi(comm, fn): fn must be callable as fn(baton::mpi_communicator&)");
  using result = std::invoke_result_t<F&, mpi_communicator&>;
  if (!comm.board_) throw comm_error("baton::run_mpi: the communicator is empty (moved from)");
  if (comm.board_ranks_) {
    throw comm_error(comm.rank_text() + ": run_mpi: pass the communicator constructed from an MPI_Comm, not one "
                     "split from it (the split communicators share its failure notices already)");
  }
  struct end_run {
    detail::comm::mpi::notice_board& board;
    ~end_run() { board.end_run(); }
  };
  comm.board_->begin_run();
  const end_run guard{*comm.board_};
  try {
    if constexpr (std::is_void_v<result>) {
      std::invoke(fn, comm);
      comm.join_run();
    } else {
      result value = std::invoke(fn, comm);
      comm.join_run();
      return value;
    }
  } catch (const std::exception& e) {
    comm.announce_failure(e.what());
    throw;
  } catch (...) {
    comm.announce_failure("an exception not derived from std::exception");
    throw;
  }
}

}  // namespace baton
