// Faults of the threads backend become exceptions on every rank, never hangs: a rank that throws
// (peer_aborted_error naming it), a rank that never arrives (timeout_error naming it after the
// deadline), mismatched calls (mismatch_error naming both sides), a poisoned communicator
// (every later call throws at once), and invalid arguments (thrown before anything is
// communicated; the communicator stays healthy). Each for several collectives and world sizes.
#include "support/checks.hpp"
#include <weft/comm/collectives.hpp>
#include <weft/comm/threads/world.hpp>

#include <support/run_ranks.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <ctime>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {
using weft::test::has;

using namespace std::chrono_literals;
using weft::comm::buffer_view;
using weft::comm::host_view;
using weft::comm::op_options;
using weft::comm::reduce_kind;
using weft::comm::threads::communicator;
using clk = std::chrono::steady_clock;

enum class op {
  all_reduce,
  reduce,
  broadcast,
  all_gather,
  all_gather_v,
  reduce_scatter,
  all_to_all,
  gather,
  scatter,
  barrier,
  split,
  recv
};

char const* op_name(op o) {
  switch (o) {
    case op::all_reduce: return "all_reduce";
    case op::reduce: return "reduce";
    case op::broadcast: return "broadcast";
    case op::all_gather: return "all_gather";
    case op::all_gather_v: return "all_gather_v";
    case op::reduce_scatter: return "reduce_scatter";
    case op::all_to_all: return "all_to_all";
    case op::gather: return "gather";
    case op::scatter: return "scatter";
    case op::barrier: return "barrier";
    case op::split: return "split";
    case op::recv: return "recv";
  }
  return "?";
}

// Calls `o` with valid arguments; `peer` is the root of rooted ops and the source of recv.
void call(communicator& c, op o, int peer, op_options opt = {}) {
  auto const n = static_cast<std::size_t>(c.size());
  std::vector<float> in(4 * n, 1.0f);
  std::vector<float> out(4 * n, 0.0f);
  std::vector<std::size_t> counts(n, 4);
  auto const in4 = host_view(std::span<float>(in).first(4));
  auto const out4 = host_view(std::span<float>(out).first(4));
  auto const inn = host_view(std::span<float>(in));
  auto const outn = host_view(std::span<float>(out));
  switch (o) {
    case op::all_reduce: c.all_reduce(in4, out4, {}, opt); break;
    case op::reduce: c.reduce(in4, out4, {}, peer, opt); break;
    case op::broadcast: c.broadcast(in4, out4, peer, opt); break;
    case op::all_gather: c.all_gather(in4, outn, opt); break;
    case op::all_gather_v: c.all_gather_v(in4, outn, counts, opt); break;
    case op::reduce_scatter: c.reduce_scatter(inn, out4, {}, opt); break;
    case op::all_to_all: c.all_to_all(inn, outn, opt); break;
    case op::gather: c.gather(in4, outn, peer, opt); break;
    case op::scatter: c.scatter(inn, out4, peer, opt); break;
    case op::barrier: c.barrier(opt); break;
    case op::split: (void)c.split(0, c.rank()); break;
    case op::recv: c.recv(out4, peer, opt); break;
  }
}

double ms_since(clk::time_point t0) {
  return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

}  // namespace

TEST_SUITE("threads") {
  TEST_CASE(
      "faults: a rank that throws makes every peer's pending and later calls throw "
      "peer_aborted_error") {
    for (int n : {2, 4, 8}) {
      for (op o : {op::all_reduce, op::broadcast, op::all_gather, op::reduce_scatter, op::barrier,
                   op::split, op::recv}) {
        int const bad = n - 1;
        CAPTURE(n);
        CAPTURE(op_name(o));
        std::atomic<int> aborted_peers{0};
        auto body = [&](communicator& c) {
          if (c.rank() == bad) {
            std::this_thread::sleep_for(20ms);  // let the peers block first
            throw std::runtime_error("boom from the test");
          }
          auto const t0 = clk::now();
          try {
            call(c, o, bad);
            FAIL_CHECK("rank " << c.rank() << ": " << op_name(o) << " returned although rank "
                               << bad << " failed");
            return;
          } catch (weft::peer_aborted_error const& e) {
            CHECK(e.origin_rank() == bad);
            CHECK(has(e.what(), "boom from the test"));
            CHECK(has(e.what(), "rank " + std::to_string(bad)));
            ++aborted_peers;
          }
          CHECK(ms_since(t0) < 2000.0);  // woken by the failure, not by the 10 s deadline
          CHECK(c.state() == weft::comm::comm_state::poisoned);
          // Later calls fail at once, with the same origin.
          auto const t1 = clk::now();
          try {
            call(c, op::all_reduce, 0);
            FAIL_CHECK("a call on a poisoned communicator returned");
          } catch (weft::peer_aborted_error const& e) {
            CHECK(e.origin_rank() == bad);
          }
          CHECK(ms_since(t1) < 1000.0);  // at once, not after the 10 s deadline
        };
        CHECK_THROWS_WITH_AS(weft::test::run_ranks(n, body), "boom from the test",
                             std::runtime_error);
        CHECK(aborted_peers.load() == n - 1);
      }
    }
  }

  TEST_CASE(
      "faults: a missing rank makes the others throw timeout_error naming it after the deadline") {
    for (int n : {2, 4, 8}) {
      for (op o : {op::all_reduce, op::reduce, op::all_gather_v, op::barrier, op::recv}) {
        int const missing = n / 2;  // not the last rank: names must be exact
        int const root = (missing + 1) % n;
        CAPTURE(n);
        CAPTURE(op_name(o));
        auto opts = weft::test::test_options(200ms);
        // The first rank to reach its deadline gives up for everyone, so a rank that started late
        // may throw sooner after its own call: time everyone from the common start.
        auto const t0 = clk::now();
        std::atomic<int> gave_up{0};
        int const waiting = o == op::recv ? 1 : n - 1;
        weft::test::run_ranks(
            n,
            [&](communicator& c) {
              if (c.rank() == missing) {
                // Alive but late: it arrives only after the others gave up (a rank whose function
                // returned has finished, and its peers fail at once; see the test below).
                for (int i = 0; i < 500 && gave_up.load() < waiting; ++i)
                  std::this_thread::sleep_for(10ms);
                return;
              }
              if (o == op::recv && c.rank() != root) return;  // one receiver waits for `missing`
              try {
                call(c, o, o == op::recv ? missing : root);
                FAIL_CHECK(op_name(o) << " returned without rank " << missing);
              } catch (weft::timeout_error const& e) {
                double const waited = ms_since(t0);
                CHECK(e.missing_ranks() == std::vector<int>{missing});
                CHECK(has(e.what(), "[" + std::to_string(missing) + "]"));
                CHECK(waited >= 190.0);
                CHECK(waited < 1500.0);
              }
              ++gave_up;
              CHECK(c.state() == weft::comm::comm_state::poisoned);
            },
            opts);
      }
    }
  }

  TEST_CASE("faults: a per-call timeout overrides the world's; the late rank then fails at once") {
    for (int n : {3, 5}) {
      CAPTURE(n);
      int const late = 1;
      weft::test::run_ranks(n, [&](communicator& c) {
        op_options o;
        o.timeout = 200ms;  // the world's default is 10 s
        if (c.rank() == late) {
          std::this_thread::sleep_for(600ms);  // well after the others gave up (200 ms)
          auto const t0 = clk::now();
          CHECK_THROWS_AS(
              c.all_reduce(host_view(std::span<float>()), host_view(std::span<float>()), {}, o)
                  .wait(),
              weft::comm_error);  // zero-length: no sync, but the comm is poisoned
          CHECK_THROWS_AS(c.barrier(o), weft::timeout_error);
          CHECK(ms_since(t0) < 150.0);  // at once, not after another 200 ms deadline
          return;
        }
        auto const t0 = clk::now();
        try {
          c.barrier(o);
          FAIL_CHECK("barrier returned without rank " << late);
        } catch (weft::timeout_error const& e) {
          CHECK(e.missing_ranks() == std::vector<int>{late});
          CHECK(ms_since(t0) < 1500.0);
        }
      });
    }
  }

  TEST_CASE("faults: mismatched calls throw mismatch_error on every rank, naming both sides") {
    struct scenario {
      char const* name;
      char const* field;
      void (*deviant)(communicator&);
      void (*normal)(communicator&);
    };
    scenario const scenarios[] = {
        {"op", "op", [](communicator& c) { call(c, op::all_reduce, 0); },
         [](communicator& c) { call(c, op::all_gather, 0); }},
        {"count", "count",
         [](communicator& c) {
           std::vector<float> a(5, 1.0f);
           c.all_reduce(host_view(std::span<float>(a)), host_view(std::span<float>(a)));
         },
         [](communicator& c) { call(c, op::all_reduce, 0); }},
        {"dtype", "dtype",
         [](communicator& c) {
           std::vector<double> a(4, 1.0);
           c.all_reduce(host_view(std::span<double>(a)), host_view(std::span<double>(a)));
         },
         [](communicator& c) { call(c, op::all_reduce, 0); }},
        {"root", "root", [](communicator& c) { call(c, op::broadcast, 1); },
         [](communicator& c) { call(c, op::broadcast, 0); }},
        {"reduction", "reduction",
         [](communicator& c) {
           std::vector<float> a(4, 1.0f);
           c.all_reduce(host_view(std::span<float>(a)), host_view(std::span<float>(a)),
                        reduce_kind::max);
         },
         [](communicator& c) { call(c, op::all_reduce, 0); }},
        {"_v counts", "counts",
         [](communicator& c) {
           auto const n = static_cast<std::size_t>(c.size());
           std::vector<std::size_t> counts(n, 4);
           counts[0] = 3;  // rank 0 thinks rank 0 sends 3
           std::vector<float> in(counts[static_cast<std::size_t>(c.rank())], 1.0f);
           std::vector<float> out(4 * n - 1);
           c.all_gather_v(host_view(std::span<float>(in)), host_view(std::span<float>(out)),
                          counts);
         },
         [](communicator& c) { call(c, op::all_gather_v, 0); }},
    };
    for (auto const& s : scenarios) {
      for (int n : {2, 3, 8}) {
        CAPTURE(s.name);
        CAPTURE(n);
        int const deviant = n - 1;
        std::atomic<int> thrown{0};
        weft::test::run_ranks(n, [&](communicator& c) {
          try {
            (c.rank() == deviant ? s.deviant : s.normal)(c);
            FAIL_CHECK("a mismatched collective returned on rank " << c.rank());
          } catch (weft::mismatch_error const& e) {
            std::string const what = e.what();
            CHECK(has(what, "rank 0"));
            CHECK(has(what, "rank " + std::to_string(deviant)));
            CHECK(has(what, std::string("differ in: ") + s.field));
            ++thrown;
          }
          CHECK(c.state() == weft::comm::comm_state::poisoned);
          CHECK_THROWS_AS(c.barrier(), weft::mismatch_error);
        });
        CHECK(thrown.load() == n);
      }
    }
  }

  TEST_CASE("faults: all_to_all_v counts that do not pair up are a mismatch") {
    for (int n : {2, 4}) {
      CAPTURE(n);
      weft::test::run_ranks(n, [&](communicator& c) {
        auto const un = static_cast<std::size_t>(n);
        std::vector<std::size_t> send(un, 2);
        std::vector<std::size_t> recv(un, 2);
        if (c.rank() == 1) {
          recv[0] = 3;  // expects 3 from rank 0, which sends 2
        }
        std::vector<float> in(2 * un, 1.0f);
        std::vector<float> out(2 * un + (c.rank() == 1 ? 1 : 0));
        try {
          c.all_to_all_v(host_view(std::span<float>(in)), host_view(std::span<float>(out)), send,
                         recv);
          FAIL_CHECK("inconsistent all_to_all_v returned");
        } catch (weft::mismatch_error const& e) {
          CHECK(has(e.what(), "rank 0 sends 2 elements to rank 1 but rank 1 expects 3"));
        }
      });
    }
  }

  TEST_CASE("faults: a point-to-point count or dtype mismatch fails both sides") {
    weft::test::run_ranks(2, [](communicator& c) {
      std::vector<float> a(4, 1.0f);
      std::vector<float> b(5);
      try {
        if (c.rank() == 0) {
          c.send(host_view(std::span<float>(a)), 1);
        } else {
          c.recv(host_view(std::span<float>(b)), 0);
        }
        FAIL_CHECK("mismatched send/recv returned");
      } catch (weft::mismatch_error const& e) {
        CHECK(has(e.what(), "count 4"));
        CHECK(has(e.what(), "count 5"));
      }
      CHECK(c.state() == weft::comm::comm_state::poisoned);
    });
  }

  TEST_CASE("faults: a poisoned communicator rejects every later call at once") {
    auto comms = weft::comm::threads::make_communicators(2, weft::test::test_options(100ms));
    CHECK_THROWS_AS(comms[0].barrier(), weft::timeout_error);
    auto& c = comms[1];
    CHECK(c.state() == weft::comm::comm_state::poisoned);
    std::vector<float> v(4);
    std::vector<float> half(2);
    auto const b = host_view(std::span<float>(v));
    auto const h = host_view(std::span<float>(half));
    auto const empty = host_view(std::span<float>());
    auto const t0 = clk::now();
    CHECK_THROWS_AS(c.all_reduce(b, b), weft::timeout_error);
    CHECK_THROWS_AS(c.all_reduce(empty, empty), weft::timeout_error);  // even zero-length
    CHECK_THROWS_AS(c.reduce(b, b, {}, 0), weft::timeout_error);
    CHECK_THROWS_AS(c.broadcast(b, b, 0), weft::timeout_error);
    CHECK_THROWS_AS(c.all_gather(h, b), weft::timeout_error);
    CHECK_THROWS_AS(c.reduce_scatter(b, h), weft::timeout_error);
    CHECK_THROWS_AS(c.all_to_all(b, b), weft::timeout_error);
    CHECK_THROWS_AS(c.barrier(), weft::timeout_error);
    CHECK_THROWS_AS((void)c.split(0, 0), weft::timeout_error);
    CHECK_THROWS_AS(c.send(b, 0), weft::timeout_error);
    CHECK_THROWS_AS(c.isend(b, 0), weft::timeout_error);
    CHECK_THROWS_AS(c.irecv(b, 0), weft::timeout_error);
    CHECK(ms_since(t0) < 600.0);  // 12 calls at once, not 12 deadlines of 100 ms
    try {
      c.barrier();
    } catch (weft::timeout_error const& e) {
      CHECK(e.missing_ranks() == std::vector<int>{1});  // the original fault: rank 1 was missing
      CHECK(has(e.what(), "poisoned"));
    }
  }

  TEST_CASE(
      "faults: invalid arguments throw before communicating and leave the communicator healthy") {
    for (int n : {1, 2, 4}) {
      CAPTURE(n);
      weft::test::run_ranks(n, [&](communicator& c) {
        auto const un = static_cast<std::size_t>(n);
        std::vector<float> in(4 * un, 1.0f);
        std::vector<float> out(4 * un + 8);
        std::vector<double> dbl(4);
        auto const in4 = host_view(std::span<float>(in).first(4));
        auto const out3 = host_view(std::span<float>(out).first(3));
        auto const out4 = host_view(std::span<float>(out).first(4));
        // Every rank makes the same bad call (otherwise it would be a mismatch or a timeout).
        CHECK_THROWS_AS(c.all_reduce(in4, out3), weft::shape_error);
        CHECK_THROWS_AS(c.all_reduce(in4, host_view(std::span<double>(dbl))),
                        weft::invalid_argument_error);
        CHECK_THROWS_AS(c.reduce(in4, out4, {}, n), weft::invalid_argument_error);
        CHECK_THROWS_AS(c.broadcast(in4, out4, -1), weft::invalid_argument_error);
        CHECK_THROWS_AS(c.all_gather(in4, out3), weft::shape_error);
        CHECK_THROWS_AS(c.all_gather_v(in4, out4, std::vector<std::size_t>(un + 1, 1)),
                        weft::invalid_argument_error);
        CHECK_THROWS_AS(c.reduce_scatter(in4, out3), weft::shape_error);
        CHECK_THROWS_AS(c.all_to_all(in4, out3), weft::shape_error);
        if (n > 1) {
          CHECK_THROWS_WITH_AS(c.all_to_all(host_view(std::span<float>(in).first(4 * un + 1)),
                                            host_view(std::span<float>(out).first(4 * un + 1))),
                               doctest::Contains("a multiple of size()"), weft::shape_error);
        }
        CHECK_THROWS_AS(c.send(in4, n), weft::invalid_argument_error);
        CHECK_THROWS_AS(c.recv(out4, -2), weft::invalid_argument_error);
        // Partial overlap (not the exact in-place form).
        CHECK_THROWS_WITH_AS(c.all_reduce(host_view(std::span<float>(out).first(4)),
                                          host_view(std::span<float>(out).subspan(1, 4))),
                             doctest::Contains("partial overlap"), weft::invalid_argument_error);
        // Null data with a count, device memory, a bad reduction.
        buffer_view null_in = in4;
        null_in.data = nullptr;
        CHECK_THROWS_WITH_AS(c.all_reduce(null_in, out4), doctest::Contains("in.data"),
                             weft::invalid_argument_error);
        buffer_view dev = in4;
        dev.where = weft::comm::memory_kind::cuda;
        CHECK_THROWS_WITH_AS(c.all_reduce(dev, out4), doctest::Contains("host memory"),
                             weft::invalid_argument_error);
        std::vector<int> ints(4, 1);
        auto const iv = host_view(std::span<int>(ints));
        CHECK_THROWS_WITH_AS(c.all_reduce(iv, iv, weft::comm::reduce_op::premul(0.5)),
                             doctest::Contains("op.scalar"), weft::invalid_argument_error);
        CHECK_THROWS_AS(c.all_reduce(in4, out4, {}, op_options{-1ms, nullptr}),
                        weft::invalid_argument_error);
        // Still healthy: a valid collective works.
        CHECK(c.state() == weft::comm::comm_state::healthy);
        c.all_reduce(in4, out4);
        CHECK(out[0] == static_cast<float>(n));
        CHECK(c.state() == weft::comm::comm_state::healthy);
      });
    }
  }

  TEST_CASE(
      "faults: abort() is idempotent, wakes waiters, names its rank, and reaches split groups") {
    for (int n : {2, 4}) {
      CAPTURE(n);
      weft::test::run_ranks(n, [&](communicator& c) {
        auto sub = c.split(c.rank() % 2, c.rank());
        if (c.rank() == 0) {
          std::this_thread::sleep_for(20ms);
          c.abort();
          c.abort();  // idempotent
          CHECK(c.state() == weft::comm::comm_state::aborted);
          CHECK_THROWS_AS(c.barrier(), weft::peer_aborted_error);
          return;
        }
        try {
          if (c.rank() % 2 == 0) {
            sub.barrier();  // waits for rank 0 in the sub-group: the abort reaches it
          } else {
            c.barrier();
          }
          FAIL_CHECK("a barrier returned after abort()");
        } catch (weft::peer_aborted_error const& e) {
          CHECK(has(e.what(), "called abort()"));
          if (c.rank() % 2 == 1) CHECK(e.origin_rank() == 0);
          if (c.rank() % 2 == 0) CHECK(e.origin_rank() == 0);  // rank 0 is sub-rank 0 too
        }
        CHECK(sub.state() == weft::comm::comm_state::poisoned);
      });
    }
  }

  TEST_CASE("faults: abort() from another thread wakes a rank blocked in a collective") {
    auto comms = weft::comm::threads::make_communicators(2, weft::test::test_options());
    std::thread watchdog([&] {
      std::this_thread::sleep_for(50ms);
      comms[1].abort();  // rank 1 never joins; a watchdog gives up for it
    });
    auto const t0 = clk::now();
    CHECK_THROWS_AS(comms[0].barrier(), weft::peer_aborted_error);
    CHECK(ms_since(t0) < 2000.0);
    watchdog.join();
  }

  TEST_CASE("faults: a timeout in a sub-group fails only that group") {
    weft::test::run_ranks(4, [](communicator& c) {
      auto half = c.split(c.rank() / 2, c.rank());  // {0, 1} and {2, 3}
      op_options o;
      o.timeout = 150ms;
      if (c.rank() == 1) {
        // skips its group's barrier
      } else if (c.rank() == 0) {
        CHECK_THROWS_AS(half.barrier(o), weft::timeout_error);
      } else {
        std::vector<float> v{static_cast<float>(c.rank())};
        half.all_reduce(host_view(std::span<float>(v)), host_view(std::span<float>(v)), {}, o);
        CHECK(v[0] == 5.0f);
        CHECK(half.state() == weft::comm::comm_state::healthy);
      }
      // The world is unaffected.
      CHECK(c.state() == weft::comm::comm_state::healthy);
      c.barrier();
    });
  }

  TEST_CASE(
      "faults: a rank that moved its communicator away still aborts its peers when it throws") {
    CHECK_THROWS_AS(weft::test::run_ranks(3,
                                          [](communicator& c) {
                                            communicator mine = std::move(c);
                                            if (mine.rank() == 2)
                                              throw std::logic_error("moved and failed");
                                            CHECK_THROWS_AS(mine.barrier(),
                                                            weft::peer_aborted_error);
                                          }),
                    std::logic_error);
  }

  TEST_CASE(
      "faults: a rank waiting 200 ms for a late peer at world size 8 sleeps (under 20 ms CPU)") {
    weft::test::run_ranks(8, [](communicator& c) {
      c.barrier();
      if (c.rank() == 7) {
        std::this_thread::sleep_for(200ms);
        c.barrier();
        return;
      }
      timespec a{};
      timespec b{};
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
      auto const t0 = clk::now();
      c.barrier();
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
      double const cpu_ms = static_cast<double>(b.tv_sec - a.tv_sec) * 1e3 +
                            static_cast<double>(b.tv_nsec - a.tv_nsec) * 1e-6;
      CHECK(ms_since(t0) >= 100.0);  // it did wait for rank 7 (exact timing is not the point)
      CHECK_MESSAGE(cpu_ms < 20.0,
                    "rank " << c.rank() << " used " << cpu_ms << " ms of CPU waiting");
    });
  }

  TEST_CASE("faults: a pending receive times out; its work says so without throwing before then") {
    auto comms = weft::comm::threads::make_communicators(2, weft::test::test_options(150ms));
    std::vector<float> v(3);
    auto w = comms[0].irecv(host_view(std::span<float>(v)), 1);
    CHECK_FALSE(w.done());
    CHECK_FALSE(w.wait_for(10ms));  // still pending, no exception
    auto const t0 = clk::now();
    try {
      w.wait();
      FAIL_CHECK("a receive with no sender completed");
    } catch (weft::timeout_error const& e) {
      CHECK(e.missing_ranks() == std::vector<int>{1});
      CHECK(has(e.what(), "did not post the matching send"));
    }
    CHECK(ms_since(t0) < 1000.0);
    CHECK_THROWS_AS(w.wait(), weft::timeout_error);  // the error sticks to the work
    CHECK(comms[1].state() == weft::comm::comm_state::poisoned);
  }

  TEST_CASE("faults: destroying a communicator withdraws its pending sends") {
    auto comms = weft::comm::threads::make_communicators(2, weft::test::test_options(150ms));
    {
      std::vector<float> doomed(4, 7.0f);
      auto moved = std::move(comms[0]);
      auto w = moved.isend(host_view(std::span<float>(doomed)), 1);
      CHECK_FALSE(w.done());
    }  // the buffer and the communicator die with the send pending
    std::vector<float> v(4, 0.0f);
    auto const t0 = clk::now();
    // Its communicator is gone, so rank 0 can never send again: the receive fails at once.
    CHECK_THROWS_AS(comms[1].recv(host_view(std::span<float>(v)), 0), weft::peer_aborted_error);
    CHECK(ms_since(t0) < 100.0);  // not the 150 ms deadline
    CHECK(v[0] == 0.0f);          // nothing was read from the dead buffer
  }

  TEST_CASE("faults: a rank whose function returns makes peers waiting for it fail at once") {
    // The world's deadline is 10 s; the old behaviour waited for all of it.
    for (int n : {2, 4}) {
      for (op o :
           {op::all_reduce, op::reduce, op::all_gather_v, op::barrier, op::split, op::recv}) {
        CAPTURE(n);
        CAPTURE(op_name(o));
        int const gone = n - 1;
        int const root = 0;
        std::atomic<int> failed_fast{0};
        auto const t0 = clk::now();
        CHECK_THROWS_AS(
            weft::test::run_ranks(n,
                                  [&](communicator& c) {
                                    if (c.rank() == gone) return;  // finishes without calling
                                    if (o == op::recv && c.rank() != root) return;
                                    try {
                                      call(c, o, o == op::recv ? gone : root);
                                      FAIL_CHECK(op_name(o) << " returned without rank " << gone);
                                    } catch (weft::peer_aborted_error const& e) {
                                      CHECK(e.origin_rank() == gone);
                                      CHECK(has(e.what(), "finished"));
                                      CHECK(has(e.what(),
                                                "rank " + std::to_string(gone) + " has finished"));
                                      ++failed_fast;
                                      throw;
                                    }
                                  }),
            weft::peer_aborted_error);
        CHECK(ms_since(t0) < 2000.0);
        CHECK(failed_fast.load() >= 1);
      }
    }
  }

  TEST_CASE("faults: a rank that returns from a split group's function fails only waiters on it") {
    // Ranks 0 and 1 form one group, 2 and 3 another; rank 3 returns, rank 2 fails at once, and
    // the group {0, 1} keeps working.
    std::atomic<bool> rank2_failed{false};
    auto const t0 = clk::now();
    CHECK_THROWS_AS(weft::test::run_ranks(4,
                                          [&](communicator& c) {
                                            auto sub = c.split(c.rank() / 2, c.rank());
                                            if (c.rank() == 3) return;
                                            std::vector<float> v(4, 1.0f);
                                            auto const b = host_view(std::span<float>(v));
                                            if (c.rank() == 2) {
                                              CHECK_THROWS_AS(sub.all_reduce(b, b),
                                                              weft::peer_aborted_error);
                                              rank2_failed = true;
                                              return;
                                            }
                                            for (int i = 0; i < 3; ++i) sub.all_reduce(b, b);
                                            CHECK(v[0] == 8.0f);
                                            // Rank 3 is gone, so the world barrier fails at once
                                            // too.
                                            c.barrier();
                                          }),
                    weft::peer_aborted_error);
    CHECK(rank2_failed.load());
    CHECK(ms_since(t0) < 2000.0);
  }

  TEST_CASE(
      "faults: a rank that throws with a split communicator alive is reported as failed, not "
      "finished") {
    // Unwinding destroys rank 3's split communicator before threads::world catches the exception:
    // its peer must hear the exception's reason, not "has finished".
    std::atomic<bool> told{false};
    CHECK_THROWS_WITH_AS(weft::test::run_ranks(4,
                                               [&](communicator& c) {
                                                 auto sub = c.split(c.rank() / 2, c.rank());
                                                 if (c.rank() == 3) {
                                                   std::this_thread::sleep_for(20ms);
                                                   throw std::runtime_error("boom in rank 3");
                                                 }
                                                 if (c.rank() != 2) return;
                                                 try {
                                                   sub.barrier();
                                                 } catch (weft::peer_aborted_error const& e) {
                                                   CHECK(has(e.what(), "boom in rank 3"));
                                                   CHECK_FALSE(has(e.what(), "has finished"));
                                                   told = true;
                                                   throw;
                                                 }
                                               }),
                         "boom in rank 3", std::runtime_error);
    CHECK(told.load());
  }

  TEST_CASE("faults: ranks that all make the same invalid call each get their own argument error") {
    // The first rank to throw aborts the world (threads::world does); the others, arriving later,
    // must still see their own argument error: validation comes before the poison check.
    for (int n : {2, 4}) {
      CAPTURE(n);
      std::atomic<int> shape_errors{0};
      std::atomic<int> arg_errors{0};
      std::atomic<int> others{0};
      std::atomic<bool> first_thrown{false};
      CHECK_THROWS(weft::test::run_ranks(n, [&](communicator& c) {
        if (c.rank() != 0) {
          for (int i = 0; i < 200 && !first_thrown; ++i) std::this_thread::sleep_for(1ms);
          std::this_thread::sleep_for(20ms);  // rank 0's failure has aborted the world by now
          CHECK(c.state() != weft::comm::comm_state::healthy);
        }
        std::vector<float> in(4);
        std::vector<float> out(3);
        try {
          c.all_reduce(host_view(std::span<float>(in)), host_view(std::span<float>(out)));
        } catch (weft::shape_error const&) {
          ++shape_errors;
        } catch (...) {
          ++others;
        }
        try {
          c.broadcast(host_view(std::span<float>(in)), host_view(std::span<float>(in)), n);
        } catch (weft::invalid_argument_error const&) {
          ++arg_errors;
        } catch (...) {
          ++others;
        }
        if (c.rank() == 0) {
          first_thrown = true;
          throw weft::invalid_argument_error("rank 0 gives up");
        }
      }));
      CHECK(shape_errors.load() == n);
      CHECK(arg_errors.load() == n);
      CHECK(others.load() == 0);
    }
  }

}  // TEST_SUITE("threads")
