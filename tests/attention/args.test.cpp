// What the attention entry points accept (issue 9, items 7 and 18): owning weft::tensor arguments
// as well as views (flash, varlen, ring, Ulysses, USP on two communicators and on a device_mesh),
// with results bit for bit those of the views; outputs that share memory with an input (or with
// another output) rejected before anything is written, while disjoint views interleaved in one
// packed buffer are accepted.
#include <weft/attention/flash.hpp>
#include <weft/attention/ring.hpp>
#include <weft/attention/ulysses.hpp>
#include <weft/attention/usp.hpp>
#include <weft/comm/threads/world.hpp>
#include <weft/mesh/device_mesh.hpp>

#include "attention_testing.hpp"
#include "distributed_testing.hpp"
#include "mailbox_comm.hpp"
#include "support/run_ranks.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

namespace wa = weft::attention;
using namespace attention_testing;

namespace {

template <class T, class... I>
weft::tensor<T, sizeof...(I)> random_owning(std::uint64_t seed, I... ext) {
  auto t = weft::make_tensor<T>(ext...);
  for (std::size_t i = 0; i < t.size(); ++i) t.data()[i] = T(uniform(seed, i));
  return t;
}

template <class A, class B>
bool same_bits(A const& a, B const& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(*a.data())) == 0;
}

//! An owning weft::tensor copy of a [B, S, H, D] test buffer.
template <class X>
weft::tensor<float, 4> owning_copy(X const& x) {
  auto t = weft::make_tensor<float>(x.extent(0), x.extent(1), x.extent(2), x.extent(3));
  weft::copy(t.view(), x.view());
  return t;
}

//! One rank's USP arguments as owning tensors (inputs const, as a caller's would often be) and
//! two sets of outputs: one passed as owning tensors, one as views.
struct usp_rank_args {
  weft::tensor<float, 4> const q, k, v, g;
  weft::tensor<float, 4> o, o2, dq, dq2, dk, dk2, dv, dv2;
  weft::tensor<float, 3> l, l2;
  usp_rank_args(global_problem<float> const& gp, wa::seq_layout const& lay, int rank)
      : q(owning_copy(gp.local(lay, rank, gp.q))),
        k(owning_copy(gp.local(lay, rank, gp.k))),
        v(owning_copy(gp.local(lay, rank, gp.v))),
        g(owning_copy(gp.local(lay, rank, gp.g))),
        o(weft::make_tensor<float>(gp.b, lay.local_length(), gp.hq, gp.d)),
        o2(weft::make_tensor<float>(gp.b, lay.local_length(), gp.hq, gp.d)),
        dq(weft::make_tensor<float>(gp.b, lay.local_length(), gp.hq, gp.d)),
        dq2(weft::make_tensor<float>(gp.b, lay.local_length(), gp.hq, gp.d)),
        dk(weft::make_tensor<float>(gp.b, lay.local_length(), gp.hk, gp.d)),
        dk2(weft::make_tensor<float>(gp.b, lay.local_length(), gp.hk, gp.d)),
        dv(weft::make_tensor<float>(gp.b, lay.local_length(), gp.hk, gp.d)),
        dv2(weft::make_tensor<float>(gp.b, lay.local_length(), gp.hk, gp.d)),
        l(weft::make_tensor<float>(gp.b, gp.hq, lay.local_length())),
        l2(weft::make_tensor<float>(gp.b, gp.hq, lay.local_length())) {}
  //! How many of the five outputs differ in a bit between the owning and the view calls.
  [[nodiscard]] int mismatches() const {
    return !same_bits(o, o2) + !same_bits(l, l2) + !same_bits(dq, dq2) + !same_bits(dk, dk2) +
           !same_bits(dv, dv2);
  }
};

}  // namespace

TEST_CASE("attention args: flash_forward and flash_backward take owning tensors like views") {
  std::int64_t const b = 2, s = 37, h = 4, hk = 2, d = 16;
  auto q = random_owning<float>(1, b, s, h, d);
  auto k = random_owning<float>(2, b, s, hk, d);
  auto v = random_owning<float>(3, b, s, hk, d);
  auto g = random_owning<float>(4, b, s, h, d);
  wa::attention_options opt;
  opt.causal = wa::causal_mode::top_left;
  // Owning tensors everywhere; const inputs give read-only views.
  auto o = weft::make_tensor<float>(b, s, h, d);
  auto l = weft::make_tensor<float>(b, h, s);
  auto const& cq = q;
  wa::flash_forward(cq, k, v, o, l, opt);
  auto dq = weft::make_tensor<float>(b, s, h, d), dk = weft::make_tensor<float>(b, s, hk, d),
       dv = weft::make_tensor<float>(b, s, hk, d);
  wa::flash_backward(cq, k, v, o, l, g, dq, dk, dv, opt);
  // The same calls on views.
  auto o2 = weft::make_tensor<float>(b, s, h, d);
  auto l2 = weft::make_tensor<float>(b, h, s);
  wa::flash_forward(q.view(), k.view(), v.view(), o2.view(), l2.view(), opt);
  auto dq2 = weft::make_tensor<float>(b, s, h, d), dk2 = weft::make_tensor<float>(b, s, hk, d),
       dv2 = weft::make_tensor<float>(b, s, hk, d);
  wa::flash_backward(q.view(), k.view(), v.view(), o2.view(), l2.view(), g.view(), dq2.view(),
                     dk2.view(), dv2.view(), opt);
  CHECK(same_bits(o, o2));
  CHECK(same_bits(l, l2));
  CHECK(same_bits(dq, dq2));
  CHECK(same_bits(dk, dk2));
  CHECK(same_bits(dv, dv2));
  // Packed sequences too.
  auto qp = random_owning<float>(5, 1, s, h, d);
  auto kp = random_owning<float>(6, 1, s, hk, d);
  auto vp = random_owning<float>(7, 1, s, hk, d);
  auto op = weft::make_tensor<float>(1, s, h, d);
  auto lp = weft::make_tensor<float>(1, h, s);
  std::vector<std::int64_t> const cu{0, 10, s};
  wa::flash_forward_varlen(qp, kp, vp, op, lp, cu, cu, opt);
  auto op2 = weft::make_tensor<float>(1, s, h, d);
  auto lp2 = weft::make_tensor<float>(1, h, s);
  wa::flash_forward_varlen(qp.view(), kp.view(), vp.view(), op2.view(), lp2.view(), cu, cu, opt);
  CHECK(same_bits(op, op2));
  CHECK(same_bits(lp, lp2));
}

TEST_CASE(
    "attention args: an output that shares memory with an input is rejected, nothing written") {
  std::int64_t const s = 8, h = 2, d = 4;
  auto q = random_owning<float>(1, 1, s, h, d);
  auto k = random_owning<float>(2, 1, s, h, d);
  auto v = random_owning<float>(3, 1, s, h, d);
  auto l = weft::make_tensor<float>(1, h, s);
  auto const q_before = std::vector<float>(q.data(), q.data() + q.size());
  // o is q itself.
  CHECK_THROWS_WITH_AS(wa::flash_forward(q.view(), k.view(), v.view(), q.view(), l.view()),
                       doctest::Contains("argument `o`"), weft::invalid_argument_error);
  CHECK(std::vector<float>(q.data(), q.data() + q.size()) == q_before);
  // o is v shifted by one element: a partial overlap.
  auto big = random_owning<float>(4, 1, s * h * d + 1);
  weft::tensor_view<float, 4> const vv(big.data(), 1, s, h, d), ov(big.data() + 1, 1, s, h, d);
  CHECK_THROWS_WITH_AS(wa::flash_forward(q.view(), k.view(), vv, ov, l.view()),
                       doctest::Contains("overlaps `v`"), weft::invalid_argument_error);
  // lse inside k's storage.
  weft::tensor_view<float, 3> const lk(k.data() + 3, 1, h, s);
  CHECK_THROWS_WITH_AS(wa::flash_forward(q.view(), k.view(), v.view(),
                                         weft::make_tensor<float>(1, s, h, d).view(), lk),
                       doctest::Contains("argument `lse`"), weft::invalid_argument_error);
  // Backward: dq aliasing dout, dk aliasing dv.
  auto o = weft::make_tensor<float>(1, s, h, d);
  wa::flash_forward(q.view(), k.view(), v.view(), o.view(), l.view());
  auto g = random_owning<float>(5, 1, s, h, d);
  auto dk = weft::make_tensor<float>(1, s, h, d), dv = weft::make_tensor<float>(1, s, h, d);
  auto const g_before = std::vector<float>(g.data(), g.data() + g.size());
  CHECK_THROWS_WITH_AS(wa::flash_backward(q.view(), k.view(), v.view(), o.view(), l.view(),
                                          g.view(), g.view(), dk.view(), dv.view()),
                       doctest::Contains("overlaps `dout`"), weft::invalid_argument_error);
  CHECK(std::vector<float>(g.data(), g.data() + g.size()) == g_before);
  auto dq = weft::make_tensor<float>(1, s, h, d);
  CHECK_THROWS_WITH_AS(wa::flash_backward(q.view(), k.view(), v.view(), o.view(), l.view(),
                                          g.view(), dq.view(), dk.view(), dk.view()),
                       doctest::Contains("argument `dv`"), weft::invalid_argument_error);
}

TEST_CASE("attention args: disjoint views interleaved in one packed buffer are accepted") {
  // A [1, S, 4, H, D] buffer holding q, k, v and o as its four slots: byte hulls intersect, no
  // element is shared. The result equals the one from separate tensors, bit for bit.
  std::int64_t const s = 19, h = 2, d = 8;
  auto packed = random_owning<float>(9, 1, s, 4, h, d);
  auto slot = [&](std::int64_t i) {
    using mapping = cuda::std::layout_stride::mapping<weft::dextents<4>>;
    return weft::strided_view<float, 4>(
        packed.data() + i * h * d,
        mapping(weft::dextents<4>(1, s, h, d),
                cuda::std::array<weft::index_t, 4>{s * 4 * h * d, 4 * h * d, d, 1}));
  };
  auto q = weft::make_tensor<float>(1, s, h, d), k = weft::make_tensor<float>(1, s, h, d),
       v = weft::make_tensor<float>(1, s, h, d);
  weft::copy(q.view(), slot(0));
  weft::copy(k.view(), slot(1));
  weft::copy(v.view(), slot(2));
  auto l = weft::make_tensor<float>(1, h, s), l2 = weft::make_tensor<float>(1, h, s);
  wa::flash_forward(slot(0), slot(1), slot(2), slot(3), l.view());
  auto o = weft::make_tensor<float>(1, s, h, d), o_packed = weft::make_tensor<float>(1, s, h, d);
  wa::flash_forward(q.view(), k.view(), v.view(), o.view(), l2.view());
  weft::copy(o_packed.view(), slot(3));
  CHECK(same_bits(o, o_packed));
  CHECK(same_bits(l, l2));
}

TEST_SUITE("threads") {
  TEST_CASE("attention args: ring and Ulysses take owning tensors, with the views' results") {
    wa::attention_options opt;
    opt.causal = wa::causal_mode::top_left;
    global_problem<float> const gp(1, 24, 4, 2, 8, opt, 77);
    auto const zig = wa::seq_layout::zigzag(2, gp.s);
    auto const con = wa::seq_layout::contiguous(2, gp.s);
    int mismatches = 0;
    std::mutex mu;
    run_mailbox_ranks(2, [&](mailbox_comm& comm) {
      int const r = comm.rank();
      std::int64_t const c = zig.local_length();
      auto owning = [&](auto const& x) {  // an owning weft::tensor copy of a test buffer
        auto t = weft::make_tensor<float>(x.extent(0), x.extent(1), x.extent(2), x.extent(3));
        weft::copy(t.view(), x.view());
        return t;
      };
      auto const q = owning(gp.local(zig, r, gp.q));
      auto const k = owning(gp.local(zig, r, gp.k));
      auto const v = owning(gp.local(zig, r, gp.v));
      auto const g = owning(gp.local(zig, r, gp.g));
      auto o = weft::make_tensor<float>(1, c, 4, 8), o2 = weft::make_tensor<float>(1, c, 4, 8);
      auto l = weft::make_tensor<float>(1, 4, c), l2 = weft::make_tensor<float>(1, 4, c);
      auto dq = weft::make_tensor<float>(1, c, 4, 8), dq2 = weft::make_tensor<float>(1, c, 4, 8);
      auto dk = weft::make_tensor<float>(1, c, 2, 8), dk2 = weft::make_tensor<float>(1, c, 2, 8);
      auto dv = weft::make_tensor<float>(1, c, 2, 8), dv2 = weft::make_tensor<float>(1, c, 2, 8);
      wa::ring_forward(comm, zig, q, k, v, o, l, opt);
      wa::ring_backward(comm, zig, q, k, v, o, l, g, dq, dk, dv, opt);
      wa::ring_forward(comm, zig, q.view(), k.view(), v.view(), o2.view(), l2.view(), opt);
      wa::ring_backward(comm, zig, q.view(), k.view(), v.view(), o2.view(), l2.view(), g.view(),
                        dq2.view(), dk2.view(), dv2.view(), opt);
      int bad = !same_bits(o, o2) + !same_bits(l, l2) + !same_bits(dq, dq2) + !same_bits(dk, dk2) +
                !same_bits(dv, dv2);
      auto const qc = owning(gp.local(con, r, gp.q));
      auto const kc = owning(gp.local(con, r, gp.k));
      auto const vc = owning(gp.local(con, r, gp.v));
      auto uo = weft::make_tensor<float>(1, c, 4, 8), uo2 = weft::make_tensor<float>(1, c, 4, 8);
      auto ul = weft::make_tensor<float>(1, 4, c), ul2 = weft::make_tensor<float>(1, 4, c);
      auto const gc = owning(gp.local(con, r, gp.g));
      auto udq = weft::make_tensor<float>(1, c, 4, 8), udq2 = weft::make_tensor<float>(1, c, 4, 8);
      auto udk = weft::make_tensor<float>(1, c, 2, 8), udk2 = weft::make_tensor<float>(1, c, 2, 8);
      auto udv = weft::make_tensor<float>(1, c, 2, 8), udv2 = weft::make_tensor<float>(1, c, 2, 8);
      wa::ulysses_forward(comm, qc, kc, vc, uo, ul, opt);
      wa::ulysses_backward(comm, qc, kc, vc, uo, ul, gc, udq, udk, udv, opt);
      wa::ulysses_forward(comm, qc.view(), kc.view(), vc.view(), uo2.view(), ul2.view(), opt);
      wa::ulysses_backward(comm, qc.view(), kc.view(), vc.view(), uo2.view(), ul2.view(), gc.view(),
                           udq2.view(), udk2.view(), udv2.view(), opt);
      bad += !same_bits(uo, uo2) + !same_bits(ul, ul2) + !same_bits(udq, udq2) +
             !same_bits(udk, udk2) + !same_bits(udv, udv2);
      std::lock_guard lk(mu);
      mismatches += bad;
    });
    CHECK(mismatches == 0);
  }

  TEST_CASE(
      "attention args: USP on two communicators takes owning tensors, with the views' results") {
    wa::attention_options opt;
    opt.causal = wa::causal_mode::top_left;
    int const u = 2, r = 2;
    global_problem<float> const gp(1, 2 * u * r * 3, 4, 2, 8, opt, 78);
    auto const lay = wa::seq_layout::usp(u, r, wa::layout_kind::zigzag, gp.s);
    std::atomic<int> mismatches{0};
    run_usp_ranks(u, r, [&](mailbox_comm& uc, mailbox_comm& rc, int g) {
      usp_rank_args x(gp, lay, g);
      wa::usp_forward(uc, rc, lay, x.q, x.k, x.v, x.o, x.l, opt);
      wa::usp_backward(uc, rc, lay, x.q, x.k, x.v, x.o, x.l, x.g, x.dq, x.dk, x.dv, opt);
      wa::usp_forward(uc, rc, lay, x.q.view(), x.k.view(), x.v.view(), x.o2.view(), x.l2.view(),
                      opt);
      wa::usp_backward(uc, rc, lay, x.q.view(), x.k.view(), x.v.view(), x.o2.view(), x.l2.view(),
                       x.g.view(), x.dq2.view(), x.dk2.view(), x.dv2.view(), opt);
      mismatches += x.mismatches();
    });
    CHECK(mismatches == 0);
  }

  TEST_CASE("attention args: USP on a device_mesh takes owning tensors, with the views' results") {
    // The mesh overloads once took their arguments by const reference, so an owning output did
    // not compile (its view() had const elements).
    namespace wt = weft::comm::threads;
    wa::attention_options opt;
    opt.causal = wa::causal_mode::top_left;
    int const u = 2, r = 2;
    global_problem<float> const gp(1, 2 * u * r * 3, 4, 2, 8, opt, 79);
    auto const lay = wa::seq_layout::usp(u, r, wa::layout_kind::zigzag, gp.s);
    std::atomic<int> mismatches{0};
    weft::test::run_ranks(u * r, [&](wt::communicator& world) {
      weft::device_mesh<wt::communicator> mesh(world, {r, u}, {"ring", "uly"});
      usp_rank_args x(gp, lay, wa::usp_layout_rank(mesh, "uly", "ring"));
      wa::usp_forward(mesh, "uly", "ring", lay, x.q, x.k, x.v, x.o, x.l, opt);
      wa::usp_backward(mesh, "uly", "ring", lay, x.q, x.k, x.v, x.o, x.l, x.g, x.dq, x.dk, x.dv,
                       opt);
      wa::usp_forward(mesh, "uly", "ring", lay, x.q.view(), x.k.view(), x.v.view(), x.o2.view(),
                      x.l2.view(), opt);
      wa::usp_backward(mesh, "uly", "ring", lay, x.q.view(), x.k.view(), x.v.view(), x.o2.view(),
                       x.l2.view(), x.g.view(), x.dq2.view(), x.dk2.view(), x.dv2.view(), opt);
      mismatches += x.mismatches();
    });
    CHECK(mismatches == 0);
  }
}
