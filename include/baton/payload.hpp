// baton/payload.hpp — the payload layer: what travels between pipeline stages.
//
//   payload_traits<T>, payload_role        classify a type: activation, constant or opaque
//   tensor_payload, payload, sendable_payload
//   constant<T>                            a tensor sent and split but never differentiated
//   record<field<"name", T>...>, get<"name">(r)
//   grad_t<P>, grad_like(p)                gradients keep only activation fields
//   for_each_tensor, for_each_activation
//   split_microbatches, merge_microbatches
//   host_tensor<T>                         a small owning row-major host tensor
//
// The Kokkos::View adapter is a backend header: include <baton/payload/kokkos.hpp> and link
// baton::kokkos. See docs/payloads.md.
#pragma once

#include <baton/config.hpp>
#include <baton/payload/constant.hpp>
#include <baton/payload/grad.hpp>
#include <baton/payload/host_tensor.hpp>
#include <baton/payload/microbatch.hpp>
#include <baton/payload/record.hpp>
#include <baton/payload/traits.hpp>
#include <baton/payload/visit.hpp>
