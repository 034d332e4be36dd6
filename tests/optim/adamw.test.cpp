// Tests of weft/optim/adamw.hpp: the note's golden values in f64 (θ1 = 0.899000002, θ2, θ3, m1, v1;
// the folded ε-hat form must differ; the update per lr for g = 1e-9), a multi-step trace against an
// independent textbook implementation, f32 against torch's float32 operation sequence and against
// f64, the decay flag, and argument checks that name the argument.
#include "support/checks.hpp"
#include <weft/optim/adamw.hpp>

#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace {
using weft::optim::adamw;
using weft::optim::adamw_options;
using weft::optim::param_info;
using weft::test::close_rel;
using weft::test::has;
using weft::test::message_of;

adamw_options golden_options() {
  adamw_options o;
  o.lr = 0.1;
  o.beta1 = 0.9;
  o.beta2 = 0.999;
  o.eps = 1e-8;
  o.weight_decay = 0.01;
  return o;
}

// The textbook form, written independently of the header: m̂ = m/(1 − β1^t), v̂ = v/(1 − β2^t),
// θ ← θ(1 − lr·λ) − lr·m̂/(sqrt(v̂) + ε), with a per-element decay flag.
struct naive_adamw {
  adamw_options o;
  std::vector<double> m, v;
  std::vector<bool> decay;
  int t = 0;
  void step(std::vector<double>& p, std::vector<double> const& g, double lr) {
    ++t;
    for (std::size_t i = 0; i < p.size(); ++i) {
      m[i] = o.beta1 * m[i] + (1 - o.beta1) * g[i];
      v[i] = o.beta2 * v[i] + (1 - o.beta2) * g[i] * g[i];
      double const mhat = m[i] / (1 - std::pow(o.beta1, t));
      double const vhat = v[i] / (1 - std::pow(o.beta2, t));
      double const wd = decay[i] ? lr * o.weight_decay * p[i] : 0.0;
      p[i] = p[i] - lr * (mhat / (std::sqrt(vhat) + o.eps)) - wd;
    }
  }
};
}  // namespace

TEST_CASE("adamw: the note's golden values in f64 (torch's single-tensor update)") {
  adamw<double> opt(1, golden_options());
  std::vector<double> theta{1.0};
  double const grads[3] = {0.5, -0.25, 0.125};
  double const want[3] = {0.899000002, 0.8714672987058463, 0.8365529176159483};
  for (int k = 0; k < 3; ++k) {
    std::vector<double> g{grads[k]};
    opt.step(theta, g);
    CHECK(opt.steps() == k + 1);
    CHECK(close_rel(theta[0], want[k], 1e-12));
    if (k == 0) {
      CHECK(close_rel(opt.m()[0], 0.05, 1e-12));
      CHECK(close_rel(opt.v()[0], 2.5e-4, 1e-12));
    }
  }
}

TEST_CASE("adamw: the folded eps-hat form gives 0.8990000632455132, which weft must not") {
  auto const o = golden_options();
  // ε-hat: lr_t = lr·sqrt(1 − β2)/(1 − β1), θ ← θ(1 − lr·λ) − lr_t·m/(sqrt(v) + ε) at t = 1.
  double const m = (1 - o.beta1) * 0.5, v = (1 - o.beta2) * 0.25;
  double const lr_t = o.lr * std::sqrt(1 - o.beta2) / (1 - o.beta1);
  double const hat = 1.0 * (1 - o.lr * o.weight_decay) - lr_t * m / (std::sqrt(v) + o.eps);
  CHECK(close_rel(hat, 0.8990000632455132, 1e-12));
  adamw<double> opt(1, o);
  std::vector<double> theta{1.0}, g{0.5};
  opt.step(theta, g);
  // The two differ by 6.1e-8 absolute, 7e-8 relative: far above the 1e-12 agreement with torch.
  CHECK(std::abs(theta[0] - hat) > 5e-8);
  CHECK_FALSE(close_rel(theta[0], hat, 1e-8));
}

TEST_CASE("adamw: step-1 update per lr for g = 1e-9 is 0.09090909090909091 (not 0.00315)") {
  adamw_options o;
  o.weight_decay = 0.0;
  adamw<double> opt(1, o);
  std::vector<double> theta{0.0}, g{1e-9};
  double const lr = 1e-3;
  opt.step(theta, g, lr);
  CHECK(close_rel(-theta[0] / lr, 0.09090909090909091, 1e-12));
}

TEST_CASE("adamw: llm.c's form (θ − lr(m̂/(sqrt(v̂)+ε) + λθ)) agrees within 1 ulp per step") {
  auto const o = golden_options();
  adamw<double> opt(1, o);
  std::vector<double> theta{1.0};
  double p = 1.0, m = 0.0, v = 0.0;
  double const grads[3] = {0.5, -0.25, 0.125};
  for (int t = 1; t <= 3; ++t) {
    double const g = grads[t - 1];
    std::vector<double> gv{g};
    opt.step(theta, gv);
    m = o.beta1 * m + (1 - o.beta1) * g;
    v = o.beta2 * v + (1 - o.beta2) * g * g;
    double const mh = m / (1 - std::pow(o.beta1, t)), vh = v / (1 - std::pow(o.beta2, t));
    double const llmc = p - o.lr * (mh / (std::sqrt(vh) + o.eps) + o.weight_decay * p);
    CHECK(std::abs(theta[0] - llmc) <= 2 * std::abs(std::nextafter(llmc, 2.0) - llmc));
    p = theta[0];  // follow weft's trajectory so each step is compared alone
  }
}

TEST_CASE("adamw: a 12-step trace over 37 elements equals an independent f64 implementation") {
  std::vector<param_info> const infos{{.count = 20}, {.count = 5, .decay = false}, {.count = 12}};
  std::size_t const n = weft::optim::total_count(infos);
  adamw_options o;
  o.lr = 3e-3;
  o.weight_decay = 0.1;
  adamw<double> opt(infos, o);
  naive_adamw ref{o, std::vector<double>(n), std::vector<double>(n), {}, 0};
  for (auto const& p : infos)
    for (std::size_t i = 0; i < p.count; ++i) ref.decay.push_back(p.decay);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> theta(n), theta_ref(n), g(n);
  for (auto& x : theta) x = dist(rng);
  theta_ref = theta;
  for (int step = 0; step < 12; ++step) {
    // Gradients from 1e-10 to 1e2 in magnitude, so ε matters for some elements.
    for (std::size_t i = 0; i < n; ++i)
      g[i] = dist(rng) * std::pow(10.0, static_cast<double>(i % 13) - 10.0);
    double const lr = o.lr * (1.0 + 0.1 * step);  // a changing rate, as a schedule gives
    opt.step(theta, g, lr);
    ref.step(theta_ref, g, lr);
  }
  for (std::size_t i = 0; i < n; ++i) {
    INFO("element " << i);
    CHECK(close_rel(theta[i], theta_ref[i], 1e-12));
    CHECK(close_rel(opt.m()[i], ref.m[i], 1e-12));
    CHECK(close_rel(opt.v()[i], ref.v[i], 1e-12));
  }
}

TEST_CASE("adamw: f32 is torch's float32 sequence bit for bit, and within 2e-6 of f64") {
  std::size_t const n = 53;
  adamw_options o;
  o.lr = 1e-2;
  o.weight_decay = 0.05;
  adamw<float> opt32(n, o);
  adamw<double> opt64(n, o);
  std::mt19937_64 rng(11);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<float> p32(n), g32(n), m(n, 0.0f), v(n, 0.0f), torch(n);
  std::vector<double> p64(n), g64(n);
  for (std::size_t i = 0; i < n; ++i) p32[i] = static_cast<float>(dist(rng));
  for (std::size_t i = 0; i < n; ++i) p64[i] = p32[i];
  torch = p32;
  double max_err = 0.0;
  for (int t = 1; t <= 20; ++t) {
    for (std::size_t i = 0; i < n; ++i) {
      g32[i] = static_cast<float>(dist(rng) * std::pow(10.0, static_cast<double>(i % 7) - 4.0));
      g64[i] = g32[i];
    }
    opt32.step(p32, g32);
    opt64.step(p64, g64);
    // torch's float32 tensors: Python-double scalars rounded to float, arithmetic in float.
    auto const f = [](double x) { return static_cast<float>(x); };
    double const bc1 = 1 - std::pow(o.beta1, t), bc2 = 1 - std::pow(o.beta2, t);
    for (std::size_t i = 0; i < n; ++i) {
      torch[i] = torch[i] * f(1 - o.lr * o.weight_decay);                  // mul_
      m[i] = m[i] + f(1 - o.beta1) * (g32[i] - m[i]);                      // lerp_ (weight < 0.5)
      v[i] = v[i] * f(o.beta2);                                            // mul_
      v[i] = v[i] + f(1 - o.beta2) * g32[i] * g32[i];                      // addcmul_
      float const denom = std::sqrt(v[i]) / f(std::sqrt(bc2)) + f(o.eps);  // sqrt, div, add_
      torch[i] = torch[i] + f(-(o.lr / bc1)) * m[i] / denom;               // addcdiv_
    }
    for (std::size_t i = 0; i < n; ++i)
      max_err = std::max(max_err, std::abs(static_cast<double>(p32[i]) - p64[i]) /
                                      std::max(std::abs(p64[i]), 1.0));
  }
  for (std::size_t i = 0; i < n; ++i) {
    INFO("element " << i);
    CHECK(p32[i] == torch[i]);
    CHECK(opt32.m()[i] == m[i]);
    CHECK(opt32.v()[i] == v[i]);
  }
  // Documented tolerance: after 20 steps f32 stays within 2e-6 of f64 relative to max(|θ|, 1)
  // (7.3e-7 measured; each step adds a few f32 roundings of θ, 6e-8 each, plus those of the
  // update, whose size is about lr).
  MESSAGE("f32 vs f64 after 20 steps, max error relative to max(|θ|, 1): " << max_err);
  CHECK(max_err <= 2e-6);
}

TEST_CASE("adamw: decay = false skips step 1 (with zero gradients θ is unchanged bit for bit)") {
  std::vector<param_info> const infos{{.count = 3, .decay = true}, {.count = 4, .decay = false}};
  adamw_options o;
  o.lr = 0.5;
  o.weight_decay = 0.1;
  adamw<double> opt(infos, o);
  std::vector<double> theta{1, -2, 3, 1, -2, 3, 0.25}, zero(7, 0.0);
  auto const before = theta;
  opt.step(theta, zero);
  for (std::size_t i = 0; i < 3; ++i) CHECK(theta[i] == before[i] * (1 - 0.5 * 0.1));
  for (std::size_t i = 3; i < 7; ++i) CHECK(theta[i] == before[i]);

  // With gradients, a non-decayed parameter moves exactly as under weight_decay = 0.
  adamw<double> a(infos, o);
  adamw_options o0 = o;
  o0.weight_decay = 0.0;
  adamw<double> b(7, o0);
  std::vector<double> pa = before, pb = before, g{0.1, 0.2, -0.3, 0.4, -0.5, 0.6, 1e-9};
  for (int k = 0; k < 3; ++k) {
    a.step(pa, g);
    b.step(pb, g);
  }
  for (std::size_t i = 3; i < 7; ++i) CHECK(pa[i] == pb[i]);
  for (std::size_t i = 0; i < 3; ++i) CHECK(pa[i] != pb[i]);
}

TEST_CASE("adamw: bad options and sizes throw, naming the argument, expected and actual") {
  auto bad = [](auto mutate) {
    adamw_options o;
    mutate(o);
    return message_of([&] { adamw<double> opt(4, o); });
  };
  auto const b1 = bad([](adamw_options& o) { o.beta1 = 1.0; });
  CHECK(has(b1, "adamw_options::beta1"));
  CHECK(has(b1, "in [0, 1)"));
  CHECK(has(b1, "actual 1"));
  CHECK(has(bad([](adamw_options& o) { o.beta2 = -0.1; }), "adamw_options::beta2"));
  CHECK(has(bad([](adamw_options& o) { o.lr = -1.0; }), "adamw_options::lr"));
  CHECK(has(bad([](adamw_options& o) { o.eps = -1e-8; }), "adamw_options::eps"));
  CHECK(has(bad([](adamw_options& o) { o.weight_decay = std::nan(""); }),
            "adamw_options::weight_decay"));
  CHECK_THROWS_AS(adamw<float>(4, adamw_options{.beta1 = 1.5}), weft::invalid_argument_error);

  adamw<double> opt(4, adamw_options{});
  std::vector<double> p(4), g(3), g4(4);
  CHECK_THROWS_AS(opt.step(p, g), weft::shape_error);
  auto const msg = message_of([&] { opt.step(p, g); });
  CHECK(has(msg, "grads"));
  CHECK(has(msg, "4 elements"));
  CHECK(has(msg, "3 elements"));
  CHECK(opt.steps() == 0);  // nothing changed
  CHECK(has(message_of([&] { opt.step(p, g4, -1.0); }), "argument `lr`"));
  std::vector<double> p5(5);
  CHECK_THROWS_AS(opt.step(p5, g4), weft::shape_error);
  CHECK(opt.steps() == 0);
}

TEST_CASE("adamw: a loaded state continues bit for bit; wrong sizes are refused") {
  weft::optim::adamw_options o;
  o.lr = 1e-2;
  weft::optim::adamw<float> a(5, o), b(5, o);
  std::vector<float> pa{1, -2, 3, 0.5f, -0.25f}, grad(5);
  for (int step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = std::sin(float(step * 5 + i)) * 0.1f;
    a.step(pa, grad, o.lr);
  }
  std::vector<float> pb = pa;
  b.load_state(a.m(), a.v(), a.steps());
  CHECK(b.steps() == 3);
  for (int step = 3; step < 6; ++step) {
    for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = std::cos(float(step * 5 + i)) * 0.1f;
    a.step(pa, grad, o.lr);
    b.step(pb, grad, o.lr);
  }
  CHECK(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)) == 0);
  std::vector<float> short_m(4);
  CHECK_THROWS_AS(b.load_state(short_m, a.v(), 1), weft::shape_error);
  CHECK_THROWS_WITH(b.load_state(a.m(), a.v(), -1), doctest::Contains("steps"));
}
