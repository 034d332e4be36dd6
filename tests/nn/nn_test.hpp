// tests/nn/nn_test.hpp — what the nn tests share: random tensors from weft's keyed generator,
// central finite differences of a scalar loss L = Σ r ⊙ y, normwise comparisons, and the check that
// a refused call threw the right error naming the argument and wrote nothing.
#pragma once

#include <weft/core/dtype.hpp>
#include <weft/core/error.hpp>
#include <weft/core/random.hpp>
#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace nn_test {

using weft::index_t;

//! A host tensor of the given extents, uniform in [lo, hi) from stream `stream` of seed 1234.
template <class T, class... I>
weft::tensor<T, sizeof...(I)> random(std::uint64_t stream, double lo, double hi, I... extents) {
  auto t = weft::make_tensor<T>(static_cast<index_t>(extents)...);
  weft::fill_uniform(t.view(), weft::rng(1234, stream), lo, hi);
  return t;
}

//! A tensor of the same extents holding `src`'s values converted to U (f64 references of f32 or
//! bf16 inputs, f32 copies of f64 inputs).
template <class U, class T, std::size_t R>
weft::tensor<U, R> convert(weft::tensor<T, R> const& src) {
  auto out = weft::make_tensor<U>(src.extents());
  for (std::size_t i = 0; i < src.size(); ++i)
    out.data()[i] = static_cast<U>(static_cast<double>(src.data()[i]));
  return out;
}

template <class T, std::size_t R>
weft::tensor<T, R> filled(weft::tensor<T, R> const& like, double v) {
  auto out = weft::make_tensor<T>(like.extents());
  for (std::size_t i = 0; i < out.size(); ++i) out.data()[i] = static_cast<T>(v);
  return out;
}

template <class T, std::size_t R>
std::vector<double> values(weft::tensor<T, R> const& t) {
  std::vector<double> v(t.size());
  for (std::size_t i = 0; i < t.size(); ++i) v[i] = static_cast<double>(t.data()[i]);
  return v;
}

inline double max_abs(std::vector<double> const& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

//! max |got - want| / max |want| (0 / 0 = 0): the normwise error every tolerance here is stated in.
inline double normwise_error(std::vector<double> const& got, std::vector<double> const& want) {
  REQUIRE(got.size() == want.size());
  double d = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    d = std::max(d, std::abs(got[i] - want[i]));
  }
  double const s = max_abs(want);
  return s == 0 ? d : d / s;
}

#define NN_CHECK_CLOSE(got, want, tol)                                    \
  do {                                                                    \
    double const nn_err_ = ::nn_test::normwise_error((got), (want));      \
    INFO("normwise error " << nn_err_ << " against tolerance " << (tol)); \
    CHECK(nn_err_ <= (tol));                                              \
  } while (0)

//! Central differences dL/dp_i = (L(p + h e_i) - L(p - h e_i)) / 2h of a loss that reads `p`.
template <class T, std::size_t R>
std::vector<double> finite_diff(weft::tensor<T, R>& p, std::function<double()> const& loss,
                                double h = 1e-5) {
  std::vector<double> g(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    T const keep = p.data()[i];
    p.data()[i] = static_cast<T>(keep + h);
    double const up = loss();
    p.data()[i] = static_cast<T>(keep - h);
    double const down = loss();
    p.data()[i] = keep;
    g[i] = (up - down) / (2 * h);
  }
  return g;
}

//! Σ r ⊙ y in f64.
template <class T, class U, std::size_t R>
double dot(weft::tensor<T, R> const& r, weft::tensor<U, R> const& y) {
  REQUIRE(r.size() == y.size());
  double s = 0;
  for (std::size_t i = 0; i < r.size(); ++i)
    s += static_cast<double>(r.data()[i]) * static_cast<double>(y.data()[i]);
  return s;
}

//! Runs f, requires it to throw E whose message contains `name`, and returns the message.
template <class E, class F>
std::string expect_throw(F&& f, std::string const& name) {
  std::string msg;
  bool thrown = false;
  try {
    f();
  } catch (E const& e) {
    thrown = true;
    msg = e.what();
  }
  CHECK_MESSAGE(thrown, "expected an exception naming " << name);
  CHECK_MESSAGE(msg.find(name) != std::string::npos, msg);
  return msg;
}

//! True iff every element of t still has the bit pattern of v (a sentinel the refused call must
//! not have touched).
template <class T, std::size_t R>
bool untouched(weft::tensor<T, R> const& t, double v) {
  for (std::size_t i = 0; i < t.size(); ++i)
    if (!(static_cast<double>(t.data()[i]) == static_cast<double>(static_cast<T>(v)))) return false;
  return true;
}

}  // namespace nn_test
