// Ulysses attention against single-device flash attention (out, lse, dq, dk, dv after
// extract_local) for N = 1, 2, 3, 4, 8, causal and non-causal, MHA/GQA/MQA including KV-head
// replication; the all-to-all round trip; head-count errors thrown before anything is sent.
#include <weft/attention/ulysses.hpp>

#include "distributed_testing.hpp"
#include "mailbox_comm.hpp"

#include <doctest/doctest.h>

namespace wa = weft::attention;
using namespace attention_testing;

namespace {

template <class T>
void run_ulysses(int n, global_problem<T> const& gp, wa::attention_options opt, double tol) {
  auto const lay = wa::seq_layout::contiguous(n, gp.s);
  dist_errors err;
  run_mailbox_ranks(n, [&](mailbox_comm& comm) {
    int const r = comm.rank();
    auto q = gp.local(lay, r, gp.q), k = gp.local(lay, r, gp.k), v = gp.local(lay, r, gp.v),
         g = gp.local(lay, r, gp.g);
    std::int64_t const c = lay.local_length();
    rank_result<T> res{make_owned<T>(gp.b, c, gp.hq, gp.d), make_owned<T>(gp.b, c, gp.hq, gp.d),
                       make_owned<T>(gp.b, c, gp.hk, gp.d), make_owned<T>(gp.b, c, gp.hk, gp.d),
                       make_owned<wa::lse_t<T>>(gp.b, gp.hq, c)};
    wa::ulysses_forward(comm, q.view(), k.view(), v.view(), res.o.view(), res.l.view(), opt);
    wa::ulysses_backward(comm, q.view(), k.view(), v.view(), res.o.view(), res.l.view(), g.view(),
                         res.dq.view(), res.dk.view(), res.dv.view(), opt);
    err.add(gp, lay, r, res);
  });
  err.check(tol);
}

}  // namespace

TEST_SUITE("threads") {
  TEST_CASE("Ulysses equals single-device attention (f64; MHA, GQA, MQA, replication)") {
    std::uint64_t seed = 500;
    struct cfg {
      int n;
      std::int64_t hq, hk;
    };
    for (cfg const c : {cfg{1, 4, 4}, cfg{1, 4, 1}, cfg{2, 4, 4}, cfg{2, 4, 2}, cfg{2, 4, 1},
                        cfg{4, 8, 8}, cfg{4, 8, 4}, cfg{4, 8, 2}, cfg{4, 8, 1}, cfg{8, 8, 8},
                        cfg{8, 8, 2}, cfg{8, 8, 1}, cfg{3, 6, 6}, cfg{3, 6, 3}, cfg{3, 6, 1}})
      for (bool causal : {true, false}) {
        CAPTURE(c.n);
        CAPTURE(c.hq);
        CAPTURE(c.hk);
        CAPTURE(causal);
        wa::attention_options const opt{
            0.0, causal ? wa::causal_mode::top_left : wa::causal_mode::none, 1};
        global_problem<double> gp(2, c.n * 15, c.hq, c.hk, 16, opt, seed++);  // chunks of 15 rows
        run_ulysses(c.n, gp, opt, 1e-12);
      }
  }

  TEST_CASE("Ulysses f32 within 1e-5 relative") {
    wa::attention_options const opt{0.0, wa::causal_mode::top_left, 1};
    global_problem<float> gp(1, 4 * 40, 8, 2, 64, opt, 42);
    run_ulysses(4, gp, opt, 1e-5);
  }

  TEST_CASE("Ulysses all-to-all round trip head->seq(seq->head(x)) == x, with replication") {
    run_mailbox_ranks(4, [&](mailbox_comm& comm) {
      for (std::int64_t heads : {8, 2}) {
        auto const uh = wa::ulysses_heads::make(4, 8, heads);
        auto x =
            random_tensor<double>(std::uint64_t(comm.rank() + 10 * heads), 1.0, 2, 5, heads, 3);
        auto back = filled_tensor<double>(-1.0, 2, 5, heads, 3);
        auto const rx = wa::detail::as_const(wa::detail::as_bshd(x.view(), "x"));
        auto kf = [&](int p, std::int64_t j) { return uh.k_head(p, j); };
        auto full = wa::detail::a2a_seq_to_head(comm, rx, uh.local_k(), kf);
        CHECK(full.size() == std::size_t(2 * 5 * 4 * uh.local_k() * 3));
        wa::detail::a2a_head_to_seq(
            comm, wa::detail::contiguous_bshd<double const>(full.data(), 2, 20, uh.local_k(), 3),
            wa::detail::as_bshd(back.view(), "back"), kf, uh.replicated());
        if (!uh.replicated()) {
          CHECK(back.buf == x.buf);
        } else {  // each of the 2 KV heads came back from 2 replicas and was summed
          for (std::size_t i = 0; i < x.size(); ++i) CHECK(back.buf[i] == 2 * x.buf[i]);
        }
      }
    });
  }

  TEST_CASE("Ulysses rejects head counts that do not divide, before communicating") {
    auto logs = run_mailbox_ranks(4, [&](mailbox_comm& comm) {
      auto q = make_owned<float>(1, 4, 6, 8), k = make_owned<float>(1, 4, 2, 8),
           o = make_owned<float>(1, 4, 6, 8);
      auto l = make_owned<float>(1, 6, 4);
      CHECK_THROWS_WITH_AS(
          wa::ulysses_forward(comm, q.view(), k.view(), k.view(), o.view(), l.view()),
          doctest::Contains("divisible by the Ulysses degree 4"), weft::shape_error);
      auto q8 = make_owned<float>(1, 4, 12, 8), k3 = make_owned<float>(1, 4, 3, 8),
           o8 = make_owned<float>(1, 4, 12, 8);
      auto l8 = make_owned<float>(1, 12, 4);
      CHECK_THROWS_WITH_AS(
          wa::ulysses_forward(comm, q8.view(), k3.view(), k3.view(), o8.view(), l8.view()),
          doctest::Contains("argument `k`"), weft::shape_error);
    });
    for (auto const& log : logs) CHECK(log.empty());
  }
}
