// Tests of the threads backend beyond the conformance suite: world semantics, communicators for
// one's own threads, split (ordering, nesting, non-members), zero-length calls, pending work of
// isend/irecv, the operation history and its hook, and large messages.
#include <weft/comm/comm.hpp>

#include <support/conformance.hpp>
#include <support/run_ranks.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
using weft::comm::host_view;
using weft::comm::op_kind;
using weft::comm::threads::communicator;

template <class T>
weft::comm::buffer_view bv(std::vector<T>& v) {
  return host_view(std::span<T>(v));
}

}  // namespace

static_assert(weft::comm::Communicator<communicator>);
static_assert(!weft::comm::StreamCommunicator<communicator>);
static_assert(std::same_as<weft::comm::communicator_space_t<communicator>, weft::host_space>);

TEST_CASE("threads: world validates its size and options") {
  CHECK_THROWS_AS(weft::comm::threads::world(0), weft::invalid_argument_error);
  CHECK_THROWS_AS(weft::comm::threads::world(-3), weft::invalid_argument_error);
  weft::comm::threads::options o;
  o.timeout = 0ms;
  CHECK_THROWS_WITH_AS(weft::comm::threads::world(2, o), doctest::Contains("opts.timeout"),
                       weft::invalid_argument_error);
  CHECK_THROWS_AS(weft::comm::threads::make_communicators(0), weft::invalid_argument_error);
}

TEST_CASE("threads: a non-member communicator has size 0 and rejects every operation") {
  communicator none;
  CHECK(none.size() == 0);
  CHECK(none.rank() == -1);
  CHECK(none.state() == weft::comm::comm_state::healthy);
  CHECK(none.history().empty());
  none.abort();  // no-op
  std::vector<float> v(2);
  CHECK_THROWS_WITH_AS(none.all_reduce(bv(v), bv(v)), doctest::Contains("non-member"),
                       weft::invalid_argument_error);
  CHECK_THROWS_AS(none.barrier(), weft::invalid_argument_error);
  CHECK_THROWS_AS((void)none.split(0, 0), weft::invalid_argument_error);
  CHECK_THROWS_AS(none.isend(bv(v), 0), weft::invalid_argument_error);
}

TEST_SUITE("threads") {
  TEST_CASE("threads: world runs every rank with its communicator and rethrows the first failure") {
    std::vector<int> seen(5, 0);
    weft::comm::threads::world w(5);
    CHECK(w.size() == 5);
    w.run([&](communicator& c) {
      CHECK(c.size() == 5);
      CHECK(c.world_rank() == c.rank());
      seen[static_cast<std::size_t>(c.rank())] += 1;
    });
    CHECK(seen == std::vector<int>(5, 1));
    // The first exception is the one that comes back, not the peer_aborted_errors it causes.
    CHECK_THROWS_WITH_AS(weft::comm::threads::run(4,
                                                  [](communicator& c) {
                                                    if (c.rank() == 3)
                                                      throw std::out_of_range("rank 3 gave up");
                                                    c.barrier();
                                                  }),
                         "rank 3 gave up", std::out_of_range);
    // A world can run again: each run has fresh communicators.
    int runs = 0;
    std::atomic<int> ranks{0};
    for (; runs < 3; ++runs)
      w.run([&](communicator& c) {
        c.barrier();
        ++ranks;
      });
    CHECK(ranks.load() == 15);
  }

  TEST_CASE("threads: make_communicators serves users who start their own threads") {
    auto comms = weft::comm::threads::make_communicators(3, weft::test::test_options());
    REQUIRE(comms.size() == 3);
    std::vector<float> results(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      threads.emplace_back(
          [&results, r, c = std::move(comms[static_cast<std::size_t>(r)])]() mutable {
            std::vector<float> v{static_cast<float>(r + 1)};
            c.all_reduce(bv(v), bv(v), weft::comm::reduce_kind::prod);
            results[static_cast<std::size_t>(r)] = v[0];
          });
    }
    for (auto& t : threads) t.join();
    CHECK(results == std::vector<float>(3, 6.0f));
  }

  TEST_CASE("threads: split orders ranks by (key, rank), nests, and gives non-members size 0") {
    for (int n : {1, 2, 5, 8}) {
      CAPTURE(n);
      weft::test::run_ranks(n, [n](communicator& c) {
        int const r = c.rank();
        // Keys reversed inside each color: new rank 0 is the highest old rank of the color.
        auto sub = c.split(r % 2, -r);
        std::vector<int> members;
        for (int s = n - 1; s >= 0; --s)
          if (s % 2 == r % 2) members.push_back(s);
        REQUIRE(sub.size() == static_cast<int>(members.size()));
        CHECK(members[static_cast<std::size_t>(sub.rank())] == r);
        CHECK(sub.world_rank() == r);
        std::vector<int> mine{r};
        std::vector<int> all(members.size());
        sub.all_gather(bv(mine), bv(all));
        CHECK(all == members);
        // Equal keys: ties keep the parent order.
        auto same = c.split(0, 7);
        CHECK(same.rank() == r);
        CHECK(same.size() == n);
        // A split of a split.
        auto subsub = sub.split(sub.rank() / 2, 0);
        CHECK(subsub.size() == std::min(2, sub.size() - (sub.rank() / 2) * 2));
        subsub.barrier();
        // Negative color: not a member, but the call is still collective for the others.
        auto odd_only = c.split(r % 2 == 1 ? 0 : -1, r);
        if (r % 2 == 1) {
          CHECK(odd_only.size() == n / 2);
          odd_only.barrier();
        } else {
          CHECK(odd_only.size() == 0);
          CHECK(odd_only.rank() == -1);
          CHECK_THROWS_AS(odd_only.barrier(), weft::invalid_argument_error);
        }
        c.barrier();
      });
    }
  }

  TEST_CASE("threads: interleaved collectives on several split groups complete") {
    weft::test::run_ranks(6, [](communicator& c) {
      int const r = c.rank();
      auto rows = c.split(r / 3, r);  // {0,1,2} {3,4,5}
      auto cols = c.split(r % 3, r);  // {0,3} {1,4} {2,5}
      for (int step = 0; step < 20; ++step) {
        std::vector<int> v{r + step};
        rows.all_reduce(bv(v), bv(v));
        int const row0 = (r / 3) * 3;
        CHECK(v[0] == 3 * step + row0 + row0 + 1 + row0 + 2);
        std::vector<int> w{r};
        cols.all_reduce(bv(w), bv(w), weft::comm::reduce_kind::max);
        CHECK(w[0] == r % 3 + 3);
        c.barrier();
      }
    });
  }

  TEST_CASE("threads: zero-length calls are local no-ops, not synchronisation points") {
    weft::test::run_ranks(3, [](communicator& c) {
      std::vector<float> empty;
      if (c.rank() == 0) {
        // Nobody else calls these; they must not wait.
        auto const t0 = std::chrono::steady_clock::now();
        c.all_reduce(bv(empty), bv(empty));
        c.broadcast(bv(empty), bv(empty), 2);
        c.send(bv(empty), 1);
        c.recv(bv(empty), 2);
        CHECK(std::chrono::steady_clock::now() - t0 < 1s);
        auto const h = c.history();
        REQUIRE(h.size() == 4);
        CHECK(h[0].seq == 0);  // no sequence number consumed
      }
      std::vector<float> v{1.0f};
      c.all_reduce(bv(v), bv(v));  // still the first real collective everywhere
      CHECK(v[0] == 3.0f);
      CHECK(c.history().back().seq == 1);
    });
  }

  TEST_CASE("threads: isend and irecv return pending work that completes when the peer matches") {
    weft::test::run_ranks(2, [](communicator& c) {
      std::vector<double> v{1.5, 2.5};
      if (c.rank() == 0) {
        auto w = c.isend(bv(v), 1);
        CHECK_FALSE(w.done());          // rank 1 has not posted its receive yet
        CHECK_FALSE(w.wait_for(20ms));  // still pending: no throw
        c.barrier();                    // now rank 1 posts its receive
        w.wait();
        CHECK(w.done());
      } else {
        c.barrier();
        std::vector<double> got(2);
        auto w = c.irecv(bv(got), 0);
        CHECK(w.done());  // the send was waiting: the receive completed on posting
        w.wait();
        CHECK(got == v);
      }
    });
  }

  TEST_CASE("threads: history keeps the last N operations and the hook sees each one") {
    auto opts = weft::test::test_options();
    opts.history_size = 4;
    std::atomic<bool> rank0_done{false};
    weft::test::run_ranks(
        2,
        [&](communicator& c) {
          std::vector<weft::comm::op_record> hooked;
          c.set_hook([&](weft::comm::op_record const& r) { hooked.push_back(r); });
          std::vector<float> v(8, 1.0f);
          std::vector<float> g(16);
          c.all_reduce(bv(v), bv(v));
          c.all_gather(bv(v), bv(g));
          c.barrier();
          std::vector<float> one(1, 2.0f);
          c.broadcast(bv(one), bv(one), 1);
          c.reduce(bv(v), bv(v), weft::comm::reduce_kind::max, 0);
          auto const h = c.history();
          REQUIRE(h.size() == 4);  // the first of five fell out
          CHECK(h[0].op == op_kind::all_gather);
          CHECK(h[0].seq == 2);
          CHECK(h[0].send_bytes == 32);
          CHECK(h[0].recv_bytes == 64);
          CHECK(h[1].op == op_kind::barrier);
          CHECK(h[2].op == op_kind::broadcast);
          CHECK(h[2].root_or_peer == 1);
          CHECK(h[3].op == op_kind::reduce);
          CHECK(h[3].seq == 5);
          for (auto const& r : h) {
            CHECK(r.ok);
            CHECK(r.end >= r.start);
          }
          REQUIRE(hooked.size() == 5);
          CHECK(hooked[0].op == op_kind::all_reduce);
          CHECK(hooked[0].type == weft::dtype::f32);
          // A failed operation is recorded with its error.
          weft::comm::op_options o;
          o.timeout = 50ms;
          if (c.rank() == 0) {
            CHECK_THROWS_AS(c.barrier(o), weft::timeout_error);
            auto const last = c.history().back();
            CHECK_FALSE(last.ok);
            CHECK(last.error.find("timed out") != std::string::npos);
            CHECK_FALSE(hooked.back().ok);
            rank0_done = true;
          } else {
            // Late, not finished: a finished rank would fail the barrier at once instead.
            for (int i = 0; i < 500 && !rank0_done; ++i) std::this_thread::sleep_for(10ms);
          }
          c.set_hook({});
        },
        opts);
  }

  TEST_CASE("threads: point-to-point records are completed when their work is") {
    weft::test::run_ranks(2, [](communicator& c) {
      std::vector<int> v{1, 2, 3};
      int hooks = 0;
      c.set_hook([&](weft::comm::op_record const&) { ++hooks; });
      if (c.rank() == 0) {
        auto w = c.isend(bv(v), 1);
        CHECK(hooks == 0);  // pending
        c.barrier();
        w.wait();
        CHECK(hooks == 2);  // the barrier and the send
        auto const h = c.history();
        CHECK(h[0].op == op_kind::send);
        CHECK(h[0].seq == 1);
        CHECK(h[0].send_bytes == 12);
        CHECK(h[0].root_or_peer == 1);
        CHECK(h[0].ok);
      } else {
        c.barrier();
        std::vector<int> got(3);
        c.recv(bv(got), 0);
        CHECK(got == v);
        CHECK(c.history().back().op == op_kind::recv);
        CHECK(c.history().back().recv_bytes == 12);
      }
      c.set_hook({});
    });
  }

  TEST_CASE("threads: per-communicator timeout is inherited by split and settable") {
    weft::test::run_ranks(2, [](communicator& c) {
      CHECK(c.timeout() == weft::test::default_test_timeout);
      c.set_timeout(1234ms);
      auto sub = c.split(0, 0);
      CHECK(sub.timeout() == 1234ms);
      CHECK_THROWS_AS(c.set_timeout(0ms), weft::invalid_argument_error);
    });
  }

  TEST_CASE("threads: large messages take the reduce-scatter + all-gather path, in place too") {
    // 1 Mi floats: above the default staging threshold; values make the f32 sum exact.
    for (int n : {2, 3}) {
      weft::test::run_ranks(n, [n](communicator& c) {
        std::size_t const count = std::size_t{1} << 20;
        std::vector<float> v(count);
        for (std::size_t i = 0; i < count; ++i)
          v[i] = static_cast<float>((i % 1024) * static_cast<std::size_t>(c.rank() + 1));
        c.all_reduce(bv(v), bv(v));
        float const factor = static_cast<float>(n * (n + 1) / 2);
        bool ok = true;
        for (std::size_t i = 0; i < count; ++i)
          ok = ok && v[i] == static_cast<float>(i % 1024) * factor;
        CHECK(ok);
      });
    }
  }

}  // TEST_SUITE("threads")

TEST_SUITE("slow") {
  TEST_CASE("threads: 32 MiB all_reduce and reduce_scatter at 2 and 4 ranks equal the reference") {
    namespace conf = weft::test::conformance;
    for (int n : {2, 4}) {
      weft::test::run_ranks(n, [](communicator& c) {
        std::size_t const count = std::size_t{8} << 20;  // 8 Mi f32 = 32 MiB
        conf::check_all_reduce<float>(c, count, weft::comm::reduce_kind::sum, true);
        conf::check_all_reduce<weft::bf16>(c, count, weft::comm::reduce_kind::avg, false);
        conf::check_reduce_scatter<float>(c, count / static_cast<std::size_t>(c.size()),
                                          weft::comm::reduce_kind::sum, false);
      });
    }
  }

}  // TEST_SUITE("slow")

TEST_CASE(
    "threads: a message to one's own rank is delivered, in either posting order (one rule for "
    "every backend)") {
  // Ring attention on one rank sends its dK/dV block to itself; MPI and NCCL deliver it too.
  weft::comm::threads::world(2).run([](communicator& c) {
    std::vector<float> a{1, 2, 3}, b(3, 0), x{4, 5}, y(2, 0);
    auto s = c.isend(bv(a), c.rank());
    c.recv(bv(b), c.rank());
    s.wait();
    CHECK(b == a);
    auto r = c.irecv(bv(y), c.rank());
    c.isend(bv(x), c.rank()).wait();
    r.wait();
    CHECK(y == x);
    auto const h = c.history();
    REQUIRE(h.size() == 4);
    CHECK(h[0].op == op_kind::send);
    CHECK(h[0].root_or_peer == c.rank());
  });
}
