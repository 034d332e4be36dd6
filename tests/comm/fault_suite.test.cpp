// tests/comm/fault_suite.test.cpp — the shared fault expectations (tests/support/faults.hpp) on
// the threads backend, world sizes 2 to 4 (and 1 where a case makes sense alone).
#include <weft/comm/threads/world.hpp>

#include <support/faults.hpp>
#include <support/run_ranks.hpp>

#include <doctest/doctest.h>

#include <chrono>
#include <exception>
#include <utility>

namespace {

namespace faults = weft::test::faults;
using weft::comm::threads::communicator;

//! Ranks are threads of this process; the threads backend always compares fingerprints.
struct threads_harness {
  using comm_type = communicator;
  static constexpr bool names_missing_ranks = true;  // see faults.hpp, missing_rank
  static constexpr bool ranks_in_process = true;

  template <class F>
  std::exception_ptr run(int n, std::chrono::milliseconds timeout, F&& body) {
    try {
      weft::test::run_ranks(n, std::forward<F>(body), weft::test::test_options(timeout));
    } catch (...) {
      return std::current_exception();
    }
    return nullptr;
  }
};

}  // namespace

TEST_SUITE("threads") {
  TEST_CASE("fault suite (threads): a rank that throws reaches every rank as an exception") {
    threads_harness h;
    for (int n : {2, 3, 4}) {
      CAPTURE(n);
      faults::thrown_rank(h, n);
    }
  }

  TEST_CASE("fault suite (threads): a missing rank is a timeout_error naming it") {
    threads_harness h;
    for (int n : {2, 3, 4}) {
      CAPTURE(n);
      faults::missing_rank(h, n);
    }
  }

  TEST_CASE("fault suite (threads): mismatched calls name both fingerprints; the fault poisons") {
    threads_harness h;
    for (int n : {2, 3, 4}) {
      CAPTURE(n);
      faults::mismatched_call(h, n);
    }
  }

  TEST_CASE("fault suite (threads): after abort() every operation throws peer_aborted_error") {
    threads_harness h;
    for (int n : {1, 2, 3}) {
      CAPTURE(n);
      faults::abort_then_operate(h, n);
    }
  }

  TEST_CASE("fault suite (threads): zero-count operations are recorded in the history") {
    threads_harness h;
    for (int n : {1, 2, 3}) {
      CAPTURE(n);
      faults::zero_counts_recorded(h, n);
    }
  }

  TEST_CASE("fault suite (threads): in-place all_to_all") {
    threads_harness h;
    for (int n : {1, 2, 3, 4}) {
      CAPTURE(n);
      faults::in_place_all_to_all(h, n);
    }
  }

  TEST_CASE("fault suite (threads): zero-length send and recv are local no-ops") {
    threads_harness h;
    for (int n : {2, 3}) {
      CAPTURE(n);
      faults::zero_length_p2p_is_local(h, n);
    }
  }

  TEST_CASE("fault suite (threads): messages to one's own rank follow the one rule") {
    threads_harness h;
    for (int n : {1, 2}) {
      CAPTURE(n);
      faults::self_message_rule(h, n);
    }
  }

  TEST_CASE("fault suite (threads): one message text per argument check") {
    threads_harness h;
    for (int n : {1, 2, 3}) {
      CAPTURE(n);
      faults::one_message_per_check(h, n);
    }
  }

}  // TEST_SUITE("threads")
