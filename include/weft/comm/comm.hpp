// weft/comm/comm.hpp — the communication area in one include: the communicator concepts (point-to-
// point, collective, full) and their vocabulary, the work handle, the reduction semantics and
// serial reference, the typed collectives over tensors, the threads backend (always available), and
// straggler detection around any host communicator (monitored.hpp).
// The MPI and NCCL backends have their own headers.
#pragma once

#include <weft/comm/collectives.hpp>
#include <weft/comm/concepts.hpp>
#include <weft/comm/monitored.hpp>
#include <weft/comm/reference.hpp>
#include <weft/comm/work.hpp>
#include <weft/comm/threads/communicator.hpp>
#include <weft/comm/threads/options.hpp>
#include <weft/comm/threads/world.hpp>
