// USP (Ulysses x ring) against single-device flash attention for u x r in {1x2, 2x1, 2x2, 2x4, 4x2}
// with zigzag, stripe and contiguous inner layouts, MHA/GQA/MQA, causal and non-causal.
#include <weft/attention/usp.hpp>

#include "distributed_testing.hpp"
#include "mailbox_comm.hpp"

#include <doctest/doctest.h>

namespace wa = weft::attention;
using namespace attention_testing;

namespace {

template <class T>
void run_usp(int u, int r, wa::layout_kind kind, global_problem<T> const& gp,
             wa::attention_options opt, double tol) {
  auto const lay = wa::seq_layout::usp(u, r, kind, gp.s);
  dist_errors err;
  run_usp_ranks(u, r, [&](mailbox_comm& uc, mailbox_comm& rc, int g) {
    auto q = gp.local(lay, g, gp.q), k = gp.local(lay, g, gp.k), v = gp.local(lay, g, gp.v),
         dout = gp.local(lay, g, gp.g);
    std::int64_t const c = lay.local_length();
    rank_result<T> res{make_owned<T>(gp.b, c, gp.hq, gp.d), make_owned<T>(gp.b, c, gp.hq, gp.d),
                       make_owned<T>(gp.b, c, gp.hk, gp.d), make_owned<T>(gp.b, c, gp.hk, gp.d),
                       make_owned<wa::lse_t<T>>(gp.b, gp.hq, c)};
    wa::usp_forward(uc, rc, lay, q.view(), k.view(), v.view(), res.o.view(), res.l.view(), opt);
    wa::usp_backward(uc, rc, lay, q.view(), k.view(), v.view(), res.o.view(), res.l.view(),
                     dout.view(), res.dq.view(), res.dk.view(), res.dv.view(), opt);
    err.add(gp, lay, g, res);
  });
  err.check(tol);
}

}  // namespace

TEST_SUITE("threads") {
  TEST_CASE("USP equals single-device attention (f64)") {
    std::uint64_t seed = 900;
    struct cfg {
      int u, r;
    };
    for (cfg const c : {cfg{1, 2}, cfg{2, 1}, cfg{2, 2}, cfg{2, 4}, cfg{4, 2}})
      for (auto kind :
           {wa::layout_kind::zigzag, wa::layout_kind::stripe, wa::layout_kind::contiguous})
        for (bool causal : {true, false}) {
          if (!causal && kind != wa::layout_kind::contiguous) continue;
          for (auto const& pair_hq_hk : {std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1}}) {
            auto const hq = pair_hq_hk.first;
            auto const hk = pair_hq_hk.second;
            CAPTURE(c.u);
            CAPTURE(c.r);
            CAPTURE(wa::to_string(kind));
            CAPTURE(causal);
            CAPTURE(hq);
            CAPTURE(hk);
            wa::attention_options const opt{
                0.0, causal ? wa::causal_mode::top_left : wa::causal_mode::none, 1};
            std::int64_t const s = 2 * c.u * c.r * 5;  // pieces of 5 rows
            global_problem<double> gp(2, s, hq, hk, 8, opt, seed++);
            run_usp(c.u, c.r, kind, gp, opt, 1e-12);
          }
        }
  }

  TEST_CASE("USP rejects a layout whose degrees differ from the groups") {
    run_usp_ranks(2, 2, [&](mailbox_comm& uc, mailbox_comm& rc, int) {
      auto q = make_owned<float>(1, 4, 2, 8), o = make_owned<float>(1, 4, 2, 8);
      auto l = make_owned<float>(1, 2, 4);
      wa::attention_options const opt{0.0, wa::causal_mode::top_left, 1};
      CHECK_THROWS_WITH_AS(
          wa::usp_forward(uc, rc, wa::seq_layout::usp(4, 1, wa::layout_kind::zigzag, 32), q.view(),
                          q.view(), q.view(), o.view(), l.view(), opt),
          doctest::Contains("Ulysses degree 2"), weft::invalid_argument_error);
    });
  }
}
