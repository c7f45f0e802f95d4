// baton/payload.hpp — the payload layer: what travels between pipeline stages.
//
//   payload_traits<T>, payload_role        classify a type: activation, constant or opaque
//   tensor_payload, payload, sendable_payload
//   constant<T>                            a tensor sent and split but never differentiated
//   record<field<"name", T>...>, get<"name">(r)
//   grad_t<P>, grad_like(p)                gradients keep only activation fields
//   for_each_tensor, for_each_activation
//   split_microbatches, merge_microbatches
//   microbatch_sizes, microbatch_bounds    the rows each microbatch gets
//   row_major_payload_traits<T>            payload_traits for any "data pointer + shape" tensor
//   host_tensor<T>                         a small owning row-major host tensor
//
// The Kokkos::View adapter (<baton/payload/kokkos.hpp>) is a backend header: it is included
// here when baton::kokkos is linked (like every layer's backends); include it directly to make
// the dependency explicit. See docs/payloads.md.
#pragma once

#include <baton/config.hpp>
#include <baton/payload/constant.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/payload/microbatch.hpp>
#include <baton/payload/record.hpp>
#include <baton/payload/row_major.hpp>
#include <baton/payload/traits.hpp>
#include <baton/payload/visit.hpp>

#if BATON_HAS_KOKKOS()
#include <baton/payload/kokkos.hpp>
#endif
