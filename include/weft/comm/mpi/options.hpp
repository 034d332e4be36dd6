// weft/comm/mpi/options.hpp — the settings of an MPI-backend communicator (inherited by split):
// deadline, history length, the debug-mode fingerprint check, the largest count of one MPI call,
// and whether data moves through weft-owned buffers.
#pragma once

#include <chrono>
#include <climits>
#include <cstddef>

namespace weft::comm::mpi {

//! Settings of one communicator (inherited by split). All ranks must use the same values.
struct options {
  //! Deadline of every operation unless a call passes op_options::timeout. A peer that does not
  //! take part within it makes this rank throw timeout_error (and poisons the communicator).
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  //! How many operations history() keeps (0 keeps none).
  std::size_t history_size = 64;
  //! Debug mode: before each collective, all-gather its fingerprint (op, dtype, count, root,
  //! reduction, sequence, _v counts) and throw mismatch_error on every rank if they differ. Costs
  //! one small extra collective per call.
  bool check_fingerprints = false;
  //! Largest element count (and displacement) handed to one MPI call; MPI counts are `int`, so
  //! larger operations are split into chunks. Lower it only to exercise the chunked paths.
  std::size_t max_count = static_cast<std::size_t>(INT_MAX);
  //! Data moves through buffers weft owns: inputs are copied in before the MPI call, results
  //! copied out after it completes. MPI cannot cancel a collective, so a request that outlives its
  //! deadline stays posted and writes (or reads) its buffers whenever the late peer arrives, even
  //! inside MPI_Finalize; with weft's buffers (kept for the rest of the process once a request is
  //! abandoned) the caller may free its own after a timeout_error, return and finalize. false:
  //! MPI works on the caller's buffers directly (one copy less each way), and after a
  //! timeout_error those stay on loan to MPI: keep them alive until MPI_Finalize returns, or end
  //! the job with MPI_Abort.
  bool own_buffers = true;
};

}  // namespace weft::comm::mpi
