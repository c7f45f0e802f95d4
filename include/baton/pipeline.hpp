// baton/pipeline.hpp — the pipeline runtime: stage concepts, the executor that runs a lowered
// schedule on one rank, hooks, loss scaling, eval and gradient-norm clipping.
//
//   stage, split_backward_stage          what a stage is (forward / backward, or I + W)
//   stage_list<S...>, uniform_stages<S>  the stage types of a pipeline
//   microbatch_hooks<In, Out>            hooks that live as long as one microbatch
//   loss_result<G>                       what a loss returns per microbatch
//   pipeline_executor, make_pipeline     run a schedule over a communicator
//   pipeline_options, step_report        what an executor is given and what a call reports
//   clip_grad_norm                       gradient-norm clipping over sharded parameters
//   action_time, measured_cost_model     measured action costs, as a cost model for the simulator
//   fit_cost_model                       per-stage medians over a few steps, for the planner (a cost_file)
//
// See docs/pipeline.md.
#pragma once

#include <baton/config.hpp>
#include <baton/pipeline/clip.hpp>
#include <baton/pipeline/error.hpp>
#include <baton/pipeline/executor.hpp>
#include <baton/pipeline/measure_costs.hpp>
#include <baton/pipeline/options.hpp>
#include <baton/pipeline/stage.hpp>
#include <baton/pipeline/timing.hpp>
