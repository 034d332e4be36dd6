// Ring attention (contiguous, zigzag, stripe) against single-device flash attention: out, lse, dq,
// dk, dv after extract_local for N = 1, 2, 3, 4, 8, causal and non-causal, MHA/GQA/MQA, odd chunk
// lengths; N = 1 bit-identical; protocol invariants observed through the communicator's log.
#include <weft/attention/ring.hpp>

#include "distributed_testing.hpp"
#include "mailbox_comm.hpp"

#include <doctest/doctest.h>

#include <cstring>

namespace wa = weft::attention;
using namespace attention_testing;

namespace {

template <class T>
void run_ring(wa::seq_layout const& lay, global_problem<T> const& gp, wa::attention_options opt, double tol) {
  dist_errors err;
  run_mailbox_ranks(lay.world(), [&](mailbox_comm& comm) {
    int const r = comm.rank();
    auto q = gp.local(lay, r, gp.q), k = gp.local(lay, r, gp.k), v = gp.local(lay, r, gp.v),
         g = gp.local(lay, r, gp.g);
    std::int64_t const c = lay.local_length();
    rank_result<T> res{make_owned<T>(gp.b, c, gp.hq, gp.d), make_owned<T>(gp.b, c, gp.hq, gp.d),
                       make_owned<T>(gp.b, c, gp.hk, gp.d), make_owned<T>(gp.b, c, gp.hk, gp.d),
                       make_owned<wa::lse_t<T>>(gp.b, gp.hq, c)};
    wa::ring_forward(comm, lay, q.view(), k.view(), v.view(), res.o.view(), res.l.view(), opt);
    wa::ring_backward(comm, lay, q.view(), k.view(), v.view(), res.o.view(), res.l.view(), g.view(),
                      res.dq.view(), res.dk.view(), res.dv.view(), opt);
    err.add(gp, lay, r, res);
  });
  err.check(tol);
}

wa::seq_layout make_layout(wa::layout_kind k, int n, std::int64_t s) {
  switch (k) {
    case wa::layout_kind::contiguous: return wa::seq_layout::contiguous(n, s);
    case wa::layout_kind::zigzag: return wa::seq_layout::zigzag(n, s);
    case wa::layout_kind::stripe: return wa::seq_layout::stripe(n, s);
  }
  return wa::seq_layout::contiguous(n, s);
}

}  // namespace

TEST_SUITE("threads") {
  TEST_CASE("ring attention equals single-device attention (f64, all layouts, N = 1..8)") {
    std::uint64_t seed = 1000;
    for (auto kind : {wa::layout_kind::contiguous, wa::layout_kind::zigzag, wa::layout_kind::stripe})
      for (bool causal : {true, false}) {
        if (!causal && kind != wa::layout_kind::contiguous) continue;
        for (int n : {1, 2, 3, 4, 8})
          for (auto const& pair_hq_hk : {std::pair{4, 4}, std::pair{4, 2}, std::pair{4, 1}}) {
            auto const hq = pair_hq_hk.first;
            auto const hk = pair_hq_hk.second;
            std::int64_t const s = 2 * n * 15;  // zigzag half-chunks of 15 rows: odd lengths
            CAPTURE(wa::to_string(kind));
            CAPTURE(causal);
            CAPTURE(n);
            CAPTURE(hq);
            CAPTURE(hk);
            wa::attention_options const opt{0.0, causal ? wa::causal_mode::top_left : wa::causal_mode::none, 1};
            global_problem<double> gp(2, s, hq, hk, 16, opt, seed++);
            run_ring(make_layout(kind, n, s), gp, opt, 1e-12);
          }
      }
  }

  TEST_CASE("ring attention f32 within 1e-5 relative; minimum zigzag length; odd contiguous chunks") {
    wa::attention_options const causal{0.0, wa::causal_mode::top_left, 1};
    {
      global_problem<float> gp(1, 8 * 24, 4, 2, 64, causal, 77);
      run_ring(wa::seq_layout::zigzag(4, 8 * 24), gp, causal, 1e-5);
    }
    {
      global_problem<double> gp(1, 8, 2, 1, 8, causal, 78);  // one token per half-chunk
      run_ring(wa::seq_layout::zigzag(4, 8), gp, causal, 1e-12);
    }
    {
      global_problem<double> gp(1, 3 * 7, 2, 2, 8, causal, 79);  // chunks of 7 over 3 ranks
      run_ring(wa::seq_layout::contiguous(3, 21), gp, causal, 1e-12);
      run_ring(wa::seq_layout::stripe(3, 21), gp, causal, 1e-12);
    }
  }

  TEST_CASE("ring attention with N = 1 is bit-identical to the local kernel") {
    for (bool causal : {true, false}) {
      wa::attention_options const opt{0.0, causal ? wa::causal_mode::top_left : wa::causal_mode::none, 1};
      global_problem<float> gp(2, 70, 4, 2, 40, opt, 5);
      auto const lay = wa::seq_layout::contiguous(1, 70);
      run_mailbox_ranks(1, [&](mailbox_comm& comm) {
        auto o = make_owned<float>(2, 70, 4, 40), dq = make_owned<float>(2, 70, 4, 40);
        auto dk = make_owned<float>(2, 70, 2, 40), dv = make_owned<float>(2, 70, 2, 40);
        auto l = make_owned<float>(2, 4, 70);
        wa::ring_forward(comm, lay, gp.q.view(), gp.k.view(), gp.v.view(), o.view(), l.view(), opt);
        wa::ring_backward(comm, lay, gp.q.view(), gp.k.view(), gp.v.view(), o.view(), l.view(),
                          gp.g.view(), dq.view(), dk.view(), dv.view(), opt);
        CHECK(std::memcmp(o.data(), gp.o.data(), o.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(l.data(), gp.l.data(), l.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(dq.data(), gp.dq.data(), dq.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(dk.data(), gp.dk.data(), dk.size() * sizeof(float)) == 0);
        CHECK(std::memcmp(dv.data(), gp.dv.data(), dv.size() * sizeof(float)) == 0);
      });
    }
  }

  TEST_CASE("ring protocol: K/V sent N-1 times, dK/dV N times, unreplicated under GQA") {
    for (int n : {2, 3, 4}) {
      CAPTURE(n);
      std::int64_t const s = 2 * n * 4, b = 1, hq = 4, hk = 1, d = 8;
      wa::attention_options const opt{0.0, wa::causal_mode::top_left, 1};
      global_problem<weft::bf16> gp(b, s, hq, hk, d, opt, 9);
      auto const lay = wa::seq_layout::zigzag(n, s);
      std::size_t const kv_bytes = std::size_t(2 * b * (s / n) * hk * d) * sizeof(weft::bf16);
      std::size_t const dkv_bytes = std::size_t(2 * b * (s / n) * hk * d) * sizeof(float);
      auto fwd_logs = run_mailbox_ranks(n, [&](mailbox_comm& comm) {
        auto q = gp.local(lay, comm.rank(), gp.q), k = gp.local(lay, comm.rank(), gp.k),
             v = gp.local(lay, comm.rank(), gp.v);
        auto o = make_owned<weft::bf16>(b, s / n, hq, d);
        auto l = make_owned<float>(b, hq, s / n);
        wa::ring_forward(comm, lay, q.view(), k.view(), v.view(), o.view(), l.view(), opt);
      });
      for (auto const& log : fwd_logs) {
        int kv = 0, other = 0;
        for (auto const& e : log)
          if (e.kind == event_kind::post_send) (e.bytes == kv_bytes ? kv : other)++;
        CHECK(kv == n - 1);
        CHECK(other == 0);
      }
      auto bwd_logs = run_mailbox_ranks(n, [&](mailbox_comm& comm) {
        int const r = comm.rank();
        auto q = gp.local(lay, r, gp.q), k = gp.local(lay, r, gp.k), v = gp.local(lay, r, gp.v),
             o = gp.local(lay, r, gp.o), g = gp.local(lay, r, gp.g);
        auto l = gp.local(lay, r, gp.l, 2);
        auto dq = make_owned<weft::bf16>(b, s / n, hq, d);
        auto dk = make_owned<weft::bf16>(b, s / n, hk, d), dv = make_owned<weft::bf16>(b, s / n, hk, d);
        wa::ring_backward(comm, lay, q.view(), k.view(), v.view(), o.view(), l.view(), g.view(),
                          dq.view(), dk.view(), dv.view(), opt);
      });
      for (auto const& log : bwd_logs) {
        int kv = 0, dkv = 0, other = 0;
        for (auto const& e : log)
          if (e.kind == event_kind::post_send) (e.bytes == kv_bytes ? kv : e.bytes == dkv_bytes ? dkv : other)++;
        CHECK(kv == n - 1);
        CHECK(dkv == n);
        CHECK(other == 0);
      }
    }
  }

  TEST_CASE("ring protocol: the next block's isend/irecv are posted before this block's compute") {
    // Non-causal, 4 ranks, chunks big enough that a block's compute dominates. For steps s >= 1 the
    // gap from receiving block s to posting block s+1's transfer must be small next to the time
    // that transfer stays in flight (which covers the compute of block s).
    int const n = 4;
    std::int64_t const s = n * 256;
    wa::attention_options const opt{0.0, wa::causal_mode::none, 1};
    auto q = random_tensor<float>(1, 1.0, 1, s, 2, 64), k = random_tensor<float>(2, 1.0, 1, s, 2, 64),
         v = random_tensor<float>(3, 1.0, 1, s, 2, 64);
    auto const lay = wa::seq_layout::contiguous(n, s);
    auto logs = run_mailbox_ranks(n, [&](mailbox_comm& comm) {
      auto ql = make_owned<float>(1, s / n, 2, 64), kl = make_owned<float>(1, s / n, 2, 64),
           vl = make_owned<float>(1, s / n, 2, 64);
      wa::extract_local(lay, comm.rank(), q.view(), ql.view());
      wa::extract_local(lay, comm.rank(), k.view(), kl.view());
      wa::extract_local(lay, comm.rank(), v.view(), vl.view());
      auto o = make_owned<float>(1, s / n, 2, 64);
      auto l = make_owned<float>(1, 2, s / n);
      wa::ring_forward(comm, lay, ql.view(), kl.view(), vl.view(), o.view(), l.view(), opt);
    });
    // Measured in each rank's own CPU time, so preemption on a loaded machine cannot fail the
    // test: waiting for a message costs no CPU, computing a block does. Block st's compute falls
    // between posting block st+1's receive and waiting for it; had the ring computed before
    // posting, that CPU time would fall between block st's arrival and the next post instead.
    std::chrono::nanoseconds idle{}, in_flight{};
    for (auto const& log : logs) {
      // A step posts isend then irecv; the mailbox's isend copies the block (slow under TSan), so
      // a step's posting starts at its post_send.
      std::vector<std::chrono::nanoseconds> send, post, done;
      std::vector<std::chrono::steady_clock::time_point> send_at, post_at, done_at;
      for (auto const& e : log) {
        if (e.kind == event_kind::post_send) send.push_back(e.cpu), send_at.push_back(e.at);
        if (e.kind == event_kind::post_recv) post.push_back(e.cpu), post_at.push_back(e.at);
        if (e.kind == event_kind::wait_recv) done.push_back(e.cpu), done_at.push_back(e.at);
      }
      REQUIRE(send.size() == std::size_t(n - 1));
      REQUIRE(post.size() == std::size_t(n - 1));
      REQUIRE(done.size() == std::size_t(n - 1));
      for (std::size_t st = 1; st < post.size(); ++st) {
        CHECK(post_at[st] < done_at[st]);
        CHECK(done_at[st - 1] < send_at[st]);
        idle += send[st] - done[st - 1];   // between block st arriving and the next posting
        in_flight += done[st] - post[st];  // covers block st's compute
      }
    }
    CHECK(idle * 4 < in_flight);
  }

  TEST_CASE("ring attention rejects non-causal zigzag/stripe and mismatched layouts") {
    run_mailbox_ranks(2, [&](mailbox_comm& comm) {
      auto q = make_owned<float>(1, 4, 2, 8), o = make_owned<float>(1, 4, 2, 8);
      auto l = make_owned<float>(1, 2, 4);
      CHECK_THROWS_WITH_AS(wa::ring_forward(comm, wa::seq_layout::zigzag(2, 8), q.view(), q.view(),
                                            q.view(), o.view(), l.view()),
                           doctest::Contains("contiguous for non-causal"), weft::invalid_argument_error);
      CHECK_THROWS_WITH_AS(wa::ring_forward(comm, wa::seq_layout::contiguous(4, 16), q.view(), q.view(),
                                            q.view(), o.view(), l.view()),
                           doctest::Contains("argument `layout`"), weft::invalid_argument_error);
    });
  }
}

TEST_CASE("ring step planner: zigzag steps do equal work, contiguous skips exactly src > rank") {
  std::int64_t const c = 16;
  for (int n : {2, 4, 8})
    for (int r = 0; r < n; ++r)
      for (int s = 0; s < n; ++s) {
        int const src = (r - s + n) % n;
        auto const z = wa::plan_ring_step(wa::layout_kind::zigzag, true, r, src, c);
        CHECK(z.pairs() == (s == 0 ? c * c / 2 + c / 2 : c * c / 2));
        auto const ct = wa::plan_ring_step(wa::layout_kind::contiguous, true, r, src, c);
        CHECK(ct.skip == (src > r));
        auto const st = wa::plan_ring_step(wa::layout_kind::stripe, true, r, src, c);
        CHECK(st.pairs() == (src <= r ? c * (c + 1) / 2 : c * (c - 1) / 2));
      }
}
