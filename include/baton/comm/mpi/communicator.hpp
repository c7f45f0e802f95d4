// baton/comm/mpi/communicator.hpp — mpi_communicator: one rank's handle on an MPI
// communicator, modelling every capability concept with non-blocking MPI calls polled against
// a deadline (see <baton/comm/mpi.hpp> for the whole backend).
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/comm/detail/checks.hpp>
#include <baton/comm/detail/mpi_agreement.hpp>
#include <baton/comm/detail/mpi_all_reduce.hpp>
#include <baton/comm/detail/mpi_notice.hpp>
#include <baton/comm/detail/mpi_state.hpp>
#include <baton/comm/detail/mpi_support.hpp>
#include <baton/comm/detail/unique_state.hpp>
#include <baton/comm/error.hpp>
#include <baton/comm/mpi/options.hpp>
#include <baton/comm/mpi/request.hpp>

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// One rank's handle on an MPI communicator. Move-only; owns (and frees) its MPI_Comm, so
/// destroy it before MPI_Finalize. After a collective timed out, the communicator refuses
/// further collectives and is not freed (MPI may still progress the abandoned collective);
/// such a program should report the error and end.
class mpi_communicator {
 public:
  using request_type = mpi_request;

  /// Wraps a duplicate of `comm` (collective over `comm`), so baton's traffic never matches
  /// the caller's messages and errors return as comm_error. MPI must be initialised.
  explicit mpi_communicator(MPI_Comm comm = MPI_COMM_WORLD, mpi_options options = {}) {
    s_->options = options;
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (initialized == 0 || detail::comm::mpi::finalized()) {
      throw comm_error("baton::mpi_communicator: MPI is not initialised (or already finalised); call MPI_Init or "
                       "MPI_Init_thread first and destroy every communicator before MPI_Finalize");
    }
    s_->check_options();
    MPI_Comm dup = MPI_COMM_NULL;
    s_->check(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup");
    adopt(dup);
    s_->board = std::make_shared<detail::comm::mpi::notice_board>(s_->comm);
  }

  int rank() const noexcept { return s_->rank; }
  int size() const noexcept { return s_->size; }
  /// The MPI communicator baton uses (its own duplicate): for calls baton does not wrap.
  MPI_Comm native_handle() const noexcept { return s_->comm; }
  /// The largest tag MPI allows on this communicator (at least 32767).
  int max_tag() const noexcept { return s_->tag_ub; }

  std::chrono::nanoseconds timeout() const noexcept { return s_->options.timeout; }
  void set_timeout(std::chrono::nanoseconds timeout) {
    s_->options.timeout = timeout;
    s_->check_options();
  }
  const mpi_options& options() const noexcept { return s_->options; }

  /// Tells every rank of this communicator's family — the communicator it was constructed
  /// from and every communicator split from that — that this rank failed with `what`: their
  /// pending and later operations end within milliseconds with comm_error "... aborted because
  /// rank N failed: <what>". run_mpi calls it when its function throws; call it yourself where
  /// a rank's failure is caught outside run_mpi. Does nothing when a failure was already
  /// announced to this rank (its own error is then a consequence). Never throws.
  void announce_failure(std::string_view what) noexcept {
    try {
      if (s_->board) s_->board->announce_failure(what);
    } catch (...) {  // announcing is best effort: the caller is already handling an error
    }
  }

  // ---- point to point ---------------------------------------------------------------

  [[nodiscard]] mpi_request isend(std::span<const std::byte> data, int dest, int tag) {
    detail::comm::check_peer_and_tag([this] { return s_->rank_text(); }, s_->size, "isend", dest, tag, data.size(), s_->tag_ub);
    s_->refuse_if_aborted([&] { return detail::comm::p2p_text("isend", dest, tag, data.size()); });
    mpi_request r = make_request();
    start_send(r.s_->parts[0], data, dest, tag);
    return r;
  }

  [[nodiscard]] mpi_request irecv(std::span<std::byte> data, int source, int tag) {
    detail::comm::check_peer_and_tag([this] { return s_->rank_text(); }, s_->size, "irecv", source, tag, data.size(), s_->tag_ub);
    s_->refuse_if_aborted([&] { return detail::comm::p2p_text("irecv", source, tag, data.size()); });
    mpi_request r = make_request();
    start_recv(r.s_->parts[0], data, source, tag);
    return r;
  }

  [[nodiscard]] mpi_request shift(std::span<const std::byte> send, std::span<std::byte> recv, int k, int tag) {
    const auto peers = detail::comm::ring_peers_of(s_->rank, s_->size, k);
    detail::comm::check_peer_and_tag([this] { return s_->rank_text(); }, s_->size, "shift: isend", peers.dest, tag,
                                     send.size(), s_->tag_ub);
    s_->refuse_if_aborted([&] { return detail::comm::p2p_text("shift: isend", peers.dest, tag, send.size()); });
    mpi_request r = make_request();
    start_recv(r.s_->parts[1], recv, peers.source, tag);
    start_send(r.s_->parts[0], send, peers.dest, tag);
    return r;
  }

  // ---- collectives (agreed first: see detail/mpi_agreement.hpp) ------------------------

  /// Folds every rank's contribution in rank order (see detail/mpi_all_reduce.hpp).
  template <class T>
  void all_reduce(std::span<T> inout, reduce_op op) {
    detail::comm::mpi::all_reduce(*s_, inout, op);
  }

  template <class T>
  void all_gather(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_gather moves elements as bytes; T must be trivially copyable");
    using problem = detail::comm::mpi::problem;
    agree(kind::all_gather, static_cast<std::int64_t>(send.size_bytes()), "send size in bytes", 0, "",
          recv.size_bytes() == send.size_bytes() * static_cast<std::size_t>(s_->size) ? problem::none : problem::gather_recv_size);
    MPI_Request request = MPI_REQUEST_NULL;
    const int bytes = s_->int_count(send.size_bytes(), "all_gather");
    s_->check(MPI_Iallgather(send.data(), bytes, MPI_BYTE, recv.data(), bytes, MPI_BYTE, s_->comm, &request), "MPI_Iallgather");
    s_->finish(request, "all_gather");
  }

  template <class T>
  void all_to_all(std::span<const std::type_identity_t<T>> send, std::span<T> recv) {
    static_assert(communicable_element<T>, "baton: all_to_all moves elements as bytes; T must be trivially copyable");
    using problem = detail::comm::mpi::problem;
    const auto n = static_cast<std::size_t>(s_->size);
    problem p = problem::none;
    if (send.size() % n != 0) p = problem::to_all_not_divisible;
    else if (recv.size() != send.size()) p = problem::to_all_recv_size;
    agree(kind::all_to_all, static_cast<std::int64_t>(send.size_bytes()), "send size in bytes", 0, "", p);
    MPI_Request request = MPI_REQUEST_NULL;
    const int block = s_->int_count(send.size_bytes() / n, "all_to_all");
    s_->check(MPI_Ialltoall(send.data(), block, MPI_BYTE, recv.data(), block, MPI_BYTE, s_->comm, &request), "MPI_Ialltoall");
    s_->finish(request, "all_to_all");
  }

  template <class T>
  void all_to_all_v(std::span<const std::type_identity_t<T>> send, std::span<const std::int64_t> send_counts,
                    std::span<T> recv, std::span<const std::int64_t> recv_counts) {
    static_assert(communicable_element<T>, "baton: all_to_all_v moves elements as bytes; T must be trivially copyable");
    using problem = detail::comm::mpi::problem;
    const auto n = static_cast<std::size_t>(s_->size);
    const auto me = [this] { return s_->rank_text(); };
    problem p = problem::none;
    if (!detail::comm::counts_problem(me, "send_counts", send_counts, s_->size, send.size()).empty() ||
        !detail::comm::counts_problem(me, "recv_counts", recv_counts, s_->size, recv.size()).empty()) {
      p = problem::counts_invalid;
    }
    agree(kind::all_to_all_v, static_cast<std::int64_t>(sizeof(T)), "element size in bytes", 0, "", p);
    if (s_->options.check_collectives) {
      // What each rank sends me must be what I expect: exchange the counts first.
      auto sent_to_me = std::make_unique<std::int64_t[]>(n);
      MPI_Request request = MPI_REQUEST_NULL;
      s_->check(MPI_Ialltoall(send_counts.data(), 1, MPI_INT64_T, sent_to_me.get(), 1, MPI_INT64_T, s_->comm, &request),
               "MPI_Ialltoall");
      s_->finish(request, "all_to_all_v", sent_to_me);
      const bool same = std::equal(sent_to_me.get(), sent_to_me.get() + n, recv_counts.begin());
      agree(kind::all_to_all_v, 0, "", 0, "", same ? problem::none : problem::counts_disagree);
    }
    std::vector<int> sc(n), sd(n), rc(n), rd(n);
    std::size_t send_at = 0, recv_at = 0;
    for (std::size_t i = 0; i < n; ++i) {
      sc[i] = s_->int_count(static_cast<std::size_t>(send_counts[i]) * sizeof(T), "all_to_all_v");
      rc[i] = s_->int_count(static_cast<std::size_t>(recv_counts[i]) * sizeof(T), "all_to_all_v");
      sd[i] = s_->int_count(send_at, "all_to_all_v");
      rd[i] = s_->int_count(recv_at, "all_to_all_v");
      send_at += static_cast<std::size_t>(sc[i]);
      recv_at += static_cast<std::size_t>(rc[i]);
    }
    MPI_Request request = MPI_REQUEST_NULL;
    s_->check(MPI_Ialltoallv(send.data(), sc.data(), sd.data(), MPI_BYTE, recv.data(), rc.data(), rd.data(), MPI_BYTE,
                            s_->comm, &request),
             "MPI_Ialltoallv");
    s_->finish(request, "all_to_all_v");
  }

  template <class T>
  void broadcast(std::span<T> data, int root) {
    static_assert(communicable_element<T>, "baton: broadcast moves elements as bytes; T must be trivially copyable");
    agree(kind::broadcast, root, "root", static_cast<std::int64_t>(data.size_bytes()), "size in bytes");
    // Every rank passed this root (agreed above): all throw alike.
    if (auto bad = detail::comm::root_problem([this] { return s_->rank_text(); }, root, s_->size); !bad.empty()) {
      throw comm_error(bad);
    }
    MPI_Request request = MPI_REQUEST_NULL;
    s_->check(MPI_Ibcast(data.data(), s_->int_count(data.size_bytes(), "broadcast"), MPI_BYTE, root, s_->comm, &request),
             "MPI_Ibcast");
    s_->finish(request, "broadcast");
  }

  void barrier() {
    if (s_->options.check_collectives) {
      agree(kind::barrier, 0, "", 0, "");  // the agreement is itself a barrier
      return;
    }
    detail::comm::mpi::refuse_collective(*s_, "barrier");
    MPI_Request request = MPI_REQUEST_NULL;
    s_->check(MPI_Ibarrier(s_->comm, &request), "MPI_Ibarrier");
    s_->finish(request, "barrier");
  }

  /// Collective. Colors must be >= 0 on every rank; otherwise every rank throws, naming
  /// the ranks and colors at fault.
  [[nodiscard]] mpi_communicator split(int color, int key) {
    agree(kind::split, 0, "", 0, "");
    const auto n = static_cast<std::size_t>(s_->size);
    auto scratch = std::make_unique<int[]>(n + 1);
    scratch[n] = color;
    MPI_Request request = MPI_REQUEST_NULL;
    s_->check(MPI_Iallgather(&scratch[n], 1, MPI_INT, scratch.get(), 1, MPI_INT, s_->comm, &request), "MPI_Iallgather");
    s_->finish(request, "split", scratch);
    const std::span<const int> colors(scratch.get(), n);
    if (auto bad = detail::comm::colors_problem([this] { return s_->rank_text(); }, s_->size,
                                                [&](int r) { return colors[static_cast<std::size_t>(r)]; });
        !bad.empty()) {
      throw comm_error(bad);
    }
    MPI_Comm part = MPI_COMM_NULL;
    s_->check(MPI_Comm_split(s_->comm, color, key, &part), "MPI_Comm_split");  // every rank is here: no wait
    mpi_communicator child(adopt_tag{}, part, s_->options);
    // The part shares this family's notice board; its ranks are translated to the board's.
    child.s_->board = s_->board;
    MPI_Group mine = MPI_GROUP_NULL, board = MPI_GROUP_NULL;
    MPI_Comm_group(child.s_->comm, &mine);
    MPI_Comm_group(s_->board->channel(), &board);
    std::vector<int> ranks(static_cast<std::size_t>(child.s_->size));
    std::iota(ranks.begin(), ranks.end(), 0);
    auto translated = std::make_shared<std::vector<int>>(ranks.size());
    MPI_Group_translate_ranks(mine, child.s_->size, ranks.data(), board, translated->data());
    MPI_Group_free(&mine);
    MPI_Group_free(&board);
    child.s_->board_ranks = std::move(translated);
    return child;
  }

 private:
  using kind = detail::comm::collective_kind;

  struct adopt_tag {};
  mpi_communicator(adopt_tag, MPI_Comm comm, mpi_options options) {
    s_->options = options;
    adopt(comm);
  }

  void adopt(MPI_Comm comm) {
    s_->comm = comm;
    s_->check(MPI_Comm_set_errhandler(s_->comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    s_->check(MPI_Comm_rank(s_->comm, &s_->rank), "MPI_Comm_rank");
    s_->check(MPI_Comm_size(s_->comm, &s_->size), "MPI_Comm_size");
    MPI_Comm_rank(MPI_COMM_WORLD, &s_->world_rank);
    void* value = nullptr;
    int found = 0;
    MPI_Comm_get_attr(s_->comm, MPI_TAG_UB, &value, &found);
    s_->tag_ub = found != 0 ? *static_cast<int*>(value) : 32767;
    // baton's own messages (agreement descriptors, all_reduce data) never match the caller's.
    s_->check(MPI_Comm_dup(s_->comm, &s_->coll), "MPI_Comm_dup");
    s_->check(MPI_Comm_set_errhandler(s_->coll, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  }

  void agree(kind k, std::int64_t a, const char* a_name, std::int64_t b, const char* b_name,
             detail::comm::mpi::problem p = detail::comm::mpi::problem::none) {
    detail::comm::mpi::agree(*s_, k, a, a_name, b, b_name, p);
  }

  mpi_request make_request() const {
    mpi_request r;
    r.s_->rank_text = s_->rank_text();
    r.s_->timeout = s_->options.timeout;
    r.s_->board = s_->board;
    r.s_->board_label = s_->board_label();
    return r;
  }

  void start_send(mpi_request::part& p, std::span<const std::byte> data, int dest, int tag) {
    p = {.is_recv = false, .peer = dest, .tag = tag, .bytes = data.size(), .board_peer = s_->board_rank(dest)};
    s_->check(MPI_Isend(data.data(), s_->int_count(data.size(), "isend"), MPI_BYTE, dest, tag, s_->comm, &p.request), "MPI_Isend");
  }

  void start_recv(mpi_request::part& p, std::span<std::byte> data, int source, int tag) {
    p = {.is_recv = true, .peer = source, .tag = tag, .bytes = data.size(), .board_peer = s_->board_rank(source)};
    s_->check(MPI_Irecv(data.data(), s_->int_count(data.size(), "irecv"), MPI_BYTE, source, tag, s_->comm, &p.request), "MPI_Irecv");
  }

  template <class F>
  friend auto run_mpi(mpi_communicator& comm, F&& fn);

  // Every member, moved as a whole and released (the communicator freed) once.
  detail::comm::unique_state<detail::comm::mpi::comm_state, &detail::comm::mpi::comm_state::release> s_;
};

}  // namespace baton
