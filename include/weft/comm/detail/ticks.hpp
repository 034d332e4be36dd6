// weft/comm/detail/ticks.hpp — a cheap monotonic time stamp for per-collective arrival stamps
// (comm/monitored.hpp): the x86 time-stamp counter where the kernel itself keeps time with it, and
// steady_clock everywhere else. Reading the TSC costs about a third of a steady_clock::now() call
// (8.5 ns against 20 ns on the CI machine), which matters on a collective of 0.3 us.
#pragma once

#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>

#if defined(__x86_64__) && defined(__linux__)
#include <x86intrin.h>
#define WEFT_COMM_HAVE_TSC 1
#else
#define WEFT_COMM_HAVE_TSC 0
#endif

namespace weft::comm::detail {

//! Ticks of one process-wide clock. `tsc` is true where stamps are TSC readings: x86-64 Linux
//! whose clock source is "tsc", which the kernel selects only when the counter is invariant (a
//! constant rate through frequency and sleep states) and synchronised across cores, so two
//! threads' readings compare. Elsewhere ticks are steady_clock nanoseconds.
struct tick_clock {
  bool tsc = false;
  double seconds_per_tick = 1e-9;

  [[nodiscard]] std::int64_t now() const noexcept {
#if WEFT_COMM_HAVE_TSC
    if (tsc) return static_cast<std::int64_t>(__rdtsc());
#endif
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  //! The process's clock, decided and calibrated once (the TSC rate against steady_clock over
  //! 0.5 ms: the first call takes that long). The rate is good to about 1e-4 (1.3e-3 seen with
  //! busy cores): lags and steps scale alike, and the absolute floors (min_lag, the silent
  //! threshold) move by as little.
  static tick_clock const& get() {
    static tick_clock const c = make();
    return c;
  }

 private:
  static tick_clock make() {
    tick_clock c;
#if WEFT_COMM_HAVE_TSC
    std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    std::string source;
    if (!(f >> source) || source != "tsc") return c;
    using steady = std::chrono::steady_clock;
    auto const t0 = steady::now();
    auto const k0 = __rdtsc();
    auto t1 = t0;
    while (t1 - t0 < std::chrono::microseconds(500)) t1 = steady::now();
    auto const k1 = __rdtsc();
    if (k1 <= k0) return c;
    c.tsc = true;
    c.seconds_per_tick = std::chrono::duration<double>(t1 - t0).count() / double(k1 - k0);
#endif
    return c;
  }
};

}  // namespace weft::comm::detail
