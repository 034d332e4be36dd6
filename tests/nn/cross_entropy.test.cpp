// Tests of weft/nn/cross_entropy.hpp: the note's golden values, the fused backward against f64
// central finite differences (1e-6 normwise) with ignored targets, f32 against f64, logits of 1e4
// and -inf staying finite, and refused targets and shapes.
#include <weft/nn/cross_entropy.hpp>

#include "nn_test.hpp"

#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace {
using namespace nn_test;
using weft::index_t;
namespace nn = weft::nn;
using id_span = std::span<std::int32_t const>;

TEST_CASE("nn/cross_entropy: golden values and gradient") {
  // pipeline_executor_parallel.md §11 item 11: [[1,2,3],[0.5,-0.5,1]], targets [2,0].
  auto logits = weft::make_tensor<double>(2, 3);
  double const z[] = {1, 2, 3, 0.5, -0.5, 1};
  for (int i = 0; i < 6; ++i) logits.data()[i] = z[i];
  std::vector<std::int32_t> const t = {2, 0};
  auto lse = weft::make_tensor<double>(2);
  double const sum = nn::cross_entropy_forward(logits, id_span(t), 1.0, lse);
  CHECK(sum == doctest::Approx(0.4076059644443806 + 1.1041306053367284).epsilon(1e-15));
  double const mean =
      nn::cross_entropy_forward(logits, id_span(t), nn::mean_weight(id_span(t)), lse);
  CHECK(mean == doctest::Approx((0.4076059644443806 + 1.1041306053367284) / 2).epsilon(1e-15));
  auto d = weft::make_tensor<double>(2, 3);
  nn::cross_entropy_backward(logits, id_span(t), 1.0, lse, d);
  CHECK(d.data()[0] == doctest::Approx(0.0900306).epsilon(1e-6));
  CHECK(d.data()[1] == doctest::Approx(0.2447285).epsilon(1e-6));
  CHECK(d.data()[2] == doctest::Approx(-0.3347590).epsilon(1e-6));
}

TEST_CASE("nn/cross_entropy: f64 backward equals finite differences, ignored rows are zero") {
  auto logits = random<double>(1, -3, 3, 5, 7);
  std::vector<std::int32_t> const t = {6, -1, 0, 3, -100};
  auto lse = weft::make_tensor<double>(5);
  double const w = nn::mean_weight(id_span(t));
  CHECK(w == doctest::Approx(1.0 / 3));
  auto const loss = [&] { return nn::cross_entropy_forward(logits, id_span(t), w, lse); };
  loss();
  auto d = filled(logits, 9.0);
  nn::cross_entropy_backward(logits, id_span(t), w, lse, d);
  NN_CHECK_CLOSE(values(d), finite_diff(logits, loss), 1e-6);
  for (index_t j = 0; j < 7; ++j) {
    CHECK(d.data()[7 + j] == 0.0);
    CHECK(d.data()[28 + j] == 0.0);
  }
  // Rows of a counted token sum to 0 (softmax minus a one-hot).
  double s = 0;
  for (index_t j = 0; j < 7; ++j) s += d.data()[j];
  CHECK(std::abs(s) < 1e-15);
}

TEST_CASE("nn/cross_entropy: f32 within 1e-5 of f64; logits of 1e4 and -inf stay finite") {
  auto logits = random<float>(2, -5, 5, 6, 50);
  logits.data()[3] = 1e4f;  // row 0: one huge logit
  for (int j = 0; j < 50; ++j) logits.data()[50 + j] = j % 2 ? 1e4f : -1e4f;  // row 1: ±1e4
  logits.data()[100] = -std::numeric_limits<float>::infinity();               // row 2: a -inf logit
  std::vector<std::int32_t> const t = {3, 4, 5, 0, -1, 49};
  auto ld = convert<double>(logits);
  auto lse = weft::make_tensor<float>(6);
  auto lsed = weft::make_tensor<double>(6);
  double const w = nn::mean_weight(id_span(t));
  double const l32 = nn::cross_entropy_forward(logits, id_span(t), w, lse);
  double const l64 = nn::cross_entropy_forward(ld, id_span(t), w, lsed);
  CHECK(std::isfinite(l32));
  CHECK(l32 == doctest::Approx(l64).epsilon(1e-5));
  auto d = weft::make_tensor<float>(6, 50);
  auto dd = weft::make_tensor<double>(6, 50);
  nn::cross_entropy_backward(logits, id_span(t), w, lse, d);
  nn::cross_entropy_backward(ld, id_span(t), w, lsed, dd);
  for (double v : values(d)) CHECK(std::isfinite(v));
  NN_CHECK_CLOSE(values(d), values(dd), 1e-5);
  // Row 1's target (4, a -1e4 logit) costs 2e4 + log(25) per token weight.
  CHECK(static_cast<double>(lse.data()[1]) == doctest::Approx(1e4 + std::log(25.0)).epsilon(1e-7));
}

TEST_CASE("nn/cross_entropy: bad targets and shapes throw, nothing written") {
  auto logits = random<float>(3, -1, 1, 3, 4);
  auto lse = filled(weft::make_tensor<float>(3), 2.0);
  std::vector<std::int32_t> const bad = {0, 4, 1};
  expect_throw<weft::invalid_argument_error>(
      [&] { (void)nn::cross_entropy_forward(logits, id_span(bad), 1.0, lse); }, "targets[1]");
  std::vector<std::int32_t> const short_t = {0, 1};
  expect_throw<weft::shape_error>(
      [&] { (void)nn::cross_entropy_forward(logits, id_span(short_t), 1.0, lse); }, "`targets`");
  CHECK(untouched(lse, 2.0));
  std::vector<std::int32_t> const ok = {0, 1, 2};
  auto d = filled(weft::make_tensor<float>(3, 5), 2.0);
  expect_throw<weft::shape_error>(
      [&] { nn::cross_entropy_backward(logits, id_span(ok), 1.0, lse, d); }, "`dlogits`");
  CHECK(untouched(d, 2.0));
}

}  // namespace
