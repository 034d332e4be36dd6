// Degenerate attention inputs that once gave plausible-looking values (issue 9, item 8): a NaN,
// infinite or negative scale, head dimension 0, and non-finite q or k are invalid_argument_errors
// naming the argument, thrown before o or lse is written. A non-finite v propagates.
#include <weft/attention/flash.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>

namespace wa = weft::attention;

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
