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
// microbatch_state.hpp (what is kept per stage and microbatch), transfer.hpp (payloads on the
// wire, receive pools, sends and receives in flight), agreement.hpp (the fingerprint every
// call starts with) and gradient_check.hpp. This file holds the run loop and the handler of
// each action kind.
#pragma once

#include <baton/comm/concepts.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/microbatch.hpp>
#include <baton/payload/traits.hpp>
#include <baton/core/tags.hpp>
#include <baton/pipeline/detail/agreement.hpp>
#include <baton/pipeline/detail/gradient_check.hpp>
#include <baton/pipeline/detail/microbatch_state.hpp>
#include <baton/pipeline/detail/stage_set.hpp>
#include <baton/pipeline/detail/transfer.hpp>
#include <baton/pipeline/error.hpp>
#include <baton/pipeline/options.hpp>
#include <baton/pipeline/stage.hpp>
#include <baton/pipeline/timing.hpp>
#include <baton/schedule/action.hpp>
#include <baton/schedule/lower.hpp>
#include <baton/schedule/policy.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/validate.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
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
  using types = typename set::types;
  static constexpr std::size_t type_count = set::type_count;
  template <std::size_t T>
  using stage_t = std::tuple_element_t<T, types>;
  using request = comm_request_t<Comm>;
  using stores = typename detail::pipeline::stores_of<types, request>::type;

  // Which type index precedes / follows type index T in the pipeline.
  template <std::size_t T>
  static constexpr bool has_prev = set::uniform || T > 0;
  template <std::size_t T>
  static constexpr bool has_next = set::uniform || T + 1 < type_count;
  template <std::size_t T>
  static constexpr std::size_t prev = set::uniform ? 0 : (T > 0 ? T - 1 : 0);
  template <std::size_t T>
  static constexpr std::size_t next = set::uniform ? 0 : (T + 1 < type_count ? T + 1 : T);

 public:
  using input_type = typename stage_t<0>::input;
  using output_type = typename stage_t<type_count - 1>::output;
  using side_type = typename detail::pipeline::side_of<types>::type;
  using communicator_type = Comm;

  /// Builds the executor of rank comm.rank() for `prog` (compute-only — it is validated and
  /// lowered here — or already lowered). Throws pipeline_error when the program does not fit
  /// the communicator or the stage types, and schedule_error when it is invalid.
  template <class MakeStage>
  pipeline_executor(Comm& comm, program prog, MakeStage&& make_stage, Loss loss, pipeline_options options = {})
      : comm_(&comm), loss_(std::move(loss)), options_(options) {
    rank_ = comm.rank();
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
    if (!is_lowered(prog) && prog.shape.ranks > 1) {
      prog = lower(prog);
    } else {
      validate(prog);
    }
    program_ = std::move(prog);
    program_hash_ = detail::pipeline::program_hash(program_);
    num_stages_ = program_.shape.num_stages();
    microbatches_ = program_.shape.microbatches;
    holds_first_ = stage_rank(program_.shape, 0) == rank_;
    holds_last_ = stage_rank(program_.shape, num_stages_ - 1) == rank_;
    check_tag_range();
    build_stages(make_stage);
    compile();
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
  template <class Target>
    requires std::same_as<side_type, no_side>
  step_report step(const input_type& batch, const Target& target) {
    return run(detail::pipeline::call_kind::train, batch, no_side{}, target);
  }

  /// Forward only (no saved state kept, no gradients touched): the loss of the batch under
  /// the current weights. Works before the first step() and leaves training state alone.
  template <class Target>
  step_report eval(const input_type& batch, const side_type& side, const Target& target) {
    return run(detail::pipeline::call_kind::eval, batch, side, target);
  }
  template <class Target>
    requires std::same_as<side_type, no_side>
  step_report eval(const input_type& batch, const Target& target) {
    return run(detail::pipeline::call_kind::eval, batch, no_side{}, target);
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
    std::apply([](auto&... s) { (s.forward_hooks.clear(), ...); }, stores_);
  }

  // ---- access ----------------------------------------------------------------------------

  /// Calls f(int stage_index, S& stage) for every stage this rank holds, in stage order.
  template <class F>
  void for_each_local_stage(F&& f) {
    for (int s : local_stage_indices_) visit_stage(s, f);
  }
  template <class F>
  void for_each_local_stage(F&& f) const {
    for (int s : local_stage_indices_) const_cast<pipeline_executor*>(this)->visit_stage(s, [&](int i, auto& st) {
      f(i, std::as_const(st));
    });
  }

  /// Stage I of a stage_list (throws pipeline_error when this rank does not hold it).
  template <std::size_t I>
    requires(!set::uniform)
  stage_t<I>& stage() {
    auto& slots = std::get<I>(stores_).slots;
    if (slots.empty()) {
      throw pipeline_error("baton pipeline: rank " + std::to_string(rank_) + " does not hold stage " +
                           std::to_string(I) + " (it runs on rank " +
                           std::to_string(stage_rank(program_.shape, static_cast<int>(I))) + ")");
    }
    return slots.front()->stage;
  }
  /// Stage `index` of uniform_stages (throws pipeline_error when this rank does not hold it).
  stage_t<0>& stage(int index)
    requires set::uniform
  {
    const int slot = index >= 0 && index < num_stages_ ? slot_of_[static_cast<std::size_t>(index)] : -1;
    if (slot < 0) {
      throw pipeline_error("baton pipeline: rank " + std::to_string(rank_) + " does not hold stage " +
                           std::to_string(index));
    }
    return std::get<0>(stores_).slots[static_cast<std::size_t>(slot)]->stage;
  }

  [[nodiscard]] const std::vector<int>& local_stages() const noexcept { return local_stage_indices_; }
  [[nodiscard]] bool holds_first_stage() const noexcept { return holds_first_; }
  [[nodiscard]] bool holds_last_stage() const noexcept { return holds_last_; }
  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int microbatches() const noexcept { return microbatches_; }
  /// The lowered program this executor runs (every rank's row).
  [[nodiscard]] const program& lowered_program() const noexcept { return program_; }
  /// Receive-buffer pool counters, summed over this rank's stages (activation and gradient).
  /// How many message tags this executor uses, from tags::pipeline::first + tag_offset: a
  /// second executor on the same communicator takes tag_offset >= this one's + tag_count().
  [[nodiscard]] std::int64_t tag_count() const noexcept {
    return 2 + 2 * std::int64_t{num_stages_} * std::int64_t{microbatches_};
  }

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
        stores_);
    return total;
  }

 private:
  struct compiled_action;
  using handler = void (pipeline_executor::*)(const compiled_action&);

  struct compiled_action {
    action act;
    handler run = nullptr;
    int slot = -1;       // this stage's position in its store
    int neighbour = -1;  // F: slot of stage - 1, B/I: slot of stage + 1, when on this rank
    int peer = -1;       // SEND/RECV: the other rank
    int tag = 0;
  };

  // ---- construction ----------------------------------------------------------------------

  template <class MakeStage>
  void build_stages(MakeStage& make_stage) {
    slot_of_.assign(static_cast<std::size_t>(num_stages_), -1);
    local_stage_indices_ = rank_stages(program_.shape, rank_);
    for (int s : local_stage_indices_) {
      if constexpr (set::uniform) {
        auto& slots = std::get<0>(stores_).slots;
        slot_of_[static_cast<std::size_t>(s)] = static_cast<int>(slots.size());
        using S = stage_t<0>;
        static_assert(std::is_invocable_v<MakeStage&, int>,
                      "baton pipeline: the stage factory of uniform_stages<S> is called as make_stage(int "
                      "stage_index) and must return S");
        slots.push_back(std::make_unique<detail::pipeline::local_stage<S, request>>(
            s, microbatches_, [&]() -> S { return make_stage(s); }));
      } else {
        [&]<std::size_t... T>(std::index_sequence<T...>) {
          ((T == static_cast<std::size_t>(s) ? build_one<T>(make_stage) : void()), ...);
        }(std::make_index_sequence<type_count>{});
        slot_of_[static_cast<std::size_t>(s)] = 0;
      }
    }
  }

  template <std::size_t T, class MakeStage>
  void build_one(MakeStage& make_stage) {
    using S = stage_t<T>;
    using index = std::integral_constant<std::size_t, T>;
    static_assert(std::is_invocable_v<MakeStage&, index>,
                  "baton pipeline: the stage factory of a stage_list is called as make_stage(i) with i a "
                  "std::integral_constant<std::size_t, I> (use a generic lambda: [&](auto i) { ... }) and "
                  "must return stage type I");
    static_assert(std::is_same_v<std::remove_cvref_t<std::invoke_result_t<MakeStage&, index>>, S>,
                  "baton pipeline: make_stage(std::integral_constant<std::size_t, I>) must return the "
                  "stage_list's type number I");
    std::get<T>(stores_).slots.push_back(std::make_unique<detail::pipeline::local_stage<S, request>>(
        static_cast<int>(T), microbatches_, [&]() -> S { return make_stage(index{}); }));
  }

  template <std::size_t T>
  static constexpr handler handler_of(action_kind kind) {
    switch (kind) {
      case action_kind::forward: return &pipeline_executor::template run_forward<T>;
      case action_kind::backward: return &pipeline_executor::template run_backward<T>;
      case action_kind::backward_input: return &pipeline_executor::template run_backward_input<T>;
      case action_kind::backward_weight: return &pipeline_executor::template run_backward_weight<T>;
      case action_kind::send_forward: return &pipeline_executor::template run_send_forward<T>;
      case action_kind::recv_forward: return &pipeline_executor::template run_recv_forward<T>;
      case action_kind::send_backward: return &pipeline_executor::template run_send_backward<T>;
      case action_kind::recv_backward: return &pipeline_executor::template run_recv_backward<T>;
      // Stage-level kinds (UNSHARD, RESHARD, REDUCE_GRAD): they stay in the program where they
      // stand, and a stage that does not shard its parameters has nothing to do for them.
      default: return &pipeline_executor::run_nothing;
    }
  }
  template <std::size_t T>
  static constexpr std::array<handler, action_kind_count> handlers_of() {
    std::array<handler, action_kind_count> handlers{};
    for (std::size_t k = 0; k < handlers.size(); ++k) handlers[k] = handler_of<T>(static_cast<action_kind>(k));
    return handlers;
  }

  void compile() {
    static constexpr auto table = []<std::size_t... T>(std::index_sequence<T...>) {
      return std::array<std::array<handler, action_kind_count>, type_count>{handlers_of<T>()...};
    }(std::make_index_sequence<type_count>{});
    static constexpr auto splits = []<std::size_t... T>(std::index_sequence<T...>) {
      return std::array<bool, type_count>{split_backward_stage<stage_t<T>>...};
    }(std::make_index_sequence<type_count>{});

    const auto& row = program_.ranks[static_cast<std::size_t>(rank_)];
    train_.clear();
    eval_.clear();
    // Every action of this row is for a stage this rank holds: validate() rejects stages out of
    // range and actions on the wrong rank, and lower() only adds messages of the row's own stages.
    for (const action& a : row) {
      const std::size_t t = set::type_of(a.stage);
      if ((a.kind == action_kind::backward_input || a.kind == action_kind::backward_weight) && !splits[t]) {
        throw pipeline_error("baton pipeline: the program runs " + to_string(a) +
                             " (a split backward) but stage " + std::to_string(a.stage) +
                             "'s type has no backward_input/backward_weight: implement them (see "
                             "baton::split_backward_stage) or use a full-backward schedule");
      }
      compiled_action c;
      c.act = a;
      c.run = table[t][static_cast<std::size_t>(a.kind)];
      c.slot = slot_of_[static_cast<std::size_t>(a.stage)];
      const auto local_slot = [&](int s) {
        return s >= 0 && s < num_stages_ ? slot_of_[static_cast<std::size_t>(s)] : -1;
      };
      switch (a.kind) {
        case action_kind::forward: c.neighbour = local_slot(a.stage - 1); break;
        case action_kind::backward:
        case action_kind::backward_input: c.neighbour = local_slot(a.stage + 1); break;
        case action_kind::send_forward:
        case action_kind::recv_backward: c.peer = stage_rank(program_.shape, a.stage + 1); break;
        case action_kind::recv_forward:
        case action_kind::send_backward: c.peer = stage_rank(program_.shape, a.stage - 1); break;
        default: break;
      }
      if (is_communication(a.kind)) c.tag = data_tag(a);
      train_.push_back(c);
      if (a.kind == action_kind::forward || a.kind == action_kind::send_forward ||
          a.kind == action_kind::recv_forward) {
        eval_.push_back(c);
      }
    }
    // Missing receives or hand-overs cannot get here: the program was validated above, and the
    // handlers still report a missing input naming the action if a stage's state says otherwise.
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
                           " message tags (2 + 2 x " + std::to_string(num_stages_) + " stages x " +
                           std::to_string(microbatches_) + " microbatches), from tag " +
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
      std::get<T>(stores_).forward_hooks.emplace_back(f);
      accepted = true;
    }
  }

  template <class F>
  void visit_stage(int s, F&& f) {
    const int slot = slot_of_[static_cast<std::size_t>(s)];
    const std::size_t t = set::type_of(s);
    [&]<std::size_t... T>(std::index_sequence<T...>) {
      ((T == t ? (void)f(s, std::get<T>(stores_).slots[static_cast<std::size_t>(slot)]->stage) : void()), ...);
    }(std::make_index_sequence<type_count>{});
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
      throw pipeline_error("baton pipeline rank " + std::to_string(rank_) +
                           ": this executor is unusable after a failed call (" + failure_ +
                           "); construct a new one on every rank");
    }
    // Every rank holds the same program (the constructor validated it), so every rank
    // refuses here alike, before any transfer: nothing waits on a peer that left.
    if (kind == detail::pipeline::call_kind::train && is_forward_only(program_)) {
      throw pipeline_error("baton pipeline rank " + std::to_string(rank_) +
                           ": step() trains, but the schedule is forward-only (it has no backward); call "
                           "eval() for the loss, or build the executor from a training schedule");
    }
    const auto call_start = detail::pipeline::action_clock::clock::now();
    ++calls_;
    const bool train = kind == detail::pipeline::call_kind::train;
    const int m = microbatches_;

    // Prepare this rank's inputs first, so that a batch that cannot be split fails on every
    // rank together (through the fingerprint) instead of leaving the others waiting.
    std::string prepare_error;
    std::vector<Target> targets;
    // The batch's rows (known on the first stage's rank) and the target's (on the last
    // stage's) must agree; the fingerprint carries them to every rank.
    const std::int64_t batch_rows = holds_first_ ? detail::pipeline::leading_rows(batch) : -1;
    const std::int64_t target_rows = holds_last_ ? detail::pipeline::leading_rows(target) : -1;
    try {
      if (holds_first_) batch_mbs_ = split_microbatches(batch, m);
      if constexpr (!std::is_same_v<side_type, no_side>) side_mbs_ = split_microbatches(side, m);
      if (holds_last_) {
        targets = split_microbatches(target, m);
        weights_ = loss_weights(targets);
      }
    } catch (const std::exception& e) {
      prepare_error = e.what();
    }
    if (options_.check_agreement) {
      exchange_fingerprint(kind, side, prepare_error, batch_rows, target_rows);
    } else if (!prepare_error.empty()) {
      fail("rank " + std::to_string(rank_) + " could not split its inputs into " + std::to_string(m) +
           " microbatches: " + prepare_error);
    } else if (const auto problem = detail::pipeline::target_rows_mismatch(batch_rows, target_rows, m); !problem.empty()) {
      fail(call_context() + ": " + problem);  // without the exchange, seen only where one rank holds both
    }

    loss_sum_ = 0;
    if (holds_last_) {
      current_loss_ = [this, &targets](const output_type& y, int mb) {
        return std::invoke(loss_, y, targets[static_cast<std::size_t>(mb)]);
      };
    }
    training_ = train;
    live_saved_ = live_bytes_ = peak_saved_ = peak_bytes_ = 0;
    clock_.reset(num_stages_);

    const auto& actions = train ? train_ : eval_;
    for (const compiled_action& c : actions) {
      try {
        (this->*c.run)(c);
      } catch (const std::exception& e) {
        fail(where(c) + e.what());
      } catch (...) {
        fail(where(c) + "an exception not derived from std::exception");
      }
      // After compute only: that is when a payload freed early matters (the next compute may
      // allocate), and each test takes the communicator's lock.
      if (!outgoing_.empty() && is_compute(c.act.kind)) poll_sends();
    }
    finish_sends();
    check_finished();

    step_report report;
    report.actions = actions.size();
    report.peak_live_saved = peak_saved_;
    report.peak_saved_bytes = peak_bytes_;
    report.action_times = clock_.entries(report.compute_seconds);
    if (holds_last_) report.loss = loss_sum_;
    if (options_.loss_on_every_rank) report.loss = share_loss(loss_sum_);
    batch_mbs_.clear();
    side_mbs_.clear();
    current_loss_ = nullptr;
    report.wall_seconds =
        std::chrono::duration<double>(detail::pipeline::action_clock::clock::now() - call_start).count();
    return report;
  }

  template <class Target>
  std::vector<double> loss_weights(const std::vector<Target>& targets) {
    const auto m = targets.size();
    std::vector<double> w(m, 1.0 / static_cast<double>(m));
    if (options_.scaling == loss_scaling::by_token_count) {
      if constexpr (requires(Loss& l, const Target& t) {
                      { l.tokens(t) } -> std::convertible_to<std::int64_t>;
                    }) {
        std::int64_t total = 0;
        std::vector<std::int64_t> tokens(m);
        for (std::size_t i = 0; i < m; ++i) total += tokens[i] = static_cast<std::int64_t>(loss_.tokens(targets[i]));
        if (total <= 0) {
          throw pipeline_error("loss_scaling::by_token_count: the targets hold no tokens (loss.tokens() summed to " +
                               std::to_string(total) + ")");
        }
        for (std::size_t i = 0; i < m; ++i) w[i] = static_cast<double>(tokens[i]) / static_cast<double>(total);
      } else {
        throw pipeline_error("pipeline_options::scaling is loss_scaling::by_token_count, but the loss has no "
                             "`std::int64_t tokens(const target&)`: add it (the number of tokens of a target "
                             "microbatch) or use loss_scaling::mean_over_microbatches");
      }
    }
    return w;
  }

  [[nodiscard]] std::string where(const compiled_action& c) const {
    return call_context() + ", action " + to_string(c.act) + " (" + describe(c.act.kind) +
           " of stage " + std::to_string(c.act.stage) + ", microbatch " + std::to_string(c.act.microbatch) + "): ";
  }

  // What an action does, in the words of an error message.
  static std::string describe(action_kind kind) {
    switch (kind) {
      case action_kind::forward: return "forward";
      case action_kind::backward: return "backward";
      case action_kind::backward_input: return "backward_input";
      case action_kind::backward_weight: return "backward_weight";
      case action_kind::send_forward: return "send of the activation";
      case action_kind::recv_forward: return "receive of the activation";
      case action_kind::send_backward: return "send of the gradient";
      case action_kind::recv_backward: return "receive of the gradient";
      default: return std::string(token(kind));
    }
  }

  // "baton pipeline rank R, call N": how every error of a call starts.
  [[nodiscard]] std::string call_context() const {
    return "baton pipeline rank " + std::to_string(rank_) + ", call " + std::to_string(calls_);
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
    mine.rank = rank_;
    if (!prepare_error.empty()) mine.fail(1);
    mine.values[field::call] = calls_;
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
      fail(call_context() + ": cannot split this rank's inputs into " + std::to_string(microbatches_) +
           " microbatches: " + prepare_error);
    }
    if (const auto problem = detail::pipeline::fingerprint_disagreement(
            fingerprints_, rank_, microbatches_, stage_rank(program_.shape, 0),
            stage_rank(program_.shape, num_stages_ - 1));
        !problem.empty()) {
      fail(call_context() + ": " + problem);
    }
  }

  std::optional<double> share_loss(double value) {
    const int last = stage_rank(program_.shape, num_stages_ - 1);
    double v = value;
    try {
      if (rank_ == last) {
        std::vector<request> requests;
        for (int r = 0; r < comm_->size(); ++r) {
          if (r != rank_) requests.push_back(comm_->isend(std::as_bytes(std::span(&v, 1)), r, loss_tag()));
        }
        wait_all(requests);
      } else {
        auto q = comm_->irecv(std::as_writable_bytes(std::span(&v, 1)), last, loss_tag());
        q.wait();
      }
    } catch (const std::exception& e) {
      fail(call_context() + ": sharing the loss from rank " + std::to_string(last) + " failed: " + e.what());
    }
    return v;
  }

  // ---- sends in flight -----------------------------------------------------------------------

  void poll_sends() {
    // Completed sends release their payload early; the rest are waited at the end of the call.
    // Sends complete roughly in the order they were posted, so only the oldest are tested:
    // each test() takes the communicator's lock, and testing every pending send after every
    // action would cost more than the executor itself.
    // Completed send objects go back to their spares, for the next send of their type.
    std::size_t done = 0;
    try {
      while (done < outgoing_.size() && outgoing_[done]->test()) ++done;
    } catch (const std::exception& e) {
      fail(call_context() + ": a send did not complete: " + e.what());
    }
    for (std::size_t i = 0; i < done; ++i) outgoing_[i]->retire(std::move(outgoing_[i]));
    if (done > 0) outgoing_.erase(outgoing_.begin(), outgoing_.begin() + static_cast<std::ptrdiff_t>(done));
  }

  void finish_sends() {
    try {
      for (auto& o : outgoing_) o->wait();
    } catch (const std::exception& e) {
      fail(call_context() + ": a send did not complete: " + e.what());
    }
    for (auto& o : outgoing_) o->retire(std::move(o));
    outgoing_.clear();
  }

  template <class P, class Request>
  void send(P&& payload, const compiled_action& c, int direction,
            detail::pipeline::send_spares<Request, std::remove_cvref_t<P>>& spares) {
    const detail::pipeline::message_id id{calls_, c.act.stage, c.act.microbatch, direction};
    outgoing_.push_back(detail::pipeline::post_send(*comm_, std::forward<P>(payload), c.peer, c.tag, id, spares));
  }

  // Every microbatch must have been carried through: a program that forgets a W (or a send)
  // would otherwise leak saved state into the next step silently.
  void check_finished() {
    std::string problem;
    [&]<std::size_t... T>(std::index_sequence<T...>) {
      (check_finished_in<T>(problem), ...);
    }(std::make_index_sequence<type_count>{});
    if (!problem.empty()) {
      fail(call_context() + ": the program ended with work left over: " + problem +
           "; the program is incomplete (validate() it, or use a built-in policy)");
    }
  }

  template <std::size_t T>
  void check_finished_in(std::string& problem) {
    for (auto& slot : std::get<T>(stores_).slots) {
      for (std::size_t m = 0; m < slot->mb.size(); ++m) {
        auto& st = slot->mb[m];
        if (st.idle() || !problem.empty()) continue;
        const std::string place = "stage " + std::to_string(slot->index) + ", microbatch " + std::to_string(m);
        if (st.saved) problem = place + " still holds its saved state (no B or W ran)";
        else if (st.y) problem = place + " still holds an output that was never sent or used";
        else if (st.dx) problem = place + " still holds an input gradient that was never sent";
        else if (st.recv_x.active() || st.recv_dy.active()) problem = place + " has a receive that no compute consumed";
        else problem = place + " was not finished";
      }
    }
  }

  // ---- action handlers -------------------------------------------------------------------

  template <std::size_t T>
  auto& state(const compiled_action& c) {
    return std::get<T>(stores_).slots[static_cast<std::size_t>(c.slot)]->mb[static_cast<std::size_t>(c.act.microbatch)];
  }
  template <std::size_t T>
  auto& stage_object(const compiled_action& c) {
    return std::get<T>(stores_).slots[static_cast<std::size_t>(c.slot)]->stage;
  }

  template <std::size_t T>
  const typename stage_t<T>::side& side_for(int mb) const {
    using side = typename stage_t<T>::side;
    if constexpr (std::is_same_v<side, no_side>) {
      static const no_side none{};
      return none;
    } else {
      return side_mbs_[static_cast<std::size_t>(mb)];
    }
  }

  template <std::size_t T>
  void release_saved(detail::pipeline::microbatch_state<stage_t<T>, request>& st) {
    auto& store = std::get<T>(stores_);
    if (st.saved) {
      st.saved.reset();
      --live_saved_;
      live_bytes_ -= st.saved_bytes;
    }
    st.input_grad_done = false;
    st.hooks.reset();
    if (st.x) {
      if (st.x_pooled) store.input_pool.release(std::move(*st.x));
      st.x.reset();
    }
  }

  template <std::size_t T>
  void run_forward(const compiled_action& c) {
    using S = stage_t<T>;
    auto& store = std::get<T>(stores_);
    auto& st = state<T>(c);
    const int s = c.act.stage;
    const int mb = c.act.microbatch;
    if (st.saved || st.x) throw pipeline_error("forward ran twice for this microbatch");
    // The input: the batch, the previous stage's output on this rank, or a received payload.
    bool have = false;
    if constexpr (T == 0) {
      if (s == 0) {
        st.x.emplace(std::move(batch_mbs_[static_cast<std::size_t>(mb)]));
        st.x_pooled = false;
        have = true;
      }
    }
    if (!have && c.neighbour >= 0) {
      if constexpr (has_prev<T>) {
        auto& prev_state = std::get<prev<T>>(stores_).slots[static_cast<std::size_t>(c.neighbour)]->mb[static_cast<std::size_t>(mb)];
        if (!prev_state.y) {
          throw pipeline_error("the output of stage " + std::to_string(s - 1) + " for this microbatch is not "
                               "there (its forward has not run, or it was sent away)");
        }
        st.x.emplace(std::move(*prev_state.y));
        prev_state.y.reset();
        st.x_pooled = false;
        have = true;
      }
    }
    if (!have) {
      if (!st.recv_x.active()) {
        throw pipeline_error("no input: stage " + std::to_string(s - 1) + " runs on rank " +
                             std::to_string(stage_rank(program_.shape, s - 1)) +
                             " and the program has no RECV_F before this forward (lower() the program)");
      }
      try {
        st.x.emplace(detail::pipeline::complete_recv(*comm_, st.recv_x, store.input_pool));
      } catch (const std::exception& e) {
        throw pipeline_error(std::string("receiving the input activation from rank ") +
                             std::to_string(st.recv_x.source) + " failed: " + e.what());
      }
      st.x_pooled = true;
    }

    st.hooks.emplace();
    st.saved.emplace();
    st.saved_bytes = 0;
    ++live_saved_;
    const auto compute_start = detail::pipeline::action_clock::clock::now();
    typename S::output y = [&] {
      try {
        return detail::pipeline::call_forward(stage_object<T>(c), *st.x, side_for<T>(mb), *st.saved, *st.hooks);
      } catch (const std::exception& e) {
        throw pipeline_error(std::string("the stage's forward threw: ") + e.what());
      }
    }();
    st.saved_bytes = saved_state_bytes(*st.saved);
    live_bytes_ += st.saved_bytes;
    if (live_saved_ > peak_saved_ || (live_saved_ == peak_saved_ && live_bytes_ > peak_bytes_)) {
      peak_saved_ = live_saved_;
      peak_bytes_ = live_bytes_;
    }
    for (auto& hook : store.forward_hooks) hook(s, mb, *st.x, y, *st.hooks);

    bool consumed = false;
    if (s == num_stages_ - 1) {
      if constexpr (T == type_count - 1) {
        auto result = [&] {
          try {
            return current_loss_(y, mb);
          } catch (const std::exception& e) {
            throw pipeline_error(std::string("the loss threw: ") + e.what());
          }
        }();
        const double w = weights_[static_cast<std::size_t>(mb)];
        loss_sum_ += w * result.value;
        if (training_) {
          if (auto problem = detail::pipeline::gradient_mismatch(y, result.grad, "the loss", "output"); !problem.empty()) {
            throw pipeline_error(problem);
          }
          detail::pipeline::scale_payload(result.grad, w);
          st.dy.emplace(std::move(result.grad));
          st.dy_pooled = false;
        }
        consumed = true;
      }
    }
    clock_.add(s, action_kind::forward, detail::pipeline::action_clock::clock::now() - compute_start);
    if (!consumed) st.y.emplace(std::move(y));
    if (!training_) release_saved<T>(st);
  }

  // Obtains the gradient of stage s's output for backward: the loss gradient (last stage), the
  // next stage's input gradient on this rank, or a received gradient.
  template <std::size_t T>
  void take_output_grad(const compiled_action& c, detail::pipeline::microbatch_state<stage_t<T>, request>& st) {
    if (st.dy) return;
    const int s = c.act.stage;
    const int mb = c.act.microbatch;
    if (s == num_stages_ - 1) throw pipeline_error("the loss gradient of this microbatch is missing");
    if (c.neighbour >= 0) {
      if constexpr (has_next<T>) {
        auto& next_state = std::get<next<T>>(stores_).slots[static_cast<std::size_t>(c.neighbour)]->mb[static_cast<std::size_t>(mb)];
        if (!next_state.dx) {
          throw pipeline_error("the input gradient of stage " + std::to_string(s + 1) +
                               " for this microbatch is not there (its backward has not run)");
        }
        st.dy.emplace(std::move(*next_state.dx));
        next_state.dx.reset();
        st.dy_pooled = false;
        return;
      }
    }
    if (!st.recv_dy.active()) {
      throw pipeline_error("no output gradient: stage " + std::to_string(s + 1) + " runs on rank " +
                           std::to_string(stage_rank(program_.shape, s + 1)) +
                           " and the program has no RECV_B before this backward (lower() the program)");
    }
    try {
      st.dy.emplace(detail::pipeline::complete_recv(*comm_, st.recv_dy, std::get<T>(stores_).grad_pool));
    } catch (const std::exception& e) {
      throw pipeline_error(std::string("receiving the output gradient from rank ") +
                           std::to_string(st.recv_dy.source) + " failed: " + e.what());
    }
    st.dy_pooled = true;
  }

  template <std::size_t T>
  void release_output_grad(detail::pipeline::microbatch_state<stage_t<T>, request>& st) {
    if (st.dy_pooled) std::get<T>(stores_).grad_pool.release(std::move(*st.dy));
    st.dy.reset();
    st.dy_pooled = false;
  }

  template <std::size_t T>
  void backward_common(const compiled_action& c, bool split) {
    auto& st = state<T>(c);
    if (!st.saved) throw pipeline_error("backward before the forward of this microbatch");
    if (st.input_grad_done) throw pipeline_error("the input gradient of this microbatch was already computed");
    take_output_grad<T>(c, st);
    st.hooks->fire_output_grad(*st.dy);
    const auto compute_start = detail::pipeline::action_clock::clock::now();
    auto dx = [&] {
      try {
        if constexpr (split_backward_stage<stage_t<T>>) {
          if (split) return stage_object<T>(c).backward_input(*st.saved, *st.dy);
        }
        return stage_object<T>(c).backward(*st.saved, *st.dy);
      } catch (const std::exception& e) {
        throw pipeline_error(std::string("the stage's ") + (split ? "backward_input" : "backward") +
                             " threw: " + e.what());
      }
    }();
    clock_.add(c.act.stage, split ? action_kind::backward_input : action_kind::backward,
               detail::pipeline::action_clock::clock::now() - compute_start);
    // Checked before anything sees it: the previous stage's backward trusts its output's shape.
    if (auto problem = detail::pipeline::gradient_mismatch(*st.x, dx, split ? "the stage's backward_input"
                                                                      : "the stage's backward",
                                                     "input");
        !problem.empty()) {
      throw pipeline_error(problem);
    }
    release_output_grad<T>(st);
    st.hooks->fire_input_grad(dx);
    if (c.act.stage > 0) st.dx.emplace(std::move(dx));
    if (split) {
      st.input_grad_done = true;
    } else {
      release_saved<T>(st);
    }
  }

  template <std::size_t T>
  void run_backward(const compiled_action& c) {
    backward_common<T>(c, false);
  }

  template <std::size_t T>
  void run_backward_input(const compiled_action& c) {
    if constexpr (split_backward_stage<stage_t<T>>) {
      backward_common<T>(c, true);
    } else {
      throw pipeline_error("the stage has no backward_input");  // rejected at construction
    }
  }

  template <std::size_t T>
  void run_backward_weight(const compiled_action& c) {
    if constexpr (split_backward_stage<stage_t<T>>) {
      auto& st = state<T>(c);
      if (!st.saved || !st.input_grad_done) {
        throw pipeline_error("backward_weight before the backward_input of this microbatch");
      }
      const auto compute_start = detail::pipeline::action_clock::clock::now();
      try {
        stage_object<T>(c).backward_weight(*st.saved);
      } catch (const std::exception& e) {
        throw pipeline_error(std::string("the stage's backward_weight threw: ") + e.what());
      }
      clock_.add(c.act.stage, action_kind::backward_weight, detail::pipeline::action_clock::clock::now() - compute_start);
      release_saved<T>(st);
    } else {
      throw pipeline_error("the stage has no backward_weight");  // rejected at construction
    }
  }

  void run_nothing(const compiled_action&) {}

  template <std::size_t T>
  void run_send_forward(const compiled_action& c) {
    auto& st = state<T>(c);
    if (!st.y) throw pipeline_error("nothing to send: the forward of this microbatch has not run");
    send(std::move(*st.y), c, 0, std::get<T>(stores_).output_sends);
    st.y.reset();
  }

  template <std::size_t T>
  void run_recv_forward(const compiled_action& c) {
    auto& st = state<T>(c);
    if (st.recv_x.active() || st.x) throw pipeline_error("the input of this microbatch was already received");
    const detail::pipeline::message_id id{calls_, c.act.stage - 1, c.act.microbatch, 0};
    detail::pipeline::post_recv(*comm_, st.recv_x, c.peer, c.tag, id);
    // If the header is already here, post the data receives now so they overlap compute.
    detail::pipeline::advance_recv(*comm_, st.recv_x, std::get<T>(stores_).input_pool, false);
  }

  template <std::size_t T>
  void run_send_backward(const compiled_action& c) {
    auto& st = state<T>(c);
    if (!st.dx) throw pipeline_error("nothing to send: the backward of this microbatch has not run");
    send(std::move(*st.dx), c, 1, std::get<T>(stores_).input_grad_sends);
    st.dx.reset();
  }

  template <std::size_t T>
  void run_recv_backward(const compiled_action& c) {
    auto& st = state<T>(c);
    if (st.recv_dy.active() || st.dy) {
      throw pipeline_error("the output gradient of this microbatch was already received");
    }
    const detail::pipeline::message_id id{calls_, c.act.stage + 1, c.act.microbatch, 1};
    detail::pipeline::post_recv(*comm_, st.recv_dy, c.peer, c.tag, id);
    detail::pipeline::advance_recv(*comm_, st.recv_dy, std::get<T>(stores_).grad_pool, false);
  }

  // ---- data ------------------------------------------------------------------------------

  Comm* comm_;
  Loss loss_;
  pipeline_options options_;
  program program_;
  std::uint64_t program_hash_ = 0;
  int rank_ = 0;
  int num_stages_ = 0;
  int microbatches_ = 0;
  bool holds_first_ = false;
  bool holds_last_ = false;
  std::vector<int> slot_of_;  // stage -> position in its store, -1 when not on this rank
  std::vector<int> local_stage_indices_;
  stores stores_;
  std::vector<compiled_action> train_;
  std::vector<compiled_action> eval_;
  std::vector<std::unique_ptr<detail::pipeline::outgoing<request>>> outgoing_;
  std::vector<detail::pipeline::fingerprint> fingerprints_;  // every rank's, for this call

  // Per call.
  std::int64_t calls_ = 0;
  bool training_ = false;
  std::vector<input_type> batch_mbs_;
  std::vector<side_type> side_mbs_;
  std::vector<double> weights_;
  std::function<loss_result<grad_t<output_type>>(const output_type&, int)> current_loss_;
  double loss_sum_ = 0;
  detail::pipeline::action_clock clock_;
  std::size_t live_saved_ = 0, live_bytes_ = 0, peak_saved_ = 0, peak_bytes_ = 0;
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
