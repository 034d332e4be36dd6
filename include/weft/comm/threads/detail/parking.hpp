// weft/comm/threads/detail/parking.hpp — where rank threads of the threads backend sleep: a short
// bounded spin, yields for as long as a futex wake-up takes, then a Linux futex (or, elsewhere, a
// condition variable) with a deadline. Never an unbounded spin, and with more ranks than cores only
// two yields: there a yielding waiter takes turns its runnable peers need.
#pragma once

#include <weft/core/config.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <thread>

#if defined(__linux__) && !defined(WEFT_THREADS_NO_FUTEX)
#define WEFT_THREADS_FUTEX 1
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#else
#define WEFT_THREADS_FUTEX 0
#include <condition_variable>
#include <mutex>
#endif

namespace weft::comm::threads::detail {

using clock = std::chrono::steady_clock;

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

//! now + d without overflowing for huge durations (time_point::max() stands for "no deadline").
inline clock::time_point deadline_after(std::chrono::milliseconds d,
                                        clock::time_point now = clock::now()) noexcept {
  if (d >= std::chrono::duration_cast<std::chrono::milliseconds>(clock::time_point::max() - now))
    return clock::time_point::max();
  return now + d;
}

//! A generation counter that waiters sleep on. Whoever changes a condition that a waiter may be
//! waiting for calls notify_all() after the change; wait_until(ready, deadline) returns once
//! ready() holds (true) or the deadline passed first (false).
//!
//! Lost wake-ups are impossible: a waiter reads the generation, announces itself in sleepers_,
//! re-checks ready() and then sleeps only while the generation is unchanged; a notifier changes
//! the condition, bumps the generation, then reads sleepers_ (all seq_cst).
class parking {
 public:
  parking() = default;
  parking(parking const&) = delete;
  parking& operator=(parking const&) = delete;

  void notify_all() noexcept {
    gen_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) == 0) return;
#if WEFT_THREADS_FUTEX
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&gen_), FUTEX_WAKE_PRIVATE, INT_MAX,
            nullptr, nullptr, 0);
#else
    { std::lock_guard<std::mutex> lock(mutex_); }  // orders the bump before a sleeper's re-check
    cv_.notify_all();
#endif
  }

  //! How long a waiter keeps yielding before it sleeps, beyond its first two yields: 30 us by
  //! default; the group sets 0 when its world has more ranks than the machine has cores.
  void set_yield_time(std::chrono::microseconds t) noexcept { yield_time_ = t; }
  [[nodiscard]] std::chrono::microseconds yield_time() const noexcept { return yield_time_; }

  template <class Ready>
  bool wait_until(Ready&& ready, clock::time_point deadline) {
    // A few pauses catch a peer that is a few hundred nanoseconds behind; a few yields hand the
    // core to a runnable peer when ranks outnumber cores. Both are bounded.
    for (int i = 0; i < spin_pauses; ++i) {
      if (ready()) return true;
      cpu_relax();
    }
    // Then yields: two, and more for up to yield_time() (when the ranks have a core each): a peer
    // that was woken from a futex is that late, and a waiter that slept at each of its late
    // peer's arrivals would make the peer sleep in turn, one wake-up per call for as long as it
    // runs (seen: 0.7 -> 6 us per 8-byte all_reduce after a single 5 us delay on 2 ranks).
    bool const timed = yield_time_.count() > 0;
    auto const yield_end = timed ? std::min(deadline, clock::now() + yield_time_) : deadline;
    for (int i = 0;; ++i) {
      if (ready()) return true;
      if (i >= spin_yields && (!timed || (i % 4 == 0 && clock::now() >= yield_end))) break;
      std::this_thread::yield();
    }
    for (;;) {
      std::uint32_t const g = gen_.load(std::memory_order_seq_cst);
      if (ready()) return true;
      auto const now = clock::now();
      if (now >= deadline) return ready();
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      if (ready()) {
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
        return true;
      }
      sleep(g, now, deadline);
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }

 private:
  static constexpr int spin_pauses = 64;
  static constexpr int spin_yields = 2;
  std::chrono::microseconds yield_time_{30};

  void sleep(std::uint32_t g, clock::time_point now, clock::time_point deadline) {
#if WEFT_THREADS_FUTEX
    static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                      std::atomic<std::uint32_t>::is_always_lock_free,
                  "weft: the futex word must be a plain lock-free 32-bit integer");
    timespec rel{};
    timespec* timeout = nullptr;
    if (deadline != clock::time_point::max()) {
      // Sleep at most an hour per call: the loop re-checks, and the conversion cannot overflow.
      auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - now);
      left = std::min<std::chrono::nanoseconds>(left, std::chrono::hours(1));
      rel.tv_sec = static_cast<time_t>(left.count() / 1000000000);
      rel.tv_nsec = static_cast<long>(left.count() % 1000000000);
      timeout = &rel;
    }
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&gen_), FUTEX_WAIT_PRIVATE, g, timeout,
            nullptr, 0);
#else
    (void)now;
    std::unique_lock<std::mutex> lock(mutex_);
    auto const changed = [&] { return gen_.load(std::memory_order_seq_cst) != g; };
    if (deadline == clock::time_point::max()) {
      cv_.wait(lock, changed);
    } else {
      cv_.wait_until(lock, deadline, changed);
    }
#endif
  }

  alignas(64) std::atomic<std::uint32_t> gen_{0};
  std::atomic<int> sleepers_{0};
#if !WEFT_THREADS_FUTEX
  std::mutex mutex_;
  std::condition_variable cv_;
#endif
};

}  // namespace weft::comm::threads::detail
