// weft/comm/detail/poll.hpp — waiting for something a library must be asked about (MPI requests,
// NCCL's asynchronous state, CUDA events) without burning a core: test, then back off (yield,
// then sleeps growing to a cap) until it is ready, the deadline passes, or the caller stops it.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace weft::comm::detail {

enum class poll_result { done, deadline, stopped };

//! How poll_until waits between tests: `yields` plain yields, then sleeps starting at `first`,
//! doubling every 16 tests up to `cap` (MPI's progress happens inside the test, so the first
//! retries are quick); `first == cap` sleeps a fixed interval (NCCL's poll_interval).
struct backoff {
  unsigned yields = 32;
  std::chrono::microseconds first{5};
  std::chrono::microseconds cap{200};
};

//! Calls `test()` until it returns true (done), `stop()` returns true (stopped) or `deadline`
//! passes. `test` may throw; its exception leaves through poll_until.
template <class Test, class Stop>
poll_result poll_until(std::chrono::steady_clock::time_point deadline, Test&& test, Stop&& stop,
                       backoff b = {}) {
  using clock = std::chrono::steady_clock;
  for (unsigned k = 0;; ++k) {
    if (test()) return poll_result::done;
    if (stop()) return poll_result::stopped;
    auto const now = clock::now();
    if (now >= deadline) return poll_result::deadline;
    if (k < b.yields) {
      std::this_thread::yield();
      continue;
    }
    auto const step = std::min<unsigned>((k - b.yields) / 16, 6);
    auto const sleep = std::min(b.cap, b.first * (1u << step));
    std::this_thread::sleep_for(std::min<clock::duration>(sleep, deadline - now));
  }
}

}  // namespace weft::comm::detail
