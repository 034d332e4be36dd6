// tests/attention/distributed_testing.hpp — the single-device truth and the per-rank comparison
// shared by the ring, Ulysses and USP tests: global q, k, v, dout; the local flash kernel's out,
// lse, dq, dk, dv on them; and the errors of each rank's results against extract_local of those.
#pragma once

#include <weft/attention/flash.hpp>
#include <weft/attention/sharding.hpp>

#include "attention_testing.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

namespace attention_testing {

template <class T>
struct global_problem {
  std::int64_t b, s, hq, hk, d;
  owned<T, 4> q, k, v, g, o, dq, dk, dv;
  owned<weft::attention::lse_t<T>, 3> l;

  global_problem(std::int64_t b_, std::int64_t s_, std::int64_t hq_, std::int64_t hk_,
                 std::int64_t d_, weft::attention::attention_options const& opt, std::uint64_t seed)
      : b(b_),
        s(s_),
        hq(hq_),
        hk(hk_),
        d(d_),
        q(random_tensor<T>(seed, 1.0, b, s, hq, d)),
        k(random_tensor<T>(seed + 1, 1.0, b, s, hk, d)),
        v(random_tensor<T>(seed + 2, 1.0, b, s, hk, d)),
        g(random_tensor<T>(seed + 3, 1.0, b, s, hq, d)),
        o(make_owned<T>(b, s, hq, d)),
        dq(make_owned<T>(b, s, hq, d)),
        dk(make_owned<T>(b, s, hk, d)),
        dv(make_owned<T>(b, s, hk, d)),
        l(make_owned<weft::attention::lse_t<T>>(b, hq, s)) {
    namespace wa = weft::attention;
    wa::flash_forward(q.view(), k.view(), v.view(), o.view(), l.view(), opt);
    wa::flash_backward(q.view(), k.view(), v.view(), o.view(), l.view(), g.view(), dq.view(),
                       dk.view(), dv.view(), opt);
  }

  template <class U, std::size_t R>
  owned<U, R> local(weft::attention::seq_layout const& lay, int rank, owned<U, R> const& x,
                    std::size_t axis = 1) const {
    auto e = x.ext;
    e[axis] = lay.local_length();
    owned<U, R> out(e);
    weft::attention::extract_local(lay, rank, x.view(), out.view(), axis);
    return out;
  }
};

//! One rank's results.
template <class T>
struct rank_result {
  owned<T, 4> o, dq, dk, dv;
  owned<weft::attention::lse_t<T>, 3> l;
};

//! Worst relative error (max |x - ref| / max |ref|) of out, dq, dk, dv and the worst absolute lse
//! error of rank results against the global problem's shards.
struct dist_errors {
  double out = 0, lse = 0, dq = 0, dk = 0, dv = 0;
  bool nonfinite = false;
  std::mutex mu;
  template <class T>
  void add(global_problem<T> const& gp, weft::attention::seq_layout const& lay, int rank,
           rank_result<T> const& r) {
    auto const eo = compare(r.o, gp.local(lay, rank, gp.o));
    auto const el = compare(r.l, gp.local(lay, rank, gp.l, 2));
    auto const eq = compare(r.dq, gp.local(lay, rank, gp.dq));
    auto const ek = compare(r.dk, gp.local(lay, rank, gp.dk));
    auto const ev = compare(r.dv, gp.local(lay, rank, gp.dv));
    std::lock_guard lk(mu);
    out = std::max(out, eo.rel());
    lse = std::max(lse, el.max_abs);
    dq = std::max(dq, eq.rel());
    dk = std::max(dk, ek.rel());
    dv = std::max(dv, ev.rel());
    nonfinite = nonfinite || eo.mismatch_nonfinite || el.mismatch_nonfinite ||
                eq.mismatch_nonfinite || ek.mismatch_nonfinite || ev.mismatch_nonfinite;
  }
  void check(double tol) const {
    CHECK(out <= tol);
    CHECK(lse <= tol * 4);
    CHECK(dq <= tol);
    CHECK(dk <= tol);
    CHECK(dv <= tol);
    CHECK_FALSE(nonfinite);
  }
};

}  // namespace attention_testing
