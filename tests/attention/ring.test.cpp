// Ring attention (contiguous, zigzag, stripe) against single-device flash attention: out, lse, dq,
// dk, dv after extract_local for N = 1, 2, 3, 4, 8, causal and non-causal, MHA/GQA/MQA, odd chunk
// lengths; N = 1 bit-identical; protocol invariants observed through the communicator's log; and
// a user's minimal point-to-point communicator (tag, rank, size, isend, irecv) driving it.
#include <weft/attention/ring.hpp>
#include <weft/comm/work.hpp>

#include "distributed_testing.hpp"
#include "mailbox_comm.hpp"

#include <doctest/doctest.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace wa = weft::attention;
using namespace attention_testing;

// The smallest communicator ring attention accepts, as a user would write it (docs/extending.md
// shows the same type): the opt-in tag and four members, rank, size, isend and irecv, over FIFO
// queues shared by threads. isend copies the message and is complete at once; irecv's work takes
// the message when waited on, through a comm::work_state of its own.
namespace user_p2p {

namespace comm = weft::comm;

struct queues {
  explicit queues(int ranks) : n(ranks), box(std::size_t(ranks * ranks)) {}
  int n;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::deque<std::vector<std::byte>>> box;  // [src * n + dst]
};

class p2p {
 public:
  using communicator_concept = comm::point_to_point_tag;

  p2p(queues& q, int rank) : q_(&q), rank_(rank) {}

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return q_->n; }

  comm::work isend(comm::buffer_view in, int peer, comm::op_options = {}) {
    auto const* p = static_cast<std::byte const*>(in.data);
    {
      std::lock_guard lk(q_->mu);
      q_->box[std::size_t(rank_ * q_->n + peer)].emplace_back(p, p + in.bytes());
    }
    q_->cv.notify_all();
    return {};  // buffered: complete on return
  }

  comm::work irecv(comm::buffer_view out, int peer, comm::op_options = {}) {
    return comm::work(std::make_shared<receive>(*q_, out, std::size_t(peer * q_->n + rank_)));
  }

 private:
  struct receive final : comm::work_state {
    receive(queues& q, comm::buffer_view o, std::size_t s) : qs(&q), out(o), slot(s) {}
    bool wait_until(std::chrono::steady_clock::time_point deadline) override {
      if (complete) return true;
      std::unique_lock lk(qs->mu);
      auto& box = qs->box[slot];
      auto const ready = [&] { return !box.empty(); };
      if (deadline == std::chrono::steady_clock::time_point::max())
        qs->cv.wait(lk, ready);
      else if (!qs->cv.wait_until(lk, deadline, ready))
        return false;
      std::vector<std::byte> msg = std::move(box.front());
      box.pop_front();
      WEFT_EXPECTS(msg.size() == out.bytes(), "out", msg.size(), out.bytes());
      if (!msg.empty()) std::memcpy(out.data, msg.data(), msg.size());
      complete = true;
      return true;
    }
    [[nodiscard]] bool done() const noexcept override { return complete; }
    queues* qs;
    comm::buffer_view out;
    std::size_t slot;
    bool complete = false;
  };

  queues* q_;
  int rank_;
};

static_assert(comm::PointToPointIn<p2p, weft::host_space>);
static_assert(!comm::Collective<p2p>);

//! Runs f(comm) on n threads, one rank each, and rethrows the first exception.
template <class F>
void run(int n, F&& f) {
  queues q(n);
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      p2p c(q, r);
      try {
        f(c);
      } catch (...) {
        errors[std::size_t(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace user_p2p

namespace {

template <class T>
void run_ring(wa::seq_layout const& lay, global_problem<T> const& gp, wa::attention_options opt,
              double tol) {
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
    for (auto kind :
         {wa::layout_kind::contiguous, wa::layout_kind::zigzag, wa::layout_kind::stripe})
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
            wa::attention_options const opt{
                0.0, causal ? wa::causal_mode::top_left : wa::causal_mode::none, 1};
            global_problem<double> gp(2, s, hq, hk, 16, opt, seed++);
            run_ring(make_layout(kind, n, s), gp, opt, 1e-12);
          }
      }
  }

  TEST_CASE(
      "ring attention f32 within 1e-5 relative; minimum zigzag length; odd contiguous chunks") {
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
      wa::attention_options const opt{
          0.0, causal ? wa::causal_mode::top_left : wa::causal_mode::none, 1};
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
        auto dk = make_owned<weft::bf16>(b, s / n, hk, d),
             dv = make_owned<weft::bf16>(b, s / n, hk, d);
        wa::ring_backward(comm, lay, q.view(), k.view(), v.view(), o.view(), l.view(), g.view(),
                          dq.view(), dk.view(), dv.view(), opt);
      });
      for (auto const& log : bwd_logs) {
        int kv = 0, dkv = 0, other = 0;
        for (auto const& e : log)
          if (e.kind == event_kind::post_send)
            (e.bytes == kv_bytes ? kv : e.bytes == dkv_bytes ? dkv : other)++;
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
    auto q = random_tensor<float>(1, 1.0, 1, s, 2, 64),
         k = random_tensor<float>(2, 1.0, 1, s, 2, 64),
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
                           doctest::Contains("contiguous for non-causal"),
                           weft::invalid_argument_error);
      CHECK_THROWS_WITH_AS(wa::ring_forward(comm, wa::seq_layout::contiguous(4, 16), q.view(),
                                            q.view(), q.view(), o.view(), l.view()),
                           doctest::Contains("argument `layout`"), weft::invalid_argument_error);
    });
  }
}

TEST_SUITE("threads") {
  TEST_CASE(
      "a user's point-to-point communicator (rank, size, isend, irecv) drives ring attention") {
    wa::attention_options const causal{0.0, wa::causal_mode::top_left, 1};
    std::int64_t const n = 4, s = 2 * n * 6;
    global_problem<double> gp(2, s, 4, 2, 16, causal, 4242);
    auto const lay = wa::seq_layout::zigzag(int(n), s);
    dist_errors err;
    user_p2p::run(int(n), [&](user_p2p::p2p& comm) {
      int const r = comm.rank();
      auto q = gp.local(lay, r, gp.q), k = gp.local(lay, r, gp.k), v = gp.local(lay, r, gp.v),
           g = gp.local(lay, r, gp.g);
      std::int64_t const c = lay.local_length();
      rank_result<double> res{
          make_owned<double>(gp.b, c, gp.hq, gp.d), make_owned<double>(gp.b, c, gp.hq, gp.d),
          make_owned<double>(gp.b, c, gp.hk, gp.d), make_owned<double>(gp.b, c, gp.hk, gp.d),
          make_owned<wa::lse_t<double>>(gp.b, gp.hq, c)};
      wa::ring_forward(comm, lay, q.view(), k.view(), v.view(), res.o.view(), res.l.view(), causal);
      wa::ring_backward(comm, lay, q.view(), k.view(), v.view(), res.o.view(), res.l.view(),
                        g.view(), res.dq.view(), res.dk.view(), res.dv.view(), causal);
      err.add(gp, lay, r, res);
    });
    err.check(1e-12);
  }

  TEST_CASE("over point-to-point only, the entry check still makes every rank throw alike") {
    // The fingerprints travel around the ring (no all_gather): rank 2 passes another layout kind.
    std::vector<std::string> what(3);
    user_p2p::run(3, [&](user_p2p::p2p& comm) {
      int const r = comm.rank();
      auto const lay = r == 2 ? wa::seq_layout::contiguous(3, 12) : wa::seq_layout::stripe(3, 12);
      auto q = make_owned<float>(1, 4, 2, 8), o = make_owned<float>(1, 4, 2, 8);
      auto l = make_owned<wa::lse_t<float>>(1, 2, 4);
      try {
        wa::ring_forward(comm, lay, q.view(), q.view(), q.view(), o.view(), l.view(),
                         wa::attention_options{0.0, wa::causal_mode::top_left, 1});
      } catch (weft::invalid_argument_error const& e) {
        what[std::size_t(r)] = e.what();
      }
    });
    for (auto const& w : what) {
      INFO(w);
      CHECK(w.find("the same layout kind on every rank of the ring group (rank 0 has stripe)") !=
            std::string::npos);
      CHECK(w.find("contiguous on rank 2") != std::string::npos);
    }
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
