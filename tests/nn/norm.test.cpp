// Tests of weft/nn/norm.hpp: LayerNorm and RMSNorm gradients (input, weight, bias) against f64
// central finite differences (1e-6 normwise), f32 and bf16 against f64, zero-variance and far
// from zero rows, accumulation of the weight gradients, and refused calls that write nothing.
#include <weft/nn/norm.hpp>

#include "nn_test.hpp"

#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

namespace {
using namespace nn_test;
using weft::index_t;
namespace nn = weft::nn;

TEST_CASE("nn/norm: LayerNorm f64 gradients equal central finite differences") {
  for (bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    index_t const n = 3, c = 7;
    auto x = random<double>(1, -2, 2, n, c);
    auto w = random<double>(2, 0.5, 1.5, c);
    auto b = random<double>(3, -1, 1, with_bias ? c : 0);
    auto r = random<double>(4, -1, 1, n, c);
    auto y = weft::make_tensor<double>(n, c);
    auto mean = weft::make_tensor<double>(n);
    auto rstd = weft::make_tensor<double>(n);
    auto const loss = [&] {
      nn::layer_norm_forward(x, w, b, y, mean, rstd, 1e-5);
      return dot(r, y);
    };
    loss();
    auto dx = filled(x, 5.0);
    auto dw = filled(w, 0.0);
    auto db = filled(b, 0.0);
    nn::layer_norm_backward_input(r, x, w, mean, rstd, dx);
    nn::layer_norm_backward_weight(r, x, mean, rstd, dw, db);
    NN_CHECK_CLOSE(values(dx), finite_diff(x, loss), 1e-6);
    NN_CHECK_CLOSE(values(dw), finite_diff(w, loss), 1e-6);
    if (with_bias) NN_CHECK_CLOSE(values(db), finite_diff(b, loss), 1e-6);
    // Forward (recomputed: the differences left y at a perturbed point): each row of (y - b) / w
    // has mean 0 and variance var/(var + eps) ~ 1.
    loss();
    for (index_t i = 0; i < n; ++i) {
      double s = 0, s2 = 0;
      for (index_t j = 0; j < c; ++j) {
        double const v = (y.data()[i * c + j] - (with_bias ? b.data()[j] : 0.0)) / w.data()[j];
        s += v;
        s2 += v * v;
      }
      CHECK(std::abs(s / c) < 1e-12);
      CHECK(s2 / c == doctest::Approx(1.0).epsilon(1e-4));
    }
  }
}

TEST_CASE("nn/norm: RMSNorm f64 gradients equal central finite differences") {
  index_t const n = 4, c = 6;
  auto x = random<double>(5, -2, 2, n, c);
  auto w = random<double>(6, 0.5, 1.5, c);
  auto r = random<double>(7, -1, 1, n, c);
  auto y = weft::make_tensor<double>(n, c);
  auto rstd = weft::make_tensor<double>(n);
  auto const loss = [&] {
    nn::rms_norm_forward(x, w, y, rstd, 1e-6);
    return dot(r, y);
  };
  loss();
  auto dx = filled(x, 5.0);
  auto dw = filled(w, 0.0);
  nn::rms_norm_backward_input(r, x, w, rstd, dx);
  nn::rms_norm_backward_weight(r, x, rstd, dw);
  NN_CHECK_CLOSE(values(dx), finite_diff(x, loss), 1e-6);
  NN_CHECK_CLOSE(values(dw), finite_diff(w, loss), 1e-6);
  // Accumulation: a second call doubles dw.
  auto const once = values(dw);
  nn::rms_norm_backward_weight(r, x, rstd, dw);
  std::vector<double> twice = once;
  for (double& v : twice) v *= 2;
  NN_CHECK_CLOSE(values(dw), twice, 1e-15);
}

template <class T>
void norms_against_f64(double tol) {
  index_t const n = 5, c = 96;
  auto x = random<T>(10, -3, 3, n, c);
  auto w = random<T>(11, 0.5, 1.5, c);
  auto b = random<T>(12, -1, 1, c);
  auto dy = random<T>(13, -1, 1, n, c);
  auto xd = convert<double>(x);
  auto wd = convert<double>(w);
  auto bd = convert<double>(b);
  auto dyd = convert<double>(dy);
  using C = weft::compute_t<T>;
  auto y = weft::make_tensor<T>(n, c);
  auto yd = weft::make_tensor<double>(n, c);
  auto m = weft::make_tensor<C>(n);
  auto rs = weft::make_tensor<C>(n);
  auto md = weft::make_tensor<double>(n);
  auto rsd = weft::make_tensor<double>(n);
  auto dx = weft::make_tensor<T>(n, c);
  auto dxd = weft::make_tensor<double>(n, c);
  auto dw = filled(w, 0.0);
  auto db = filled(b, 0.0);
  auto dwd = filled(wd, 0.0);
  auto dbd = filled(bd, 0.0);
  nn::layer_norm_forward(x, w, b, y, m, rs);
  nn::layer_norm_forward(xd, wd, bd, yd, md, rsd);
  nn::layer_norm_backward_input(dy, x, w, m, rs, dx);
  nn::layer_norm_backward_input(dyd, xd, wd, md, rsd, dxd);
  nn::layer_norm_backward_weight(dy, x, m, rs, dw, db);
  nn::layer_norm_backward_weight(dyd, xd, md, rsd, dwd, dbd);
  NN_CHECK_CLOSE(values(y), values(yd), tol);
  NN_CHECK_CLOSE(values(dx), values(dxd), tol);
  NN_CHECK_CLOSE(values(dw), values(dwd), tol);
  NN_CHECK_CLOSE(values(db), values(dbd), tol);
  auto dw2 = filled(w, 0.0);
  auto dwd2 = filled(wd, 0.0);
  nn::rms_norm_forward(x, w, y, rs);
  nn::rms_norm_forward(xd, wd, yd, rsd);
  nn::rms_norm_backward_input(dy, x, w, rs, dx);
  nn::rms_norm_backward_input(dyd, xd, wd, rsd, dxd);
  nn::rms_norm_backward_weight(dy, x, rs, dw2);
  nn::rms_norm_backward_weight(dyd, xd, rsd, dwd2);
  NN_CHECK_CLOSE(values(y), values(yd), tol);
  NN_CHECK_CLOSE(values(dx), values(dxd), tol);
  NN_CHECK_CLOSE(values(dw2), values(dwd2), tol);
}

TEST_CASE("nn/norm: f32 within 1e-5 and bf16 within 8e-3 (normwise) of f64") {
  norms_against_f64<float>(1e-5);
  norms_against_f64<weft::bf16>(8e-3);
}

template <class T>
void degenerate_rows() {
  index_t const c = 8;
  auto x = weft::make_tensor<T>(3, c);
  for (index_t j = 0; j < c; ++j) {
    x.data()[j] = T(3.0f);                                             // zero variance
    x.data()[c + j] = T(0.0f);                                         // all zero
    x.data()[2 * c + j] = static_cast<T>(1e4 + (j % 2 ? 0.5 : -0.5));  // far from zero
  }
  auto w = random<T>(20, 0.5, 1.5, c);
  auto b = random<T>(21, -1, 1, c);
  auto dy = random<T>(22, -1, 1, 3, c);
  using C = weft::compute_t<T>;
  auto y = weft::make_tensor<T>(3, c);
  auto m = weft::make_tensor<C>(3);
  auto rs = weft::make_tensor<C>(3);
  auto dx = weft::make_tensor<T>(3, c);
  auto dw = filled(w, 0.0);
  auto db = filled(b, 0.0);
  nn::layer_norm_forward(x, w, b, y, m, rs);
  nn::layer_norm_backward_input(dy, x, w, m, rs, dx);
  nn::layer_norm_backward_weight(dy, x, m, rs, dw, db);
  for (double v : values(y)) CHECK(std::isfinite(v));
  for (double v : values(dx)) CHECK(std::isfinite(v));
  for (double v : values(dw)) CHECK(std::isfinite(v));
  // A constant row normalises to 0: y = b exactly.
  for (index_t j = 0; j < c; ++j)
    CHECK(static_cast<double>(y.data()[j]) == static_cast<double>(b.data()[j]));
  // The row at 1e4 ± 0.5 keeps its variance (two-pass statistics): n̂ = ±1 up to eps.
  for (index_t j = 0; j < c; ++j) {
    double const nh =
        (static_cast<double>(y.data()[2 * c + j]) - static_cast<double>(b.data()[j])) /
        static_cast<double>(w.data()[j]);
    CHECK(std::abs(std::abs(nh) - 1.0) < 1e-3);
  }
  nn::rms_norm_forward(x, w, y, rs);
  nn::rms_norm_backward_input(dy, x, w, rs, dx);
  for (double v : values(y)) CHECK(std::isfinite(v));
  for (double v : values(dx)) CHECK(std::isfinite(v));
}

TEST_CASE("nn/norm: zero-variance, zero and far-from-zero rows stay finite") {
  degenerate_rows<float>();
  degenerate_rows<double>();
}

TEST_CASE("nn/norm: bad shapes and eps throw naming the argument, writing nothing") {
  auto x = random<float>(30, -1, 1, 3, 4);
  auto w = random<float>(31, -1, 1, 4);
  auto b = random<float>(32, -1, 1, 4);
  auto y = filled(weft::make_tensor<float>(3, 4), 2.0);
  auto m = filled(weft::make_tensor<float>(3), 2.0);
  auto rs = filled(weft::make_tensor<float>(3), 2.0);
  auto bad_w = random<float>(33, -1, 1, 5);
  auto bad_m = filled(weft::make_tensor<float>(2), 2.0);
  auto bad_y = filled(weft::make_tensor<float>(4, 3), 2.0);
  expect_throw<weft::shape_error>([&] { nn::layer_norm_forward(x, bad_w, b, y, m, rs); },
                                  "`weight`");
  expect_throw<weft::shape_error>([&] { nn::layer_norm_forward(x, w, bad_w, y, m, rs); }, "`bias`");
  expect_throw<weft::shape_error>([&] { nn::layer_norm_forward(x, w, b, bad_y, m, rs); }, "`y`");
  expect_throw<weft::shape_error>([&] { nn::layer_norm_forward(x, w, b, y, bad_m, rs); }, "`mean`");
  expect_throw<weft::shape_error>([&] { nn::layer_norm_forward(x, w, b, y, m, bad_m); }, "`rstd`");
  expect_throw<weft::invalid_argument_error>(
      [&] { nn::layer_norm_forward(x, w, b, y, m, rs, 0.0); }, "`eps`");
  expect_throw<weft::shape_error>([&] { nn::rms_norm_forward(x, w, bad_y, rs); }, "`y`");
  expect_throw<weft::invalid_argument_error>([&] { nn::rms_norm_forward(x, w, y, rs, -1.0); },
                                             "`eps`");
  CHECK(untouched(y, 2.0));
  CHECK(untouched(m, 2.0));
  CHECK(untouched(rs, 2.0));
  auto dx = filled(weft::make_tensor<float>(3, 4), 2.0);
  auto dw = filled(weft::make_tensor<float>(4), 2.0);
  expect_throw<weft::shape_error>([&] { nn::layer_norm_backward_input(bad_y, x, w, m, rs, dx); },
                                  "`dy`");
  expect_throw<weft::shape_error>([&] { nn::layer_norm_backward_weight(x, x, m, rs, dw, bad_w); },
                                  "`dbias`");
  expect_throw<weft::shape_error>([&] { nn::rms_norm_backward_weight(x, x, bad_m, dw); }, "`rstd`");
  CHECK(untouched(dx, 2.0));
  CHECK(untouched(dw, 2.0));
}

}  // namespace
