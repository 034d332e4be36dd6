// tests/support/run_ranks.hpp — run a test body on N ranks as threads: run_ranks(n, f) calls
// f(weft::comm::threads::communicator&) on every rank, joins, and rethrows the first failure.
// Tests get a 10 s default deadline, so a broken collective fails the test instead of hanging CI.
#pragma once

#include <weft/comm/threads/world.hpp>

#include <chrono>
#include <concepts>
#include <utility>

namespace weft::test {

//! Deadline of every wait in tests unless a test asks for another.
inline constexpr std::chrono::milliseconds default_test_timeout{10000};

inline comm::threads::options test_options(
    std::chrono::milliseconds timeout = default_test_timeout) {
  comm::threads::options o;
  o.timeout = timeout;
  return o;
}

template <class F>
requires std::invocable<F&, comm::threads::communicator&>
void run_ranks(int n, F&& f, comm::threads::options opts = test_options()) {
  comm::threads::world(n, opts).run(std::forward<F>(f));
}

}  // namespace weft::test
