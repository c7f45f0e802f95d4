// baton/pipeline/executor.hpp — the executor: one per rank, it runs that rank's row of a
// lowered program over the rank's stages and a point-to-point communicator.
//
// Example: a 4-rank ZBV pipeline of the stage `scaled_tanh` (docs/pipeline.md), its loss
// `half_squared_error`, a batch and its target, on each rank of a local world (`comm`).
// ```cpp
// // ZBV runs two stages per rank in a V: shape_for<zbv> gives {comm.size(), 2, 8, placement::v}.
// auto exec = baton::make_pipeline<baton::zbv, baton::uniform_stages<scaled_tanh>>(
//     comm, baton::shape_for<baton::zbv>(comm.size(), /*microbatches=*/8),
//     [](int stage) { return scaled_tanh(3, 0.5 + 0.1 * stage); }, half_squared_error{});
// const baton::step_report report = exec.step(batch, target);  // report.loss on the last stage's rank
// ```
//
// What it guarantees (the seeds it fixes):
//  - stage inputs, outputs and gradients are payloads; only activation fields get gradients,
//    opaque side inputs never enter a backward (seed 000);
//  - receive buffers are pooled, but what a stage sees per microbatch (its input payload and
//    its microbatch_hooks) is fresh, and hooks die with their microbatch (seed 002);
//  - records cross stages; the loss is scaled per microbatch and can be reported on every
//    rank; eval() is forward-only and needs no prior step (seed 004).
//
// The pieces: pipeline/options.hpp (options and reports), pipeline/stage.hpp (what a stage
// is), and under pipeline/detail/: stage_set.hpp (the stage types and their checks),
// action_runner.hpp (the rank's stages and the handler of each action kind),
// compiled_actions.hpp (the row compiled against those handlers), microbatch_state.hpp (what
// is kept per stage and microbatch), wire.hpp, buffer_pool.hpp, sends.hpp and receives.hpp
// (payloads between ranks), loss.hpp (loss weights, scaling and sharing), agreement.hpp (the
// fingerprint every call starts with) and gradient_check.hpp. This file holds the executor's
// public face, its construction and one call's run, and the make_pipeline entry points.
#pragma once

#include <baton/comm/agree.hpp>
#include <baton/comm/concepts.hpp>
#include <baton/core/tags.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/microbatch.hpp>
#include <baton/payload/traits.hpp>
#include <baton/pipeline/detail/action_runner.hpp>
#include <baton/pipeline/detail/agreement.hpp>
#include <baton/pipeline/detail/compiled_actions.hpp>
#include <baton/pipeline/detail/gradient_check.hpp>
#include <baton/pipeline/detail/loss.hpp>
#include <baton/pipeline/detail/stage_set.hpp>
#include <baton/pipeline/error.hpp>
#include <baton/pipeline/options.hpp>
#include <baton/pipeline/stage.hpp>
#include <baton/pipeline/timing.hpp>
#include <baton/schedule/action.hpp>
#include <baton/schedule/lower.hpp>
#include <baton/schedule/policy.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/validate.hpp>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace baton {

/// Runs this rank's part of a pipeline. See the file comment and docs/pipeline.md.
///
/// - `Stages`: `stage_list<S0, ..., S_{N-1}>` (one type per stage; stage i's output type must
///   be stage i+1's input type) or `uniform_stages<S>`;
/// - `Comm`: any point-to-point communicator (the local world, MPI, ...) over the pipeline's
///   ranks: rank r of Comm runs row r of the program;
/// - `Loss`: called on the last stage's rank as `loss(const output&, const target&)` for each
///   microbatch, returning `loss_result<grad_t<output>>` (unscaled value and gradient); with
///   loss_scaling::by_token_count it also provides `std::int64_t tokens(const target&)`.
///
/// Stages are built on the rank that holds them, by `make_stage(i)` where i is a
/// `std::integral_constant<std::size_t, I>` for a stage_list (so the factory can return a
/// different type per stage) and the stage index (int) for uniform_stages. Each stage
/// accumulates its own weight gradients; zero them between steps yourself
/// (for_each_local_stage).
template <class Stages, point_to_point_communicator Comm, class Loss>
class pipeline_executor {
  using set = detail::pipeline::stage_set<Stages>;
  static_assert(detail::pipeline::check_stage_set<set>());
  using runner_type = detail::pipeline::action_runner<Stages, Comm>;
  using action_type = typename runner_type::action_type;
  static constexpr std::size_t type_count = set::type_count;
  template <std::size_t T>
  using stage_t = std::tuple_element_t<T, typename set::types>;

 public:
  using input_type = typename runner_type::input_type;
  using output_type = typename runner_type::output_type;
  using side_type = typename runner_type::side_type;
  using communicator_type = Comm;

  /// Builds the executor of rank comm.rank() for `prog` (compute-only — it is validated and
  /// lowered here — or already lowered). Throws pipeline_error when the program does not fit
  /// the communicator or the stage types, and schedule_error when it is invalid.
  template <class MakeStage>
  pipeline_executor(Comm& comm, program prog, MakeStage&& make_stage, Loss loss, pipeline_options options = {})
      : comm_(&comm),
        loss_(std::move(loss)),
        options_(options),
        program_(checked_program(comm, std::move(prog))),
        program_hash_(detail::pipeline::program_hash(program_)),
        runner_(comm, program_.shape) {
    holds_first_ = stage_rank(program_.shape, 0) == runner_.rank;
    holds_last_ = stage_rank(program_.shape, runner_.num_stages - 1) == runner_.rank;
    check_tag_range();
    runner_.build_stages(make_stage);
    auto row = detail::pipeline::compile_row<runner_type>(
        program_.ranks[static_cast<std::size_t>(runner_.rank)], program_.shape, runner_.slot_of,
        [&](const action& a) { return runner_.handler_for(a); }, [&](const action& a) { return data_tag(a); });
    train_ = std::move(row.train);
    eval_ = std::move(row.eval);
  }

  pipeline_executor(pipeline_executor&&) noexcept = default;
  pipeline_executor& operator=(pipeline_executor&&) noexcept = default;
  pipeline_executor(const pipeline_executor&) = delete;
  pipeline_executor& operator=(const pipeline_executor&) = delete;

  // ---- running ---------------------------------------------------------------------------

  /// One training step: forward and backward of every microbatch under the schedule. The
  /// stages accumulate weight gradients. Every rank of the pipeline calls it; `batch` is used
  /// on the rank holding stage 0 (others may pass an empty payload), `target` on the rank
  /// holding the last stage, `side` on every rank (split per microbatch there).
  template <class Target>
  step_report step(const input_type& batch, const side_type& side, const Target& target) {
    return run(detail::pipeline::call_kind::train, batch, side, target);
  }

  /// Forward only (no saved state kept, no gradients touched): the loss of the batch under
  /// the current weights. Works before the first step() and leaves training state alone.
  template <class Target>
  step_report eval(const input_type& batch, const side_type& side, const Target& target) {
    return run(detail::pipeline::call_kind::eval, batch, side, target);
  }

  /// step() and eval() of a pipeline whose stages take no side input.
  template <class Target>
    requires std::same_as<side_type, no_side>
  step_report step(const input_type& batch, const Target& target) {
    return step(batch, no_side{}, target);
  }
  template <class Target>
    requires std::same_as<side_type, no_side>
  step_report eval(const input_type& batch, const Target& target) {
    return eval(batch, no_side{}, target);
  }

  // ---- hooks -------------------------------------------------------------------------------

  /// Registers a forward hook, called after each forward of each local stage whose types it
  /// accepts as `f(int stage, int microbatch, const input&, const output&,
  /// microbatch_hooks<input, output>& hooks)`. Through `hooks` it can register gradient hooks
  /// that live exactly as long as that microbatch. The forward hook itself stays until
  /// clear_forward_hooks().
  template <class F>
  void add_forward_hook(F f) {
    bool accepted = false;
    [&]<std::size_t... T>(std::index_sequence<T...>) {
      (add_forward_hook_to<T>(f, accepted), ...);
    }(std::make_index_sequence<type_count>{});
    if (!accepted) {
      throw pipeline_error("baton pipeline: add_forward_hook: the hook accepts none of the stage types; it is "
                           "called as f(int stage, int microbatch, const input&, const output&, "
                           "baton::microbatch_hooks<input, output>&)");
    }
  }
  void clear_forward_hooks() {
    std::apply([](auto&... s) { (s.forward_hooks.clear(), ...); }, runner_.stores);
  }

  // ---- access ----------------------------------------------------------------------------

  /// Calls f(int stage_index, S& stage) for every stage this rank holds, in stage order.
  template <class F>
  void for_each_local_stage(F&& f) {
    for (int s : runner_.local_stage_indices) runner_.visit_stage(s, f);
  }
  template <class F>
  void for_each_local_stage(F&& f) const {
    auto& runner = const_cast<runner_type&>(runner_);
    for (int s : runner_.local_stage_indices) runner.visit_stage(s, [&](int i, auto& st) { f(i, std::as_const(st)); });
  }

  /// Stage I of a stage_list (throws pipeline_error when this rank does not hold it).
  template <std::size_t I>
    requires(!set::uniform)
  stage_t<I>& stage() {
    auto& slots = std::get<I>(runner_.stores).slots;
    if (slots.empty()) {
      throw pipeline_error("baton pipeline: rank " + std::to_string(runner_.rank) + " does not hold stage " +
                           std::to_string(I) + " (it runs on rank " +
                           std::to_string(stage_rank(program_.shape, static_cast<int>(I))) + ")");
    }
    return slots.front()->stage;
  }
  /// Stage `index` of uniform_stages (throws pipeline_error when this rank does not hold it).
  stage_t<0>& stage(int index)
    requires set::uniform
  {
    const int slot = index >= 0 && index < runner_.num_stages ? runner_.slot_of[static_cast<std::size_t>(index)] : -1;
    if (slot < 0) {
      throw pipeline_error("baton pipeline: rank " + std::to_string(runner_.rank) + " does not hold stage " +
                           std::to_string(index));
    }
    return std::get<0>(runner_.stores).slots[static_cast<std::size_t>(slot)]->stage;
  }

  [[nodiscard]] const std::vector<int>& local_stages() const noexcept { return runner_.local_stage_indices; }
  [[nodiscard]] bool holds_first_stage() const noexcept { return holds_first_; }
  [[nodiscard]] bool holds_last_stage() const noexcept { return holds_last_; }
  [[nodiscard]] int rank() const noexcept { return runner_.rank; }
  [[nodiscard]] int microbatches() const noexcept { return runner_.microbatches; }
  /// The lowered program this executor runs (every rank's row).
  [[nodiscard]] const program& lowered_program() const noexcept { return program_; }
  /// How many message tags this executor uses, from tags::pipeline::first + tag_offset: a
  /// second executor on the same communicator takes tag_offset >= this one's + tag_count().
  [[nodiscard]] std::int64_t tag_count() const noexcept {
    return 2 + 2 * std::int64_t{runner_.num_stages} * std::int64_t{runner_.microbatches};
  }
  /// Receive-buffer pool counters, summed over this rank's stages (activation and gradient).
  [[nodiscard]] buffer_pool_stats pool_stats() const {
    buffer_pool_stats total;
    std::apply(
        [&](const auto&... s) {
          auto add = [&](const buffer_pool_stats& p) {
            total.allocations += p.allocations;
            total.reuses += p.reuses;
            total.idle += p.idle;
          };
          (add(s.input_pool.stats()), ...);
          (add(s.grad_pool.stats()), ...);
        },
        runner_.stores);
    return total;
  }

 private:
  // ---- construction ----------------------------------------------------------------------

  // The program, checked against the communicator and the stage types, and lowered.
  static program checked_program(const Comm& comm, program prog) {
    if (prog.shape.ranks != comm.size()) {
      throw pipeline_error("baton pipeline: the schedule is for " + std::to_string(prog.shape.ranks) +
                           " ranks but the communicator has " + std::to_string(comm.size()) +
                           "; build the schedule_shape with ranks = comm.size()");
    }
    if constexpr (!set::uniform) {
      if (prog.shape.num_stages() != static_cast<int>(type_count)) {
        throw pipeline_error("baton pipeline: the stage_list has " + std::to_string(type_count) +
                             " stage types but the schedule has " + std::to_string(prog.shape.num_stages()) +
                             " stages (ranks x stages_per_rank); make them agree");
      }
    }
    // lower() validates first (the same schedule_error as validate()) and returns a lowered
    // program unchanged, so each program is validated exactly once.
    if (!is_lowered(prog) && prog.shape.ranks > 1) return lower(prog);
    validate(prog);
    return prog;
  }

  // The executor's tags (core/tags.hpp): from the registry's pipeline range, shifted by
  // tag_offset; the fingerprint, the loss, then one data tag per (microbatch, stage boundary,
  // direction), none reused within a call.
  [[nodiscard]] int fingerprint_tag() const { return tags::pipeline::first + options_.tag_offset; }
  [[nodiscard]] int loss_tag() const { return fingerprint_tag() + 1; }
  [[nodiscard]] int data_tag(const action& a) const { return fingerprint_tag() + 2 + message_tag(program_.shape, a); }

  // Refuses, at construction, a schedule whose data tags would pass the communicator's tag
  // bound: a tag reused within a call would let one message be taken for another.
  void check_tag_range() const {
    if (options_.tag_offset < 0) {
      throw pipeline_error("baton pipeline: pipeline_options::tag_offset is " + std::to_string(options_.tag_offset) +
                           "; it must be >= 0 (0 for the first executor on a communicator, then the previous "
                           "executor's tag_offset + tag_count())");
    }
    const std::int64_t bound = tag_bound(*comm_);
    const std::int64_t last = std::int64_t{tags::pipeline::first} + options_.tag_offset + tag_count() - 1;
    if (last > bound) {
      throw pipeline_error("baton pipeline: the schedule needs " + std::to_string(tag_count()) +
                           " message tags (2 + 2 x " + std::to_string(runner_.num_stages) + " stages x " +
                           std::to_string(runner_.microbatches) + " microbatches), from tag " +
                           std::to_string(fingerprint_tag()) + " to " + std::to_string(last) +
                           ", but the communicator's largest tag is " + std::to_string(bound) +
                           "; run fewer microbatches per step (or stages), or lower pipeline_options::tag_offset");
    }
  }

  template <std::size_t T, class F>
  void add_forward_hook_to(F& f, bool& accepted) {
    using S = stage_t<T>;
    if constexpr (std::is_invocable_v<F&, int, int, const typename S::input&, const typename S::output&,
                                      detail::pipeline::hooks_for<S>&>) {
      std::get<T>(runner_.stores).forward_hooks.emplace_back(f);
      accepted = true;
    }
  }

  // ---- one call (step or eval) ------------------------------------------------------------

  template <class Target>
  step_report run(detail::pipeline::call_kind kind, const input_type& batch, const side_type& side, const Target& target) {
    using out_grad = grad_t<output_type>;
    static_assert(std::is_invocable_v<Loss&, const output_type&, const Target&>,
                  "baton pipeline: the loss is called as loss(const output&, const target&) with the last "
                  "stage's output type and the target passed to step()/eval()");
    static_assert(
        std::is_same_v<std::remove_cvref_t<std::invoke_result_t<Loss&, const output_type&, const Target&>>,
                       loss_result<out_grad>>,
        "baton pipeline: the loss must return baton::loss_result<baton::grad_t<output>>: the unscaled loss "
        "value of the microbatch and its gradient with respect to the last stage's output");
    if (failed_) {
      throw pipeline_error("baton pipeline rank " + std::to_string(runner_.rank) +
                           ": this executor is unusable after a failed call (" + failure_ +
                           "); construct a new one on every rank");
    }
    // Every rank holds the same program (the constructor validated it), so every rank
    // refuses here alike, before any transfer: nothing waits on a peer that left.
    if (kind == detail::pipeline::call_kind::train && is_forward_only(program_)) {
      throw pipeline_error("baton pipeline rank " + std::to_string(runner_.rank) +
                           ": step() trains, but the schedule is forward-only (it has no backward); call "
                           "eval() for the loss, or build the executor from a training schedule");
    }
    const auto call_start = detail::pipeline::action_clock::clock::now();
    ++runner_.call;
    const bool train = kind == detail::pipeline::call_kind::train;
    const int m = runner_.microbatches;

    // Prepare this rank's inputs first, so that a batch that cannot be split fails on every
    // rank together (through the fingerprint) instead of leaving the others waiting.
    std::string prepare_error;
    std::vector<Target> targets;
    // The batch's rows (known on the first stage's rank) and the target's (on the last
    // stage's) must agree; the fingerprint carries them to every rank.
    const std::int64_t batch_rows = holds_first_ ? detail::pipeline::leading_rows(batch) : -1;
    const std::int64_t target_rows = holds_last_ ? detail::pipeline::leading_rows(target) : -1;
    try {
      if (holds_first_) runner_.batch_mbs = split_microbatches(batch, m);
      if constexpr (!std::is_same_v<side_type, no_side>) runner_.side_mbs = split_microbatches(side, m);
      if (holds_last_) {
        targets = split_microbatches(target, m);
        runner_.weights = detail::pipeline::loss_weights(loss_, options_.scaling, targets);
      }
    } catch (const std::exception& e) {
      prepare_error = e.what();
    }
    if (options_.check_agreement) {
      exchange_fingerprint(kind, side, prepare_error, batch_rows, target_rows);
    } else if (!prepare_error.empty()) {
      fail("rank " + std::to_string(runner_.rank) + " could not split its inputs into " + std::to_string(m) +
           " microbatches: " + prepare_error);
    } else if (const auto problem = detail::pipeline::target_rows_mismatch(batch_rows, target_rows, m); !problem.empty()) {
      fail(call_context() + ": " + problem);  // without the exchange, seen only where one rank holds both
    }

    runner_.start_call(train);
    if (holds_last_) {
      runner_.loss = [this, &targets](const output_type& y, int mb) {
        return std::invoke(loss_, y, targets[static_cast<std::size_t>(mb)]);
      };
    }

    const auto& actions = train ? train_ : eval_;
    for (const action_type& c : actions) {
      try {
        (runner_.*c.run)(c);
      } catch (const std::exception& e) {
        fail(where(c) + e.what());
      } catch (...) {
        fail(where(c) + "an exception not derived from std::exception");
      }
      // After compute only: that is when a payload freed early matters (the next compute may
      // allocate), and each test takes the communicator's lock.
      if (!runner_.sends.empty() && is_compute(c.act.kind)) poll_sends();
    }
    finish_sends();
    if (const std::string problem = runner_.work_left_over(); !problem.empty()) {
      fail(call_context() + ": the program ended with work left over: " + problem +
           "; the program is incomplete (validate() it, or use a built-in policy)");
    }

    step_report report;
    report.actions = actions.size();
    report.peak_live_saved = runner_.peak_saved;
    report.peak_saved_bytes = runner_.peak_bytes;
    report.action_times = runner_.clock.entries(report.compute_seconds);
    report.action_events = runner_.clock.events();
    if (holds_last_) report.loss = runner_.loss_sum;
    if (options_.loss_on_every_rank) report.loss = share_loss(runner_.loss_sum);
    runner_.end_call();
    report.wall_seconds =
        std::chrono::duration<double>(detail::pipeline::action_clock::clock::now() - call_start).count();
    return report;
  }

  [[nodiscard]] std::string where(const action_type& c) const {
    return call_context() + ", action " + to_string(c.act) + " (" + detail::pipeline::describe(c.act.kind) +
           " of stage " + std::to_string(c.act.stage) + ", microbatch " + std::to_string(c.act.microbatch) + "): ";
  }

  // "baton pipeline rank R, call N": how every error of a call starts.
  [[nodiscard]] std::string call_context() const {
    return "baton pipeline rank " + std::to_string(runner_.rank) + ", call " + std::to_string(runner_.call);
  }

  [[noreturn]] void fail(const std::string& message) {
    failed_ = true;
    failure_ = message;
    throw pipeline_error(message);
  }

  // ---- agreement between ranks -------------------------------------------------------------

  void exchange_fingerprint(detail::pipeline::call_kind kind, const side_type& side, const std::string& prepare_error,
                            std::int64_t batch_rows, std::int64_t target_rows) {
    using field = detail::pipeline::call_field;
    detail::pipeline::fingerprint mine;
    mine.protocol = tags::pipeline::first;
    mine.operation = static_cast<std::int64_t>(kind);
    mine.rank = runner_.rank;
    if (!prepare_error.empty()) mine.fail(1);
    mine.values[field::call] = runner_.call;
    mine.values[field::program] = static_cast<std::int64_t>(program_hash_);
    mine.values[field::side] = detail::pipeline::side_shape_hash(side);
    mine.values[field::options] = (options_.loss_on_every_rank ? 1 : 0) + 2 * static_cast<std::int64_t>(options_.scaling);
    mine.values[field::batch_rows] = batch_rows;
    mine.values[field::target_rows] = target_rows;
    try {
      baton::gather_descriptors(*comm_, fingerprint_tag(), mine, fingerprints_);
    } catch (const std::exception& e) {
      fail(call_context() + ": exchanging the schedule fingerprint with the other ranks failed: " + e.what());
    }
    if (!prepare_error.empty()) {
      fail(call_context() + ": cannot split this rank's inputs into " + std::to_string(runner_.microbatches) +
           " microbatches: " + prepare_error);
    }
    if (const auto problem = detail::pipeline::fingerprint_disagreement(
            fingerprints_, runner_.rank, runner_.microbatches, stage_rank(program_.shape, 0),
            stage_rank(program_.shape, runner_.num_stages - 1));
        !problem.empty()) {
      fail(call_context() + ": " + problem);
    }
  }

  // ---- sends in flight and the loss, in the words of a call's failure -----------------------

  void poll_sends() {
    try {
      runner_.sends.poll();
    } catch (const std::exception& e) {
      fail(call_context() + ": a send did not complete: " + e.what());
    }
  }

  void finish_sends() {
    try {
      runner_.sends.finish();
    } catch (const std::exception& e) {
      fail(call_context() + ": a send did not complete: " + e.what());
    }
  }

  std::optional<double> share_loss(double value) {
    const int last = stage_rank(program_.shape, runner_.num_stages - 1);
    try {
      return detail::pipeline::share_loss(*comm_, last, loss_tag(), value);
    } catch (const std::exception& e) {
      fail(call_context() + ": sharing the loss from rank " + std::to_string(last) + " failed: " + e.what());
    }
  }

  // ---- data ------------------------------------------------------------------------------

  Comm* comm_;
  Loss loss_;
  pipeline_options options_;
  program program_;
  std::uint64_t program_hash_ = 0;
  runner_type runner_;  // this rank's stages, and the state of the call being run
  bool holds_first_ = false;
  bool holds_last_ = false;
  std::vector<action_type> train_;
  std::vector<action_type> eval_;
  std::vector<detail::pipeline::fingerprint> fingerprints_;  // every rank's, for this call
  bool failed_ = false;
  std::string failure_;
};

/// Builds the executor of this rank for schedule policy P: generates P's program for `shape`,
/// validates and lowers it. A policy that splits the backward (zero-bubble) given a stage
/// without backward_input/backward_weight is a compile error saying so.
template <schedule_policy Policy, class Stages, point_to_point_communicator Comm, class MakeStage, class Loss>
auto make_pipeline(Comm& comm, const schedule_shape& shape, MakeStage&& make_stage, Loss loss,
                   pipeline_options options = {}) {
  static_assert(requires { Policy::generate(shape); },
                "baton::make_pipeline<Policy, Stages>: the policy needs an object to generate its program "
                "(a csv_schedule); pass the program instead: make_pipeline<Stages>(comm, policy.generate(shape), "
                "make_stage, loss)");
  if constexpr (Policy::splits_backward) {
    static_assert(detail::pipeline::check_split_stages<Stages>());
  }
  return pipeline_executor<Stages, Comm, Loss>(comm, Policy::generate(shape), std::forward<MakeStage>(make_stage),
                                               std::move(loss), options);
}

/// Builds the executor of this rank for an explicit program (a CSV schedule, a hand-written
/// one): compute-only programs are validated and lowered, lowered ones validated.
template <class Stages, point_to_point_communicator Comm, class MakeStage, class Loss>
auto make_pipeline(Comm& comm, program prog, MakeStage&& make_stage, Loss loss, pipeline_options options = {}) {
  return pipeline_executor<Stages, Comm, Loss>(comm, std::move(prog), std::forward<MakeStage>(make_stage),
                                               std::move(loss), options);
}

}  // namespace baton
