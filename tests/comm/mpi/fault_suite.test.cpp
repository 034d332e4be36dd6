// tests/comm/mpi/fault_suite.test.cpp — the shared fault expectations (tests/support/faults.hpp) on
// the MPI backend, one process per rank under mpiexec (world sizes 1 to 4), debug fingerprints on.
// Its own executable: the thrown-rank and missing-rank cases leave abandoned requests behind on
// their communicators (left to MPI_Finalize), which the conformance executable should not share.
#include "support/faults.hpp"

#include <weft/comm/mpi/communicator.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <exception>

namespace {

namespace faults = weft::test::faults;
using weft::comm::mpi::communicator;

//! One rank per process: run() gives this process's rank a fresh world communicator (n is the
//! launcher's world size) and returns what escaped its body.
struct mpi_harness {
  using comm_type = communicator;
  static constexpr bool names_missing_ranks = false;  // see faults.hpp, missing_rank
  static constexpr bool ranks_in_process = false;

  template <class F>
  std::exception_ptr run(int, std::chrono::milliseconds timeout, F&& body) {
    weft::comm::mpi::options o;
    o.timeout = timeout;
    o.check_fingerprints = true;
    try {
      auto c = communicator::world(o);
      body(c);
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }
};

int world_size() {
  int n = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

}  // namespace

TEST_SUITE("mpi") {
  TEST_CASE("fault suite (mpi): a rank that throws reaches every rank as an exception") {
    if (world_size() < 2) return;
    mpi_harness h;
    faults::thrown_rank(h, world_size());
  }

  TEST_CASE("fault suite (mpi): a missing rank is a timeout_error naming it") {
    if (world_size() < 2) return;
    mpi_harness h;
    faults::missing_rank(h, world_size());
  }

  TEST_CASE("fault suite (mpi): mismatched calls name both fingerprints; the fault poisons") {
    if (world_size() < 2) return;
    mpi_harness h;
    faults::mismatched_call(h, world_size());
  }

  TEST_CASE("fault suite (mpi): after abort() every operation throws peer_aborted_error") {
    mpi_harness h;
    faults::abort_then_operate(h, world_size());
  }

  TEST_CASE("fault suite (mpi): zero-count operations are recorded in the history") {
    mpi_harness h;
    faults::zero_counts_recorded(h, world_size());
  }

  TEST_CASE("fault suite (mpi): in-place all_to_all") {
    mpi_harness h;
    faults::in_place_all_to_all(h, world_size());
  }

  TEST_CASE("fault suite (mpi): zero-length send and recv are local no-ops") {
    if (world_size() < 2) return;
    mpi_harness h;
    faults::zero_length_p2p_is_local(h, world_size());
  }

  TEST_CASE("fault suite (mpi): messages to one's own rank follow the one rule") {
    mpi_harness h;
    faults::self_message_rule(h, world_size());
  }

  TEST_CASE("fault suite (mpi): one message text per argument check") {
    mpi_harness h;
    faults::one_message_per_check(h, world_size());
  }

}  // TEST_SUITE("mpi")
