// Tests of weft/nn/gpt.hpp: the whole model's backward against f64 central finite differences of
// its loss (every parameter of a 2-layer GQA GPT over two packed documents, with an ignored
// target), f32 against f64, GPT-2's initialisation rules, a few Adam-free SGD steps that lower
// the loss, and the argument checks.
#include <weft/nn/gpt.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

namespace {
using weft::index_t;
namespace nn = weft::nn;

nn::gpt_config tiny() {
  nn::gpt_config c;
  c.vocab = 11;
  c.context = 8;
  c.d_model = 8;
  c.heads = 2;
  c.kv_heads = 1;
  c.layers = 2;
  c.mlp_hidden = 12;
  return c;
}

struct batch_data {
  std::vector<std::int32_t> tokens{3, 7, 1, 9, 0, 4, 4, 10, 2};
  std::vector<std::int32_t> positions{0, 1, 2, 3, 0, 1, 2, 3, 4};
  std::vector<std::int32_t> targets{7, 1, 9, -1, 4, 4, 10, 2, 5};
  std::vector<std::int64_t> cu{0, 4, 9};
  nn::gpt_batch view() const { return {tokens, positions, targets, cu}; }
};

// GPT-2's initialisation in f64, scaled up and jittered so that every path (attention mixing,
// GELU's curvature, the norms' gains and biases) carries a gradient well above finite
// differences' noise, then rounded to T (f32 and f64 stores hold the same model).
template <class T>
nn::param_store<T> make_store(nn::gpt_config const& c, double scale_up) {
  nn::param_store<double> s(nn::gpt_layout(c));
  nn::gpt_init(s, c, 1234);
  nn::param_store<T> out(nn::gpt_layout(c));
  std::uint64_t k = 0;
  for (std::size_t i = 0; i < s.params().size(); ++i) {
    double const jitter = 0.05 * std::sin(0.7 * static_cast<double>(k++));
    out.params()[i] = static_cast<T>(s.params()[i] * scale_up + jitter);
  }
  return out;
}

}  // namespace

TEST_CASE("nn gpt: backward equals f64 central finite differences for every parameter") {
  auto const c = tiny();
  batch_data const data;
  auto store = make_store<double>(c, 4.0);
  nn::gpt<double> model(c, store);
  double const loss = model.forward(data.view());
  CHECK(std::isfinite(loss));
  model.backward();
  std::vector<double> const analytic(store.grads().begin(), store.grads().end());
  auto params = store.params();
  double const h = 1e-5;
  double worst = 0.0, largest = 0.0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    double const p0 = params[i];
    params[i] = p0 + h;
    double const up = model.forward(data.view());
    params[i] = p0 - h;
    double const down = model.forward(data.view());
    params[i] = p0;
    double const fd = (up - down) / (2 * h);
    worst = std::max(worst, std::abs(fd - analytic[i]));
    largest = std::max(largest, std::abs(fd));
  }
  MESSAGE("max |fd - analytic| = ", worst, " of max |grad| = ", largest);
  CHECK(largest > 1e-2);
  CHECK(worst <= 1e-6 * largest);
  // Every parameter group gets a gradient (a path left out of backward would show as zeros).
  for (auto const& e : store.layout().entries()) {
    auto const g = store.grad_span(e.name);
    CAPTURE(e.name);
    CHECK(std::any_of(g.begin(), g.end(), [](double x) { return x != 0.0; }));
  }
}

TEST_CASE("nn gpt: f32 loss and gradients within 1e-4 of f64") {
  auto const c = tiny();
  batch_data const data;
  auto s64 = make_store<double>(c, 4.0);
  auto s32 = make_store<float>(c, 4.0);
  nn::gpt<double> m64(c, s64);
  nn::gpt<float> m32(c, s32);
  double const l64 = m64.forward(data.view());
  double const l32 = m32.forward(data.view());
  CHECK(l32 == doctest::Approx(l64).epsilon(1e-5));
  m64.backward();
  m32.backward();
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < s64.grads().size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(s32.grads()[i]) - s64.grads()[i]));
    largest = std::max(largest, std::abs(s64.grads()[i]));
  }
  CHECK(worst <= 1e-4 * largest);
}

TEST_CASE("nn gpt: GPT-2 initialisation and a loss near log(V) that SGD lowers") {
  auto const c = tiny();
  batch_data const data;
  nn::param_store<double> store(nn::gpt_layout(c));
  nn::gpt_init(store, c, 7);
  for (double w : store.param_span("h0.ln1.w")) CHECK(w == 1.0);
  for (double b : store.param_span("h1.fc.b")) CHECK(b == 0.0);
  auto const spread = [&](char const* name) {
    double s = 0;
    auto const v = store.param_span(name);
    for (double x : v) s += x * x;
    return std::sqrt(s / static_cast<double>(v.size()));
  };
  CHECK(spread("h0.fc.w") == doctest::Approx(0.02).epsilon(0.15));
  CHECK(spread("h0.proj.w") == doctest::Approx(0.01).epsilon(0.15));  // 0.02 / sqrt(2·2)
  nn::gpt<double> model(c, store);
  double const first = model.forward(data.view());
  CHECK(first == doctest::Approx(std::log(11.0)).epsilon(0.02));
  double last = first;
  for (int step = 0; step < 20; ++step) {
    store.zero_grad();
    last = model.forward(data.view());
    model.backward();
    auto p = store.params();
    auto g = store.grads();
    for (std::size_t i = 0; i < p.size(); ++i) p[i] -= 0.5 * g[i];
  }
  CHECK(last < 0.8 * first);
}

TEST_CASE("nn gpt: bad configurations, stores and batches throw") {
  auto c = tiny();
  c.kv_heads = 3;
  CHECK_THROWS_AS(nn::gpt_layout(c), weft::invalid_argument_error);
  c = tiny();
  c.d_model = 9;
  CHECK_THROWS_AS(nn::gpt_layout(c), weft::invalid_argument_error);
  c = tiny();
  auto other = c;
  other.layers = 1;
  nn::param_store<float> small(nn::gpt_layout(other));
  CHECK_THROWS_AS(nn::gpt<float>(c, small), weft::shape_error);
  // The same parameter count and total, one name different: another layout all the same.
  nn::param_layout renamed;
  nn::param_layout const layout = nn::gpt_layout(c);
  for (auto const& e : layout.entries())
    renamed.add(e.name == "wpe" ? std::string("wpx") : e.name, e.shape, e.info);
  nn::param_store<float> impostor(renamed);
  CHECK_THROWS_WITH_AS(nn::gpt<float>(c, impostor),
                       doctest::Contains("argument `store parameter 1`: expected wpe"),
                       weft::shape_error);
  nn::param_store<float> store(nn::gpt_layout(c));
  nn::gpt<float> model(c, store);
  batch_data data;
  data.targets[2] = 11;
  CHECK_THROWS_AS(model.forward(data.view()), weft::invalid_argument_error);
  data = batch_data{};
  data.tokens[0] = 11;
  CHECK_THROWS_AS(model.forward(data.view()), weft::invalid_argument_error);
  data = batch_data{};
  data.positions.pop_back();
  CHECK_THROWS_AS(model.forward(data.view()), weft::shape_error);
}
