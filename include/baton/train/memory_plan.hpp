// baton/train/memory_plan.hpp — plan a training run under a memory cap per rank: choose each
// stage's recompute policy and the schedule with the smallest makespan whose predicted peak
// (estimate_memory, train/memory.hpp) fits the cap, with a lower bound and the gap to it
// (plan_under_memory_cap; docs/memory.md, "Planning under a cap").
//
// The schedule layer's planner (synthesize_with_recompute, schedule/recompute_plan.hpp) does
// not know the model; this header tells it, from the same formulas estimate_memory walks
// (detail/memory_model.hpp):
//   - the menu: per stage and policy, the bytes one live microbatch-stage holds from F to I
//     (its saved state and its input) and from I to W (what backward_weight reads);
//   - the fixed part per rank: parameters, gradients, AdamW, context-parallel buffers, token ids
//     (estimate_memory of a program with no actions: the walk adds nothing to them);
//   - the costs: T_F, T_I, T_W per stage and each policy's recompute time, in FLOPs (matrix
//     products and attention from the model's sizes; element-wise work at a few FLOPs an element).
//     FLOPs, not measurements: the plan is made before anything runs, and the planner compares
//     times only with each other; docs/memory.md says where the count is off.
// The planner's model leaves out what estimate_memory counts only at the moment of the peak (the
// receive pools, the logits, a block's temporaries), so the chosen plan is estimated in full; where
// a rank passes the cap, its fixed part is raised by the excess and the plan made again
// (refinements times), and at last one microbatch at a time with full recomputation everywhere
// is tried, which is what the least cap (least_memory_cap_for) is the peak of.
#pragma once

#include <baton/nn/config.hpp>
#include <baton/schedule/action.hpp>
#include <baton/schedule/makespan_bound.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/recompute_menu.hpp>
#include <baton/schedule/recompute_plan.hpp>
#include <baton/schedule/simulate.hpp>
#include <baton/train/config.hpp>
#include <baton/train/detail/memory_model.hpp>
#include <baton/train/memory.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace baton::detail::train {

inline constexpr baton::nn::recompute_policy plan_policies[] = {
    baton::nn::recompute_policy::none, baton::nn::recompute_policy::selective, baton::nn::recompute_policy::full};

// The sizes of one microbatch-stage on one rank, counted as estimate_memory counts them.
inline stage_sizes sizes_of(const baton::train::lm_config& config, const baton::train::lm_parallelism& parallelism,
                            const baton::schedule_shape& shape, double element_bytes) {
  const baton::nn::transformer_config m = config.model.resolved();
  const mesh_shape& mesh = parallelism.mesh;
  const bool sharded = parallelism.cp != baton::nn::cp_mode::none && mesh.cp_ring * mesh.cp_ulysses > 1;
  const int cp = sharded ? mesh.cp_ring * mesh.cp_ulysses : 1;
  const int microbatches = std::max(1, shape.microbatches);
  const double seq_local = static_cast<double>((config.seq + cp - 1) / cp);
  const double rows = static_cast<double>((config.batch + microbatches - 1) / microbatches);
  const int stages = shape.num_stages();
  // As estimate_memory: bf16 storage keeps and sends the stored terms at 2 bytes.
  const element_sizes e{element_bytes, m.storage == baton::nn::activation_storage::bf16 ? 2.0 : element_bytes};
  return stage_sizes(m, stages, static_cast<double>(config.layers / stages), rows * seq_local, seq_local, e);
}

// FLOPs per token of one block: the matrix products, causal attention over the whole sequence
// (QK^T and PV over seq / 2 keys on average), and the element-wise work that selective
// recomputes (two RMSNorms and SwiGLU's product, a few FLOPs an element).
struct block_flops {
  double gemm = 0, attention = 0, elementwise = 0;
  block_flops(const token_sizes& z, double seq)
      : gemm(2 * (z.d * (z.q + 2 * z.k) + z.q * z.d + 3 * z.d * z.f)), attention(2 * z.q * seq),
        elementwise(8 * z.d + 4 * z.f) {}
};

// One microbatch at a time, each through every stage and back (fused B): the least any schedule
// of the shape holds.
inline baton::program sequential_program(const baton::schedule_shape& shape) {
  baton::program p{shape, std::vector<std::vector<baton::action>>(static_cast<std::size_t>(shape.ranks))};
  const int stages = shape.num_stages();
  for (int mb = 0; mb < shape.microbatches; ++mb) {
    for (int s = 0; s < stages; ++s)
      p.ranks[static_cast<std::size_t>(baton::stage_rank(shape, s))].emplace_back(s, baton::action_kind::forward, mb);
    for (int s = stages - 1; s >= 0; --s)
      p.ranks[static_cast<std::size_t>(baton::stage_rank(shape, s))].emplace_back(s, baton::action_kind::backward, mb);
  }
  return p;
}

inline std::string bytes_text(double bytes) {
  char text[80];
  const double mib = bytes / (1024.0 * 1024.0);
  if (!std::isfinite(bytes)) return "unlimited";
  if (mib >= 1024 * 10)
    std::snprintf(text, sizeof text, "%.0f bytes (%.2f GiB)", std::ceil(bytes), mib / 1024);
  else
    std::snprintf(text, sizeof text, "%.0f bytes (%.2f MiB)", std::ceil(bytes), mib);
  return text;
}

}  // namespace baton::detail::train

namespace baton::train {

/// The planner's costs of `config` on `shape`, in FLOPs of one microbatch on one rank: T_F, T_I,
/// T_W (T_B = T_I + T_W) per stage without recomputation; communication 0 (the transfers are not
/// priced); activation unset (the menu's bytes replace it).
inline cost_model recompute_cost_model(const lm_config& config, const lm_parallelism& parallelism,
                                       const schedule_shape& shape) {
  const detail::train::stage_sizes z = detail::train::sizes_of(config, parallelism, shape, 1);
  const detail::train::block_flops f(z.z, static_cast<double>(config.seq));
  const int S = shape.num_stages();
  cost_model c;
  c.forward.assign(static_cast<std::size_t>(S), 0);
  c.backward_input = c.backward_weight = c.backward = c.activation = c.forward;
  const double head = 2 * z.z.d * z.z.vocab;  // the LM head's product, forward and each backward part
  for (int s = 0; s < S; ++s) {
    const auto i = static_cast<std::size_t>(s);
    const double last = s == S - 1 ? head : 0;
    // Attention's backward recomputes the scores from O and the LSE: 5 products where the forward
    // has 2, so 2.5 x the forward's; it is all backward_input (attention has no weights).
    c.forward[i] = z.n * (z.per_stage * (f.gemm + f.attention + f.elementwise) + last);
    c.backward_input[i] = z.n * (z.per_stage * (f.gemm + 2.5 * f.attention + 2 * f.elementwise) + last);
    c.backward_weight[i] = z.n * (z.per_stage * f.gemm + last);
    c.backward[i] = c.backward_input[i] + c.backward_weight[i];
    c.activation[i] = 1;
  }
  return c;
}

/// The planner's menu of `config` on `shape`: for every stage, none, selective and full (in
/// that order), each with the bytes a live microbatch-stage holds from F to I (its saved state
/// and, after stage 0, its input), from I to W (what backward_weight reads, and the input), and
/// the FLOPs its backward_input pays to recompute (selective: the element-wise work; full: the
/// whole forward of its blocks).
inline recompute_menu recompute_menu_for(const lm_config& config, const lm_parallelism& parallelism,
                                         const schedule_shape& shape, std::size_t element_bytes) {
  const detail::train::stage_sizes z =
      detail::train::sizes_of(config, parallelism, shape, static_cast<double>(element_bytes));
  const detail::train::block_flops f(z.z, static_cast<double>(config.seq));
  recompute_menu menu;
  for (int s = 0; s < shape.num_stages(); ++s) {
    const double input = s > 0 ? z.hidden() : 0;  // held until W frees the microbatch-stage
    std::vector<recompute_option> options;
    for (nn::recompute_policy p : detail::train::plan_policies) {
      const double per_token = p == nn::recompute_policy::none        ? 0
                               : p == nn::recompute_policy::selective ? f.elementwise
                                                                      : f.gemm + f.attention + f.elementwise;
      options.push_back({std::string(nn::to_string(p)), z.forward_state(s, p) + input, z.n * z.per_stage * per_token,
                         z.input_state(s) + input});
    }
    menu.push_back(std::move(options));
  }
  return menu;
}

/// Each pipeline rank's fixed part: parameters, gradients, AdamW, context-parallel buffers and
/// token ids (estimate_memory's categories before any action).
inline std::vector<memory_estimate> fixed_memory(const lm_config& config, const lm_parallelism& parallelism,
                                                 const schedule_shape& shape, std::size_t element_bytes) {
  const program nothing{shape, std::vector<std::vector<action>>(static_cast<std::size_t>(shape.ranks))};
  const std::vector<nn::recompute_policy> full(static_cast<std::size_t>(shape.num_stages()), nn::recompute_policy::full);
  return estimate_memory(config, parallelism, nothing, element_bytes, full);
}

/// The least cap per rank a plan of `shape` fits: the largest rank's predicted peak running one
/// microbatch at a time with full recomputation on every stage.
inline double least_memory_cap_for(const lm_config& config, const lm_parallelism& parallelism,
                                   const schedule_shape& shape, std::size_t element_bytes) {
  const std::vector<nn::recompute_policy> full(static_cast<std::size_t>(shape.num_stages()), nn::recompute_policy::full);
  double most = 0;
  for (const memory_estimate& e :
       estimate_memory(config, parallelism, detail::train::sequential_program(shape), element_bytes, full))
    most = std::max(most, e.total());
  return most;
}

struct memory_plan_options {
  std::size_t element_bytes = sizeof(float);
  int refinements = 8;  // plans made again with the fixed part raised (see the file comment)
  // synthesize_with_recompute's, with one bisection step: the refinements re-plan under the
  // caps the full estimate asks for, which the bisection's finer caps would only guess at (on
  // the docs' shapes the same plans, a third of the time).
  recompute_search_options search{.bisection_steps = 1};
};

/// A plan under a cap: a compute-only program (lm_trainer takes it) and a policy per stage
/// (lm_config::stage_recompute), with their predicted peaks.
struct memory_plan {
  program prog;
  std::vector<nn::recompute_policy> stage_policies;
  double cap_bytes = 0;
  double makespan = 0;     ///< simulate(prog, costs), in FLOPs on the critical path
  double lower_bound = 0;  ///< no policies with any schedule that fits the cap are faster (see below)
  double gap = 1;          ///< makespan / lower_bound
  cost_model costs;        ///< the chosen policies' costs (recompute_cost_model plus the recompute FLOPs)
  /// estimate_memory of prog under stage_policies, per pipeline rank; each total() <= cap_bytes.
  std::vector<memory_estimate> predicted;
  std::string method;        ///< how the policies and the schedule were chosen
  std::string bound_method;  ///< synthesize_with_recompute's, under the fixed part alone
  int replans = 0;           ///< plans made again after the full estimate passed the cap

  double predicted_peak() const {
    double most = 0;
    for (const memory_estimate& e : predicted) most = std::max(most, e.total());
    return most;
  }
};

/// Plans training `config` under `parallelism` on a schedule of `shape` (its stages, ranks,
/// microbatches and placement; the order of the actions is planned) within `cap_bytes` per
/// rank (see the file comment). The lower bound is synthesize_with_recompute's under the fixed
/// part alone: every plan that fits the full estimate fits that budget (the estimate holds the
/// fixed part and the live microbatch-stages at every moment, and more), so no plan that fits
/// is faster. Throws config_error (setting "memory_cap") when nothing fits, naming the least cap
/// that does (least_memory_cap_for), and for a configuration that cannot run.
inline memory_plan plan_under_memory_cap(const lm_config& config, const lm_parallelism& parallelism,
                                         const schedule_shape& shape, double cap_bytes,
                                         const memory_plan_options& options = {}) {
  check_config(config, parallelism, parallelism.mesh.size(), shape);
  if (!(cap_bytes > 0))
    throw config_error("memory_cap", "the memory cap must be a positive number of bytes, got " + std::to_string(cap_bytes));
  const int S = shape.num_stages();
  const std::size_t element = options.element_bytes;
  const double least = least_memory_cap_for(config, parallelism, shape, element);
  const auto refuse = [&](const std::string& why) {
    throw config_error("memory_cap", "no plan fits a memory cap of " + detail::train::bytes_text(cap_bytes) +
                                         " per rank" + why + "; the least cap that fits is " +
                                         detail::train::bytes_text(least) +
                                         " (one microbatch at a time, full recomputation on every stage): raise the "
                                         "cap to at least that, or shrink the model, the sequence or the rows per "
                                         "microbatch (more microbatches), or use more ranks");
  };
  if (cap_bytes < least) refuse("");
  const cost_model base = recompute_cost_model(config, parallelism, shape);
  const recompute_menu menu = recompute_menu_for(config, parallelism, shape, element);
  memory_budget budget;
  budget.cap_bytes = cap_bytes;
  budget.fixed_bytes.clear();
  for (const memory_estimate& e : fixed_memory(config, parallelism, shape, element)) budget.fixed_bytes.push_back(e.total());
  const auto policies_of = [&](const std::vector<int>& choice) {
    std::vector<nn::recompute_policy> p;
    for (int c : choice) p.push_back(detail::train::plan_policies[c]);
    return p;
  };

  memory_plan out;
  out.cap_bytes = cap_bytes;
  recompute_plan plan;
  try {
    plan = synthesize_with_recompute(shape, base, menu, budget, options.search);
  } catch (const schedule_error& e) {
    refuse(std::string(" (the planner: ") + e.what() + ")");
  }
  out.lower_bound = plan.lower_bound;
  out.bound_method = plan.bound_method;
  for (int round = 0;; ++round) {
    const auto policies = policies_of(plan.choice);
    auto predicted = estimate_memory(config, parallelism, plan.prog, element, policies);
    bool fits = true;
    for (std::size_t r = 0; r < predicted.size(); ++r) {
      const double excess = predicted[r].total() - cap_bytes;
      if (excess > 0) {
        fits = false;
        budget.fixed_bytes[r] += excess;
      }
    }
    if (fits) {
      out.prog = plan.prog;
      out.stage_policies = policies;
      out.costs = plan.costs;
      out.makespan = plan.makespan;
      out.predicted = std::move(predicted);
      out.method = plan.method + "; schedule: " + plan.schedule_method;
      out.replans = round;
      break;
    }
    bool replanned = false;
    if (round < options.refinements) try {
        plan = synthesize_with_recompute(shape, base, menu, budget, options.search);
        replanned = true;
      } catch (const schedule_error&) {
      }
    if (!replanned) {
      // One microbatch at a time, full everywhere: fits whenever the cap is at least `least`.
      if (cap_bytes < least) refuse("");
      const std::vector<nn::recompute_policy> full(static_cast<std::size_t>(S), nn::recompute_policy::full);
      out.prog = detail::train::sequential_program(shape);
      out.stage_policies = full;
      out.costs = base;
      for (int s = 0; s < S; ++s) {
        const double extra = menu[static_cast<std::size_t>(s)].back().extra_backward_input;
        out.costs.backward_input[static_cast<std::size_t>(s)] += extra;
        out.costs.backward[static_cast<std::size_t>(s)] += extra;
      }
      out.makespan = simulate(out.prog, out.costs).makespan;
      out.predicted = estimate_memory(config, parallelism, out.prog, element, full);
      out.method = "one microbatch at a time, full on every stage (the planner's plans passed the cap in the full "
                   "estimate after " + std::to_string(round) + " replans)";
      out.replans = round;
      break;
    }
  }
  out.gap = out.lower_bound > 0 ? out.makespan / out.lower_bound : 1.0;
  return out;
}

}  // namespace baton::train
