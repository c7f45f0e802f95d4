// baton/attention.hpp — the attention layer: tensor views, global-position masks, the
// backend contract, the reference oracle and (when Kokkos is linked) the Kokkos flash
// kernels. See docs/attention.md.
#pragma once

#include <baton/config.hpp>

#include <baton/attention/backend.hpp>
#include <baton/attention/error.hpp>
#include <baton/attention/masks.hpp>
#include <baton/attention/positions.hpp>
#include <baton/attention/reference.hpp>
#include <baton/core/tensor_view.hpp>

#if BATON_HAS_KOKKOS()
#include <baton/attention/kokkos.hpp>
#endif
