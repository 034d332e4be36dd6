// Tests of weft/nn/linear.hpp: f64 gradients against central finite differences (1e-6 normwise),
// accumulation of the weight gradients, the BLAS path against the plain loops, f32 and bf16
// against f64, strided and owning arguments, and refused calls (shape_error naming the argument,
// overlapping output) that write nothing.
#include <weft/nn/linear.hpp>

#include "nn_test.hpp"

#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <vector>

namespace {
using namespace nn_test;
using weft::index_t;
namespace nn = weft::nn;

TEST_CASE("nn/linear: f64 gradients equal central finite differences") {
  for (bool with_bias : {true, false}) {
    CAPTURE(with_bias);
    index_t const n = 3, in = 4, out = 5;
    auto x = random<double>(1, -1, 1, n, in);
    auto w = random<double>(2, -1, 1, out, in);
    auto b = random<double>(3, -1, 1, with_bias ? out : 0);
    auto r = random<double>(4, -1, 1, n, out);
    auto y = weft::make_tensor<double>(n, out);
    auto const loss = [&] {
      nn::linear_forward(x, w, b, y);
      return dot(r, y);
    };
    auto dx = filled(x, -7.0);  // overwritten
    auto dw = filled(w, 0.0);
    auto db = filled(b, 0.0);
    nn::linear_backward_input(r, w, dx);
    nn::linear_backward_weight(r, x, dw, db);
    NN_CHECK_CLOSE(values(dx), finite_diff(x, loss), 1e-6);
    NN_CHECK_CLOSE(values(dw), finite_diff(w, loss), 1e-6);
    if (with_bias) NN_CHECK_CLOSE(values(db), finite_diff(b, loss), 1e-6);
  }
}

TEST_CASE("nn/linear: forward matches a direct sum, and the weight gradients accumulate") {
  index_t const n = 2, in = 3, out = 2;
  auto x = random<double>(5, -1, 1, n, in);
  auto w = random<double>(6, -1, 1, out, in);
  auto b = random<double>(7, -1, 1, out);
  auto y = weft::make_tensor<double>(n, out);
  nn::linear_forward(x.view(), w.view(), b.view(), y.view());
  for (index_t i = 0; i < n; ++i)
    for (index_t o = 0; o < out; ++o) {
      double s = b.data()[o];
      for (index_t k = 0; k < in; ++k) s += x.data()[i * in + k] * w.data()[o * in + k];
      CHECK(y.data()[i * out + o] == doctest::Approx(s).epsilon(1e-14));
    }
  auto dy = random<double>(8, -1, 1, n, out);
  auto dw1 = filled(w, 0.0);
  auto db1 = filled(b, 0.0);
  nn::linear_backward_weight(dy, x, dw1, db1);
  auto dw2 = filled(w, 0.0);
  auto db2 = filled(b, 0.0);
  nn::linear_backward_weight(dy, x, dw2, db2);
  nn::linear_backward_weight(dy, x, dw2, db2);
  std::vector<double> twice_w = values(dw1), twice_b = values(db1);
  for (double& v : twice_w) v *= 2;
  for (double& v : twice_b) v *= 2;
  NN_CHECK_CLOSE(values(dw2), twice_w, 1e-15);
  NN_CHECK_CLOSE(values(db2), twice_b, 1e-15);
  // No bias gradient wanted: dw alone.
  auto dw3 = filled(w, 0.0);
  nn::linear_backward_weight(dy, x, dw3, nn::no_bias_grad<double>());
  NN_CHECK_CLOSE(values(dw3), values(dw1), 0.0);
}

template <class T>
void blas_against_loops(double tol) {
  index_t const n = 7, in = 33, out = 19;
  auto x = random<T>(10, -1, 1, n, in);
  auto w = random<T>(11, -1, 1, out, in);
  auto b = random<T>(12, -1, 1, out);
  auto dy = random<T>(13, -1, 1, n, out);
  auto y1 = weft::make_tensor<T>(n, out), y2 = weft::make_tensor<T>(n, out);
  auto dx1 = weft::make_tensor<T>(n, in), dx2 = weft::make_tensor<T>(n, in);
  auto dw1 = filled(w, 0.5);
  auto dw2 = filled(w, 0.5);
  auto db1 = filled(b, 0.25);
  auto db2 = filled(b, 0.25);
  namespace d = nn::detail;
  d::linear_forward_impl(x.view(), w.view(), b.view(), y1.view(), true);
  d::linear_forward_impl(x.view(), w.view(), b.view(), y2.view(), false);
  d::linear_backward_input_impl(dy.view(), w.view(), dx1.view(), true);
  d::linear_backward_input_impl(dy.view(), w.view(), dx2.view(), false);
  d::linear_backward_weight_impl(dy.view(), x.view(), dw1.view(), db1.view(), true);
  d::linear_backward_weight_impl(dy.view(), x.view(), dw2.view(), db2.view(), false);
  NN_CHECK_CLOSE(values(y2), values(y1), tol);
  NN_CHECK_CLOSE(values(dx2), values(dx1), tol);
  NN_CHECK_CLOSE(values(dw2), values(dw1), tol);
  NN_CHECK_CLOSE(values(db2), values(db1), 0.0);  // the bias sums never go through BLAS
  // The loops are a real product, not a copy of the BLAS path: check one element by hand.
  double s = static_cast<double>(b.data()[3]);
  for (index_t k = 0; k < in; ++k)
    s += static_cast<double>(x.data()[2 * in + k]) * static_cast<double>(w.data()[3 * in + k]);
  CHECK(static_cast<double>(y2.data()[2 * out + 3]) == doctest::Approx(s).epsilon(tol));
}

TEST_CASE("nn/linear: the plain-loop fallback equals the BLAS path") {
  INFO("weft::blas::enabled = " << weft::blas::enabled);
  blas_against_loops<double>(1e-14);
  blas_against_loops<float>(1e-6);
}

template <class T>
void against_f64(double tol) {
  index_t const n = 9, in = 64, out = 24;
  auto x = random<T>(20, -1, 1, n, in);
  auto w = random<T>(21, -0.5, 0.5, out, in);
  auto b = random<T>(22, -1, 1, out);
  auto dy = random<T>(23, -1, 1, n, out);
  auto xd = convert<double>(x);
  auto wd = convert<double>(w);
  auto bd = convert<double>(b);
  auto dyd = convert<double>(dy);
  auto y = weft::make_tensor<T>(n, out);
  auto yd = weft::make_tensor<double>(n, out);
  auto dx = weft::make_tensor<T>(n, in);
  auto dxd = weft::make_tensor<double>(n, in);
  auto dw = filled(w, 0.0);
  auto db = filled(b, 0.0);
  auto dwd = filled(wd, 0.0);
  auto dbd = filled(bd, 0.0);
  nn::linear_forward(x, w, b, y);
  nn::linear_forward(xd, wd, bd, yd);
  nn::linear_backward_input(dy, w, dx);
  nn::linear_backward_input(dyd, wd, dxd);
  nn::linear_backward_weight(dy, x, dw, db);
  nn::linear_backward_weight(dyd, xd, dwd, dbd);
  NN_CHECK_CLOSE(values(y), values(yd), tol);
  NN_CHECK_CLOSE(values(dx), values(dxd), tol);
  NN_CHECK_CLOSE(values(dw), values(dwd), tol);
  NN_CHECK_CLOSE(values(db), values(dbd), tol);
}

TEST_CASE("nn/linear: f32 within 1e-5 and bf16 within 4e-3 (normwise) of f64") {
  against_f64<float>(1e-5);
  against_f64<weft::bf16>(4e-3);  // one bf16 rounding of the output (2^-9 relative) dominates
}

TEST_CASE("nn/linear: strided views give what contiguous ones give") {
  index_t const n = 4, in = 5, out = 3;
  auto x = random<double>(30, -1, 1, n, in);
  auto w = random<double>(31, -1, 1, out, in);
  auto b = random<double>(32, -1, 1, out);
  // wt holds wᵀ; its transpose view is w with a non-unit column stride.
  auto wt = weft::make_tensor<double>(in, out);
  for (index_t o = 0; o < out; ++o)
    for (index_t k = 0; k < in; ++k) wt.data()[k * out + o] = w.data()[o * in + k];
  // y written into columns 1..out of a wider buffer.
  auto wide = filled(weft::make_tensor<double>(n, out + 2), 9.0);
  auto y = weft::make_tensor<double>(n, out);
  nn::linear_forward(x, w, b, y);
  nn::linear_forward(x, weft::transpose(wt.view()), b, weft::slice(wide.view(), 1, 1, 1 + out));
  for (index_t i = 0; i < n; ++i) {
    CHECK(wide.data()[i * (out + 2)] == 9.0);
    CHECK(wide.data()[i * (out + 2) + out + 1] == 9.0);
    for (index_t o = 0; o < out; ++o)
      CHECK(wide.data()[i * (out + 2) + 1 + o] ==
            doctest::Approx(y.data()[i * out + o]).epsilon(1e-15));
  }
}

TEST_CASE("nn/linear: bad shapes throw shape_error naming the argument and write nothing") {
  auto x = random<float>(40, -1, 1, 3, 4);
  auto w = random<float>(41, -1, 1, 5, 4);
  auto b = random<float>(42, -1, 1, 5);
  auto y = filled(weft::make_tensor<float>(3, 5), 3.0);
  auto bad_w = random<float>(43, -1, 1, 5, 3);
  auto bad_b = random<float>(44, -1, 1, 4);
  auto bad_y = filled(weft::make_tensor<float>(3, 4), 3.0);
  auto msg = expect_throw<weft::shape_error>([&] { nn::linear_forward(x, bad_w, b, y); }, "`w`");
  CHECK(msg.find("[5, 4]") != std::string::npos);  // expected
  CHECK(msg.find("[5, 3]") != std::string::npos);  // actual
  expect_throw<weft::shape_error>([&] { nn::linear_forward(x, w, bad_b, y); }, "`bias`");
  expect_throw<weft::shape_error>([&] { nn::linear_forward(x, w, b, bad_y); }, "`y`");
  CHECK(untouched(y, 3.0));
  CHECK(untouched(bad_y, 3.0));

  auto dy = random<float>(45, -1, 1, 3, 5);
  auto dx = filled(weft::make_tensor<float>(3, 4), 3.0);
  auto bad_dx = filled(weft::make_tensor<float>(4, 4), 3.0);
  auto bad_w_rows = random<float>(49, -1, 1, 4, 4);
  expect_throw<weft::shape_error>([&] { nn::linear_backward_input(dy, bad_w_rows, dx); }, "`w`");
  expect_throw<weft::shape_error>([&] { nn::linear_backward_input(dy, w, bad_dx); }, "`dx`");
  CHECK(untouched(dx, 3.0));
  CHECK(untouched(bad_dx, 3.0));

  auto dw = filled(weft::make_tensor<float>(5, 4), 3.0);
  auto db = filled(weft::make_tensor<float>(5), 3.0);
  auto bad_x = random<float>(46, -1, 1, 2, 4);
  auto bad_db = filled(weft::make_tensor<float>(6), 3.0);
  auto bad_dw = filled(weft::make_tensor<float>(4, 5), 3.0);
  expect_throw<weft::shape_error>([&] { nn::linear_backward_weight(dy, bad_x, dw, db); }, "`x`");
  expect_throw<weft::shape_error>([&] { nn::linear_backward_weight(dy, x, bad_dw, db); }, "`dw`");
  expect_throw<weft::shape_error>([&] { nn::linear_backward_weight(dy, x, dw, bad_db); },
                                  "`dbias`");
  CHECK(untouched(dw, 3.0));
  CHECK(untouched(db, 3.0));

  // An output that overlaps an input is refused too, before anything is written.
  auto buf = random<float>(47, -1, 1, 3, 4);
  auto wsq = random<float>(48, -1, 1, 4, 4);
  auto const before = values(buf);
  expect_throw<weft::invalid_argument_error>(
      [&] { nn::linear_forward(buf, wsq, nn::no_bias<float>(), buf); }, "`y`");
  CHECK(values(buf) == before);
}

}  // namespace
