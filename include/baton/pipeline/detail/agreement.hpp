// baton/pipeline/detail/agreement.hpp — how the ranks of a pipeline make sure, at the start
// of every call, that they are about to run the same thing: each rank's fingerprint (program,
// call, side-input shapes, batch and target rows, options), exchanged among all ranks, and
// the sentence that names the first disagreement. Without it, ranks that disagree would wait
// for messages that never come.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/payload/visit.hpp>
#include <baton/pipeline/detail/extents.hpp>
#include <baton/pipeline/detail/gradient_check.hpp>
#include <baton/pipeline/detail/transfer.hpp>
#include <baton/pipeline/stage.hpp>
#include <baton/schedule/program.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace baton::detail::pipeline {

enum class call_kind : std::int64_t { train = 1, eval = 2 };

// The words every rank contributes at the start of a call.
struct fingerprint {
  static constexpr std::size_t size = 9;
  enum : std::size_t { magic, kind, call, program, side, options, prepared, batch_rows, target_rows };
  std::array<std::int64_t, size> words{};
};

inline constexpr std::uint64_t fnv_offset_basis = 14695981039346656037ull;

inline std::uint64_t hash_mix(std::uint64_t h, std::uint64_t v) noexcept {
  // FNV-1a over the 8 bytes of v.
  for (int i = 0; i < 8; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
  return h;
}

// Computed once per executor: the program does not change after construction.
inline std::uint64_t program_hash(const program& p) {
  std::uint64_t h = fnv_offset_basis;
  h = hash_mix(h, static_cast<std::uint64_t>(p.shape.ranks));
  h = hash_mix(h, static_cast<std::uint64_t>(p.shape.stages_per_rank));
  h = hash_mix(h, static_cast<std::uint64_t>(p.shape.microbatches));
  h = hash_mix(h, static_cast<std::uint64_t>(p.shape.place));
  for (const auto& row : p.ranks) {
    h = hash_mix(h, row.size());
    for (const auto& a : row) {
      h = hash_mix(h, (static_cast<std::uint64_t>(a.stage) << 40) ^ (static_cast<std::uint64_t>(a.kind) << 32) ^
                          static_cast<std::uint64_t>(a.microbatch));
    }
  }
  return h;
}

// The shapes of the side input's tensors (their values may differ between ranks; their
// shapes may not, as every rank splits them the same way).
template <class Side>
std::int64_t side_shape_hash(const Side& side) {
  std::uint64_t h = fnv_offset_basis;
  if constexpr (!std::is_same_v<Side, no_side>) {
    for_each_tensor(side, [&](const auto& t) {
      with_extents(t, [&](const auto& shape) {
        h = hash_mix(h, static_cast<std::uint64_t>(std::ranges::size(shape)));
        for (auto e : shape) h = hash_mix(h, static_cast<std::uint64_t>(e));
      });
    });
  }
  return static_cast<std::int64_t>(h);
}

// Gives every rank the fingerprints of all ranks (`all[r]` is rank r's): rank 0 gathers them
// and sends the table back. That is 2 (n - 1) messages per call where an exchange between
// every pair of ranks takes n (n - 1), and every rank still compares the same table, so every
// rank reaches the same verdict. `all` is reused from call to call. Throws what the
// communicator throws.
template <point_to_point_communicator Comm>
void exchange_fingerprints(Comm& comm, int tag, const fingerprint& mine, std::vector<fingerprint>& all) {
  using request = comm_request_t<Comm>;
  const int n = comm.size();
  const int me = comm.rank();
  all.resize(static_cast<std::size_t>(n));
  all[static_cast<std::size_t>(me)] = mine;
  if (n == 1) return;
  const auto table = std::as_writable_bytes(std::span(all));
  if (me == 0) {
    std::vector<request> requests;
    requests.reserve(static_cast<std::size_t>(n - 1));
    for (int r = 1; r < n; ++r) {
      requests.push_back(comm.irecv(std::as_writable_bytes(std::span(all[static_cast<std::size_t>(r)].words)), r, tag));
    }
    wait_all(requests);
    requests.clear();
    for (int r = 1; r < n; ++r) requests.push_back(comm.isend(std::as_bytes(table), r, tag));
    wait_all(requests);
  } else {
    auto sent = comm.isend(std::as_bytes(std::span(mine.words)), 0, tag);
    auto received = comm.irecv(table, 0, tag);
    // The table comes only after rank 0 has received this rank's words, so once it is here
    // the send is done too: one wait that can block, not two.
    received.wait();
    sent.wait();
  }
}

// "" when the fingerprints agree with this rank's (`me`), otherwise the sentence that names the
// first disagreement and what to do. Every rank compares the same table, so the ranks that
// disagree with each other all fail.
inline std::string fingerprint_disagreement(std::span<const fingerprint> all, int me, int microbatches,
                                            int first_stage_rank, int last_stage_rank) {
  using fp = fingerprint;
  const auto& mine = all[static_cast<std::size_t>(me)].words;
  const auto call_name = [](std::int64_t kind) {
    return kind == static_cast<std::int64_t>(call_kind::train) ? "step()" : "eval()";
  };
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    if (r == me) continue;
    const auto& w = all[static_cast<std::size_t>(r)].words;
    const std::string peer = "rank " + std::to_string(r);
    if (w[fp::magic] != wire_magic) {
      return peer + " sent something other than a pipeline fingerprint: another component uses the pipeline's "
                    "tags on this communicator; set pipeline_options::tag_offset";
    }
    if (w[fp::prepared] == 0) {
      return peer + " could not split its inputs into " + std::to_string(microbatches) +
             " microbatches (see that rank's error): the step is abandoned on every rank";
    }
    if (w[fp::kind] != mine[fp::kind]) {
      return "this rank called " + std::string(call_name(mine[fp::kind])) + " but " + peer + " called " +
             call_name(w[fp::kind]) + ": every pipeline rank must make the same calls in the same order";
    }
    if (w[fp::call] != mine[fp::call]) {
      return peer + " is at call " + std::to_string(w[fp::call]) + " but this rank at call " +
             std::to_string(mine[fp::call]) + ": every pipeline rank must make the same calls in the same order";
    }
    if (w[fp::program] != mine[fp::program]) {
      return "ranks disagree on the schedule: " + peer +
             " runs a different program (policy, schedule_shape or CSV); build every rank's executor from the same "
             "schedule";
    }
    if (w[fp::side] != mine[fp::side]) {
      return "ranks disagree on the shape of the side inputs: " + peer +
             " passed side tensors of other shapes (e.g. another sequence length); pass the same side input on "
             "every rank";
    }
    if (w[fp::options] != mine[fp::options]) {
      return "ranks disagree on pipeline_options (loss_on_every_rank or scaling) with " + peer;
    }
  }
  // The batch's rows are known on the first stage's rank, the target's on the last stage's.
  return target_rows_mismatch(all[static_cast<std::size_t>(first_stage_rank)].words[fp::batch_rows],
                              all[static_cast<std::size_t>(last_stage_rank)].words[fp::target_rows], microbatches);
}

}  // namespace baton::detail::pipeline
