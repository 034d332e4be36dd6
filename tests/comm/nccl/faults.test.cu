// tests/comm/nccl/faults.test.cu — the shared fault expectations (tests/support/faults.hpp) on the
// NCCL backend over the mock, ranks as threads, debug fingerprints on. The mock expresses every
// fault of the suite: a rank that throws or never posts leaves its peers' operations pending (as
// real NCCL would hang), which the backend's deadline turns into timeout_error.
#include "mock_suite.hpp"
#include "support/faults.hpp"

#include <doctest/doctest.h>

namespace {

namespace faults = weft::test::faults;
using weft::test::nccl_mock::harness;

}  // namespace

TEST_CASE("fault suite (nccl mock): a rank that throws reaches every rank as an exception") {
  harness h;
  for (int n : {2, 3}) {
    CAPTURE(n);
    faults::thrown_rank(h, n);
  }
}

TEST_CASE("fault suite (nccl mock): a missing rank is a timeout_error naming it") {
  harness h;
  for (int n : {2, 3}) {
    CAPTURE(n);
    faults::missing_rank(h, n);
  }
}

TEST_CASE("fault suite (nccl mock): mismatched calls name both fingerprints; the fault poisons") {
  harness h;
  for (int n : {2, 3}) {
    CAPTURE(n);
    faults::mismatched_call(h, n);
  }
}

TEST_CASE("fault suite (nccl mock): after abort() every operation throws peer_aborted_error") {
  harness h;
  for (int n : {1, 2}) {
    CAPTURE(n);
    faults::abort_then_operate(h, n);
  }
}

TEST_CASE("fault suite (nccl mock): zero-count operations are recorded in the history") {
  harness h;
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    faults::zero_counts_recorded(h, n);
  }
}

TEST_CASE("fault suite (nccl mock): in-place all_to_all") {
  harness h;
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    faults::in_place_all_to_all(h, n);
  }
}

TEST_CASE("fault suite (nccl mock): zero-length send and recv are local no-ops") {
  harness h;
  for (int n : {2, 3}) {
    CAPTURE(n);
    faults::zero_length_p2p_is_local(h, n);
  }
}

TEST_CASE("fault suite (nccl mock): messages to one's own rank follow the one rule") {
  harness h;
  for (int n : {1, 2}) {
    CAPTURE(n);
    faults::self_message_rule(h, n);
  }
}

TEST_CASE("fault suite (nccl mock): one message text per argument check") {
  harness h;
  for (int n : {1, 2, 3}) {
    CAPTURE(n);
    faults::one_message_per_check(h, n);
  }
}
