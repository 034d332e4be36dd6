// Tests of weft/nn/activation.hpp and weft/nn/residual.hpp: GELU (tanh form) and SwiGLU backward
// against f64 central finite differences (1e-6 normwise), GELU's known values, f32 against f64,
// large inputs staying finite, the residual add and its fork backward, in-place use, and refused
// shapes that write nothing.
#include <weft/nn/activation.hpp>
#include <weft/nn/residual.hpp>

#include "nn_test.hpp"

#include <weft/core/simd.hpp>
#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include "support/checks.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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

TEST_CASE("core/math tanh_fn: float within 4.5 ulp of tanh, exact saturation, NaN kept") {
  // Every 97th float in [0, inf) and its negative: error in units of the result's last place.
  // Under a sanitizer (17 s under ASan at -O0) every 9973rd, still every exponent.
  std::uint32_t const stride = weft::test::under_sanitizer ? 9973u : 97u;
  double worst = 0.0;
  int sign_errors = 0;
  for (std::uint32_t bits = 0; bits < 0x7f800000u; bits += stride) {
    float x = 0.0f;
    std::memcpy(&x, &bits, sizeof x);
    for (float s : {x, -x}) {
      double const want = std::tanh(static_cast<double>(s));
      float const got = weft::tanh_fn{}(s);
      float const w = static_cast<float>(want);
      double const ulp =
          std::max(static_cast<double>(std::nextafter(std::fabs(w), 2.0f) - std::fabs(w)), 1e-45);
      // Below float's normal range the error is absolute: tanh(x) = x there.
      double const err = std::fabs(static_cast<double>(got) - want);
      if (std::fabs(want) > 1.2e-38) worst = std::max(worst, err / ulp);
      sign_errors += std::signbit(got) != std::signbit(s) ? 1 : 0;
    }
  }
  CHECK(worst <= 4.5);
  CHECK(sign_errors == 0);
  MESSAGE("tanh_fn: largest error " << worst << " ulp");
  CHECK(weft::tanh_fn{}(9.0f) == std::tanh(9.0f));  // 1 − 3.05e-8 rounds below 1
  CHECK(weft::tanh_fn{}(9.5f) == 1.0f);
  CHECK(weft::tanh_fn{}(1e-5f) == 1e-5f);
  CHECK(weft::tanh_fn{}(-1e30f) == -1.0f);
  CHECK(weft::tanh_fn{}(std::numeric_limits<float>::infinity()) == 1.0f);
  CHECK(std::isnan(weft::tanh_fn{}(std::numeric_limits<float>::quiet_NaN())));
  CHECK(weft::tanh_fn{}(-0.0f) == 0.0f);
  CHECK(std::signbit(weft::tanh_fn{}(-0.0f)));
}

TEST_CASE("nn/activation: the vectorised f32 GELU rows follow the scalar functors") {
  // Bit for bit on the SSE2 baseline; the AVX2/AVX-512 versions differ only by FMA contraction.
  bool const exact = weft::detail::host_simd_level() == weft::detail::simd_level::base;
  // Rows of 37 (two blocks of 16 and a scalar tail of 5), values across the range, NaN and inf.
  std::vector<float> x(3 * 37), dy(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) *
                              std::pow(10.0, static_cast<double>(i % 9) - 3.0));
    dy[i] = static_cast<float>(std::cos(0.11 * static_cast<double>(i)));
  }
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[4] = std::numeric_limits<float>::infinity();
  x[5] = -std::numeric_limits<float>::infinity();
  x[6] = 3e4f;
  x[7] = -3e4f;
  std::vector<float> y(x.size()), dx(x.size());
  nn::gelu_forward(weft::tensor_view<float const, 2>(x.data(), 3, 37),
                   weft::tensor_view<float, 2>(y.data(), 3, 37));
  nn::gelu_backward(weft::tensor_view<float const, 2>(x.data(), 3, 37),
                    weft::tensor_view<float const, 2>(dy.data(), 3, 37),
                    weft::tensor_view<float, 2>(dx.data(), 3, 37));
  for (std::size_t i = 0; i < x.size(); ++i) {
    float const ys = nn::gelu_fn{}(x[i]);
    float const ds = nn::gelu_grad_fn{}(x[i]) * dy[i];
    CAPTURE(i);
    CAPTURE(x[i]);
    // Errors relative to the terms' size: 1 + tanh cancels for negative x.
    auto close = [&](float a, float b, float scale) {
      if (exact || !std::isfinite(b)) return std::memcmp(&a, &b, sizeof(float)) == 0;
      return std::fabs(a - b) <= 1e-6f * (std::fabs(b) + scale);
    };
    float const ax = std::fabs(x[i]);
    CHECK(close(y[i], ys, ax));
    CHECK(close(dx[i], ds, std::fabs(dy[i]) * (1.0f + ax)));
  }
  CHECK(std::isnan(y[3]));
  CHECK(y[4] == std::numeric_limits<float>::infinity());
  CHECK(dx[4] == dy[4]);  // gelu'(inf) = 1
  CHECK(dx[5] == 0.0f);   // gelu'(-inf) = 0
  CHECK(std::isfinite(dx[6]));
}
