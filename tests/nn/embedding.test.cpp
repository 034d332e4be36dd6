// Tests of weft/nn/embedding.hpp: lookups, the scatter-add backward with repeated ids (against f64
// finite differences and a hand count), position embeddings of packed sequences, and out-of-range
// ids and bad shapes refused before anything is written.
#include <weft/nn/embedding.hpp>

#include "nn_test.hpp"

#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <vector>

namespace {
using namespace nn_test;
using weft::index_t;
namespace nn = weft::nn;

TEST_CASE("nn/embedding: lookup and scatter-add backward against finite differences") {
  std::vector<std::int32_t> const ids = {3, 0, 3, 4, 3};
  auto table = random<double>(1, -1, 1, 5, 4);
  auto out = weft::make_tensor<double>(5, 4);
  auto r = random<double>(2, -1, 1, 5, 4);
  nn::embedding_forward(std::span<std::int32_t const>(ids), table, out);
  for (index_t t = 0; t < 5; ++t)
    for (index_t j = 0; j < 4; ++j) CHECK(out.data()[t * 4 + j] == table.data()[ids[t] * 4 + j]);
  auto const loss = [&] {
    nn::embedding_forward(std::span<std::int32_t const>(ids), table, out);
    return dot(r, out);
  };
  auto dtable = filled(table, 0.0);
  nn::embedding_backward(std::span<std::int32_t const>(ids), r, dtable);
  NN_CHECK_CLOSE(values(dtable), finite_diff(table, loss), 1e-6);
  // Row 3 holds r[0] + r[2] + r[4] in that order; rows 1 and 2 stay 0.
  for (index_t j = 0; j < 4; ++j) {
    CHECK(dtable.data()[3 * 4 + j] == (r.data()[j] + r.data()[8 + j]) + r.data()[16 + j]);
    CHECK(dtable.data()[1 * 4 + j] == 0.0);
  }
  // Accumulates.
  nn::embedding_backward(std::span<std::int32_t const>(ids), r, dtable);
  CHECK(dtable.data()[0] == 2 * r.data()[4]);
}

TEST_CASE("nn/embedding: learned positions of packed sequences, int64 ids, f32") {
  // Two documents of 3 and 2 tokens: positions restart at 0.
  std::vector<std::int64_t> const pos = {0, 1, 2, 0, 1};
  auto wpe = random<float>(3, -1, 1, 8, 6);
  auto out = weft::make_tensor<float>(5, 6);
  nn::embedding_forward(std::span<std::int64_t const>(pos), wpe, out);
  for (index_t j = 0; j < 6; ++j) {
    CHECK(out.data()[3 * 6 + j] == wpe.data()[j]);
    CHECK(out.data()[4 * 6 + j] == wpe.data()[6 + j]);
  }
  auto g = random<float>(4, -1, 1, 5, 6);
  auto dwpe = filled(wpe, 0.0);
  nn::embedding_backward(std::span<std::int64_t const>(pos), g, dwpe);
  for (index_t j = 0; j < 6; ++j) {
    CHECK(dwpe.data()[j] == g.data()[j] + g.data()[18 + j]);
    CHECK(dwpe.data()[2 * 6 + j] == g.data()[12 + j]);
    CHECK(dwpe.data()[3 * 6 + j] == 0.0f);
  }
}

TEST_CASE("nn/embedding: out-of-range ids and bad shapes throw, nothing written") {
  auto table = random<float>(5, -1, 1, 4, 3);
  auto out = filled(weft::make_tensor<float>(3, 3), 2.0);
  std::vector<std::int32_t> const bad = {1, 4, 0};
  auto msg = expect_throw<weft::invalid_argument_error>(
      [&] { nn::embedding_forward(std::span<std::int32_t const>(bad), table, out); }, "ids[1]");
  CHECK(msg.find("[0, 4)") != std::string::npos);
  CHECK(msg.find("actual 4") != std::string::npos);
  std::vector<std::int32_t> const neg = {-1, 0, 0};
  expect_throw<weft::invalid_argument_error>(
      [&] { nn::embedding_forward(std::span<std::int32_t const>(neg), table, out); }, "ids[0]");
  CHECK(untouched(out, 2.0));
  std::vector<std::int32_t> const ok = {1, 2};
  expect_throw<weft::shape_error>(
      [&] { nn::embedding_forward(std::span<std::int32_t const>(ok), table, out); }, "`out`");
  auto dtable = filled(table, 2.0);
  expect_throw<weft::invalid_argument_error>(
      [&] { nn::embedding_backward(std::span<std::int32_t const>(bad), out, dtable); }, "ids[1]");
  CHECK(untouched(dtable, 2.0));
}

}  // namespace
