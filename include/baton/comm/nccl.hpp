// baton/comm/nccl.hpp — the NCCL backend: ranks are GPUs.
//
// Ran on one GPU only (an H200, 2026-12-04: its test with one rank, and pipelines over a
// one-rank world); between two or more GPUs it has never run, and its test
// (baton_comm_nccl) skips without a GPU. Treat multi-GPU use as planned until a run proves it.
//
//     baton::mpi_communicator host;                                    // or a local_communicator
//     auto gpu = baton::nccl_communicator::bootstrap(host, /*device=*/local_rank);
//     gpu.all_reduce(std::span(device_grad, n), baton::reduce_op::sum);  // device memory
//
// Models the same capability concepts as the local world and MPI. Data spans should point to
// device memory (cudaMalloc, cudaMallocManaged) of the communicator's device. Host memory is
// accepted by isend, irecv, shift, all_reduce and broadcast — the pipeline executor sends its
// message headers, agreement tables and loss values from the host — and is staged through a
// pinned host buffer and a device buffer of the communicator (a host irecv's data is copied
// into place when wait() or test() sees the transfer complete; wait_on alone does not). The
// staging slots are made at construction (nccl_options::staging_slots x staging_slot_bytes)
// and grow only when no transfer is pending: allocating pinned memory waits for the device,
// which with a receive posted could deadlock; an exhausted pool mid-flight is a comm_error.
// all_gather, all_to_all and all_to_all_v take device memory only.
//
// Stream-ordered: collectives are enqueued on the communicator's stream (stream()).
// Point-to-point transfers travel on two more lanes, each its own NCCL communicator (split
// from this one at construction) and stream: one for messages to a higher rank, one for
// messages to a lower rank (a shift onto oneself uses the main one; a standalone isend or
// irecv to oneself is refused: NCCL pairs it only with a receive in the same group). An NCCL send blocks its
// stream until the peer receives it, so with one stream a rank sending a large activation up
// the pipeline could not receive the gradient coming down behind it while its peer does the
// same — the executor's lowered programs assume buffered sends; per-direction lanes keep each
// stream's transfers in the same order on both ends of every pair.
// isend, irecv and shift return a request holding a CUDA event recorded after the transfer:
// wait() blocks the host until it passes (with the timeout), wait_on(s) makes another stream
// wait for it without blocking the host. Point-to-point calls are issued inside
// ncclGroupStart/ncclGroupEnd. Collectives enqueue and then wait on the host (they are
// blocking, as the concepts promise), so host code may read managed memory after them.
//
// What NCCL cannot do, and baton therefore cannot check here: tags are not transmitted
// (messages between two ranks match in issue order; the tag only names the transfer in
// errors), a receive buffer of the wrong size is not detected, and ranks disagreeing about
// a collective's arguments are undefined behaviour. Run the same program on the local world
// or MPI to catch those. A transfer that times out cannot be cancelled: call abort().
//
// The pieces: nccl/options.hpp (nccl_options), nccl/request.hpp (nccl_request),
// nccl/communicator.hpp (nccl_communicator); the host staging's bookkeeping is
// detail/staging_pool.hpp (plain C++, tested on the host) and its CUDA calls
// detail/nccl_staging.hpp.
#pragma once

#include <baton/config.hpp>

#if !BATON_HAS_NCCL()
#error "baton/comm/nccl.hpp needs NCCL and CUDA: link baton::nccl (find_package(baton COMPONENTS nccl)); NCCL ships with the CUDA toolkit under /usr/local/cuda, or install libnccl-dev"
#endif

#include <baton/comm/nccl/communicator.hpp>
#include <baton/comm/nccl/options.hpp>
#include <baton/comm/nccl/request.hpp>
