// Tests of the vectorised host paths of weft/rl: exp_fn (f32) against libm over a dense sweep
// with -inf, NaN, denormal and overflowing inputs; every multiversioned ISA level of the row
// kernels against the baseline build; the f32 fused sweep (saved exponentials) against a long
// double reference; the blocked policy loss against a naive per-token loop, NaN padding included.
#include <weft/rl/exp.hpp>
#include <weft/rl/logprobs.hpp>
#include <weft/rl/policy_loss.hpp>

#include <doctest/doctest.h>

#include "support/checks.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace {
using weft::index_t;

float ulp_distance(float a, float b) {
  if (a == b) return 0;
  std::int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return static_cast<float>(
      std::abs(static_cast<std::int64_t>(ia) - static_cast<std::int64_t>(ib)));
}

}  // namespace

TEST_CASE("exp_fn f32 over a dense sweep: within 2 ulp of libm where normal, IEEE specials exact") {
  float worst = 0;
  // Every 97th float in [-87.3, 88.7) (about 2e7 values), walked by the floats' order-preserving
  // integer keys; under a sanitizer every 9973rd (2e5 values, every exponent still).
  auto const key = [](float f) {
    std::uint32_t b = 0;
    std::memcpy(&b, &f, 4);
    return (b & 0x80000000u) != 0 ? ~b : b | 0x80000000u;
  };
  auto const from_key = [](std::uint32_t k) {
    std::uint32_t const b = (k & 0x80000000u) != 0 ? k & 0x7fffffffu : ~k;
    float f = 0;
    std::memcpy(&f, &b, 4);
    return f;
  };
  std::uint32_t const stride = weft::test::under_sanitizer ? 9973u : 97u;
  std::uint64_t swept = 0;
  for (std::uint64_t k = key(-87.3f); k < key(88.7f); k += stride, ++swept) {
    float const x = from_key(static_cast<std::uint32_t>(k));
    float const ref = static_cast<float>(std::exp(static_cast<double>(x)));
    float const got = weft::fast_exp(x);
    worst = std::max(worst, ulp_distance(got, ref));
  }
  CHECK(swept * stride > 2'000'000'000u);  // the range holds about 2.1e9 floats
  CHECK(from_key(key(-87.3f)) == -87.3f);
  CHECK(from_key(key(-0.0f)) == 0.0f);
  CHECK(key(-0.0f) + 1 == key(0.0f));
  CHECK(key(std::nextafter(1.0f, 2.0f)) == key(1.0f) + 1);
  MESSAGE("worst f32 exp error over the sweep: ", worst, " ulp");
  CHECK(worst <= 2.0f);
  float const finf = std::numeric_limits<float>::infinity();
  CHECK(weft::fast_exp(-finf) == 0.0f);
  CHECK(weft::fast_exp(finf) == finf);
  CHECK(std::isnan(weft::fast_exp(std::numeric_limits<float>::quiet_NaN())));
  CHECK(weft::fast_exp(89.0f) == finf);
  CHECK(weft::fast_exp(1e30f) == finf);
  CHECK(weft::fast_exp(-1e30f) == 0.0f);
  CHECK(weft::fast_exp(-100.0f) == 0.0f);  // below 2^-126: flushed to +0 (documented)
  CHECK(weft::fast_exp(std::numeric_limits<float>::lowest()) == 0.0f);
  // Denormal inputs are e^0 = 1 to float precision.
  CHECK(weft::fast_exp(std::numeric_limits<float>::denorm_min()) == 1.0f);
  CHECK(weft::fast_exp(-std::numeric_limits<float>::denorm_min()) == 1.0f);
  CHECK(weft::fast_exp(0.0f) == 1.0f);
  CHECK(weft::fast_exp(-0.0f) == 1.0f);
}

TEST_CASE("exp_fn over arrays (the vectorised form) equals the scalar calls bit for bit") {
  std::vector<float> x;
  float const finf = std::numeric_limits<float>::infinity();
  for (float v :
       {-finf, finf, 0.0f, -0.0f, 88.72f, 88.73f, -87.33f, -87.34f, -103.0f, 1e-40f, -1e-40f})
    x.push_back(v);
  std::mt19937 gen(3);
  std::uniform_real_distribution<float> u(-120.0f, 100.0f);
  for (int k = 0; k < 10000; ++k) x.push_back(u(gen));
  std::vector<float> y(x.size());
  for (std::size_t k = 0; k < x.size(); ++k) y[k] = weft::fast_exp(x[k]);  // vectorised at -O2+
  for (std::size_t k = 0; k < x.size(); ++k) {
    volatile float xv = x[k];
    float const s = weft::fast_exp(static_cast<float>(xv));
    CHECK(ulp_distance(y[k], s) <= 1.0f);  // FMA contraction may differ between the two forms
    if (std::isfinite(x[k]) && x[k] > -87.3f && x[k] < 88.7f)
      CHECK(ulp_distance(y[k], static_cast<float>(std::exp(static_cast<double>(x[k])))) <= 2.0f);
  }
}

namespace {

struct row_case {
  std::vector<float> z;
  index_t n;
};

row_case make_row(index_t n, unsigned seed, bool with_inf) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  row_case r{std::vector<float>(static_cast<std::size_t>(n)), n};
  for (auto& v : r.z) v = nd(gen);
  if (with_inf) {
    for (index_t j = 0; j < n; j += 7)
      r.z[static_cast<std::size_t>(j)] = -std::numeric_limits<float>::infinity();
    // A whole chunk of -inf when the row has more than one chunk.
    if (n > 2 * weft::rl::detail::logit_chunk)
      for (index_t j = weft::rl::detail::logit_chunk; j < 2 * weft::rl::detail::logit_chunk; ++j)
        r.z[static_cast<std::size_t>(j)] = -std::numeric_limits<float>::infinity();
  }
  return r;
}

}  // namespace

TEST_CASE("every ISA level of the row kernels agrees with the baseline build") {
  namespace d = weft::rl::detail;
  for (index_t n : {index_t{1}, index_t{17}, index_t{2048}, index_t{2049}, index_t{7000}}) {
    for (bool with_inf : {false, true}) {
      auto const r = make_row(n, static_cast<unsigned>(n), with_inf);
      float const inv_tau = 1.0f / 0.7f;
      auto const base = d::row_stats_impl(r.z.data(), n, inv_tau);
      double const lse = weft::softmax_finish{}.lse(base);
      double const h = weft::softmax_finish{}.entropy(base);
      std::vector<float> dz_base(r.z.size()), dz(r.z.size());
      d::row_backward_impl(r.z.data(), n, inv_tau, lse, h, -0.7, 0.3, n / 2, dz_base.data());
      auto check = [&](weft::softmax_stats<double> s, char const* what) {
        INFO(what, " n = ", n, " with_inf = ", with_inf);
        CHECK(s.max == base.max);
        CHECK(s.sum == doctest::Approx(base.sum).epsilon(1e-6));
        CHECK(s.ent == doctest::Approx(base.ent).epsilon(1e-5).scale(1.0));
        for (std::size_t j = 0; j < dz.size(); ++j) CHECK(std::abs(dz[j] - dz_base[j]) <= 1e-6f);
      };
      d::row_backward(r.z.data(), n, inv_tau, lse, h, -0.7, 0.3, n / 2, dz.data());
      check(d::row_stats(r.z.data(), n, inv_tau), "dispatched");
#if WEFT_RL_MULTIVERSION
      if (d::host_simd_level() >= d::simd_level::avx2) {
        d::row_backward_avx2(r.z.data(), n, inv_tau, lse, h, -0.7, 0.3, n / 2, dz.data());
        check(d::row_stats_avx2(r.z.data(), n, inv_tau), "avx2");
      }
      if (d::host_simd_level() >= d::simd_level::avx512) {
        d::row_backward_avx512(r.z.data(), n, inv_tau, lse, h, -0.7, 0.3, n / 2, dz.data());
        check(d::row_stats_avx512(r.z.data(), n, inv_tau), "avx512");
      }
#endif
    }
  }
}

TEST_CASE(
    "f32 fused sweep (saved exponentials) matches a long double reference, -inf chunks included") {
  index_t const V = 5000;  // three chunks, the second all -inf
  std::vector<std::int64_t> tgt = {3, -100, 4999, 2};
  std::vector<float> z;
  for (std::size_t k = 0; k < tgt.size(); ++k) {
    auto const r = make_row(V, static_cast<unsigned>(11 + k), k != 3);
    z.insert(z.end(), r.z.begin(), r.z.end());
  }
  // Row 3: every logit -inf but the target's.
  for (index_t v = 0; v < V; ++v)
    z[static_cast<std::size_t>(3 * V + v)] = -std::numeric_limits<float>::infinity();
  z[static_cast<std::size_t>(3 * V + 2)] = 1.5f;
  weft::rl::logprob_options opt;
  opt.temperature = 0.9;
  std::vector<float> lp(tgt.size()), h(tgt.size()), dz(z.size());
  std::vector<double> gl = {-0.5, 0.0, 1.25, 2.0}, ge = {0.1, 0.0, -0.3, 0.5};
  weft::rl::log_prob_fused(
      std::span<float const>(z), V, std::span<std::int64_t const>(tgt), opt, std::span<float>(lp),
      std::span<float>(h),
      [&](index_t k, float, float) {
        return weft::rl::logprob_grads{gl[static_cast<std::size_t>(k)],
                                       ge[static_cast<std::size_t>(k)]};
      },
      std::span<float>(dz));
  for (std::size_t k = 0; k < tgt.size(); ++k) {
    float const* zr = z.data() + k * V;
    float const* dr = dz.data() + k * V;
    if (tgt[k] < 0) {
      for (index_t v = 0; v < V; ++v) CHECK(dr[v] == 0.0f);
      CHECK(lp[k] == 0.0f);
      continue;
    }
    long double mx = -INFINITY;
    for (index_t v = 0; v < V; ++v)
      mx = std::max(mx, (long double)zr[v] / (long double)opt.temperature);
    long double s = 0;
    for (index_t v = 0; v < V; ++v)
      s += std::exp((long double)zr[v] / (long double)opt.temperature - mx);
    long double const lse = mx + std::log(s);
    long double H = 0;
    std::vector<long double> p(static_cast<std::size_t>(V)), lg(static_cast<std::size_t>(V));
    for (index_t v = 0; v < V; ++v) {
      long double const x = (long double)zr[v] / (long double)opt.temperature;
      p[static_cast<std::size_t>(v)] = std::isinf(x) ? 0.0L : std::exp(x - lse);
      lg[static_cast<std::size_t>(v)] = std::isinf(x) ? 0.0L : x - lse;
      H -= p[static_cast<std::size_t>(v)] * lg[static_cast<std::size_t>(v)];
    }
    long double const xo = (long double)zr[tgt[k]] / (long double)opt.temperature;
    CHECK(lp[k] == doctest::Approx(static_cast<double>(xo - lse)).epsilon(2e-6).scale(1.0));
    CHECK(h[k] == doctest::Approx(static_cast<double>(H)).epsilon(2e-6).scale(1.0));
    double worst = 0, row_max = 0;
    for (index_t v = 0; v < V; ++v) {
      auto const j = static_cast<std::size_t>(v);
      long double g = -p[j] * (gl[k] + ge[k] * (lg[j] + H));
      if (v == tgt[k]) g += gl[k];
      g /= (long double)opt.temperature;
      row_max = std::max(row_max, std::abs(static_cast<double>(g)));
      worst = std::max(worst, std::abs(static_cast<double>(g) - static_cast<double>(dr[v])));
      if (std::isinf(zr[v]) && v != tgt[k]) CHECK(dr[v] == 0.0f);  // exactly 0, never NaN
    }
    CHECK(worst <= 2e-6 * row_max);
  }
}

TEST_CASE("blocked policy loss equals a naive per-token loop; NaN in masked tokens never leaks") {
  using weft::rl::policy_loss_kind;
  index_t const rows = 7, cols = 333;  // not a multiple of the block or the lanes
  auto const n = static_cast<std::size_t>(rows * cols);
  std::mt19937 gen(9);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> lp(n), old(n), adv(n), w(n), isw(n), dl(n);
  std::vector<std::uint8_t> mask(n);
  float const nan = std::numeric_limits<float>::quiet_NaN();
  for (std::size_t k = 0; k < n; ++k) {
    old[k] = -4.0f * u(gen);
    lp[k] = old[k] + 1.6f * (u(gen) - 0.5f);
    if (k % 101 == 0) lp[k] = old[k] + 30.0f;  // log-ratio clamp
    adv[k] = k % 13 == 0 ? 0.0f : 2.0f * (u(gen) - 0.5f);
    w[k] = 0.001f * (1.0f + u(gen));
    isw[k] = 0.5f + u(gen);
    mask[k] = u(gen) < 0.8f ? 1 : 0;
    if (!mask[k]) lp[k] = old[k] = adv[k] = w[k] = isw[k] = nan;
  }
  auto const layout = weft::rl::token_layout::padded(rows, cols);
  for (auto kind :
       {policy_loss_kind::ppo_clip, policy_loss_kind::cispo, policy_loss_kind::reinforce}) {
    for (bool use_isw : {false, true}) {
      INFO(weft::rl::to_string(kind), " isw = ", use_isw);
      weft::rl::policy_loss_config cfg;
      cfg.kind = kind;
      auto const res = weft::rl::policy_loss(
          cfg, layout,
          weft::rl::policy_inputs<float, std::uint8_t>{
              weft::rl::arg::new_logp{lp}, weft::rl::arg::old_logp{old},
              weft::rl::arg::advantages{adv}, weft::rl::arg::mask{mask}, weft::rl::arg::weights{w},
              weft::rl::arg::rollout_is_weights{use_isw ? std::span<float const>(isw)
                                                        : std::span<float const>()}},
          std::span<float>(dl));
      // Naive reference in double with libm's exp and plain branches.
      double loss = 0, tokens = 0, lo = 0, hi = 0, dual = 0, clamped = 0, nlr = 0, rs = 0,
             rmin = INFINITY, rmax = -INFINITY;
      for (std::size_t k = 0; k < n; ++k) {
        if (!mask[k]) {
          CHECK(dl[k] == 0.0f);
          continue;
        }
        double const delta = static_cast<double>(lp[k]) - static_cast<double>(old[k]);
        bool const cl = std::abs(delta) > cfg.log_ratio_clamp;
        double const dc = std::max(-cfg.log_ratio_clamp, std::min(cfg.log_ratio_clamp, delta));
        double const r = std::exp(dc);
        double const A = adv[k];
        double const s = static_cast<double>(w[k]) * (use_isw ? static_cast<double>(isw[k]) : 1.0);
        double l = 0, g = 0;
        if (kind == policy_loss_kind::ppo_clip) {
          if (A > 0) {
            bool const c = r > 1 + cfg.clip_high;
            l = -A * (c ? 1 + cfg.clip_high : r);
            g = c || cl ? 0 : -A * r;
            hi += c;
          } else if (A < 0) {
            bool const low = r<1 - cfg.clip_low, du = r> cfg.dual_clip;
            l = -A * (low ? 1 - cfg.clip_low : du ? cfg.dual_clip : r);
            g = low || du || cl ? 0 : -A * r;
            lo += low;
            dual += du;
          }
        } else if (kind == policy_loss_kind::cispo) {
          double const rc = std::max(1 - cfg.clip_low, std::min(1 + cfg.clip_high, r));
          l = -rc * A * lp[k];
          g = -rc * A;
          lo += r < 1 - cfg.clip_low;
          hi += r > 1 + cfg.clip_high;
        } else {
          l = -A * lp[k];
          g = -A;
        }
        if (kind == policy_loss_kind::reinforce) {
          double const rr = std::exp(delta);
          rs += rr;
          rmin = std::min(rmin, rr);
          rmax = std::max(rmax, rr);
          nlr += -delta;
        } else {
          clamped += cl;
          rs += r;
          rmin = std::min(rmin, r);
          rmax = std::max(rmax, r);
          nlr += -dc;
        }
        tokens += 1;
        loss += s * l;
        CHECK(dl[k] == doctest::Approx(s * g).epsilon(1e-5).scale(1e-9));
      }
      auto const& m = res.metrics;
      CHECK(res.loss == doctest::Approx(loss).epsilon(1e-5));
      CHECK(m.tokens == tokens);
      CHECK(m.clipped_low == lo);
      CHECK(m.clipped_high == hi);
      CHECK(m.dual_clipped == dual);
      CHECK(m.log_ratio_clamped == clamped);
      CHECK(m.neg_log_ratio_sum == doctest::Approx(nlr).epsilon(1e-5));
      CHECK(m.ratio_sum == doctest::Approx(rs).epsilon(1e-5));
      CHECK(m.ratio_min == doctest::Approx(rmin).epsilon(1e-5));
      CHECK(m.ratio_max == doctest::Approx(rmax).epsilon(1e-5));
    }
  }
}
