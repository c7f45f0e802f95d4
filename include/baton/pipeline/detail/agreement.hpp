// baton/pipeline/detail/agreement.hpp — how the ranks of a pipeline make sure, at the start
// of every call, that they are about to run the same thing: each rank's fingerprint (program,
// call, side-input shapes, batch and target rows, options) is an agreement descriptor
// (core/agreement.hpp), gathered among all ranks (comm/agree.hpp), and the sentence names the
// first disagreement. Without it, ranks that disagree would wait for messages that never come.
#pragma once

#include <baton/comm/agree.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/core/agreement.hpp>
#include <baton/core/hash.hpp>
#include <baton/core/tags.hpp>
#include <baton/payload/visit.hpp>
#include <baton/pipeline/detail/extents.hpp>
#include <baton/pipeline/detail/gradient_check.hpp>
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

// The words every rank contributes at the start of a call, after the descriptor's own
// (protocol, operation = the call_kind, rank, failure = could not split its inputs).
struct call_field {
  enum : std::size_t { call, program, side, options, batch_rows, target_rows, count };
  // The batch's rows are known on the first stage's rank, the target's on the last stage's:
  // they are compared with each other, not across ranks.
  static constexpr std::uint64_t compared = (std::uint64_t{1} << batch_rows) - 1;
};
using fingerprint = agreement_descriptor<call_field::count>;

// Computed once per executor: the program does not change after construction.
inline std::uint64_t program_hash(const program& p) {
  core::hasher h;
  h.add(static_cast<std::uint64_t>(p.shape.ranks));
  h.add(static_cast<std::uint64_t>(p.shape.stages_per_rank));
  h.add(static_cast<std::uint64_t>(p.shape.microbatches));
  h.add(static_cast<std::uint64_t>(p.shape.place));
  for (const auto& row : p.ranks) {
    h.add(row.size());
    for (const auto& a : row) {
      h.add((static_cast<std::uint64_t>(a.stage) << 40) ^ (static_cast<std::uint64_t>(a.kind) << 32) ^
            static_cast<std::uint64_t>(a.microbatch));
    }
  }
  return static_cast<std::uint64_t>(h.value());
}

// The shapes of the side input's tensors (their values may differ between ranks; their
// shapes may not, as every rank splits them the same way).
template <class Side>
std::int64_t side_shape_hash(const Side& side) {
  core::hasher h;
  if constexpr (!std::is_same_v<Side, no_side>) {
    for_each_tensor(side, [&](const auto& t) {
      with_extents(t, [&](const auto& shape) {
        h.add(static_cast<std::uint64_t>(std::ranges::size(shape)));
        for (auto e : shape) h.add(static_cast<std::uint64_t>(e));
      });
    });
  }
  return h.value();
}

// "" when the fingerprints agree with this rank's (`me`), otherwise the sentence that names the
// first disagreement and what to do. Every rank compares the same table, so the ranks that
// disagree with each other all fail.
inline std::string fingerprint_disagreement(std::span<const fingerprint> all, int me, int microbatches,
                                            int first_stage_rank, int last_stage_rank) {
  const auto call_name = [](std::int64_t kind) {
    return kind == static_cast<std::int64_t>(call_kind::train) ? "step()" : "eval()";
  };
  const agreement_verdict v = compare_descriptors(all, tags::pipeline::first, me, call_field::compared);
  const std::string peer = "rank " + std::to_string(v.rank);
  const auto& mine = all[static_cast<std::size_t>(me)];
  switch (v.what) {
    case agreement_verdict::kind::agreed: break;
    case agreement_verdict::kind::foreign:
      return peer + " sent something other than a pipeline fingerprint: another component uses the pipeline's "
                    "tags on this communicator; set pipeline_options::tag_offset";
    case agreement_verdict::kind::failed:
      return peer + " could not split its inputs into " + std::to_string(microbatches) +
             " microbatches (see that rank's error): the step is abandoned on every rank";
    case agreement_verdict::kind::operation:
      return "this rank called " + std::string(call_name(mine.operation)) + " but " + peer + " called " +
             call_name(v.value) + ": every pipeline rank must make the same calls in the same order";
    case agreement_verdict::kind::field:
      switch (v.field) {
        case call_field::call:
          return peer + " is at call " + std::to_string(v.value) + " but this rank at call " +
                 std::to_string(v.reference_value) + ": every pipeline rank must make the same calls in the same order";
        case call_field::program:
          return "ranks disagree on the schedule: " + peer +
                 " runs a different program (policy, schedule_shape or CSV); build every rank's executor from the "
                 "same schedule";
        case call_field::side:
          return "ranks disagree on the shape of the side inputs: " + peer +
                 " passed side tensors of other shapes (e.g. another sequence length); pass the same side input on "
                 "every rank";
        default:
          return "ranks disagree on pipeline_options (loss_on_every_rank or scaling) with " + peer;
      }
  }
  return target_rows_mismatch(all[static_cast<std::size_t>(first_stage_rank)].values[call_field::batch_rows],
                              all[static_cast<std::size_t>(last_stage_rank)].values[call_field::target_rows], microbatches);
}

}  // namespace baton::detail::pipeline
