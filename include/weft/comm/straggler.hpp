// weft/comm/straggler.hpp — straggler detection from collective arrival times: the options and
// their checks, the report a detector gives, and the detector itself (a single-threaded algorithm
// over rows of per-rank arrival times; comm/monitored.hpp feeds it from a communicator).
#pragma once

#include <weft/core/error.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace weft::comm {

//! How a straggler detector decides. The defaults suit training steps of a few milliseconds and
//! more on a shared machine; the lag a rank must show is max(min_lag, relative_lag * step), where
//! step is the median interval between consecutive collectives over the last window.
struct straggler_options {
  //! Collectives per decision: a rank is named when its lag exceeds the bar in more than half of
  //! the last `window` collectives (its windowed median lag is over the bar), and cleared when it
  //! does so in at most a quarter of them. In [3, history].
  int window = 15;
  //! The bar relative to the step: 0.1 names a rank that arrives 10 % of a step after the median
  //! rank, persistently. In (0, 10].
  double relative_lag = 0.1;
  //! The absolute floor of the bar: scheduler noise below it is never an alarm. >= 0.
  std::chrono::microseconds min_lag{1000};
  //! Lags kept per rank for lag_history() (a ring). In [window, 1 << 20].
  int history = 256;
  //! Processes (MPI): arrival stamps are exchanged with one all_gather every this many monitored
  //! collectives (a decision can come this many collectives later). In [1, 4096].
  int exchange_every = 8;
  //! A rank that has not arrived at a collective that a peer entered this long ago is named
  //! silent; as a fraction of the communicator's deadline (so it is named before that deadline
  //! raises timeout_error). In (0, 1).
  double silent_fraction = 0.5;
};

//! Throws invalid_argument_error naming the first option out of range.
inline void check(straggler_options const& o) {
  WEFT_EXPECTS(o.history >= 3 && o.history <= (1 << 20), "history", "in [3, 1048576]", o.history);
  WEFT_EXPECTS(o.window >= 3 && o.window <= o.history, "window",
               weft::detail::concat("in [3, history = ", o.history, "]"), o.window);
  WEFT_EXPECTS(o.relative_lag > 0.0 && o.relative_lag <= 10.0, "relative_lag", "in (0, 10]",
               o.relative_lag);
  WEFT_EXPECTS(o.min_lag.count() >= 0, "min_lag", ">= 0 us", o.min_lag.count());
  WEFT_EXPECTS(o.exchange_every >= 1 && o.exchange_every <= 4096, "exchange_every", "in [1, 4096]",
               o.exchange_every);
  WEFT_EXPECTS(o.silent_fraction > 0.0 && o.silent_fraction < 1.0, "silent_fraction", "in (0, 1)",
               o.silent_fraction);
}

enum class straggler_kind : std::uint8_t {
  slow,    //!< arrives late, persistently (windowed median lag over the bar)
  silent,  //!< has not arrived at a collective its peers have been waiting in
};

constexpr std::string_view to_string(straggler_kind k) noexcept {
  return k == straggler_kind::slow ? "slow" : "silent";
}

//! What the hook receives and suspects() returns. Times in seconds.
struct straggler_report {
  int rank = -1;
  straggler_kind kind = straggler_kind::slow;
  //! The monitored collective (0-based count of monitored collectives) at which it was named.
  std::uint64_t collective = 0;
  //! slow: median lag over the window; silent: how long the first peer has been waiting.
  double lag = 0;
  double bar = 0;   //!< slow: the lag it had to exceed; silent: the silence threshold
  double step = 0;  //!< median interval between collectives over the window (0 if unknown)
  int over = 0;     //!< slow: collectives of the window in which its lag exceeded the bar
  int window = 0;
};

//! The decision procedure, fed one row per collective: row[r] is rank r's arrival time in seconds
//! on any clock common to the row (a shared clock, or each rank's exit of the collective, which
//! every rank leaves within the network latency). Lag = arrival - median arrival of the row, so
//! a common offset cancels. A rank is named slow when its lag exceeds the bar in a majority of
//! the window. Not thread-safe: comm/monitored.hpp serialises it. Costs O(ranks) per row, plus
//! O(ranks * window) once per window when the bar is re-estimated.
class straggler_detector {
 public:
  straggler_detector() = default;
  straggler_detector(int ranks, straggler_options const& o) : n_(ranks), o_(o) {
    WEFT_EXPECTS(ranks >= 1, "ranks", ">= 1", ranks);
    check(o);
    auto const n = static_cast<std::size_t>(ranks);
    lags_.assign(n * static_cast<std::size_t>(o.history), 0.0);
    over_.assign(n, 0);
    named_.assign(n, 0);
    scratch_.resize(std::max<std::size_t>(n, static_cast<std::size_t>(o.window)));
    medians_.assign(static_cast<std::size_t>(o.window) + 1, 0.0);
    bar_ = seconds(o.min_lag);
  }

  [[nodiscard]] int ranks() const noexcept { return n_; }
  [[nodiscard]] std::uint64_t rows() const noexcept { return rows_; }
  [[nodiscard]] double bar() const noexcept { return bar_; }
  [[nodiscard]] double step() const noexcept { return step_; }
  [[nodiscard]] bool named(int r) const noexcept {
    return named_[static_cast<std::size_t>(r)] != 0;
  }

  //! Adds the row of the next collective; calls on_named(report) for each rank named slow by it
  //! and on_cleared(rank) for each rank that stops being one.
  template <class OnNamed, class OnCleared>
  void observe(std::span<double const> row, OnNamed&& on_named, OnCleared&& on_cleared) {
    auto const n = static_cast<std::size_t>(n_);
    auto const w = static_cast<std::uint64_t>(o_.window);
    auto const h = static_cast<std::uint64_t>(o_.history);
    double const med = median_of(row);
    std::uint64_t const k = rows_++;
    // Ring positions kept as counters: this runs once per monitored collective, and three 64-bit
    // divisions by run-time moduli cost more than the rest of a small row.
    medians_[med_pos_] = med;
    med_pos_ = med_pos_ == w ? 0 : med_pos_ + 1;
    std::size_t const slot = pos_;
    pos_ = pos_ + 1 == h ? 0 : pos_ + 1;
    bool const evict = k >= w;
    std::size_t const old = slot >= w ? slot - w : slot + h - w;  // k - w (mod h), when evict
    // A straggler is an outlier: when more than a quarter of the ranks (at least one) are late
    // in the same collective, the delay is the machine's (threads descheduled in waves on an
    // oversubscribed host), not a rank's, and that collective's late lags are recorded as 0.
    std::size_t late = 0;
    for (std::size_t r = 0; r < n; ++r) late += row[r] - med > bar_ ? 1 : 0;
    bool const outliers = late <= std::max<std::size_t>(1, n / 4);
    for (std::size_t r = 0; r < n; ++r) {
      double* const lr = &lags_[r * h];
      if (evict && lr[old] > bar_) --over_[r];
      double lag = row[r] - med;
      if (!outliers && lag > bar_) lag = 0.0;
      lr[slot] = lag;
      if (lag > bar_) ++over_[r];
    }
    if (++since_rebar_ == w) since_rebar_ = 0;
    if (rows_ < w) return;
    if (since_rebar_ == 0) rebar();  // rows_ % w == 0
    int const majority = o_.window / 2 + 1;
    int const clear = o_.window / 4;
    for (std::size_t r = 0; r < n; ++r) {
      if (!named_[r] && over_[r] >= majority) {
        named_[r] = 1;
        on_named(report_for(static_cast<int>(r), k));
      } else if (named_[r] && over_[r] <= clear) {
        named_[r] = 0;
        on_cleared(static_cast<int>(r));
      }
    }
  }

  //! The report a named rank would get now (its windowed median lag).
  [[nodiscard]] straggler_report report_for(int r, std::uint64_t collective) {
    auto const w = static_cast<std::uint64_t>(o_.window);
    auto const h = static_cast<std::uint64_t>(o_.history);
    std::size_t const m = static_cast<std::size_t>(std::min<std::uint64_t>(rows_, w));
    double const* lr = &lags_[static_cast<std::size_t>(r) * h];
    for (std::size_t i = 0; i < m; ++i) scratch_[i] = lr[(rows_ - 1 - i) % h];
    straggler_report rep;
    rep.rank = r;
    rep.kind = straggler_kind::slow;
    rep.collective = collective;
    rep.lag = median_in_place(std::span<double>(scratch_.data(), m));
    rep.bar = bar_;
    rep.step = step_;
    rep.over = over_[static_cast<std::size_t>(r)];
    rep.window = o_.window;
    return rep;
  }

  //! Rank r's last lags (seconds, oldest first), at most `history` of them.
  [[nodiscard]] std::vector<double> lag_history(int r) const {
    auto const h = static_cast<std::uint64_t>(o_.history);
    std::uint64_t const m = std::min(rows_, h);
    std::vector<double> v;
    v.reserve(static_cast<std::size_t>(m));
    double const* lr = &lags_[static_cast<std::size_t>(r) * h];
    for (std::uint64_t i = rows_ - m; i < rows_; ++i) v.push_back(lr[i % h]);
    return v;
  }

  static double seconds(std::chrono::microseconds d) noexcept { return double(d.count()) * 1e-6; }

 private:
  double median_of(std::span<double const> row) {
    // Two or three ranks (the common small case) without a copy or a call.
    if (row.size() == 2) return 0.5 * (row[0] + row[1]);
    if (row.size() == 3)
      return std::max(std::min(row[0], row[1]), std::min(std::max(row[0], row[1]), row[2]));
    std::copy(row.begin(), row.end(), scratch_.begin());
    return median_in_place(std::span<double>(scratch_.data(), row.size()));
  }
  static double median_in_place(std::span<double> v) {
    if (v.empty()) return 0;
    auto const mid = v.size() / 2;
    if (v.size() <= 16) {
      // A row of a few ranks (the per-collective case): insertion sort beats nth_element's
      // partitioning several times over; the median is the same number either way.
      for (std::size_t i = 1; i < v.size(); ++i) {
        double const x = v[i];
        std::size_t j = i;
        for (; j > 0 && v[j - 1] > x; --j) v[j] = v[j - 1];
        v[j] = x;
      }
      return v.size() % 2 == 1 ? v[mid] : 0.5 * (v[mid - 1] + v[mid]);
    }
    std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
    double const hi = v[mid];
    if (v.size() % 2 == 1) return hi;
    double const lo = *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid));
    return 0.5 * (lo + hi);
  }

  // Once per window: step = median interval between the window's collectives; the bar follows it,
  // and the counts are redone against the new bar.
  void rebar() {
    auto const w = static_cast<std::size_t>(o_.window);
    auto const h = static_cast<std::uint64_t>(o_.history);
    std::size_t m = 0;
    for (std::uint64_t i = rows_ - w + (rows_ == w ? 1 : 0); i < rows_; ++i)
      scratch_[m++] = medians_[i % (w + 1)] - medians_[(i - 1) % (w + 1)];
    step_ = std::max(0.0, median_in_place(std::span<double>(scratch_.data(), m)));
    double const bar = std::max(seconds(o_.min_lag), o_.relative_lag * step_);
    if (bar == bar_) return;
    bar_ = bar;
    for (std::size_t r = 0; r < static_cast<std::size_t>(n_); ++r) {
      double const* lr = &lags_[r * h];
      int c = 0;
      for (std::uint64_t i = rows_ - w; i < rows_; ++i) c += lr[i % h] > bar_ ? 1 : 0;
      over_[r] = c;
    }
  }

  int n_ = 0;
  straggler_options o_{};
  std::uint64_t rows_ = 0;
  std::size_t pos_ = 0;            // rows_ % history: the lag slot of the next row
  std::size_t med_pos_ = 0;        // rows_ % (window + 1): the median slot of the next row
  std::uint64_t since_rebar_ = 0;  // rows_ % window
  double bar_ = 0;
  double step_ = 0;
  std::vector<double> lags_;     // [rank][history], a ring per rank
  std::vector<int> over_;        // per rank: lags over the bar in the window
  std::vector<char> named_;      // per rank: currently named slow
  std::vector<double> scratch_;  // row medians, window medians
  std::vector<double> medians_;  // median arrival of the last window + 1 rows (a ring)
};

}  // namespace weft::comm
