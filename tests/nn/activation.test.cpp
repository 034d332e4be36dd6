// Tests of weft/nn/activation.hpp and weft/nn/residual.hpp: GELU (tanh form) and SwiGLU backward
// against f64 central finite differences (1e-6 normwise), GELU's known values, f32 against f64,
// large inputs staying finite, the residual add and its fork backward, in-place use, and refused
// shapes that write nothing.
#include <weft/nn/activation.hpp>
#include <weft/nn/residual.hpp>

#include "nn_test.hpp"

#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <vector>

namespace {
using namespace nn_test;
using weft::index_t;
namespace nn = weft::nn;

TEST_CASE("nn/activation: GELU values and f64 gradient against finite differences") {
  // torch.nn.functional.gelu(x, approximate="tanh") at 1 and -2.
  CHECK(weft::nn::gelu_fn{}(1.0) == doctest::Approx(0.8411919906082768).epsilon(1e-15));
  CHECK(weft::nn::gelu_fn{}(-2.0) == doctest::Approx(-0.04540230591222).epsilon(1e-12));
  CHECK(weft::nn::gelu_fn{}(0.0) == 0.0);
  auto x = random<double>(1, -4, 4, 3, 5);
  auto r = random<double>(2, -1, 1, 3, 5);
  auto y = weft::make_tensor<double>(3, 5);
  auto const loss = [&] {
    nn::gelu_forward(x, y);
    return dot(r, y);
  };
  auto dx = filled(x, 7.0);
  nn::gelu_backward(x, r, dx);
  NN_CHECK_CLOSE(values(dx), finite_diff(x, loss), 1e-6);
}

TEST_CASE("nn/activation: SwiGLU f64 gradients against finite differences") {
  auto a = random<double>(3, -4, 4, 4, 3);
  auto b = random<double>(4, -2, 2, 4, 3);
  auto r = random<double>(5, -1, 1, 4, 3);
  auto y = weft::make_tensor<double>(4, 3);
  auto const loss = [&] {
    nn::swiglu_forward(a, b, y);
    return dot(r, y);
  };
  loss();
  for (index_t i = 0; i < 12; ++i) {
    double const av = a.data()[i];
    CHECK(y.data()[i] == doctest::Approx(av / (1 + std::exp(-av)) * b.data()[i]).epsilon(1e-14));
  }
  auto da = filled(a, 7.0);
  auto db = filled(b, 7.0);
  nn::swiglu_backward(a, b, r, da, db);
  NN_CHECK_CLOSE(values(da), finite_diff(a, loss), 1e-6);
  NN_CHECK_CLOSE(values(db), finite_diff(b, loss), 1e-6);
}

TEST_CASE("nn/activation: f32 within 1e-6 of f64; large inputs stay finite") {
  auto x = random<float>(6, -6, 6, 8, 32);
  auto b = random<float>(7, -2, 2, 8, 32);
  auto dy = random<float>(8, -1, 1, 8, 32);
  // Saturated and huge inputs in the first row.
  float const extremes[] = {-1e4f, 1e4f, -80.0f, 80.0f, -1e30f, 1e30f};
  for (int k = 0; k < 6; ++k) x.data()[k] = extremes[k];
  auto xd = convert<double>(x);
  auto bd = convert<double>(b);
  auto dyd = convert<double>(dy);
  auto y = weft::make_tensor<float>(8, 32);
  auto yd = weft::make_tensor<double>(8, 32);
  auto dx = weft::make_tensor<float>(8, 32);
  auto dxd = weft::make_tensor<double>(8, 32);
  nn::gelu_forward(x, y);
  nn::gelu_forward(xd, yd);
  nn::gelu_backward(x, dy, dx);
  nn::gelu_backward(xd, dyd, dxd);
  for (int k = 0; k < 6; ++k) CAPTURE(y.data()[k]);
  NN_CHECK_CLOSE(values(y), values(yd), 1e-6);
  NN_CHECK_CLOSE(values(dx), values(dxd), 1e-6);
  auto db = weft::make_tensor<float>(8, 32);
  auto dbd = weft::make_tensor<double>(8, 32);
  nn::swiglu_forward(x, b, y);
  nn::swiglu_forward(xd, bd, yd);
  nn::swiglu_backward(x, b, dy, dx, db);
  nn::swiglu_backward(xd, bd, dyd, dxd, dbd);
  // 1e30·2 is out of f32 range, as in f64's 2e30: compare rows 1.. only for SwiGLU.
  auto tail = [](std::vector<double> v) { return std::vector<double>(v.begin() + 32, v.end()); };
  NN_CHECK_CLOSE(tail(values(y)), tail(values(yd)), 1e-6);
  NN_CHECK_CLOSE(tail(values(dx)), tail(values(dxd)), 1e-6);
  NN_CHECK_CLOSE(tail(values(db)), tail(values(dbd)), 1e-6);
  for (int k = 0; k < 4; ++k) {
    CHECK(std::isfinite(y.data()[k]));
    CHECK(std::isfinite(dx.data()[k]));
    CHECK(std::isfinite(db.data()[k]));
  }
}

TEST_CASE("nn/residual: add, fork backward, in place") {
  auto a = random<double>(9, -1, 1, 2, 3);
  auto b = random<double>(10, -1, 1, 2, 3);
  auto y = weft::make_tensor<double>(2, 3);
  nn::residual_forward(a, b, y);
  for (index_t i = 0; i < 6; ++i) CHECK(y.data()[i] == a.data()[i] + b.data()[i]);
  // In place: y = a.
  auto const av = values(a);
  nn::residual_forward(a, b, a);
  for (index_t i = 0; i < 6; ++i)
    CHECK(a.data()[i] == av[static_cast<std::size_t>(i)] + b.data()[i]);
  // y = x + f(x) with f = gelu: dx = dy + gelu'(x)·dy, checked by finite differences.
  auto x = random<double>(11, -2, 2, 2, 3);
  auto r = random<double>(12, -1, 1, 2, 3);
  auto f = weft::make_tensor<double>(2, 3);
  auto const loss = [&] {
    nn::gelu_forward(x, f);
    nn::residual_forward(x, f, y);
    return dot(r, y);
  };
  auto dbranch = weft::make_tensor<double>(2, 3);
  nn::gelu_backward(x, r, dbranch);
  auto dx = filled(x, 3.0);
  nn::residual_backward(r, dbranch, dx);
  NN_CHECK_CLOSE(values(dx), finite_diff(x, loss), 1e-6);
  nn::residual_backward(r, dbranch, dbranch);  // in place
  NN_CHECK_CLOSE(values(dbranch), values(dx), 0.0);
}

TEST_CASE("nn/activation, nn/residual: bad shapes and overlaps are refused, nothing written") {
  auto x = random<float>(13, -1, 1, 2, 3);
  auto y = filled(weft::make_tensor<float>(3, 2), 4.0);
  auto b = random<float>(14, -1, 1, 2, 4);
  expect_throw<weft::shape_error>([&] { nn::gelu_forward(x, y); }, "`y`");
  expect_throw<weft::shape_error>([&] { nn::swiglu_forward(x, b, y); }, "`b`");
  expect_throw<weft::shape_error>([&] { nn::residual_forward(x, x, y); }, "`y`");
  expect_throw<weft::shape_error>([&] { nn::residual_backward(x, b, x); }, "`dbranch`");
  CHECK(untouched(y, 4.0));
  // A shifted overlap (y = x one column on) is refused.
  auto wide = random<float>(15, -1, 1, 2, 4);
  auto const before = values(wide);
  expect_throw<weft::invalid_argument_error>(
      [&] {
        nn::gelu_forward(weft::slice(wide.view(), 1, 0, 3), weft::slice(wide.view(), 1, 1, 4));
      },
      "`y`");
  CHECK(values(wide) == before);
}

}  // namespace
