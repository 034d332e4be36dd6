// tests/comm/straggler.test.cpp — straggler and fault detection (comm/straggler.hpp,
// comm/monitored.hpp): option checks, the detector on synthetic rows, and monitored threads worlds
// with one rank slowed by 20 % (shared clock and exchanged stamps), a silent rank named before the
// deadline, and normal collectives that raise no alarm.
#include <weft/comm/comm.hpp>
#include <weft/comm/monitored.hpp>
#include <weft/comm/straggler.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace wc = weft::comm;
namespace wt = weft::comm::threads;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using monitored = wc::monitored<wt::communicator>;

// The synthetic rows' options: steps of 2 ms, a 20 % slow rank lags 0.4 ms, well over the
// bar max(200 us, 10 % of a step); scheduler noise on a loaded machine stays under it in most
// collectives of a window.
wc::straggler_options timed_options() {
  wc::straggler_options o;
  o.min_lag = 200us;
  return o;
}

// The 8-thread runs: the defaults' 1 ms floor. A loaded 2-core machine delays threads by
// milliseconds, so the slow rank's lag (2 ms of a 10 ms step) must stand above that.
wc::straggler_options run_options() { return wc::straggler_options{}; }

// Back-to-back collectives on a 2-core machine under a parallel ctest: 8 spinning threads starve
// each other, and one can stay descheduled for a whole window, 1.8 ms late each time (seen once
// with the default 1 ms floor). The floor must exceed the machine's scheduling noise (docs/comm.md,
// Limits); 5 ms does here.
wc::straggler_options noisy_options() {
  wc::straggler_options o;
  o.min_lag = 5ms;
  return o;
}

struct named_rank {
  wc::straggler_report rep;
  clock_type::time_point at;
  std::thread::id by;  // the thread that called the hook
};

// Collects the hook's reports (from any thread).
struct recorder {
  std::mutex m;
  std::vector<named_rank> seen;
  wc::straggler_hook hook() {
    return [this](wc::straggler_report const& r) {
      std::lock_guard<std::mutex> lock(m);
      seen.push_back({r, clock_type::now(), std::this_thread::get_id()});
    };
  }
  std::vector<named_rank> get() {
    std::lock_guard<std::mutex> lock(m);
    return seen;
  }
};

std::string what_of(auto&& f) {
  try {
    f();
  } catch (weft::invalid_argument_error const& e) {
    return e.what();
  }
  return "no exception";
}

// One 8-byte all_reduce per step, each rank sleeping `step` first (the slow rank `step * 1.2`
// from collective `slow_from` on). Returns when every rank has run `total` collectives; the
// start of the slowdown is recorded as the moment the slow rank starts its first slow sleep.
struct slow_run {
  int slow_rank = 5;
  std::uint64_t slow_from = 40;
  std::uint64_t total = 100;
  std::chrono::microseconds step = 10000us;  // 100 collectives/s; the slow rank 2 ms late
  std::atomic<std::int64_t> slow_start_ns{0};
  clock_type::time_point t0 = clock_type::now();

  void rank_body(monitored& m) {
    float in[2] = {1.0f, 2.0f};
    float out[2] = {};
    for (std::uint64_t k = 0; k < total; ++k) {
      auto d = step;
      if (m.rank() == slow_rank && k >= slow_from) {
        if (k == slow_from)
          slow_start_ns.store(std::chrono::nanoseconds(clock_type::now() - t0).count());
        d = step * 12 / 10;
      }
      std::this_thread::sleep_for(d);
      m.all_reduce(wc::host_view(std::span<float>(in)), wc::host_view(std::span<float>(out)))
          .wait();
      REQUIRE(out[0] == float(m.size()));
    }
  }
};

// Back-to-back 8-byte all_reduces with no work between them: the noisiest case for arrival order
// (8 threads on a few cores), and no rank is slower than the others.
// With `offload`, a straggler_watchdog evaluates (shared clock only).
void normal_collectives(int n, std::uint64_t count, wc::straggler_options const& o,
                        wc::stamp_exchange x, bool offload = false) {
  recorder rec;
  std::vector<std::shared_ptr<wc::straggler_monitor>> mons;
  for (int r = 0; r < (x == wc::stamp_exchange::shared_clock ? 1 : n); ++r) {
    mons.push_back(std::make_shared<wc::straggler_monitor>(n, o, x));
    mons.back()->set_hook(rec.hook());
  }
  {
    std::optional<wc::straggler_watchdog> dog;
    if (offload) dog.emplace(mons[0]);
    wt::run(n, [&](wt::communicator& c) {
      auto const r = static_cast<std::size_t>(c.rank());
      monitored m(std::move(c), mons[x == wc::stamp_exchange::shared_clock ? 0 : r]);
      float in[2] = {1.0f, 1.0f};
      float out[2] = {};
      for (std::uint64_t k = 0; k < count; ++k)
        m.all_reduce(wc::host_view(std::span<float>(in)), wc::host_view(std::span<float>(out)));
    });
  }  // the watchdog evaluates what is left as it stops
  auto const seen = rec.get();
  for (auto const& s : seen)
    MESSAGE("false alarm: rank " << s.rep.rank << " " << wc::to_string(s.rep.kind)
                                 << " at collective " << s.rep.collective << ", lag "
                                 << s.rep.lag * 1e6 << " us, bar " << s.rep.bar * 1e6 << " us");
  CHECK(seen.empty());
  CHECK(mons[0]->suspects().empty());
  CHECK(mons[0]->collectives() == count);
}

}  // namespace

static_assert(wc::Communicator<monitored>);
static_assert(wc::CommunicatorIn<monitored, weft::host_space>);

TEST_CASE("straggler: options out of range are refused, naming the option and the value") {
  auto bad = [](auto edit) {
    wc::straggler_options o;
    edit(o);
    return what_of([&] { wc::straggler_monitor m(4, o); });
  };
  auto const w = bad([](auto& o) { o.window = 2; });
  CHECK(w.find("`window`") != std::string::npos);
  CHECK(w.find("in [3, history = 256]") != std::string::npos);
  CHECK(w.find("actual 2") != std::string::npos);
  CHECK(bad([](auto& o) { o.window = 300; }).find("actual 300") != std::string::npos);
  auto const rl = bad([](auto& o) { o.relative_lag = 0.0; });
  CHECK(rl.find("`relative_lag`") != std::string::npos);
  CHECK(rl.find("in (0, 10]") != std::string::npos);
  CHECK(bad([](auto& o) { o.relative_lag = 11.0; }).find("actual 11") != std::string::npos);
  CHECK(bad([](auto& o) { o.min_lag = -1us; }).find("`min_lag`") != std::string::npos);
  CHECK(bad([](auto& o) { o.history = 2; }).find("`history`") != std::string::npos);
  CHECK(bad([](auto& o) { o.exchange_every = 0; }).find("`exchange_every`") != std::string::npos);
  auto const sf = bad([](auto& o) { o.silent_fraction = 1.0; });
  CHECK(sf.find("`silent_fraction`") != std::string::npos);
  CHECK(sf.find("in (0, 1)") != std::string::npos);
  CHECK(what_of([] { wc::straggler_monitor m(0); }).find("`ranks`") != std::string::npos);
  CHECK(what_of([] { wc::straggler_watchdog dog(nullptr); }).find("`monitor`") !=
        std::string::npos);
  CHECK_NOTHROW(wc::straggler_monitor(4, wc::straggler_options{}));
}

TEST_CASE("straggler: the detector names a rank lagging 20 % of a step within 20 rows, only it") {
  // Synthetic rows: steps of 2.4 ms with +-50 us of deterministic jitter per rank; rank 5 arrives
  // 0.4 ms late from row 200 on, and on time again from row 400.
  int const n = 8;
  wc::straggler_detector det(n, timed_options());
  std::vector<wc::straggler_report> named;
  std::vector<std::pair<int, std::uint64_t>> cleared;
  std::vector<double> row(n);
  for (std::uint64_t k = 0; k < 600; ++k) {
    for (int r = 0; r < n; ++r) {
      double const jitter = double((k * 7919 + std::uint64_t(r) * 104729) % 101) - 50.0;  // us
      row[std::size_t(r)] = double(k) * 2.4e-3 + jitter * 1e-6;
      if (r == 5 && k >= 200 && k < 400) row[std::size_t(r)] += 0.4e-3;
    }
    det.observe(
        row, [&](wc::straggler_report const& rep) { named.push_back(rep); },
        [&](int r) { cleared.emplace_back(r, det.rows() - 1); });
  }
  REQUIRE(named.size() == 1);
  CHECK(named[0].rank == 5);
  CHECK(named[0].kind == wc::straggler_kind::slow);
  CHECK(named[0].collective >= 200);
  CHECK(named[0].collective < 220);
  CHECK(named[0].lag == doctest::Approx(0.4e-3).epsilon(0.2));
  CHECK(named[0].step == doctest::Approx(2.4e-3).epsilon(0.05));
  CHECK(named[0].bar == doctest::Approx(0.24e-3).epsilon(0.05));  // 10 % of the step > 200 us
  REQUIRE(cleared.size() == 1);
  CHECK(cleared[0].first == 5);
  CHECK(cleared[0].second >= 400);
  CHECK(cleared[0].second < 420);
  auto const h = det.lag_history(5);
  CHECK(h.size() == 256);
  auto sorted = row;
  std::sort(sorted.begin(), sorted.end());
  CHECK(h.back() == doctest::Approx(row[5] - 0.5 * (sorted[3] + sorted[4])));
}

TEST_CASE("straggler: each lag is the arrival minus the row's median, for any number of ranks") {
  // 1, 2 and 3 ranks take closed forms, up to 16 an insertion sort, more nth_element: all must
  // give the sorted row's median (the mean of the middle two for an even count). Arrivals spread
  // over less than the bar, so no lag is set aside as the machine's (see observe()).
  std::uint64_t x = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return double(x % 100003) * 1e-9;
  };
  for (int n : {1, 2, 3, 4, 5, 16, 17, 33}) {
    CAPTURE(n);
    wc::straggler_detector det(n, timed_options());
    std::vector<std::vector<double>> rows;
    for (int k = 0; k < 40; ++k) {
      std::vector<double> row(static_cast<std::size_t>(n));
      for (auto& a : row) a = double(k) * 1e-3 + next();
      if (k % 7 == 3 && n > 1) row[1] = row[0];  // ties
      det.observe(
          row, [](auto const&) {}, [](int) {});
      rows.push_back(row);
    }
    for (int r = 0; r < n; ++r) {
      auto const h = det.lag_history(r);
      REQUIRE(h.size() == rows.size());
      for (std::size_t k = 0; k < rows.size(); ++k) {
        auto sorted = rows[k];
        std::sort(sorted.begin(), sorted.end());
        auto const m = sorted.size() / 2;
        double const med = sorted.size() % 2 ? sorted[m] : 0.5 * (sorted[m - 1] + sorted[m]);
        CHECK(h[k] == doctest::Approx(rows[k][std::size_t(r)] - med).epsilon(1e-12));
      }
    }
  }
}

TEST_CASE("straggler: a lag under the absolute floor is never an alarm") {
  // Rank 2 is always last, by 150 us, in steps of 1 ms: over 10 % of the step, under min_lag.
  wc::straggler_detector det(4, timed_options());
  int alarms = 0;
  std::vector<double> row(4);
  for (std::uint64_t k = 0; k < 1000; ++k) {
    for (int r = 0; r < 4; ++r) row[std::size_t(r)] = double(k) * 1e-3 + (r == 2 ? 150e-6 : 0.0);
    det.observe(
        row, [&](auto const&) { ++alarms; }, [](int) {});
  }
  CHECK(alarms == 0);
  CHECK(det.bar() == doctest::Approx(200e-6));
}

TEST_SUITE("threads") {
  TEST_CASE("monitored: forwards every operation and counts only symmetric, non-empty ones") {
    auto mon = std::make_shared<wc::straggler_monitor>(4);
    wt::run(4, [&](wt::communicator& c) {
      monitored m(std::move(c), mon);
      CHECK(m.size() == 4);
      CHECK(m.state() == wc::comm_state::healthy);
      std::vector<float> in{float(m.rank() + 1)};
      std::vector<float> out(1);
      std::vector<float> all(4);
      auto v = [](std::vector<float>& x) { return wc::host_view(std::span<float>(x)); };
      m.all_reduce(v(in), v(out)).wait();
      CHECK(out[0] == 10.0f);
      m.all_gather(v(in), v(all)).wait();
      CHECK(all == std::vector<float>{1, 2, 3, 4});
      m.broadcast(v(in), v(out), 2).wait();  // rooted: passes through
      CHECK(out[0] == 3.0f);
      m.barrier().wait();
      std::vector<float> none;
      m.all_reduce(v(none), v(none)).wait();  // a local no-op: not a collective to time
      auto sub = m.split(m.rank() % 2, 0);
      CHECK(sub.size() == 2);
      CHECK(sub.monitor() == nullptr);
      sub.all_reduce(v(in), v(out)).wait();
      CHECK(out[0] == float(m.rank() % 2 == 0 ? 1 + 3 : 2 + 4));
      for (int i = 0; i < 5; ++i) m.barrier().wait();
    });
    // all_reduce, all_gather, six barriers: one batch of 8, evaluated by rank 0 as it completes.
    CHECK(mon->collectives() == 8);
    CHECK(mon->lag_history(3).size() == 8);
    CHECK(mon->suspects().empty());
    CHECK_THROWS_AS(wt::run(2,
                            [&](wt::communicator& c) {
                              monitored m(std::move(c), mon);  // a monitor of 4 for 2 ranks
                            }),
                    weft::invalid_argument_error);
  }

  TEST_CASE("straggler: 8 ranks, one 20 % slower from collective 40 on, named within 20") {
    auto mon = std::make_shared<wc::straggler_monitor>(8, run_options());
    recorder rec;
    mon->set_hook(rec.hook());
    slow_run run;
    wt::run(8, [&](wt::communicator& c) {
      monitored m(std::move(c), mon);
      run.rank_body(m);
    });
    auto const seen = rec.get();
    for (auto const& s : seen)
      MESSAGE("named rank " << s.rep.rank << " at collective " << s.rep.collective << ", lag "
                            << s.rep.lag * 1e6 << " us, bar " << s.rep.bar * 1e6 << " us, step "
                            << s.rep.step * 1e6 << " us, over " << s.rep.over << "/"
                            << s.rep.window);
    REQUIRE(seen.size() == 1);
    auto const& first = seen.front();
    CHECK(first.rep.rank == run.slow_rank);
    CHECK(first.rep.kind == wc::straggler_kind::slow);
    CHECK(first.rep.collective >= run.slow_from);
    CHECK(first.rep.collective - run.slow_from <= 20);
    // Wall time from the first slow step to the naming, and the collective rate it ran at.
    double const latency_s = std::chrono::duration<double>(first.at - run.t0).count() -
                             double(run.slow_start_ns.load()) * 1e-9;
    double const rate = 1.0 / first.rep.step;
    MESSAGE("named after " << first.rep.collective - run.slow_from << " collectives, "
                           << latency_s * 1e3 << " ms, at " << rate << " collectives/s");
    if (rate >= 100.0) CHECK(latency_s < 1.0);
    auto const now = mon->suspects();
    REQUIRE(now.size() == 1);
    CHECK(now[0].rank == run.slow_rank);
  }

  TEST_CASE("straggler: evaluated by the watchdog, off the ranks' path, the slow rank is named") {
    auto mon = std::make_shared<wc::straggler_monitor>(8, run_options());
    recorder rec;
    mon->set_hook(rec.hook());
    slow_run run;
    std::thread::id rank0;
    {
      wc::straggler_watchdog dog(mon);  // 10 ms, evaluating
      CHECK(mon->offloaded());
      wt::run(8, [&](wt::communicator& c) {
        monitored m(std::move(c), mon);
        if (m.rank() == 0) rank0 = std::this_thread::get_id();
        run.rank_body(m);
      });
    }
    CHECK(!mon->offloaded());
    CHECK(mon->collectives() == run.total);
    auto const seen = rec.get();
    REQUIRE(seen.size() == 1);
    auto const& first = seen.front();
    CHECK(first.rep.rank == run.slow_rank);
    CHECK(first.rep.collective >= run.slow_from);
    CHECK(first.rep.collective - run.slow_from <= 20);
    CHECK(first.by != rank0);                       // named from the watchdog's thread, not by
    CHECK(first.by != std::this_thread::get_id());  // rank 0 or the watchdog's final evaluation
    double const latency_s = std::chrono::duration<double>(first.at - run.t0).count() -
                             double(run.slow_start_ns.load()) * 1e-9;
    MESSAGE("named after " << first.rep.collective - run.slow_from << " collectives, "
                           << latency_s * 1e3 << " ms (watchdog)");
    CHECK(latency_s < 1.0);
  }

  TEST_CASE("straggler: offloaded with no one evaluating, rank 0 evaluates every ring / 2") {
    // What happens when a watchdog falls behind: the evaluation is offloaded but nobody polls, so
    // rank 0 must evaluate each time ring / 2 collectives are pending, and no stamp is lost.
    int const n = 2;
    std::uint64_t const count = 2 * wc::straggler_monitor::ring + 100;
    auto mon = std::make_shared<wc::straggler_monitor>(n, noisy_options());
    mon->set_offload(true);
    std::uint64_t seen_by_rank0 = 0;
    wt::run(n, [&](wt::communicator& c) {
      monitored m(std::move(c), mon);
      float in[2] = {1.0f, 1.0f};
      float out[2] = {};
      for (std::uint64_t k = 0; k < count; ++k)
        m.all_reduce(wc::host_view(std::span<float>(in)), wc::host_view(std::span<float>(out)));
      if (m.rank() == 0) seen_by_rank0 = mon->collectives();
    });
    // Evaluated each time 2048 more collectives had completed (2048, 4096, 6144, 8192), not after.
    std::uint64_t const half = wc::straggler_monitor::ring / 2;
    CHECK(seen_by_rank0 == count / half * half);
    CHECK(mon->pending() == count - seen_by_rank0);
    mon->set_offload(false);  // evaluates the rest
    CHECK(mon->pending() == 0);
    CHECK(mon->collectives() == count);
    CHECK(mon->lag_history(1).size() == 256);
  }

  TEST_CASE("straggler: exchanged stamps (the MPI scheme) name the slow rank on every rank") {
    // One monitor per rank, waits all_gathered every 8 collectives: what MPI processes do, run
    // here over threads. Every rank must reach the same verdict.
    int const n = 8;
    std::vector<std::shared_ptr<wc::straggler_monitor>> mons;
    std::vector<std::unique_ptr<recorder>> recs;
    for (int r = 0; r < n; ++r) {
      mons.push_back(std::make_shared<wc::straggler_monitor>(n, run_options(),
                                                             wc::stamp_exchange::all_gather));
      recs.push_back(std::make_unique<recorder>());
      mons.back()->set_hook(recs.back()->hook());
    }
    slow_run run;
    wt::run(n, [&](wt::communicator& c) {
      auto const r = std::size_t(c.rank());
      monitored m(std::move(c), mons[r]);
      run.rank_body(m);
    });
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      auto const seen = recs[std::size_t(r)]->get();
      REQUIRE(seen.size() == 1);
      CHECK(seen[0].rep.rank == run.slow_rank);
      CHECK(seen[0].rep.collective >= run.slow_from);
      CHECK(seen[0].rep.collective - run.slow_from <= 20);
      // Evaluated up to the last exchange: every 8 collectives.
      CHECK(mons[std::size_t(r)]->collectives() == run.total / 8 * 8);
      CHECK(mons[std::size_t(r)]->poll() == 0);  // processes cannot see silent peers
    }
  }

  TEST_CASE("straggler: a rank that stops answering is named silent before the deadline raises") {
    int const n = 8;
    int const silent = 3;
    wt::options opts;
    opts.timeout = 1000ms;
    auto mon = std::make_shared<wc::straggler_monitor>(n);
    recorder rec;
    mon->set_hook(rec.hook());
    std::mutex m;
    clock_type::time_point first_timeout = clock_type::time_point::max();
    {
      wc::straggler_watchdog dog(mon, 5ms);
      CHECK_THROWS_AS(wt::run(
                          n,
                          [&](wt::communicator& c) {
                            monitored mc(std::move(c), mon);
                            float in[2] = {1, 1};
                            float out[2] = {};
                            auto const iv = wc::host_view(std::span<float>(in));
                            auto const ov = wc::host_view(std::span<float>(out));
                            for (int k = 0; k < 10; ++k) mc.all_reduce(iv, ov).wait();
                            // Stops answering for longer than the deadline.
                            if (mc.rank() == silent) std::this_thread::sleep_for(1300ms);
                            try {
                              mc.all_reduce(iv, ov).wait();
                            } catch (weft::timeout_error const&) {
                              std::lock_guard<std::mutex> lock(m);
                              first_timeout = std::min(first_timeout, clock_type::now());
                              throw;
                            }
                          },
                          opts),
                      weft::timeout_error);
    }
    auto const seen = rec.get();
    REQUIRE(!seen.empty());
    CHECK(seen[0].rep.rank == silent);
    CHECK(seen[0].rep.kind == wc::straggler_kind::silent);
    CHECK(seen[0].rep.collective == 10);
    CHECK(seen[0].rep.lag > seen[0].rep.bar);
    CHECK(seen[0].rep.bar == doctest::Approx(0.5));  // half of the 1000 ms deadline
    CHECK(seen[0].at < first_timeout);
    for (auto const& s : seen) CHECK(s.rep.rank == silent);
  }

  TEST_CASE("straggler: 5000 normal back-to-back collectives on 8 ranks raise no alarm") {
    normal_collectives(8, 5000, noisy_options(), wc::stamp_exchange::shared_clock);
    normal_collectives(8, 5000, noisy_options(), wc::stamp_exchange::shared_clock, true);
    normal_collectives(8, 5000, noisy_options(), wc::stamp_exchange::all_gather);
  }
}  // TEST_SUITE("threads")

TEST_SUITE("slow") {
  TEST_CASE("straggler: 100,000 normal back-to-back collectives on 8 ranks raise no alarm") {
    normal_collectives(8, 100000, noisy_options(), wc::stamp_exchange::shared_clock);
    normal_collectives(8, 100000, noisy_options(), wc::stamp_exchange::shared_clock, true);
    normal_collectives(8, 100000, noisy_options(), wc::stamp_exchange::all_gather);
  }
}  // TEST_SUITE("slow")
