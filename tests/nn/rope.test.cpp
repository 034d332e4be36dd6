// Tests of weft/nn/rope.hpp: a direct rotate-half formula, the backward against f64 finite
// differences (1e-6 normwise) and as the exact inverse, packed positions restarting at 0, f32
// against f64, and refused arguments that write nothing.
#include <weft/nn/rope.hpp>

#include "nn_test.hpp"

#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace {
using namespace nn_test;
using weft::index_t;
namespace nn = weft::nn;
using pos_span = std::span<std::int32_t const>;

TEST_CASE("nn/rope: rotate-half values, packed positions, inverse and finite differences") {
  index_t const t = 5, h = 2, d = 8;
  std::vector<std::int32_t> const pos = {0, 1, 7, 0, 1};  // two documents, packed
  auto x = random<double>(1, -1, 1, t, h * d);
  auto y = weft::make_tensor<double>(t, h * d);
  nn::rope_forward(x, pos_span(pos), d, y);
  // Position 0 is the identity.
  for (index_t j = 0; j < h * d; ++j) CHECK(y.data()[j] == x.data()[j]);
  // Row 2 (pos 7), head 1, pair i = 1: angle 7·10000^(-2/8).
  double const a = 7 * std::pow(10000.0, -2.0 / 8);
  double const x1 = x.data()[2 * 16 + 8 + 1], x2 = x.data()[2 * 16 + 8 + 1 + 4];
  CHECK(y.data()[2 * 16 + 8 + 1] ==
        doctest::Approx(x1 * std::cos(a) - x2 * std::sin(a)).epsilon(1e-14));
  CHECK(y.data()[2 * 16 + 8 + 5] ==
        doctest::Approx(x2 * std::cos(a) + x1 * std::sin(a)).epsilon(1e-14));
  // Norms of each head are kept.
  for (index_t r = 0; r < t; ++r)
    for (index_t hh = 0; hh < h; ++hh) {
      double nx = 0, ny = 0;
      for (index_t j = 0; j < d; ++j) {
        nx += x.data()[r * 16 + hh * d + j] * x.data()[r * 16 + hh * d + j];
        ny += y.data()[r * 16 + hh * d + j] * y.data()[r * 16 + hh * d + j];
      }
      CHECK(ny == doctest::Approx(nx).epsilon(1e-14));
    }
  // Backward is the inverse turn: it takes y back to x, in place.
  auto back = weft::make_tensor<double>(t, h * d);
  nn::rope_backward(y, pos_span(pos), d, back);
  NN_CHECK_CLOSE(values(back), values(x), 1e-15);
  auto r = random<double>(2, -1, 1, t, h * d);
  auto const loss = [&] {
    nn::rope_forward(x, pos_span(pos), d, y);
    return dot(r, y);
  };
  auto dx = filled(x, 3.0);
  nn::rope_backward(r, pos_span(pos), d, dx);
  NN_CHECK_CLOSE(values(dx), finite_diff(x, loss), 1e-6);
  auto copy = convert<double>(x);
  nn::rope_forward(x, pos_span(pos), d, x);  // in place gives what out of place gives
  nn::rope_forward(copy, pos_span(pos), d, y);
  NN_CHECK_CLOSE(values(x), values(y), 0.0);
}

TEST_CASE("nn/rope: f32 within 1e-5 of f64 up to position 300") {
  index_t const t = 6, d = 16;
  std::vector<std::int64_t> const pos = {0, 3, 50, 128, 255, 300};
  auto x = random<float>(3, -1, 1, t, 3 * d);
  auto xd = convert<double>(x);
  auto y = weft::make_tensor<float>(t, 3 * d);
  auto yd = weft::make_tensor<double>(t, 3 * d);
  nn::rope_forward(x, std::span<std::int64_t const>(pos), d, y);
  nn::rope_forward(xd, std::span<std::int64_t const>(pos), d, yd);
  NN_CHECK_CLOSE(values(y), values(yd), 1e-5);
  nn::rope_backward(x, std::span<std::int64_t const>(pos), d, y);
  nn::rope_backward(xd, std::span<std::int64_t const>(pos), d, yd);
  NN_CHECK_CLOSE(values(y), values(yd), 1e-5);
}

TEST_CASE("nn/rope: bad arguments throw, nothing written") {
  auto x = random<float>(4, -1, 1, 2, 12);
  auto y = filled(weft::make_tensor<float>(2, 12), 2.0);
  std::vector<std::int32_t> const pos = {0, 1};
  std::vector<std::int32_t> const neg = {0, -1};
  std::vector<std::int32_t> const short_pos = {0};
  expect_throw<weft::invalid_argument_error>([&] { nn::rope_forward(x, pos_span(pos), 3, y); },
                                             "`head_dim`");
  expect_throw<weft::shape_error>([&] { nn::rope_forward(x, pos_span(pos), 8, y); }, "`x`");
  expect_throw<weft::shape_error>([&] { nn::rope_forward(x, pos_span(short_pos), 4, y); },
                                  "`positions`");
  expect_throw<weft::invalid_argument_error>([&] { nn::rope_forward(x, pos_span(neg), 4, y); },
                                             "positions[1]");
  CHECK(untouched(y, 2.0));
}

}  // namespace
