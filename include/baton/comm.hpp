// baton/comm.hpp — communicators: the capability concepts, the local (threads) world and
// the device mesh. The MPI and NCCL backends are included when their targets are linked
// (baton::mpi, baton::nccl); include <baton/comm/mpi.hpp> or <baton/comm/nccl.hpp> directly
// to make the dependency explicit. The NCCL backend is compiled only: it has not yet run on
// a GPU.
#pragma once

#include <baton/config.hpp>

#include <baton/comm/concepts.hpp>
#include <baton/comm/error.hpp>
#include <baton/comm/local.hpp>
#include <baton/comm/mesh.hpp>

#if BATON_HAS_MPI()
#include <baton/comm/mpi.hpp>
#endif
#if BATON_HAS_NCCL()
#include <baton/comm/nccl.hpp>
#endif
