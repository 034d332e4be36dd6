// Ranks that disagree on the sequence layout or the call of ring / Ulysses / USP attention (issue
// 9, item 7): before the entry check, equal-sized blocks moved and every rank returned silently
// wrong rows. Now every rank throws the same invalid_argument_error before any output is written,
// and the communicator stays usable; the check is one all_gather of 14 int64 per call and group.
#include <weft/attention/ring.hpp>
#include <weft/attention/ulysses.hpp>
#include <weft/attention/usp.hpp>
#include <weft/comm/threads/world.hpp>

#include "distributed_testing.hpp"
#include "mailbox_comm.hpp"
#include "support/counting_communicator.hpp"
#include "support/run_ranks.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace wa = weft::attention;
namespace wt = weft::comm::threads;
using namespace attention_testing;

namespace {

constexpr float sentinel = 42.0f;

template <class T, std::size_t R>
void fill_sentinel(owned<T, R>& t) {
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = T(sentinel);
}
template <class T, std::size_t R>
bool untouched(owned<T, R> const& t) {
  for (std::size_t i = 0; i < t.size(); ++i)
    if (t.data()[i] != T(sentinel)) return false;
  return true;
}

//! One rank's inputs and sentinel-filled outputs for a [1, s, 4, 8] problem under `lay`.
struct shard {
  owned<float, 4> q, k, v, g, o, dq, dk, dv;
  owned<float, 3> l;
  shard(global_problem<float> const& gp, wa::seq_layout const& lay, int rank)
      : q(gp.local(lay, rank, gp.q)),
        k(gp.local(lay, rank, gp.k)),
        v(gp.local(lay, rank, gp.v)),
        g(gp.local(lay, rank, gp.g)),
        o(gp.local(lay, rank, gp.o)),
        dq(gp.local(lay, rank, gp.q)),
        dk(gp.local(lay, rank, gp.k)),
        dv(gp.local(lay, rank, gp.k)),
        l(gp.local(lay, rank, gp.l, 2)) {}
  void reset_outputs() {
    fill_sentinel(o);
    fill_sentinel(l);
    fill_sentinel(dq);
    fill_sentinel(dk);
    fill_sentinel(dv);
  }
  bool outputs_untouched() const {
    return untouched(o) && untouched(l) && untouched(dq) && untouched(dk) && untouched(dv);
  }
};

wa::attention_options causal_opt() { return {0.0, wa::causal_mode::top_left, 1}; }

}  // namespace

TEST_SUITE("threads") {
  TEST_CASE("ring: a rank with another layout kind is rejected on every rank, nothing written") {
    int const n = 4;
    std::int64_t const s = 2 * n * 3;
    global_problem<float> gp(1, s, 4, 2, 8, causal_opt(), 71);
    auto const zig = wa::seq_layout::zigzag(n, s);
    auto const con = wa::seq_layout::contiguous(n, s);
    std::atomic<int> rejected{0};
    auto logs = run_mailbox_ranks(n, [&](mailbox_comm& comm) {
      int const r = comm.rank();
      auto const& lay = r == 2 ? con : zig;  // rank 2 alone thinks the shards are contiguous
      shard x(gp, lay, r);
      x.reset_outputs();
      CHECK_THROWS_WITH_AS(wa::ring_forward(comm, lay, x.q.view(), x.k.view(), x.v.view(),
                                            x.o.view(), x.l.view(), causal_opt()),
                           doctest::Contains("layout kind"), weft::invalid_argument_error);
      try {
        wa::ring_backward(comm, lay, x.q.view(), x.k.view(), x.v.view(), x.o.view(), x.l.view(),
                          x.g.view(), x.dq.view(), x.dk.view(), x.dv.view(), causal_opt());
      } catch (weft::invalid_argument_error const& e) {
        std::string const what = e.what();
        CHECK(what.find("argument `layout`") != std::string::npos);
        CHECK(what.find("rank 0 has zigzag") != std::string::npos);
        CHECK(what.find("contiguous on rank 2") != std::string::npos);
        ++rejected;
      }
      CHECK(x.outputs_untouched());
    });
    CHECK(rejected == n);
    // Only the agreement exchange ran: no K/V block moved.
    for (auto const& log : logs) {
      int collectives = 0, p2p = 0;
      for (auto const& e : log) (e.kind == event_kind::collective ? collectives : p2p)++;
      CHECK(collectives == 2);
      CHECK(p2p == 0);
    }
  }

  TEST_CASE("ring: disagreeing causality or scale is rejected, naming the option") {
    int const n = 3;
    std::int64_t const s = n * 4;
    global_problem<float> gp(1, s, 4, 2, 8, {}, 72);
    auto const lay = wa::seq_layout::contiguous(n, s);
    run_mailbox_ranks(n, [&](mailbox_comm& comm) {
      int const r = comm.rank();
      shard x(gp, lay, r);
      x.reset_outputs();
      wa::attention_options opt;
      opt.causal = r == 1 ? wa::causal_mode::top_left : wa::causal_mode::none;
      CHECK_THROWS_WITH_AS(wa::ring_forward(comm, lay, x.q.view(), x.k.view(), x.v.view(),
                                            x.o.view(), x.l.view(), opt),
                           doctest::Contains("argument `opt.causal`"),
                           weft::invalid_argument_error);
      opt = {};
      opt.scale = r == 2 ? 0.5 : 0.0;  // 0 means 1/sqrt(8): rank 2 alone uses another scale
      CHECK_THROWS_WITH_AS(wa::ring_forward(comm, lay, x.q.view(), x.k.view(), x.v.view(),
                                            x.o.view(), x.l.view(), opt),
                           doctest::Contains("argument `opt.scale`"), weft::invalid_argument_error);
      // An explicit 1/sqrt(d) on one rank agrees with the default on the others.
      opt.scale = r == 2 ? 1.0 / std::sqrt(8.0) : 0.0;
      CHECK(x.outputs_untouched());
      wa::ring_forward(comm, lay, x.q.view(), x.k.view(), x.v.view(), x.o.view(), x.l.view(), opt);
      CHECK_FALSE(untouched(x.o));
    });
  }

  TEST_CASE("Ulysses: disagreeing causality is rejected on every rank, forward and backward") {
    int const n = 4;
    std::int64_t const s = n * 3;
    global_problem<float> gp(1, s, 4, 2, 8, {}, 73);
    auto const lay = wa::seq_layout::contiguous(n, s);
    run_mailbox_ranks(n, [&](mailbox_comm& comm) {
      int const r = comm.rank();
      shard x(gp, lay, r);
      x.reset_outputs();
      wa::attention_options opt;
      opt.causal = r == 3 ? wa::causal_mode::top_left : wa::causal_mode::none;
      CHECK_THROWS_WITH_AS(wa::ulysses_forward(comm, x.q.view(), x.k.view(), x.v.view(), x.o.view(),
                                               x.l.view(), opt),
                           doctest::Contains("true on rank 3"), weft::invalid_argument_error);
      CHECK_THROWS_WITH_AS(
          wa::ulysses_backward(comm, x.q.view(), x.k.view(), x.v.view(), x.o.view(), x.l.view(),
                               x.g.view(), x.dq.view(), x.dk.view(), x.dv.view(), opt),
          doctest::Contains("argument `opt.causal`"), weft::invalid_argument_error);
      CHECK(x.outputs_untouched());
    });
  }

  TEST_CASE("USP: one rank with another inner layout is rejected on all u x r ranks") {
    int const u = 2, r = 2;
    std::int64_t const s = 2 * u * r * 2;
    global_problem<float> gp(1, s, 4, 2, 8, causal_opt(), 74);
    auto const zig = wa::seq_layout::usp(u, r, wa::layout_kind::zigzag, s);
    auto const str = wa::seq_layout::usp(u, r, wa::layout_kind::stripe, s);
    std::atomic<int> rejected{0};
    // Ulysses groups are consecutive ranks, ring groups strided (as in usp.test.cpp).
    std::vector<std::shared_ptr<mailbox_world>> uw, rw;
    for (int i = 0; i < r; ++i) uw.push_back(std::make_shared<mailbox_world>(u));
    for (int i = 0; i < u; ++i) rw.push_back(std::make_shared<mailbox_world>(r));
    std::vector<std::thread> threads;
    for (int g = 0; g < u * r; ++g)
      threads.emplace_back([&, g] {
        int const rho = g / u, ups = g % u;
        mailbox_comm uc(uw[std::size_t(rho)], ups), rc(rw[std::size_t(ups)], rho);
        auto const& lay = g == 3 ? str : zig;
        shard x(gp, lay, g);
        x.reset_outputs();
        try {
          wa::usp_forward(uc, rc, lay, x.q.view(), x.k.view(), x.v.view(), x.o.view(), x.l.view(),
                          causal_opt());
        } catch (weft::invalid_argument_error const& e) {
          std::string const what = e.what();
          CHECK(what.find("argument `layout`") != std::string::npos);
          if (g != 0) CHECK(what.find("stripe on rank") != std::string::npos);
          if (g == 0) CHECK(what.find("Ulysses group of ring rank 1") != std::string::npos);
          ++rejected;
        }
        CHECK(x.outputs_untouched());
      });
    for (auto& t : threads) t.join();
    // Rank 3 disagrees with its Ulysses partner 2 and its ring partner 1; rank 0 agrees with both
    // of its partners (1 and 2) and hears of rank 3 only through rank 2's flag: it is told too,
    // rather than waiting in the next all-to-all for ranks that have already thrown.
    CHECK(rejected == u * r);
  }

  TEST_CASE(
      "ring and Ulysses on the threads backend: every rank rejects, the communicator stays "
      "healthy") {
    int const n = 4;
    std::int64_t const s = 2 * n * 2;
    global_problem<float> gp(1, s, 4, 2, 8, causal_opt(), 75);
    auto const zig = wa::seq_layout::zigzag(n, s);
    auto const str = wa::seq_layout::stripe(n, s);
    std::atomic<int> rejected{0};
    weft::test::run_ranks(n, [&](wt::communicator& comm) {
      int const r = comm.rank();
      auto const& lay = r == 1 ? str : zig;
      shard x(gp, lay, r);
      x.reset_outputs();
      CHECK_THROWS_WITH_AS(wa::ring_forward(comm, lay, x.q.view(), x.k.view(), x.v.view(),
                                            x.o.view(), x.l.view(), causal_opt()),
                           doctest::Contains("stripe on rank 1"), weft::invalid_argument_error);
      CHECK(x.outputs_untouched());
      CHECK(comm.state() == weft::comm::comm_state::healthy);
      // The same ranks then agree, and get single-device attention.
      shard y(gp, zig, r);
      wa::ring_forward(comm, zig, y.q.view(), y.k.view(), y.v.view(), y.o.view(), y.l.view(),
                       causal_opt());
      auto const want = gp.local(zig, r, gp.o);
      CHECK(compare(y.o, want).rel() < 1e-5);
      ++rejected;
    });
    CHECK(rejected == n);
  }

  TEST_CASE(
      "agreement check cost: one all_gather of 14 int64 per call and group, before any block") {
    int const n = 3;
    std::int64_t const s = 2 * n * 2;
    global_problem<float> gp(1, s, 4, 2, 8, causal_opt(), 76);
    auto const lay = wa::seq_layout::zigzag(n, s);
    weft::test::run_ranks(n, [&](wt::communicator& inner) {
      weft::test::counting_communicator<wt::communicator> comm(std::move(inner));
      int const r = comm.rank();
      shard x(gp, lay, r);
      wa::ring_forward(comm, lay, x.q.view(), x.k.view(), x.v.view(), x.o.view(), x.l.view(),
                       causal_opt());
      REQUIRE(!comm.events().empty());
      CHECK(comm.events().front().op == weft::comm::op_kind::all_gather);
      CHECK(comm.events().front().send_bytes == 14 * sizeof(std::int64_t));
      CHECK(comm.count(weft::comm::op_kind::all_gather) == 1);
    });
  }
}
