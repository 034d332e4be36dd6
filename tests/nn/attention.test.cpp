// Tests of weft/nn/attention.hpp: the packed causal attention core against a naive f64 softmax
// attention per document (GQA, two documents), its backward against f64 central finite
// differences, f32 against f64, and argument checks that leave the outputs untouched.
#include <weft/core/tensor.hpp>
#include <weft/nn/attention.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace {
using weft::index_t;
using weft::nn::attention_heads;

struct case_t {
  index_t t = 7;
  attention_heads h{4, 2, 3, 0.0};
  std::vector<std::int64_t> cu{0, 3, 7};
};

std::vector<double> random_vec(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Naive attention: o[i, h] = Σ_j softmax_j(q_i·k_j·scale) v_j over j <= i of i's document.
std::vector<double> naive(case_t const& c, std::vector<double> const& q,
                          std::vector<double> const& k, std::vector<double> const& v) {
  index_t const hq = c.h.heads, hk = c.h.kv_heads, d = c.h.head_dim;
  double const scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> o(static_cast<std::size_t>(c.t * hq * d), 0.0);
  for (std::size_t n = 0; n + 1 < c.cu.size(); ++n)
    for (index_t i = c.cu[n]; i < c.cu[n + 1]; ++i)
      for (index_t h = 0; h < hq; ++h) {
        index_t const g = h / (hq / hk);
        std::vector<double> s;
        for (index_t j = c.cu[n]; j <= i; ++j) {
          double dot = 0;
          for (index_t x = 0; x < d; ++x)
            dot += q[static_cast<std::size_t>((i * hq + h) * d + x)] *
                   k[static_cast<std::size_t>((j * hk + g) * d + x)];
          s.push_back(dot * scale);
        }
        double const mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (index_t j = c.cu[n]; j <= i; ++j)
          for (index_t x = 0; x < d; ++x)
            o[static_cast<std::size_t>((i * hq + h) * d + x)] +=
                s[static_cast<std::size_t>(j - c.cu[n])] / sum *
                v[static_cast<std::size_t>((j * hk + g) * d + x)];
      }
  return o;
}

template <class T>
weft::tensor_view<T, 2> rows(std::vector<T>& v, index_t t) {
  return weft::tensor_view<T, 2>(v.data(), t, static_cast<index_t>(v.size()) / t);
}

struct run_result {
  std::vector<double> o, dq, dk, dv;
};

template <class T>
run_result run(case_t const& c, std::vector<double> const& q, std::vector<double> const& k,
               std::vector<double> const& v, std::vector<double> const& r) {
  using L = weft::compute_t<T>;
  auto cast = [](std::vector<double> const& x) { return std::vector<T>(x.begin(), x.end()); };
  auto qt = cast(q), kt = cast(k), vt = cast(v), rt = cast(r);
  std::vector<T> o(q.size()), dq(q.size()), dk(k.size()), dv(v.size());
  std::vector<L> lse(static_cast<std::size_t>(c.h.heads * c.t));
  weft::tensor_view<L, 2> lv(lse.data(), c.h.heads, c.t);
  std::span<std::int64_t const> cu(c.cu);
  weft::nn::causal_attention_forward(rows(qt, c.t), rows(kt, c.t), rows(vt, c.t), rows(o, c.t), lv,
                                     cu, c.h);
  weft::nn::causal_attention_backward(rows(qt, c.t), rows(kt, c.t), rows(vt, c.t), rows(o, c.t), lv,
                                      rows(rt, c.t), rows(dq, c.t), rows(dk, c.t), rows(dv, c.t),
                                      cu, c.h);
  auto back = [](std::vector<T> const& x) { return std::vector<double>(x.begin(), x.end()); };
  return {back(o), back(dq), back(dk), back(dv)};
}

double rel_err(std::vector<double> const& got, std::vector<double> const& want) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    num = std::max(num, std::abs(got[i] - want[i]));
    den = std::max(den, std::abs(want[i]));
  }
  return num / std::max(den, 1e-300);
}

}  // namespace

TEST_CASE("nn attention: packed causal GQA forward equals naive attention per document (f64)") {
  case_t const c;
  auto const q = random_vec(static_cast<std::size_t>(c.t * 4 * 3), 1);
  auto const k = random_vec(static_cast<std::size_t>(c.t * 2 * 3), 2);
  auto const v = random_vec(static_cast<std::size_t>(c.t * 2 * 3), 3);
  auto const r = random_vec(q.size(), 4);
  auto const got = run<double>(c, q, k, v, r);
  CHECK(rel_err(got.o, naive(c, q, k, v)) < 1e-13);
  // The document boundary matters: row 3 (document 1's first token) attends to itself only.
  for (index_t h = 0; h < 4; ++h)
    for (index_t x = 0; x < 3; ++x)
      CHECK(got.o[static_cast<std::size_t>((3 * 4 + h) * 3 + x)] ==
            doctest::Approx(v[static_cast<std::size_t>((3 * 2 + h / 2) * 3 + x)]).epsilon(1e-14));
}

TEST_CASE("nn attention: backward equals f64 central finite differences to 1e-6") {
  case_t const c;
  auto q = random_vec(static_cast<std::size_t>(c.t * 4 * 3), 5);
  auto k = random_vec(static_cast<std::size_t>(c.t * 2 * 3), 6);
  auto v = random_vec(static_cast<std::size_t>(c.t * 2 * 3), 7);
  auto const r = random_vec(q.size(), 8);
  auto const got = run<double>(c, q, k, v, r);
  auto loss = [&] {
    auto const o = naive(c, q, k, v);
    double s = 0;
    for (std::size_t i = 0; i < o.size(); ++i) s += r[i] * o[i];
    return s;
  };
  double const h = 1e-6;
  auto fd = [&](std::vector<double>& x) {
    std::vector<double> g(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      double const x0 = x[i];
      x[i] = x0 + h;
      double const up = loss();
      x[i] = x0 - h;
      double const down = loss();
      x[i] = x0;
      g[i] = (up - down) / (2 * h);
    }
    return g;
  };
  CHECK(rel_err(got.dq, fd(q)) < 1e-6);
  CHECK(rel_err(got.dk, fd(k)) < 1e-6);
  CHECK(rel_err(got.dv, fd(v)) < 1e-6);
}

TEST_CASE("nn attention: f32 forward and backward within 1e-5 of f64") {
  case_t const c;
  auto const q = random_vec(static_cast<std::size_t>(c.t * 4 * 3), 9);
  auto const k = random_vec(static_cast<std::size_t>(c.t * 2 * 3), 10);
  auto const v = random_vec(static_cast<std::size_t>(c.t * 2 * 3), 11);
  auto const r = random_vec(q.size(), 12);
  auto const f64 = run<double>(c, q, k, v, r);
  auto const f32 = run<float>(c, q, k, v, r);
  CHECK(rel_err(f32.o, f64.o) < 1e-5);
  CHECK(rel_err(f32.dq, f64.dq) < 1e-5);
  CHECK(rel_err(f32.dk, f64.dk) < 1e-5);
  CHECK(rel_err(f32.dv, f64.dv) < 1e-5);
}

TEST_CASE("nn attention: bad shapes and heads throw before anything is written") {
  case_t const c;
  std::vector<float> q(static_cast<std::size_t>(c.t * 12), 1.f),
      k(static_cast<std::size_t>(c.t * 6), 1.f), v(k.size(), 1.f), o(q.size(), -7.f),
      lse(static_cast<std::size_t>(4 * c.t), -7.f);
  weft::tensor_view<float, 2> lv(lse.data(), 4, c.t);
  std::span<std::int64_t const> cu(c.cu);
  auto bad_heads = c.h;
  bad_heads.kv_heads = 3;
  CHECK_THROWS_AS(weft::nn::causal_attention_forward(rows(q, c.t), rows(k, c.t), rows(v, c.t),
                                                     rows(o, c.t), lv, cu, bad_heads),
                  weft::invalid_argument_error);
  std::vector<float> narrow_k(static_cast<std::size_t>(c.t * 3), 1.f);
  CHECK_THROWS_AS(weft::nn::causal_attention_forward(rows(q, c.t), rows(narrow_k, c.t),
                                                     rows(v, c.t), rows(o, c.t), lv, cu, c.h),
                  weft::shape_error);
  std::vector<std::int64_t> const short_cu{0, 3, 6};
  CHECK_THROWS_AS(weft::nn::causal_attention_forward(rows(q, c.t), rows(k, c.t), rows(v, c.t),
                                                     rows(o, c.t), lv, std::span(short_cu), c.h),
                  weft::invalid_argument_error);
  CHECK(std::all_of(o.begin(), o.end(), [](float x) { return x == -7.f; }));
  CHECK(std::all_of(lse.begin(), lse.end(), [](float x) { return x == -7.f; }));
}
