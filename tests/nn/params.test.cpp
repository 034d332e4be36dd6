// Tests of weft/nn/params.hpp: the flat layout in definition order, lookups (and the error for an
// unknown name), zero_grad, views aliasing the flat buffers, and sharding-invariant initialisation:
// row, column and cyclic shards equal the slices of the whole parameter bit for bit, and the
// values do not depend on the definition order.
#include <weft/nn/params.hpp>

#include "nn_test.hpp"

#include <weft/core/tensor.hpp>

#include <doctest/doctest.h>

#include <cstring>
#include <string>

namespace {
using namespace nn_test;
using weft::index_t;
namespace nn = weft::nn;

// Address of element (i, j) of a rank-2 view (C++20 has no multi-argument operator[]).
template <class V>
auto P(V const& v, index_t i, index_t j) {
  return v.data_handle() + v.mapping()(i, j);
}

nn::param_layout small_layout() {
  nn::param_layout l;
  l.add("wte", {10, 4});
  weft::optim::param_info no_decay;
  no_decay.decay = false;
  l.add("ln.weight", {4}, no_decay);
  l.add("fc.w", {8, 6});
  return l;
}

TEST_CASE("nn/params: one flat layout in definition order") {
  auto const l = small_layout();
  REQUIRE(l.entries().size() == 3);
  CHECK(l.size() == 40 + 4 + 48);
  CHECK(l.at("wte").offset == 0);
  CHECK(l.at("ln.weight").offset == 40);
  CHECK(l.at("fc.w").offset == 44);
  CHECK(l.at("fc.w").info.count == 48);
  CHECK_FALSE(l.at("ln.weight").info.decay);
  CHECK(l.at("fc.w").info.init_stream == nn::stream_of("fc.w"));
  CHECK(nn::stream_of("fc.w") != nn::stream_of("fc.b"));
  auto const infos = l.infos();
  CHECK(weft::optim::total_count(infos) == l.size());
  auto const msg = expect_throw<weft::invalid_argument_error>([&] { (void)l.at("fc.b"); }, "fc.b");
  CHECK(msg.find("wte, ln.weight, fc.w") != std::string::npos);
  nn::param_layout dup = small_layout();
  expect_throw<weft::invalid_argument_error>([&] { dup.add("wte", {3}); }, "wte");
  expect_throw<weft::shape_error>([&] { dup.add("x", {1, 2, 3, 4, 5}); }, "`shape`");
  CHECK(dup.size() == l.size());
}

TEST_CASE("nn/params: views alias the flat buffers; zero_grad clears the gradients") {
  nn::param_store<float> s(small_layout());
  auto w = s.param<2>("fc.w");
  CHECK(w.extent(0) == 8);
  CHECK(w.extent(1) == 6);
  CHECK(w.data_handle() == s.params().data() + 44);
  auto g = s.grad<1>("ln.weight");
  CHECK(g.data_handle() == s.grads().data() + 40);
  for (auto& v : s.grads()) CHECK(v == 0.0f);
  g[2] = 5.0f;
  CHECK(s.grads()[42] == 5.0f);
  s.zero_grad();
  CHECK(s.grads()[42] == 0.0f);
  expect_throw<weft::shape_error>([&] { (void)s.param<1>("fc.w"); }, "fc.w");
  expect_throw<weft::invalid_argument_error>([&] { (void)s.grad<2>("nope"); }, "nope");
  s.init_constant("ln.weight", 1.0);
  for (float v : s.param_span("ln.weight")) CHECK(v == 1.0f);
  CHECK(s.params()[39] == 0.0f);
  CHECK(s.params()[44] == 0.0f);
}

template <class T>
void shards_equal_slices() {
  nn::param_store<T> s(small_layout());
  s.init_normal("fc.w", 42, 0.0, 0.02);
  s.init_uniform("wte", 42, -0.1, 0.1);
  auto const& e = s.layout().at("fc.w");
  auto const whole = s.template param<2>("fc.w");
  // The whole parameter is not constant (a fill that did nothing would pass the comparisons).
  CHECK(*P(whole, 0, 0) != *P(whole, 0, 1));
  // Row shard (column-parallel: rows 4..8), column shard (row-parallel: columns 3..6), cyclic
  // shard (every second row from 1).
  auto rows = weft::make_tensor<T>(4, 6);
  nn::init_normal(rows.view(), 42, e, 0.0, 0.02, weft::placement{{}, {4, 0}, {}});
  auto cols = weft::make_tensor<T>(8, 3);
  nn::init_normal(cols.view(), 42, e, 0.0, 0.02, weft::placement{{}, {0, 3}, {}});
  auto cyc = weft::make_tensor<T>(4, 6);
  nn::init_normal(cyc.view(), 42, e, 0.0, 0.02, weft::placement{{}, {1, 0}, {2, 1}});
  for (index_t i = 0; i < 4; ++i)
    for (index_t j = 0; j < 6; ++j) {
      CHECK(std::memcmp(&rows.data()[i * 6 + j], P(whole, 4 + i, j), sizeof(T)) == 0);
      CHECK(std::memcmp(&cyc.data()[i * 6 + j], P(whole, 1 + 2 * i, j), sizeof(T)) == 0);
    }
  for (index_t i = 0; i < 8; ++i)
    for (index_t j = 0; j < 3; ++j)
      CHECK(std::memcmp(&cols.data()[i * 3 + j], P(whole, i, 3 + j), sizeof(T)) == 0);
  // A uniform shard of wte (rows 5..10).
  auto const& te = s.layout().at("wte");
  auto const wte = s.template param<2>("wte");
  auto part = weft::make_tensor<T>(5, 4);
  nn::init_uniform(part.view(), 42, te, -0.1, 0.1, weft::placement{{}, {5, 0}, {}});
  for (index_t i = 0; i < 5; ++i)
    for (index_t j = 0; j < 4; ++j)
      CHECK(std::memcmp(&part.data()[i * 4 + j], P(wte, 5 + i, j), sizeof(T)) == 0);
  // Another definition order (fc.w first, a new parameter before it) gives the same fc.w.
  nn::param_layout other;
  other.add("extra", {3});
  other.add("fc.w", {8, 6});
  nn::param_store<T> s2(std::move(other));
  s2.init_normal("fc.w", 42, 0.0, 0.02);
  auto const w2 = s2.template param<2>("fc.w");
  for (index_t i = 0; i < 8; ++i)
    for (index_t j = 0; j < 6; ++j) CHECK(std::memcmp(P(w2, i, j), P(whole, i, j), sizeof(T)) == 0);
  // ...and another seed does not.
  s2.init_normal("fc.w", 43, 0.0, 0.02);
  CHECK(std::memcmp(P(w2, 0, 0), P(whole, 0, 0), sizeof(T)) != 0);
}

TEST_CASE("nn/params: a shard initialises bit-identically to the same slice of the whole") {
  shards_equal_slices<float>();
  shards_equal_slices<double>();
  shards_equal_slices<weft::bf16>();
}

}  // namespace
