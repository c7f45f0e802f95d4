// baton/schedule.hpp — the schedule layer: action IR, policies, lowering, validation,
// simulation, CSV, pictures and the planner. Standard library only.
#pragma once

#include <baton/schedule/action.hpp>
#include <baton/schedule/certify.hpp>
#include <baton/schedule/controllable_v.hpp>
#include <baton/schedule/csv.hpp>
#include <baton/schedule/cost_file.hpp>
#include <baton/schedule/grid.hpp>
#include <baton/schedule/lower.hpp>
#include <baton/schedule/makespan_bound.hpp>
#include <baton/schedule/partition.hpp>
#include <baton/schedule/policies.hpp>
#include <baton/schedule/policy.hpp>
#include <baton/schedule/problem.hpp>
#include <baton/schedule/program.hpp>
#include <baton/schedule/recompute_plan.hpp>
#include <baton/schedule/registry.hpp>
#include <baton/schedule/render.hpp>
#include <baton/schedule/simulate.hpp>
#include <baton/schedule/synthesize.hpp>
#include <baton/schedule/validate.hpp>
