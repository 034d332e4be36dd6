// Degenerate attention inputs that once gave plausible-looking values (issue 9, item 8): a NaN,
// infinite or negative scale, head dimension 0, and non-finite q or k are invalid_argument_errors
// naming the argument, thrown before o or lse is written. A non-finite v propagates. The packed
// (varlen) kernel, ring, Ulysses and USP (on two communicators and on a device_mesh) reject a NaN
// scale, an inf in q and head dimension 0 the same way, forward and backward, on every rank.
#include <weft/attention/flash.hpp>
#include <weft/attention/ring.hpp>
#include <weft/attention/ulysses.hpp>
#include <weft/attention/usp.hpp>
#include <weft/comm/threads/world.hpp>
#include <weft/mesh/device_mesh.hpp>

#include "mailbox_comm.hpp"
#include "support/run_ranks.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace wa = weft::attention;
using namespace attention_testing;

namespace {

struct qkvol {
  weft::tensor<float, 4> q, k, v, o;
  weft::tensor<float, 3> l;
  explicit qkvol(std::int64_t d = 8)
      : q(weft::make_tensor<float>(1, 4, 2, d)),
        k(weft::make_tensor<float>(1, 4, 2, d)),
        v(weft::make_tensor<float>(1, 4, 2, d)),
        o(weft::make_tensor<float>(1, 4, 2, d)),
        l(weft::make_tensor<float>(1, 2, 4)) {
    for (std::size_t i = 0; i < q.size(); ++i) {
      q.data()[i] = 0.25f * float(int(i % 7) - 3);
      k.data()[i] = 0.125f * float(int(i % 5) - 2);
      v.data()[i] = float(i % 3);
    }
    for (std::size_t i = 0; i < o.size(); ++i) o.data()[i] = 42.0f;
    for (std::size_t i = 0; i < l.size(); ++i) l.data()[i] = 42.0f;
  }
  void run(wa::attention_options const& opt = {}) {
    wa::flash_forward(q.view(), k.view(), v.view(), o.view(), l.view(), opt);
  }
  bool untouched() const {
    for (std::size_t i = 0; i < o.size(); ++i)
      if (o.data()[i] != 42.0f) return false;
    for (std::size_t i = 0; i < l.size(); ++i)
      if (l.data()[i] != 42.0f) return false;
    return true;
  }
};

//! The three defects every entry point must reject before it writes or sends anything.
enum class defect { nan_scale, inf_q, head_dim_0 };
constexpr defect all_defects[] = {defect::nan_scale, defect::inf_q, defect::head_dim_0};

std::string to_string(defect d) {
  switch (d) {
    case defect::nan_scale: return "NaN scale";
    case defect::inf_q: return "+inf in q";
    case defect::head_dim_0: return "head dimension 0";
  }
  return "?";
}

//! What the error message must hold: the argument, and for q its non-finite value and index
//! (element [0, 1, 0, 3] is spoiled).
char const* expected_message(defect d) {
  switch (d) {
    case defect::nan_scale: return "argument `opt.scale`";
    case defect::inf_q: return "inf at [0, 1, 0, 3]";
    case defect::head_dim_0: return "a head dimension of at least 1";
  }
  return "?";
}

//! One rank's (or one device's) arguments, [1, s, h, d] with d = 8 (0 for head_dim_0): finite
//! inputs, every output (and o, lse, which the backward reads) filled with 42; the defect applied.
struct spoiled_args {
  weft::tensor<float, 4> q, k, v, o, g, dq, dk, dv;
  weft::tensor<float, 3> l;
  wa::attention_options opt;
  static std::int64_t dim(defect def) { return def == defect::head_dim_0 ? 0 : 8; }
  spoiled_args(defect def, std::int64_t s, std::int64_t h, wa::causal_mode causal)
      : q(weft::make_tensor<float>(1, s, h, dim(def))),
        k(weft::make_tensor<float>(1, s, h, dim(def))),
        v(weft::make_tensor<float>(1, s, h, dim(def))),
        o(weft::make_tensor<float>(1, s, h, dim(def))),
        g(weft::make_tensor<float>(1, s, h, dim(def))),
        dq(weft::make_tensor<float>(1, s, h, dim(def))),
        dk(weft::make_tensor<float>(1, s, h, dim(def))),
        dv(weft::make_tensor<float>(1, s, h, dim(def))),
        l(weft::make_tensor<float>(1, h, s)) {
    for (std::size_t i = 0; i < q.size(); ++i) {
      q.data()[i] = 0.25f * float(int(i % 7) - 3);
      k.data()[i] = 0.125f * float(int(i % 5) - 2);
      v.data()[i] = float(i % 3);
      g.data()[i] = 0.5f * float(int(i % 4) - 2);
    }
    for (auto* t : {&o, &dq, &dk, &dv})
      for (std::size_t i = 0; i < t->size(); ++i) t->data()[i] = 42.0f;
    for (std::size_t i = 0; i < l.size(); ++i) l.data()[i] = 42.0f;
    opt.causal = causal;
    if (def == defect::nan_scale) opt.scale = std::numeric_limits<double>::quiet_NaN();
    if (def == defect::inf_q) q.data()[1 * h * 8 + 3] = std::numeric_limits<float>::infinity();
  }
  bool untouched() const {
    for (auto const* t : {&o, &dq, &dk, &dv})
      for (std::size_t i = 0; i < t->size(); ++i)
        if (t->data()[i] != 42.0f) return false;
    for (std::size_t i = 0; i < l.size(); ++i)
      if (l.data()[i] != 42.0f) return false;
    return true;
  }
};

//! Whether `call` throws an invalid_argument_error holding the defect's message; checks too that
//! it left every output untouched. Other exceptions (a hang turned timeout_error, say) propagate.
template <class F>
bool rejects(defect d, spoiled_args const& x, F&& call) {
  try {
    call();
  } catch (weft::invalid_argument_error const& e) {
    std::string const what = e.what();
    bool const named = what.find(expected_message(d)) != std::string::npos;
    CHECK_MESSAGE(named, what);
    CHECK_MESSAGE(x.untouched(), "an output was written before the error");
    return named;
  }
  return false;
}

}  // namespace

TEST_CASE("attention hardening: the scale is 0 (default) or finite and positive") {
  double const nan = std::numeric_limits<double>::quiet_NaN();
  double const inf = std::numeric_limits<double>::infinity();
  for (double bad : {nan, inf, -inf, -1.0}) {
    CAPTURE(bad);
    qkvol t;
    wa::attention_options opt;
    opt.scale = bad;
    CHECK_THROWS_WITH_AS(t.run(opt), doctest::Contains("opt.scale"), weft::invalid_argument_error);
    CHECK(t.untouched());
  }
  // The default and an explicit 1/sqrt(d) agree bit for bit.
  qkvol a, b;
  a.run();
  wa::attention_options opt;
  opt.scale = 1.0 / std::sqrt(8.0);
  b.run(opt);
  for (std::size_t i = 0; i < a.o.size(); ++i) CHECK(a.o.data()[i] == b.o.data()[i]);
}

TEST_CASE("attention hardening: head dimension 0 is rejected, not a row that sees no key") {
  qkvol t(0);
  CHECK_THROWS_WITH_AS(t.run(), doctest::Contains("head dimension"), weft::invalid_argument_error);
  CHECK(t.untouched());
}

TEST_CASE("attention hardening: a non-finite q or k is rejected with its index") {
  float const inf = std::numeric_limits<float>::infinity();
  float const nan = std::numeric_limits<float>::quiet_NaN();
  {
    qkvol t;
    t.q.data()[9] = inf;  // [0, 0, 1, 1]
    CHECK_THROWS_WITH_AS(t.run(), doctest::Contains("[0, 0, 1, 1]"), weft::invalid_argument_error);
    CHECK(t.untouched());
  }
  {
    qkvol t;
    t.k.data()[17] = nan;
    CHECK_THROWS_WITH_AS(t.run(), doctest::Contains("argument `k`"), weft::invalid_argument_error);
    CHECK(t.untouched());
  }
  {
    // v is not scanned: its NaN reaches o, where it is visible.
    qkvol t;
    t.v.data()[0] = nan;
    t.run();
    CHECK(std::isnan(t.o.data()[0]));
    CHECK(std::isfinite(t.l.data()[0]));
  }
}

TEST_CASE(
    "attention hardening: flash_backward and packed (varlen) flash reject a NaN scale, +inf in q, "
    "head dim 0") {
  std::vector<std::int64_t> const cu{0, 3, 8};
  for (defect const d : all_defects) {
    CAPTURE(to_string(d));
    {
      spoiled_args x(d, 8, 2, wa::causal_mode::top_left);
      CHECK(rejects(d, x, [&] { wa::flash_forward(x.q, x.k, x.v, x.o, x.l, x.opt); }));
    }
    {
      spoiled_args x(d, 8, 2, wa::causal_mode::top_left);
      CHECK(rejects(d, x, [&] {
        wa::flash_backward(x.q, x.k, x.v, x.o, x.l, x.g, x.dq, x.dk, x.dv, x.opt);
      }));
    }
    {
      spoiled_args x(d, 8, 2, wa::causal_mode::top_left);
      CHECK(
          rejects(d, x, [&] { wa::flash_forward_varlen(x.q, x.k, x.v, x.o, x.l, cu, cu, x.opt); }));
    }
    {
      spoiled_args x(d, 8, 2, wa::causal_mode::top_left);
      CHECK(rejects(d, x, [&] {
        wa::flash_backward_varlen(x.q, x.k, x.v, x.o, x.l, x.g, x.dq, x.dk, x.dv, cu, cu, x.opt);
      }));
    }
  }
}

TEST_SUITE("threads") {
  TEST_CASE("attention hardening: ring rejects a NaN scale, +inf in q, head dim 0 on every rank") {
    int const n = 2;
    auto const lay = wa::seq_layout::zigzag(n, 16);
    for (defect const d : all_defects) {
      CAPTURE(to_string(d));
      std::atomic<int> forward{0}, backward{0};
      run_mailbox_ranks(n, [&](mailbox_comm& comm) {
        spoiled_args x(d, lay.local_length(), 2, wa::causal_mode::top_left);
        forward +=
            rejects(d, x, [&] { wa::ring_forward(comm, lay, x.q, x.k, x.v, x.o, x.l, x.opt); });
        backward += rejects(d, x, [&] {
          wa::ring_backward(comm, lay, x.q, x.k, x.v, x.o, x.l, x.g, x.dq, x.dk, x.dv, x.opt);
        });
      });
      CHECK(forward == n);
      CHECK(backward == n);
    }
  }

  TEST_CASE(
      "attention hardening: Ulysses rejects a NaN scale, +inf in q, head dim 0 on every rank") {
    // Ulysses once checked only shapes: an inf in q passed, and every row that saw it came back as
    // if it had seen no key.
    int const n = 2;
    for (defect const d : all_defects) {
      CAPTURE(to_string(d));
      std::atomic<int> forward{0}, backward{0};
      run_mailbox_ranks(n, [&](mailbox_comm& comm) {
        spoiled_args x(d, 4, 2, wa::causal_mode::top_left);
        forward +=
            rejects(d, x, [&] { wa::ulysses_forward(comm, x.q, x.k, x.v, x.o, x.l, x.opt); });
        backward += rejects(d, x, [&] {
          wa::ulysses_backward(comm, x.q, x.k, x.v, x.o, x.l, x.g, x.dq, x.dk, x.dv, x.opt);
        });
      });
      CHECK(forward == n);
      CHECK(backward == n);
    }
  }

  TEST_CASE(
      "attention hardening: USP rejects a NaN scale, +inf in q, head dim 0 on every rank, on two "
      "communicators and on a device_mesh") {
    namespace wt = weft::comm::threads;
    int const u = 2, r = 2;
    auto const lay = wa::seq_layout::usp(u, r, wa::layout_kind::zigzag, 2 * u * r * 2);
    for (defect const d : all_defects) {
      CAPTURE(to_string(d));
      std::atomic<int> forward{0}, backward{0};
      run_usp_ranks(u, r, [&](mailbox_comm& uc, mailbox_comm& rc, int) {
        spoiled_args x(d, lay.local_length(), 2, wa::causal_mode::top_left);
        forward +=
            rejects(d, x, [&] { wa::usp_forward(uc, rc, lay, x.q, x.k, x.v, x.o, x.l, x.opt); });
        backward += rejects(d, x, [&] {
          wa::usp_backward(uc, rc, lay, x.q, x.k, x.v, x.o, x.l, x.g, x.dq, x.dk, x.dv, x.opt);
        });
      });
      CHECK(forward == u * r);
      CHECK(backward == u * r);
      std::atomic<int> mesh_forward{0}, mesh_backward{0};
      weft::test::run_ranks(u * r, [&](wt::communicator& world) {
        weft::device_mesh<wt::communicator> mesh(world, {r, u}, {"ring", "uly"});
        spoiled_args x(d, lay.local_length(), 2, wa::causal_mode::top_left);
        mesh_forward += rejects(d, x, [&] {
          wa::usp_forward(mesh, "uly", "ring", lay, x.q, x.k, x.v, x.o, x.l, x.opt);
        });
        mesh_backward += rejects(d, x, [&] {
          wa::usp_backward(mesh, "uly", "ring", lay, x.q, x.k, x.v, x.o, x.l, x.g, x.dq, x.dk, x.dv,
                           x.opt);
        });
      });
      CHECK(mesh_forward == u * r);
      CHECK(mesh_backward == u * r);
    }
  }
}
