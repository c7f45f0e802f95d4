// baton/baton.hpp — the umbrella header: every layer, each with the backends whose targets
// are linked (the layer umbrellas include them).
// Prefer the layer headers (baton/payload.hpp, ...) in your own code to keep builds lean.
#pragma once

#include <baton/config.hpp>

#include <baton/core.hpp>
#include <baton/payload.hpp>
#include <baton/schedule.hpp>
#include <baton/comm.hpp>
#include <baton/pipeline.hpp>
#include <baton/attention.hpp>
#include <baton/cp.hpp>
#include <baton/nn.hpp>
#include <baton/train.hpp>
