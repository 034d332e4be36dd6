// Ring, Ulysses and USP on weft's threads backend (the mailbox communicator of the other tests
// is a test double; this checks the algorithms on the real Communicator) and USP over a
// device_mesh with named axes, against single-device flash attention.
#include <weft/attention/ring.hpp>
#include <weft/attention/ulysses.hpp>
#include <weft/attention/usp.hpp>
#include <weft/comm/threads/world.hpp>
#include <weft/mesh/device_mesh.hpp>

#include "distributed_testing.hpp"
#include "support/counting_communicator.hpp"
#include "support/run_ranks.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>

namespace wa = weft::attention;
namespace wt = weft::comm::threads;
using namespace attention_testing;

namespace {

wt::options bounded() {
  wt::options o;
  o.timeout = std::chrono::seconds(60);  // a protocol bug fails the test instead of hanging it
  return o;
}

template <class T>
rank_result<T> make_result(global_problem<T> const& gp, std::int64_t c) {
  return {make_owned<T>(gp.b, c, gp.hq, gp.d), make_owned<T>(gp.b, c, gp.hq, gp.d),
          make_owned<T>(gp.b, c, gp.hk, gp.d), make_owned<T>(gp.b, c, gp.hk, gp.d),
          make_owned<wa::lse_t<T>>(gp.b, gp.hq, c)};
}

}  // namespace

TEST_SUITE("threads") {
  TEST_CASE(
      "ring (zigzag, contiguous) and Ulysses on the threads backend equal single-device "
      "attention") {
    for (int n : {2, 3, 4}) {
      for (bool causal : {true, false}) {
        CAPTURE(n);
        CAPTURE(causal);
        wa::attention_options const opt{
            0.0, causal ? wa::causal_mode::top_left : wa::causal_mode::none, 1};
        std::int64_t const s = 2 * n * 7;
        global_problem<double> gp(2, s, 6, n == 3 ? 3 : 2, 16, opt, std::uint64_t(40 + n));
        auto const lay = causal ? wa::seq_layout::zigzag(n, s) : wa::seq_layout::contiguous(n, s);
        auto const contiguous = wa::seq_layout::contiguous(n, s);
        dist_errors ring_err, uly_err;
        bool const heads_divide = 6 % n == 0;
        wt::run(
            n,
            [&](wt::communicator& comm) {
              int const r = comm.rank();
              std::int64_t const c = lay.local_length();
              {
                auto q = gp.local(lay, r, gp.q), k = gp.local(lay, r, gp.k),
                     v = gp.local(lay, r, gp.v), g = gp.local(lay, r, gp.g);
                auto res = make_result(gp, c);
                wa::ring_forward(comm, lay, q.view(), k.view(), v.view(), res.o.view(),
                                 res.l.view(), opt);
                wa::ring_backward(comm, lay, q.view(), k.view(), v.view(), res.o.view(),
                                  res.l.view(), g.view(), res.dq.view(), res.dk.view(),
                                  res.dv.view(), opt);
                ring_err.add(gp, lay, r, res);
              }
              if (heads_divide) {
                auto q = gp.local(contiguous, r, gp.q), k = gp.local(contiguous, r, gp.k),
                     v = gp.local(contiguous, r, gp.v), g = gp.local(contiguous, r, gp.g);
                auto res = make_result(gp, c);
                wa::ulysses_forward(comm, q.view(), k.view(), v.view(), res.o.view(), res.l.view(),
                                    opt);
                wa::ulysses_backward(comm, q.view(), k.view(), v.view(), res.o.view(), res.l.view(),
                                     g.view(), res.dq.view(), res.dk.view(), res.dv.view(), opt);
                uly_err.add(gp, contiguous, r, res);
              }
            },
            bounded());
        ring_err.check(1e-12);
        if (heads_divide) uly_err.check(1e-12);
      }
    }
  }

  TEST_CASE("USP over a device_mesh (ring x ulysses axes) equals single-device attention") {
    struct cfg {
      int r, u;
      std::int64_t hq, hk;
    };
    for (cfg const c : {cfg{2, 2, 4, 2}, cfg{2, 2, 4, 1}, cfg{4, 2, 4, 4}, cfg{2, 4, 8, 2}}) {
      CAPTURE(c.r);
      CAPTURE(c.u);
      CAPTURE(c.hk);
      wa::attention_options const opt{0.0, wa::causal_mode::top_left, 1};
      std::int64_t const s = 2 * c.r * c.u * 3;
      global_problem<double> gp(1, s, c.hq, c.hk, 8, opt, 77);
      auto const lay = wa::seq_layout::usp(c.u, c.r, wa::layout_kind::zigzag, s);
      dist_errors err;
      wt::run(
          c.r * c.u,
          [&](wt::communicator& world) {
            weft::device_mesh<wt::communicator> mesh(world, {c.r, c.u}, {"ring", "uly"});
            int const g = wa::usp_layout_rank(mesh, "uly", "ring");
            CHECK(g ==
                  world.rank());  // ring axis slower, Ulysses axis fastest: g = rho*u + upsilon
            auto q = gp.local(lay, g, gp.q), k = gp.local(lay, g, gp.k), v = gp.local(lay, g, gp.v),
                 dout = gp.local(lay, g, gp.g);
            auto res = make_result(gp, lay.local_length());
            wa::usp_forward(mesh, "uly", "ring", lay, q.view(), k.view(), v.view(), res.o.view(),
                            res.l.view(), opt);
            wa::usp_backward(mesh, "uly", "ring", lay, q.view(), k.view(), v.view(), res.o.view(),
                             res.l.view(), dout.view(), res.dq.view(), res.dk.view(), res.dv.view(),
                             opt);
            err.add(gp, lay, g, res);
          },
          bounded());
      err.check(1e-12);
    }
  }
}

TEST_SUITE("threads") {
  TEST_CASE("docs example: ring attention on 4 thread ranks restores the single-device output") {
    // The ```cpp block of docs/attention.md, verbatim.
    namespace wa = weft::attention;
    std::int64_t const S = 1024, H = 8, D = 64, N = 4, C = S / N;
    auto q = weft::make_tensor<float>(1, S, H, D), k = weft::make_tensor<float>(1, S, H, D),
         v = weft::make_tensor<float>(1, S, H, D), out = weft::make_tensor<float>(1, S, H, D);
    for (std::size_t i = 0; i < q.size(); ++i) {
      q.data()[i] = std::sin(0.37f * float(i % 1000));
      k.data()[i] = std::cos(0.91f * float(i % 997));
      v.data()[i] = std::sin(1.3f * float(i % 991));
    }
    auto const layout = wa::seq_layout::zigzag(N, S);  // rank r holds chunks r and 2N-1-r
    wa::attention_options const opt{.causal = wa::causal_mode::top_left};
    weft::comm::threads::run(N, [&](weft::comm::threads::communicator& comm) {
      int const r = comm.rank();
      auto ql = weft::make_tensor<float>(1, C, H, D), kl = weft::make_tensor<float>(1, C, H, D),
           vl = weft::make_tensor<float>(1, C, H, D), ol = weft::make_tensor<float>(1, C, H, D);
      auto lse = weft::make_tensor<float>(1, H, C);
      wa::extract_local(layout, r, q.view(), ql.view());
      wa::extract_local(layout, r, k.view(), kl.view());
      wa::extract_local(layout, r, v.view(), vl.view());
      wa::ring_forward(comm, layout, ql.view(), kl.view(), vl.view(), ol.view(), lse.view(), opt);
      wa::restore_global(layout, r, ol.view(), out.view());  // each rank writes its own rows
    });
    // The same attention on one device:
    auto ref = weft::make_tensor<float>(1, S, H, D);
    auto ref_lse = weft::make_tensor<float>(1, H, S);
    wa::flash_forward(q.view(), k.view(), v.view(), ref.view(), ref_lse.view(), opt);
    float worst = 0.0f;
    for (std::size_t i = 0; i < out.size(); ++i)
      worst = std::max(worst, std::abs(out.data()[i] - ref.data()[i]));
    CHECK(worst < 1e-5f);
  }
}

TEST_SUITE("threads") {
  TEST_CASE(
      "protocol through counting_communicator: K/V sent N-1 times unreplicated, dK/dV N times") {
    for (int n : {2, 3, 4}) {
      CAPTURE(n);
      std::int64_t const s = 2 * n * 4, b = 1, hq = 4, hk = 1, d = 8, c = s / n;
      wa::attention_options const opt{0.0, wa::causal_mode::top_left, 1};
      global_problem<weft::bf16> gp(b, s, hq, hk, d, opt, 19);
      auto const lay = wa::seq_layout::zigzag(n, s);
      // K and V of one rank, unreplicated (Hkv heads, not Hq): bf16 on the way out, the
      // traveling dK/dV in f32 on the way back.
      std::size_t const kv_bytes = std::size_t(2 * b * c * hk * d) * sizeof(weft::bf16);
      std::size_t const dkv_bytes = std::size_t(2 * b * c * hk * d) * sizeof(float);
      weft::test::run_ranks(n, [&](wt::communicator& inner) {
        weft::test::counting_communicator<wt::communicator> comm(std::move(inner));
        int const r = comm.rank();
        auto q = gp.local(lay, r, gp.q), k = gp.local(lay, r, gp.k), v = gp.local(lay, r, gp.v),
             g = gp.local(lay, r, gp.g);
        auto res = make_result(gp, c);
        wa::ring_forward(comm, lay, q.view(), k.view(), v.view(), res.o.view(), res.l.view(), opt);
        std::size_t kv = 0, other = 0;
        for (auto const& e : comm.events())
          if (e.op == weft::comm::op_kind::send) (e.send_bytes == kv_bytes ? kv : other)++;
        CHECK(kv == std::size_t(n - 1));
        CHECK(other == 0);
        CHECK(comm.count(weft::comm::op_kind::recv) == std::size_t(n - 1));
        comm.clear();
        wa::ring_backward(comm, lay, q.view(), k.view(), v.view(), res.o.view(), res.l.view(),
                          g.view(), res.dq.view(), res.dk.view(), res.dv.view(), opt);
        std::size_t dkv = 0;
        kv = other = 0;
        for (auto const& e : comm.events())
          if (e.op == weft::comm::op_kind::send)
            (e.send_bytes == kv_bytes ? kv : e.send_bytes == dkv_bytes ? dkv : other)++;
        CHECK(kv == std::size_t(n - 1));
        CHECK(dkv == std::size_t(n));
        CHECK(other == 0);
        // Each step's K/V transfer is issued before that step's dK/dV hand-off, i.e. before the
        // step's compute finished; the first event of the backward after the entry's agreement
        // check (one small all_gather) is the prefetch of step 1.
        REQUIRE(comm.events().size() >= 2);
        CHECK(comm.events()[0].op == weft::comm::op_kind::all_gather);
        CHECK(comm.count(weft::comm::op_kind::all_gather) == 1);
        CHECK(comm.events()[1].op == weft::comm::op_kind::send);
        CHECK(comm.events()[1].send_bytes == kv_bytes);
      });
    }
  }

  TEST_CASE("Ulysses through counting_communicator: 5 all-to-alls forward, 9 backward, volumes") {
    int const n = 4;
    std::int64_t const s = 4 * 6, b = 1, hq = 8, hk = 2, d = 8, c = s / n;  // hk < n: replicated
    wa::attention_options const opt{0.0, wa::causal_mode::none, 1};
    global_problem<float> gp(b, s, hq, hk, d, opt, 23);
    auto const lay = wa::seq_layout::contiguous(n, s);
    weft::test::run_ranks(n, [&](wt::communicator& inner) {
      weft::test::counting_communicator<wt::communicator> comm(std::move(inner));
      int const r = comm.rank();
      auto q = gp.local(lay, r, gp.q), k = gp.local(lay, r, gp.k), v = gp.local(lay, r, gp.v),
           g = gp.local(lay, r, gp.g);
      auto res = make_result(gp, c);
      wa::ulysses_forward(comm, q.view(), k.view(), v.view(), res.o.view(), res.l.view(), opt);
      CHECK(comm.count(weft::comm::op_kind::all_to_all) == 5);
      // q: Hq/N heads to each of N ranks; k, v: one replica per rank (N/Hkv = 2 copies of each
      // head).
      std::size_t const q_bytes = std::size_t(b * c * hq * d) * sizeof(float);
      std::size_t const kv_bytes = std::size_t(b * c * 1 * d * n) * sizeof(float);
      auto const& ev = comm.events();
      REQUIRE(ev.size() ==
              6);  // the entry's agreement check (one small all_gather), then 5 all-to-alls
      CHECK(ev[0].op == weft::comm::op_kind::all_gather);
      CHECK(ev[1].send_bytes == q_bytes);
      CHECK(ev[2].send_bytes == kv_bytes);
      CHECK(ev[3].send_bytes == kv_bytes);
      comm.clear();
      wa::ulysses_backward(comm, q.view(), k.view(), v.view(), res.o.view(), res.l.view(), g.view(),
                           res.dq.view(), res.dk.view(), res.dv.view(), opt);
      CHECK(comm.count(weft::comm::op_kind::all_to_all) == 9);
      CHECK(comm.count(weft::comm::op_kind::all_gather) == 1);
    });
  }
}
