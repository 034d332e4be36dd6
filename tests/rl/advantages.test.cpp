// Tests of weft/rl/advantages.hpp and weft/rl/kl.hpp against the reference note's golden vectors
// (§12 items 13-20): GRPO / Dr. GRPO / RLOO / OPO, GAE, REINFORCE++, whitening, KL estimators
// (values, gradients, clamps, Monte-Carlo expectations), entropy bonus and the clipped value loss.
#include <weft/rl/advantages.hpp>
#include <weft/rl/kl.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

namespace {
using weft::rl::group_layout;
using weft::rl::kl_kind;
using weft::rl::token_layout;
using u8 = std::uint8_t;
template <class T>
std::span<T const> cs(std::vector<T> const& v) {
  return std::span<T const>(v);
}
template <class T>
std::span<T> ms(std::vector<T>& v) {
  return std::span<T>(v);
}
}  // namespace

TEST_CASE("GRPO, Dr. GRPO, RLOO and OPO golden vectors") {
  std::vector<double> out(4);
  std::vector<double> const binary = {1, 0, 0, 1};
  weft::rl::grpo_advantages(cs(binary), group_layout::fixed(4), ms(out));
  for (int i = 0; i < 4; ++i)
    CHECK(out[i] == doctest::Approx(binary[i] > 0 ? 0.866025 : -0.866025).epsilon(1e-6));
  std::vector<double> const one_right = {1, -1, -1, -1};
  weft::rl::grpo_advantages(cs(one_right), group_layout::fixed(4), ms(out));
  CHECK(out[0] == doctest::Approx(1.5).epsilon(1e-5));
  for (int i = 1; i < 4; ++i) CHECK(out[i] == doctest::Approx(-0.5).epsilon(1e-5));
  std::vector<double> const equal = {0.3, 0.3, 0.3, 0.3};
  weft::rl::grpo_advantages(cs(equal), group_layout::fixed(4), ms(out));
  for (double a : out) CHECK(a == 0.0);
  weft::rl::dr_grpo_advantages(cs(binary), group_layout::fixed(4), ms(out));
  for (int i = 0; i < 4; ++i) CHECK(out[i] == doctest::Approx(binary[i] > 0 ? 0.5 : -0.5));
  weft::rl::rloo_advantages(cs(binary), group_layout::fixed(4), ms(out));
  for (int i = 0; i < 4; ++i) CHECK(out[i] == doctest::Approx(binary[i] > 0 ? 2.0 / 3 : -2.0 / 3));

  // SkyRL: RLOO [6,3] -> [3,-3], [9,12] -> [-3,3]; GRPO without std groups {0,0,1,1}.
  std::vector<double> const r = {6, 3, 9, 12};
  std::vector<std::int64_t> const ids = {0, 0, 1, 1};
  weft::rl::rloo_advantages(cs(r), group_layout::by_id(cs(ids)), ms(out));
  CHECK(out == std::vector<double>{3, -3, -3, 3});
  weft::rl::dr_grpo_advantages(cs(r), group_layout::by_id(cs(ids)), ms(out));
  CHECK(out == std::vector<double>{1.5, -1.5, -1.5, 1.5});
  // Interleaved ids give the same per-item answers.
  std::vector<double> const r2 = {6, 9, 3, 12};
  std::vector<std::int64_t> const ids2 = {7, -2, 7, -2};
  weft::rl::rloo_advantages(cs(r2), group_layout::by_id(cs(ids2)), ms(out));
  CHECK(out == std::vector<double>{3, -3, -3, 3});

  // Singletons: 0 by default; keep_score reproduces verl (grpo: R/(1+eps), rloo: R).
  std::vector<double> const single = {5.0};
  std::vector<double> o1(1);
  weft::rl::grpo_advantages(cs(single), group_layout::fixed(1), ms(o1));
  CHECK(o1[0] == 0.0);
  weft::rl::rloo_advantages(cs(single), group_layout::fixed(1), ms(o1));
  CHECK(o1[0] == 0.0);
  weft::rl::grpo_advantages(
      cs(single), group_layout::fixed(1), ms(o1),
      weft::rl::grpo_options{true, 1e-6, weft::rl::singleton_group::keep_score});
  CHECK(o1[0] == doctest::Approx(5.0 / (1 + 1e-6)));
  weft::rl::rloo_advantages(cs(single), group_layout::fixed(1), ms(o1),
                            weft::rl::singleton_group::keep_score);
  CHECK(o1[0] == 5.0);

  // OPO: b = sum L R / sum L = (10 + 100) / 160 = 0.6875.
  std::vector<int> const lengths = {10, 20, 30, 100};
  weft::rl::opo_advantages(cs(binary), cs(lengths), group_layout::fixed(4), ms(out));
  CHECK(out[0] == doctest::Approx(1 - 0.6875));
  CHECK(out[1] == doctest::Approx(-0.6875));

  CHECK_THROWS_AS(weft::rl::grpo_advantages(cs(binary), group_layout::fixed(3), ms(out)),
                  weft::shape_error);
  std::vector<double> short_out(3);
  CHECK_THROWS_AS(weft::rl::grpo_advantages(cs(binary), group_layout::fixed(4), ms(short_out)),
                  weft::shape_error);
}

TEST_CASE("GAE golden vectors; values at masked positions never matter") {
  auto const layout = token_layout::padded(1, 3);
  std::vector<double> const rw = {1, 2, 3}, v = {0.5, 1, 1.5};
  std::vector<u8> const m = {1, 1, 1};
  std::vector<double> adv(3), ret(3);
  weft::rl::gae_advantages(layout, cs(rw), cs(v), cs(m), ms(adv), ms(ret), {1.0, 1.0, false});
  CHECK(adv == std::vector<double>{5.5, 4, 1.5});
  CHECK(ret == std::vector<double>{6, 5, 3});
  weft::rl::gae_advantages(layout, cs(rw), cs(v), cs(m), ms(adv), ms(ret), {1.0, 0.5, false});
  CHECK(ret == std::vector<double>{3.625, 4.25, 3});
  weft::rl::gae_advantages(layout, cs(rw), cs(v), cs(m), ms(adv), ms(ret), {0.5, 1.0, false});
  CHECK(ret == std::vector<double>{2.75, 3.5, 3});

  // Multi-turn: an observation token in the middle is skipped by the recursion.
  auto const l2 = token_layout::padded(2, 5);
  std::vector<double> const r5 = {0, 1, 0, 0, 2, 1, 0, 0, 3, 0};
  std::vector<u8> const m5 = {1, 1, 0, 1, 1, 1, 0, 1, 1, 0};
  std::vector<double> va = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  std::vector<double> vb = va;
  vb[2] = 99;
  vb[6] = -50;
  vb[9] = 1e6;
  std::vector<double> a1(10), t1(10), a2(10), t2(10);
  weft::rl::gae_advantages(l2, cs(r5), cs(va), cs(m5), ms(a1), ms(t1), {0.9, 0.8, true});
  weft::rl::gae_advantages(l2, cs(r5), cs(vb), cs(m5), ms(a2), ms(t2), {0.9, 0.8, true});
  CHECK(a1 == a2);
  CHECK(t1 == t2);
  for (int k : {2, 6, 9}) CHECK(a1[k] == 0.0);
  // Whitened: zero mean and unit unbiased variance over valid tokens.
  double s = 0, ss = 0, n = 0;
  for (std::size_t k = 0; k < 10; ++k)
    if (m5[k]) {
      s += a1[k];
      ss += a1[k] * a1[k];
      n += 1;
    }
  CHECK(s / n == doctest::Approx(0.0).epsilon(1e-12));
  CHECK(ss / (n - 1) == doctest::Approx(1.0).epsilon(1e-6));
}

TEST_CASE("REINFORCE++ returns reset after EOS; baseline form is masked after whitening") {
  auto const layout = token_layout::padded(1, 3);
  std::vector<double> const rw = {1, 2, 3};
  std::vector<double> g(3);
  std::vector<u8> const m = {1, 1, 0};
  weft::rl::discounted_returns(layout, cs(rw), cs(m), 1.0, ms(g));
  CHECK(g == std::vector<double>{3, 2, 3});
  std::vector<u8> const all = {1, 1, 1};
  weft::rl::discounted_returns(layout, cs(rw), cs(all), 0.5, ms(g));
  CHECK(g == std::vector<double>{2.75, 3.5, 3});
  weft::rl::reinforce_pp_advantages(layout, cs(rw), cs(m), 1.0, ms(g));
  CHECK(g[2] == 0.0);
  CHECK(g[0] == doctest::Approx((3 - 2.5) / std::sqrt(0.5 + 1e-8)));

  auto const l4 = token_layout::padded(4, 2);
  std::vector<double> const scores = {1, 0, 0, 1};
  std::vector<u8> const m4 = {1, 1, 1, 0, 1, 1, 1, 0};
  std::vector<double> a(8);
  weft::rl::reinforce_pp_baseline_advantages(l4, cs(scores), group_layout::fixed(2), cs(m4), ms(a));
  CHECK(a[3] == 0.0);
  CHECK(a[7] == 0.0);
  double s = 0;
  for (std::size_t k = 0; k < 8; ++k) s += m4[k] ? a[k] : 0.0;
  CHECK(s == doctest::Approx(0.0).epsilon(1e-12));

  // ReMax: returns are suffix sums; A = returns - greedy baseline.
  std::vector<double> const rr = {0, 0, 1, 0, 2, 0};
  std::vector<double> const base = {0.5, 1.0};
  std::vector<u8> const mm = {1, 1, 1, 1, 1, 0};
  std::vector<double> adv(6), ret(6);
  weft::rl::remax_advantages(token_layout::padded(2, 3), cs(rr), cs(base), cs(mm), ms(adv),
                             ms(ret));
  CHECK(ret == std::vector<double>{1, 1, 1, 2, 2, 0});
  CHECK(adv == std::vector<double>{0.5, 0.5, 0.5, 1, 1, 0});
}

TEST_CASE(
    "masked whitening: unbiased variance, valid tokens only, masked exactly 0, NaN padding "
    "ignored") {
  std::vector<double> v = {1, 2, 3, 4, std::nan("")};
  std::vector<u8> const m = {1, 1, 1, 1, 0};
  std::vector<double> out(5);
  weft::rl::masked_whiten(cs(v), cs(m), ms(out));
  double const sd = std::sqrt(5.0 / 3 + 1e-8);
  CHECK(out[0] == doctest::Approx(-1.5 / sd));
  CHECK(out[3] == doctest::Approx(1.5 / sd));
  CHECK(out[4] == 0.0);
  // Global statistics (as all-reduced over ranks) give the same answer as local ones here.
  auto const st = weft::rl::whiten_statistics(cs(v), cs(m));
  std::vector<double> out2(5);
  weft::rl::masked_whiten(cs(v), cs(m), ms(out2), st);
  for (int k = 0; k < 5; ++k) CHECK(out2[k] == doctest::Approx(out[k]).epsilon(1e-12));
}

TEST_CASE("KL estimators: golden values, gradients, clamps") {
  weft::rl::kl_token<double> k1{kl_kind::k1}, k2{kl_kind::k2}, k3{kl_kind::k3},
      k3p{kl_kind::k3_plus}, k1p{kl_kind::k1_plus};
  CHECK(k1(0.2, 0.1).value == doctest::Approx(0.1));
  CHECK(k2(0.2, 0.1).value == doctest::Approx(0.005));
  CHECK(k3(0.2, 0.1).value == doctest::Approx(0.0048374).epsilon(1e-6));
  CHECK(k3(0.2, 0.1).grad == doctest::Approx(0.0951626).epsilon(1e-6));
  CHECK(k1(0.2, 0.1).grad == 1.0);
  CHECK(k2(0.2, 0.1).grad == doctest::Approx(0.1));
  // k3 value capped at 10 with zero gradient (x = -12: e^12 - 12 - 1 > 10).
  CHECK(k3(-12.0, 0.0).value == 10.0);
  CHECK(k3(-12.0, 0.0).grad == 0.0);
  CHECK(k3(-30.0, 0.0).grad == 0.0);
  // k3+: value of k3, gradient of k2.
  CHECK(k3p(0.2, 0.1).value == k3(0.2, 0.1).value);
  CHECK(k3p(0.2, 0.1).grad == doctest::Approx(0.1));
  CHECK(k1p(0.2, 0.1).grad == doctest::Approx(0.1));

  // Finite differences of every unclamped estimator.
  for (auto kind : {kl_kind::k1, kl_kind::abs, kl_kind::k2, kl_kind::k3}) {
    weft::rl::kl_token<double> const f{kind};
    for (double x : {-2.0, -0.3, 0.4, 1.7}) {
      double const h = 1e-6;
      double const fd = (f(x + h, 0.0).value - f(x - h, 0.0).value) / (2 * h);
      CHECK(fd == doctest::Approx(f(x, 0.0).grad).epsilon(1e-7));
    }
  }

  // SkyRL vector: l = [0.2, 0.3, 0.5], ref = [0.1, 0.2, 0.4], mask [1, 1, 0], NaN must not leak.
  std::vector<double> l = {0.2, 0.3, std::nan("")}, ref = {0.1, 0.2, 0.4};
  std::vector<u8> const m = {1, 1, 0};
  std::vector<double> val(3), gr(3);
  weft::rl::kl_penalty(kl_kind::k1, cs(l), cs(ref), cs(m), ms(val), ms(gr));
  CHECK(val[0] == doctest::Approx(0.1));
  CHECK(val[2] == 0.0);
  std::vector<double> w = {0.5, 0.5, 0.0}, d(3, 0.0);
  double const kl = weft::rl::kl_loss(kl_kind::k2, 0.1, cs(l), cs(ref), cs(m), cs(w), ms(d));
  CHECK(kl == doctest::Approx(0.1 * 0.005));
  CHECK(d[0] == doctest::Approx(0.1 * 0.5 * 0.1));
  CHECK(d[2] == 0.0);
  std::vector<double> rewards = {1, 1, 1};
  std::vector<double> old = {0.2, 0.3, 0.5};
  weft::rl::apply_kl_penalty(kl_kind::k1, 0.5, cs(old), cs(ref), cs(m), ms(rewards));
  CHECK(rewards[0] == doctest::Approx(0.95));
  CHECK(rewards[2] == 1.0);
}

TEST_CASE(
    "KL gradients in expectation: k2 -> reverse KL, k3 -> forward KL, r*k3 -> reverse KL "
    "off-policy") {
  // Categorical pi(theta) = softmax(theta), ref fixed; d l(y) / d theta_j = 1[y=j] - pi_j.
  std::vector<double> const theta = {0.3, -0.2, 0.5, -0.6}, ref_logits = {0.0, 0.4, -0.3, 0.1};
  std::vector<double> const old_theta = {0.1, 0.0, 0.4, -0.3};
  auto softmax = [](std::vector<double> const& z) {
    double mx = z[0];
    for (double x : z) mx = std::max(mx, x);
    double s = 0;
    std::vector<double> p(z.size());
    for (std::size_t i = 0; i < z.size(); ++i) s += p[i] = std::exp(z[i] - mx);
    for (double& x : p) x /= s;
    return p;
  };
  auto const pi = softmax(theta), ref = softmax(ref_logits), pold = softmax(old_theta);
  std::size_t const V = pi.size();
  // Exact expectations E_{y~q}[f(y) * (e_y - pi)] by enumeration.
  auto expect = [&](std::vector<double> const& q, auto f) {
    std::vector<double> g(V, 0.0);
    for (std::size_t y = 0; y < V; ++y)
      for (std::size_t j = 0; j < V; ++j) g[j] += q[y] * f(y) * ((j == y ? 1.0 : 0.0) - pi[j]);
    return g;
  };
  // Analytic gradients of KL(pi||ref) and KL(ref||pi) w.r.t. theta.
  std::vector<double> rev(V, 0.0), fwd(V);
  double klr = 0;
  for (std::size_t y = 0; y < V; ++y) klr += pi[y] * std::log(pi[y] / ref[y]);
  for (std::size_t j = 0; j < V; ++j) {
    rev[j] = pi[j] * (std::log(pi[j] / ref[j]) - klr);
    fwd[j] = pi[j] - ref[j];
  }
  weft::rl::kl_token<double> const k2{kl_kind::k2}, k3{kl_kind::k3};
  auto const g2 =
      expect(pi, [&](std::size_t y) { return k2(std::log(pi[y]), std::log(ref[y])).grad; });
  auto const g3 =
      expect(pi, [&](std::size_t y) { return k3(std::log(pi[y]), std::log(ref[y])).grad; });
  // Off-policy samples from pi_old: gradient of r*k3 is r*(l - l_ref).
  auto const g3c = expect(pold, [&](std::size_t y) {
    double const r = pi[y] / pold[y];
    return r * (std::log(pi[y]) - std::log(ref[y]));
  });
  for (std::size_t j = 0; j < V; ++j) {
    CHECK(g2[j] == doctest::Approx(rev[j]).epsilon(1e-12));
    CHECK(g3[j] == doctest::Approx(fwd[j]).epsilon(1e-12));
    CHECK(g3c[j] == doctest::Approx(rev[j]).epsilon(1e-12));
  }
  // kl_is_corrected_loss writes exactly r*(l - l_ref) per token (weights 1, coef 1).
  std::vector<double> l = {std::log(pi[1])}, lo = {std::log(pold[1])}, lr = {std::log(ref[1])},
                      w = {1.0}, d = {0.0};
  std::vector<u8> const m = {1};
  (void)weft::rl::kl_is_corrected_loss(1.0, cs(l), cs(lo), cs(lr), cs(m), cs(w), ms(d));
  CHECK(d[0] == doctest::Approx(pi[1] / pold[1] * (l[0] - lr[0])).epsilon(1e-12));
}

TEST_CASE(
    "value loss: half the max of clipped and unclipped errors; zero gradient when clipped wins") {
  std::vector<double> v = {1.0, 3.0, 0.2}, vold = {1.2, 1.0, 0.0}, ret = {2.0, 0.0, 0.25},
                      w = {1, 1, 1}, dv(3);
  std::vector<u8> const m = {1, 1, 1};
  auto const r = weft::rl::value_loss(0.5, cs(v), cs(vold), cs(ret), cs(m), cs(w), ms(dv));
  // token 0: vclip = 1.0 (inside), errors 1 and 1 -> 0.5, grad v - R = -1
  // token 1: vclip = 1.5, errors 9 and 2.25 -> 4.5 unclipped, grad 3
  // token 2: v = 0.2 inside [-0.5, 0.5]: 0.5 * 0.0025
  CHECK(r.loss == doctest::Approx(0.5 + 4.5 + 0.5 * 0.0025));
  CHECK(dv[0] == doctest::Approx(-1.0));
  CHECK(dv[1] == doctest::Approx(3.0));
  CHECK(r.clipped == 0);
  // Clipped branch wins: v moved toward R beyond the clip interval -> gradient 0.
  std::vector<double> v2 = {1.1}, vo2 = {0.0}, r2 = {1.2}, w2 = {1.0}, d2(1);
  std::vector<u8> const m1 = {1};
  auto const rr = weft::rl::value_loss(0.5, cs(v2), cs(vo2), cs(r2), cs(m1), cs(w2), ms(d2));
  CHECK(rr.clipped == 1);
  CHECK(rr.loss == doctest::Approx(0.5 * 0.49));
  CHECK(d2[0] == 0.0);
  // Entropy bonus writes dH = -coef w.
  std::vector<double> H = {1.0, 2.0}, wh = {0.5, 0.5}, dh(2);
  std::vector<u8> const mh = {1, 0};
  CHECK(weft::rl::entropy_bonus(0.01, cs(H), cs(mh), cs(wh), ms(dh)) == doctest::Approx(-0.005));
  CHECK(dh[0] == doctest::Approx(-0.005));
  CHECK(dh[1] == 0.0);
}

// ---- the scan form of the row recurrences (rl/cuda/returns.cuh runs it) ----------------------

namespace {
namespace rd = weft::rl::detail;

// The CUDA kernels' decomposition on the host: a row's elements in reverse token order (scan
// order) in tiles of `tile`, each tile scanned by recursive doubling (a grouping unlike the
// sequential one, as a block scan's), then composed after the carry of the later tiles.
template <class E, class Op>
std::vector<E> reverse_tiled_scan(std::vector<E> const& elems, std::size_t tile, bool exclusive,
                                  Op op) {
  std::vector<E> out(elems.size());
  E carry{};
  for (std::size_t at = 0; at < elems.size(); at += tile) {
    std::size_t const n = std::min(tile, elems.size() - at);
    std::vector<E> s(elems.begin() + static_cast<std::ptrdiff_t>(at),
                     elems.begin() + static_cast<std::ptrdiff_t>(at + n));
    for (std::size_t d = 1; d < n; d *= 2) {
      std::vector<E> next = s;
      for (std::size_t k = d; k < n; ++k) next[k] = op(s[k - d], s[k]);
      s = next;
    }
    E const aggregate = s[n - 1];
    for (std::size_t k = 0; k < n; ++k)
      out[at + k] = op(carry, exclusive ? (k == 0 ? E{} : s[k - 1]) : s[k]);
    carry = op(carry, aggregate);
  }
  return out;
}

// Rows as the GPU test makes them: lengths, a padded tail, an observation gap in every third
// row, an all-masked row; NaN values and rewards of 5 at masked tokens.
struct scan_rows {
  std::vector<std::int64_t> offsets{0};
  std::vector<double> rewards, values, baselines;
  std::vector<u8> mask;
  explicit scan_rows(std::vector<std::int64_t> const& lengths) {
    std::mt19937_64 rng(11);
    std::uniform_real_distribution<double> u(-1.0, 2.0);
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      auto const len = lengths[i], valid_len = len - len / 7;
      for (std::int64_t t = 0; t < len; ++t) {
        bool ok = t < valid_len && i % 5 != 3;
        if (i % 3 == 1 && t >= valid_len / 3 && t < valid_len / 2) ok = false;
        mask.push_back(ok ? 1 : 0);
        rewards.push_back(ok ? (t + 1 == valid_len ? 3 * u(rng) : 0.1 * u(rng)) : 5.0);
        values.push_back(ok ? u(rng) : std::numeric_limits<double>::quiet_NaN());
      }
      offsets.push_back(offsets.back() + len);
      baselines.push_back(u(rng));
    }
  }
};

// max |got − want| / max(|want|, 1), NaN equal to NaN only.
double scan_error(std::vector<double> const& got, std::vector<double> const& want) {
  double worst = 0;
  for (std::size_t k = 0; k < got.size(); ++k) {
    if (std::isnan(got[k]) || std::isnan(want[k])) {
      if (!(std::isnan(got[k]) && std::isnan(want[k]))) return INFINITY;
      continue;
    }
    worst = std::max(worst, std::abs(got[k] - want[k]) / std::max(std::abs(want[k]), 1.0));
  }
  return worst;
}
}  // namespace

TEST_CASE("the reverse-scan form of GAE, discounted returns and ReMax follows the row loops") {
  // Tiles of 1 group the scan as the loops do: bit for bit. Other tiles (the CUDA kernels' 512
  // among them) regroup it: within 1e-12 of the largest of |value| and 1.
  std::vector<std::int64_t> const lengths{0, 1, 5, 64, 17, 300, 2, 9, 1000, 3, 2049, 7, 513, 40};
  scan_rows const b(lengths);
  auto const n = b.mask.size();
  std::vector<double> want_a(n), want_r(n), got_a(n, -9), got_r(n, -9);
  for (std::size_t tile : {std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{512}}) {
    CAPTURE(tile);
    double const tol = tile == 1 ? 0.0 : 1e-12;
    for (auto const& gl : {std::pair{1.0, 1.0}, std::pair{0.99, 0.95}, std::pair{0.9, 0.5}}) {
      // Variables, not a structured binding: CAPTURE's lambda cannot capture one before clang 16.
      double const gamma = gl.first, lambda = gl.second;
      CAPTURE(gamma);
      CAPTURE(lambda);
      rd::gae_scan<double, u8> const f{b.rewards.data(), b.values.data(), b.mask.data(), gamma,
                                       lambda,           got_a.data(),    got_r.data()};
      rd::discounted_scan<double, u8> const g{b.rewards.data(), b.mask.data(), gamma, got_r.data()};
      for (std::size_t i = 0; i + 1 < b.offsets.size(); ++i) {
        auto const begin = b.offsets[i], end = b.offsets[i + 1];
        rd::gae_row(begin, end, b.rewards.data(), b.values.data(), b.mask.data(), gamma, lambda,
                    want_a.data(), want_r.data());
        std::vector<rd::nearest_valid> next_elems;
        for (auto t = end; t-- > begin;) next_elems.push_back(f.value_element(t));
        auto const next = reverse_tiled_scan(next_elems, tile, true, rd::nearer_valid{});
        std::vector<rd::affine_map> elems;
        for (auto t = end; t-- > begin;)
          elems.push_back(f.element(t, next[static_cast<std::size_t>(end - 1 - t)]));
        auto const state = reverse_tiled_scan(elems, tile, false, rd::affine_then{});
        for (auto t = end; t-- > begin;) f.write(t, state[static_cast<std::size_t>(end - 1 - t)].b);
      }
      CHECK(scan_error(got_a, want_a) <= tol);
      CHECK(scan_error(got_r, want_r) <= tol);
      // Discounted returns (γ only).
      for (std::size_t i = 0; i + 1 < b.offsets.size(); ++i) {
        auto const begin = b.offsets[i], end = b.offsets[i + 1];
        rd::discounted_returns_row(begin, end, b.rewards.data(), b.mask.data(), gamma,
                                   want_r.data());
        std::vector<rd::affine_map> elems;
        for (auto t = end; t-- > begin;) elems.push_back(g.element(t));
        auto const state = reverse_tiled_scan(elems, tile, true, rd::affine_then{});
        for (auto t = end; t-- > begin;) g.write(t, state[static_cast<std::size_t>(end - 1 - t)].b);
      }
      CHECK(scan_error(got_r, want_r) <= tol);
    }
    rd::remax_scan<double, u8> const h{b.rewards.data(), b.mask.data(), got_a.data(), got_r.data()};
    for (std::size_t i = 0; i + 1 < b.offsets.size(); ++i) {
      auto const begin = b.offsets[i], end = b.offsets[i + 1];
      rd::remax_row(begin, end, b.rewards.data(), b.baselines[i], b.mask.data(), want_a.data(),
                    want_r.data());
      std::vector<rd::affine_map> elems;
      for (auto t = end; t-- > begin;) elems.push_back(h.element(t));
      auto const state = reverse_tiled_scan(elems, tile, false, rd::affine_then{});
      for (auto t = end; t-- > begin;)
        h.write(t, state[static_cast<std::size_t>(end - 1 - t)].b, b.baselines[i]);
    }
    CHECK(scan_error(got_a, want_a) <= tol);
    CHECK(scan_error(got_r, want_r) <= tol);
  }
}

TEST_CASE("the scan form keeps the loops' NaN for a non-finite masked reward; GAE may alias") {
  // Discounted returns: a NaN reward at a masked token reaches every earlier token (the loop's
  // `run *= 0`), in both forms; GAE with advantages written over the values gives the same
  // returns as with separate buffers.
  std::vector<double> r{0.5, 0.25, std::numeric_limits<double>::quiet_NaN(), 1.0};
  std::vector<u8> const m{1, 1, 0, 1};
  std::vector<double> want(4), got(4);
  rd::discounted_returns_row(0, 4, r.data(), m.data(), 0.9, want.data());
  rd::discounted_scan<double, u8> const g{r.data(), m.data(), 0.9, got.data()};
  std::vector<rd::affine_map> elems;
  for (int t = 4; t-- > 0;) elems.push_back(g.element(t));
  auto const state = reverse_tiled_scan(elems, 2, true, rd::affine_then{});
  for (int t = 4; t-- > 0;) g.write(t, state[static_cast<std::size_t>(3 - t)].b);
  CHECK(std::isnan(want[0]));
  CHECK(std::isnan(got[0]));
  CHECK(std::isnan(got[1]));
  CHECK(got[3] == want[3]);
  std::vector<double> const rewards{0.1, 0.2, 0.3}, values0{0.5, -0.25, 1.0};
  std::vector<u8> const all{1, 1, 1};
  std::vector<double> a(3), ret(3), values = values0, ret2(3);
  rd::gae_row(0, 3, rewards.data(), values0.data(), all.data(), 0.9, 0.8, a.data(), ret.data());
  rd::gae_scan<double, u8> const f{rewards.data(), values.data(), all.data(), 0.9, 0.8,
                                   values.data(),  ret2.data()};
  std::vector<rd::nearest_valid> nexts;
  for (int t = 3; t-- > 0;) nexts.push_back(f.value_element(t));
  auto const next = reverse_tiled_scan(nexts, 1, true, rd::nearer_valid{});
  std::vector<rd::affine_map> steps;
  for (int t = 3; t-- > 0;) steps.push_back(f.element(t, next[static_cast<std::size_t>(2 - t)]));
  auto const st = reverse_tiled_scan(steps, 1, false, rd::affine_then{});
  for (int t = 3; t-- > 0;) f.write(t, st[static_cast<std::size_t>(2 - t)].b);
  for (std::size_t k = 0; k < 3; ++k) {
    CHECK(values[k] == a[k]);  // the advantages, written over the values
    CHECK(ret2[k] == ret[k]);
  }
}
